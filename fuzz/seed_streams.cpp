// Seeds for consumer_fuzz and decoder_fuzz: each golden blob that reads
// back, as the byte stream a sender would put on the wire (blob_begin,
// entry_begin carrying entries of up to 1 KiB inline, larger ones followed
// by data chunks of 4 KiB, tail, close), behind the fuzzers' mode byte;
// and again with every entry whose dtype has a code in the compact form
// (docs/wire.md "Compact entries"), behind a mode byte whose bit 5 has the
// fuzzers' hello offer compact entries.
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

/// e's entry_begin payload: compact when `compact` and its dtype has a
/// code (as framer.hpp's compact_code decides), else key and meta.
std::vector<std::byte> entry_payload(const Entry& e, bool compact, std::uint8_t& flags,
                                     std::span<const std::byte> inline_bytes) {
  const std::uint8_t code = e.dtype ? compact_dtype_code(e.kind, *e.dtype) : 0;
  const std::size_t ndim = e.kind != KIND_PICKLE && e.shape ? e.shape->size() : 0;
  if (compact && (e.kind == KIND_PICKLE || code != 0) && compact_dims_fit(ndim, 256)) {
    flags |= frame_flag_compact;
    std::span<const std::int64_t> dims;
    if (ndim) dims = *e.shape;
    return encode_compact_entry_begin(e.key, e.kind, code, e.len, dims, inline_bytes);
  }
  return encode_entry_begin(e.key, e.meta(), inline_bytes);
}

std::vector<std::byte> stream_of(std::span<const std::byte> blob, const blob_index& idx,
                                 bool compact) {
  std::vector<std::byte> out;
  frame(out, {.type = frame_type::blob_begin, .blob_id = 1}, idx.foot.tag);
  for (std::size_t i = 0; i < idx.entries.size(); ++i) {
    const Entry& e = idx.entries[i];
    std::uint8_t flags = 0;
    if (e.len != 0 && e.len <= 1024) {
      flags = frame_flag_inline;
      const auto payload = entry_payload(e, compact, flags, blob.subspan(e.off, e.len));
      frame(out, {.type = frame_type::entry_begin, .flags = flags, .blob_id = 1, .arg = i},
            payload);
      continue;
    }
    const auto payload = entry_payload(e, compact, flags, {});
    frame(out, {.type = frame_type::entry_begin, .flags = flags, .blob_id = 1, .arg = i},
          payload);
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
    for (const bool compact : {false, true}) {
      const auto body = stream_of(blob, *idx, compact);
      // Modes: plain, memory assembly, resend session holding entries;
      // bit 5 (0x20): the hello offers compact entries.
      for (unsigned char mode : {0x01, 0x05, 0x0B}) {
        if (compact) mode |= 0x20;
        std::ofstream out(
            fs::path(argv[2]) / (f.path().stem().string() + "-" + std::to_string(mode)),
            std::ios::binary);
        out.put(static_cast<char>(mode));
        out.write(reinterpret_cast<const char*>(body.data()),
                  static_cast<std::streamsize>(body.size()));
        ++n;
      }
    }
  }
  std::printf("%d seeds\n", n);
  return n > 0 ? 0 : 1;
}
