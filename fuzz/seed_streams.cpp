// Seeds for consumer_fuzz and decoder_fuzz: each golden blob that reads
// back, as the byte stream a sender would put on the wire (blob_begin,
// entry_begin carrying entries of up to 1 KiB inline, larger ones followed
// by data chunks of 4 KiB, tail, close), behind the fuzzers' mode byte.
//
//   seed_streams GOLDEN_DIR OUT_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "blobpipe/format.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace fs = std::filesystem;
using namespace blobpipe;

namespace {

void frame(std::vector<std::byte>& out, frame_header h, std::span<const std::byte> payload) {
  h.length = static_cast<std::uint32_t>(payload.size());
  const auto at = out.size();
  out.resize(at + frame_header_size);
  encode_frame_header(h, std::span(out).subspan(at));
  out.insert(out.end(), payload.begin(), payload.end());
}

std::vector<std::byte> stream_of(std::span<const std::byte> blob, const blob_index& idx) {
  std::vector<std::byte> out;
  frame(out, {.type = frame_type::blob_begin, .blob_id = 1}, idx.foot.tag);
  for (std::size_t i = 0; i < idx.entries.size(); ++i) {
    const Entry& e = idx.entries[i];
    const auto meta = e.meta();
    if (e.len != 0 && e.len <= 1024) {
      frame(out, {.type = frame_type::entry_begin, .flags = frame_flag_inline, .blob_id = 1, .arg = i},
            encode_entry_begin(e.key, meta, blob.subspan(e.off, e.len)));
      continue;
    }
    frame(out, {.type = frame_type::entry_begin, .blob_id = 1, .arg = i},
          encode_entry_begin(e.key, meta));
    for (std::uint64_t pos = 0; pos < e.len; pos += 4096) {
      const auto n = std::min<std::uint64_t>(4096, e.len - pos);
      frame(out, {.type = frame_type::data, .blob_id = 1, .arg = e.off + pos},
            blob.subspan(e.off + pos, n));
    }
  }
  frame(out, {.type = frame_type::tail, .blob_id = 1}, blob.subspan(idx.data_end()));
  frame(out, {.type = frame_type::close}, {});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: seed_streams GOLDEN_DIR OUT_DIR\n");
    return 2;
  }
  int n = 0;
  for (const auto& f : fs::directory_iterator(argv[1])) {
    if (f.path().extension() != ".blob") continue;
    std::ifstream in(f.path(), std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
    const auto blob = std::as_bytes(std::span(raw));
    auto idx = read_index(blob);
    if (!idx || idx->foot.version != VERSION) continue;
    const auto body = stream_of(blob, *idx);
    // Modes: plain, memory assembly, resend session holding entries.
    for (unsigned char mode : {0x01, 0x05, 0x0B}) {
      std::ofstream out(fs::path(argv[2]) / (f.path().stem().string() + "-" + std::to_string(mode)),
                        std::ios::binary);
      out.put(static_cast<char>(mode));
      out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
      ++n;
    }
  }
  std::printf("%d seeds\n", n);
  return n > 0 ? 0 : 1;
}
