// examples/rollout/replay.cpp — see replay.hpp.
#include "examples/rollout/replay.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace rollout {

namespace fs = std::filesystem;
using blobpipe::errc;

std::uint64_t replay_blob::entry_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& e : index.entries) n += e.len;
  return n;
}

blobpipe::result<replay_set> load_replay(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".blob" && it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) return {errc::invalid_argument, dir + ": " + ec.message()};
  std::sort(files.begin(), files.end());

  replay_set set;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::vector<std::byte> bytes(fs::file_size(path, ec));
    if (ec || !in.read(reinterpret_cast<char*>(bytes.data()),
                       static_cast<std::streamsize>(bytes.size())))
      return {errc::invalid_argument, path.string() + ": cannot read"};
    std::string name = path.filename().string();
    auto idx = blobpipe::read_index(bytes);
    if (!idx) {
      set.skipped.push_back(name + ": " + blobpipe::errc_name(idx.code()) + ": " + idx.message());
      continue;
    }
    set.blobs.push_back({std::move(name), std::move(bytes), std::move(*idx)});
  }
  return set;
}

std::span<const std::byte> entry_bytes(const replay_blob& b, std::size_t i) {
  const auto& e = b.index.entries[i];
  return std::span<const std::byte>(b.bytes).subspan(e.off, e.len);
}

blobpipe::value entry_value(const replay_blob& b, std::size_t i) {
  const auto& e = b.index.entries[i];
  auto bytes = entry_bytes(b, i);
  switch (e.kind) {
    case blobpipe::KIND_NDARRAY:
      return blobpipe::value::ndarray_bytes(bytes, e.dtype.value_or(""),
                                            e.shape.value_or(blobpipe::shape_t{}));
    case blobpipe::KIND_PICKLE:
      return blobpipe::value::pickle(bytes);
    default:
      return blobpipe::value::tensor_bytes(bytes, e.dtype.value_or("float32"),
                                           e.shape.value_or(blobpipe::shape_t{}));
  }
}

}  // namespace rollout
