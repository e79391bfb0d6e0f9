// libFuzzer entry point: read_index over arbitrary bytes, then decode and
// materialize every entry it accepts; and read_index_file over the same
// bytes as a file (fmemopen), which must agree with read_index, also for a
// blob at an offset inside a larger file (bazel build --config=fuzz). Each
// parse must stay within the index parser's memory budget (index_budget).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "blobpipe/format.hpp"
#include "fuzz/alloc_budget.hpp"

namespace {

/// The index parser's stated worst case (docs/reliability.md "Fuzzing"):
/// live heap while reading a blob's index, per byte of the blob, plus a
/// constant.
constexpr blobpipe::fuzz::budget index_budget{.per_input_byte = 32, .constant_bytes = 64 << 10};

/// read_index_file on `bytes` at `off` of an in-memory file.
blobpipe::result<blobpipe::blob_index> read_as_file(std::span<const std::uint8_t> bytes,
                                                    std::size_t off) {
  std::vector<std::uint8_t> file(off, 0xAB);
  file.insert(file.end(), bytes.begin(), bytes.end());
  if (file.empty()) file.push_back(0);  // fmemopen refuses size 0
  std::FILE* f = fmemopen(file.data(), file.size(), "rb");
  if (f == nullptr) __builtin_trap();
  auto r = [&] {
    blobpipe::fuzz::alloc_budget b("read_index_file", bytes.size(), index_budget);
    return blobpipe::read_index_file(f, off, bytes.size());
  }();
  std::fclose(f);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto blob = std::as_bytes(std::span(data, size));
  auto idx = [&] {
    blobpipe::fuzz::alloc_budget b("read_index", size, index_budget);
    return blobpipe::read_index(blob);
  }();

  // The file reader checks the same numbers through two reads of its own.
  // (nbytes 0 means "to the end of the file", so an empty blob is skipped.)
  if (size > 0) {
    for (std::size_t off : {std::size_t{0}, std::size_t{13}}) {
      auto from_file = read_as_file(std::span(data, size), off);
      if (from_file.has_value() != idx.has_value()) __builtin_trap();
      if (idx && (from_file->entries != idx->entries || from_file->nbytes != idx->nbytes))
        __builtin_trap();
      if (!idx && from_file.code() != idx.code()) __builtin_trap();
    }
  }

  if (!idx) return 0;
  for (const auto& e : idx->entries) {
    auto v = blobpipe::decode_entry(blob, e);
    if (!v) __builtin_trap();  // read_index validated it: decode must agree
    if (v->numel() > 0) (void)v->as_double(0);
    (void)blobpipe::materialize(*v);
  }
  return 0;
}
