// libFuzzer entry point: the push decoder (blobpipe/protocol/decoder.hpp)
// fed arbitrary bytes as a sender's stream, with no I/O and no io_context.
//
// Byte 0 picks how: bit 0 prepends a valid sender hello; bits 1-3 how the
// stream is cut (one call, fixed pieces of 1, 7, 24, 100 or 4096 bytes, or
// pieces sized by the input's own bytes); bit 4 lands large payloads the
// way a socket reader does (payload_target / commit_payload) instead of
// copying them through consume(); bit 5 has the prepended hello offer
// compact entries (feature_compact_entries, the one feature the decoder
// accepts here, from any hello that offers it). Whatever the input, the decoder must
// keep its invariants:
// - entry bytes only ever land inside the destination the listener gave
//   (each is a vector of exactly len bytes: ASan catches a byte past it);
// - an entry completes once, after exactly its len bytes: the input is
//   decoded twice, into destinations filled with 0x00 and with 0xFF, and
//   every completed entry must read the same both times (a byte never
//   landed keeps its fill and differs);
// - a completed blob's index equals the rows it announced, in order;
// - the credit it holds never exceeds the window but for one item alone,
//   and drops to what the listener holds once blobs end.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/wire.hpp"

#include "fuzz/stream_input.hpp"

namespace {

using namespace blobpipe;

constexpr std::uint64_t window = 1 << 20;

struct fuzz_listener final : decoder_listener {
  decoder* dec = nullptr;
  struct blob {
    std::vector<Entry> rows;
    std::vector<std::vector<std::byte>> bytes;  // entry buffers
    bool entry_open = false;
  };
  std::map<std::uint64_t, blob> blobs;
  std::uint64_t held = 0;  // credit of entries this listener holds
  std::byte fill{0};       // what a destination holds before bytes land
  // Completed entries' bytes, by (blob id, index), in completion order.
  std::vector<std::pair<std::pair<std::uint64_t, std::size_t>, std::vector<std::byte>>> completed;

  result<void> on_hello(const hello& h) override {
    auto l = dec->limits();
    l.max_chunk_bytes = std::min<std::uint32_t>(h.max_chunk_bytes, 4096);
    l.inline_bytes = std::min<std::uint32_t>(h.inline_bytes, 1024);
    l.features = h.features & feature_compact_entries;
    dec->set_limits(l);
    return {};
  }
  result<void*> on_blob_begin(std::uint64_t id, const tag_t&) override {
    if (blobs.count(id)) __builtin_trap();  // ids rise: never reused
    return static_cast<void*>(&blobs[id]);
  }
  result<std::span<std::byte>> on_entry_begin(void* p, const entry_announcement& a) override {
    auto& b = *static_cast<blob*>(p);
    if (b.entry_open || a.index != b.rows.size()) __builtin_trap();
    b.rows.push_back(*a.entry);
    b.bytes.emplace_back(a.entry->len, fill);
    b.entry_open = true;
    held += a.credit;
    dec->release(a.credit);  // dropped at once, as a fast application would
    held -= a.credit;
    return std::span<std::byte>(b.bytes.back());
  }
  result<void> on_entry_complete(void* p, std::uint64_t id) override {
    auto& b = *static_cast<blob*>(p);
    if (!b.entry_open) __builtin_trap();
    b.entry_open = false;
    completed.push_back({{id, b.rows.size() - 1}, b.bytes.back()});
    return {};
  }
  result<void> on_blob_complete(void* p, std::uint64_t id, blob_index index,
                                std::span<const std::byte> tail) override {
    auto& b = *static_cast<blob*>(p);
    if (b.entry_open || index.entries != b.rows) __builtin_trap();
    if (index.nbytes != index.data_end() + tail.size()) __builtin_trap();
    blobs.erase(id);
    return {};
  }
  result<void> on_blob_abort(void*, std::uint64_t id, std::string_view reason) override {
    if (reason.size() > max_reason_bytes) __builtin_trap();
    blobs.erase(id);
    return {};
  }
};

/// The next piece's size for cutting mode `mode`.
std::size_t piece(unsigned mode, std::span<const std::byte> rest, std::size_t at) {
  static constexpr std::size_t fixed[] = {SIZE_MAX, 1, 7, 24, 100, 4096};
  if (mode < 6) return fixed[mode];
  // Sizes from the stream's own bytes: 1 to 256.
  return 1 + std::to_integer<std::size_t>(rest[at % rest.size()]);
}

/// Decodes `stream` cut as `mode` says, into destinations filled with
/// `fill`; the entries completed.
decltype(fuzz_listener::completed) decode(std::uint8_t mode, std::span<const std::byte> rest,
                                          const std::vector<std::byte>& stream, std::byte fill) {
  fuzz_listener l;
  l.fill = fill;
  decoder d(wire_role::sender,
            {.window_bytes = window, .max_chunk_bytes = 4096, .inline_bytes = 1024,
             .max_key_bytes = 256, .max_meta_bytes = 256, .max_entry_bytes = 1 << 20,
             .max_tail_bytes = 1 << 16, .max_blob_bytes = 1 << 20, .max_open_blobs = 16,
             .max_entries_per_blob = 1024},
            l);
  l.dec = &d;
  const unsigned cut = (mode >> 1) & 7;
  const bool direct = (mode & 16) != 0;
  std::uint64_t most = 0;
  std::span<const std::byte> in(stream);
  for (std::size_t at = 0; !in.empty(); ++at) {
    if (direct && d.in_payload() && d.payload_remaining() >= 64) {
      // A socket reader: the rest of the payload straight into its place.
      auto target = d.payload_target();
      const std::size_t n = std::min(target.size(), in.size());
      std::memcpy(target.data(), in.data(), n);
      in = in.subspan(n);
      if (!d.commit_payload(n)) break;
    } else {
      const std::size_t n = std::min(piece(cut, rest.empty() ? in : rest, at), in.size());
      if (!d.consume(in.first(n))) break;
      in = in.subspan(n);
    }
    most = std::max(most, d.buffered_bytes());
    (void)d.take_returned_credit();
  }
  // Credit: within the window, but for one item admitted alone (at most a
  // tail of max_tail_bytes or an entry of max_entry_bytes and its key,
  // meta and bookkeeping).
  if (most > window + (1 << 20) + 1024 + entry_overhead_bytes) __builtin_trap();
  // Every entry was released at once: with no blob open and no frame under
  // way, nothing is held any more.
  if (d.open_blobs() == 0 && !d.in_payload() && d.next_required_size() == frame_header_size &&
      d.buffered_bytes() != l.held)
    __builtin_trap();
  return std::move(l.completed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  std::optional<hello> h;
  if (mode & 1) {
    h = hello{.role = wire_role::sender, .max_chunk_bytes = 4096, .inline_bytes = 1024};
    if (mode & 32) h->features = feature_compact_entries;
  }
  const auto rest = std::as_bytes(std::span(data + 1, size - 1));
  const std::vector<std::byte> stream = fuzzing::stream_input(h, std::span(data + 1, size - 1));
  // Every byte of a completed entry landed: it reads the same whatever the
  // destination held before.
  const auto zeros = decode(mode, rest, stream, std::byte{0x00});
  const auto ones = decode(mode, rest, stream, std::byte{0xFF});
  if (zeros != ones) __builtin_trap();
  return 0;
}
