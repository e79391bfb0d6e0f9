// blobpipe/protocol/framer.hpp — turning blob-writer calls into frames.
//
// The sending half of the protocol, without I/O: each frame_* call appends
// one or more frames (docs/wire.md "Frames") to an outbox. Headers and small
// payloads are copied into the outbox's own bytes; a large payload is kept
// as a span of the caller's memory (zero copy), which must then stay valid
// until the outbox has been written. A sender's write loop hands the whole
// outbox to its transport in one gather write (write combining), so many
// small entries cost one system call.
//
//   blobpipe::outbox out;
//   blobpipe::frame_blob_begin(out, 1, tag);
//   blobpipe::frame_entry_begin(out, 1, 0, e, e.meta(), bytes);  // inline
//   for (const auto& p : out.pieces()) ...          // what to write, in order
//
// Source: docs/wire.md "Sender".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "blobpipe/format/entry.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

/// Frames queued for writing, in order: runs of bytes the outbox owns and
/// spans of the caller's memory.
class outbox {
 public:
  /// One run of bytes to write.
  struct piece {
    /// The caller's memory, or null: bytes [offset, offset + size) of bytes().
    const std::byte* external = nullptr;
    std::size_t offset = 0;
    std::size_t size = 0;
    /// An external payload of a frame whose 24-byte header ends the piece
    /// before it: a message transport may send header and payload as a
    /// message of their own (transport::write_bulk; UCX rendezvous).
    bool bulk = false;
    /// The external memory is on this CUDA device (-1: host). Only for a
    /// transport that accepts device memory (transport::write_bulk_device).
    int device = -1;
    std::span<const std::byte> bytes(const outbox& o) const noexcept {
      return external ? std::span(external, size) : std::span(o.bytes_.get() + offset, size);
    }
  };

  outbox() = default;
  /// Moves the frames and the memory; `o` is left empty, without memory.
  outbox(outbox&& o) noexcept;
  outbox& operator=(outbox&& o) noexcept;

  /// Room for `n` copied bytes at the end (valid until the next append).
  /// Not zeroed: the caller writes every byte of it.
  std::span<std::byte> append(std::size_t n);
  /// Appends the caller's memory (not copied). `bulk`, `device`: see piece.
  void append_external(std::span<const std::byte> payload, bool bulk, int device = -1);

  bool empty() const noexcept { return pieces_.empty(); }
  /// Bytes queued: copied and external.
  std::size_t size() const noexcept { return size_; }
  /// Bytes the outbox copied (its own memory).
  std::size_t copied_bytes() const noexcept { return used_; }
  std::span<const piece> pieces() const noexcept { return pieces_; }
  /// Empties it, keeping its memory for the next frames.
  void clear() noexcept;

 private:
  // bytes_[0, used_) are queued, of capacity_ bytes. bytes_ only grows,
  // and clear() keeps it. Growing copies the queued bytes and zeroes
  // nothing (every byte append() hands out is written by its caller).
  std::unique_ptr<std::byte[]> bytes_;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  std::vector<piece> pieces_;
  std::size_t size_ = 0;
};

/// hello (docs/wire.md "Handshake").
void frame_hello(outbox& out, const hello& h);
/// blob_begin: the blob's tag, and its group when given (frame_flag_group;
/// only on a connection that accepted feature_blob_groups).
void frame_blob_begin(outbox& out, std::uint64_t blob_id, const tag_t& tag,
                      const std::optional<blob_group>& group = std::nullopt);
/// entry_begin for row `e` (entry `index` of the blob), `meta` its
/// Entry::meta(), without inline bytes: the entry's e.len bytes follow in
/// data frames (frame_data), or it is empty. `sent_ns`: the sender's
/// monotonic clock (frame_flag_timestamp; only on a connection that
/// accepted feature_entry_timestamps).
void frame_entry_begin(outbox& out, std::uint64_t blob_id, std::uint64_t index, const Entry& e,
                       std::span<const std::byte> meta,
                       std::optional<std::uint64_t> sent_ns = std::nullopt);
/// entry_begin carrying the entry's bytes (frame_flag_inline): returns the
/// e.len bytes inside the frame for the caller to fill before the outbox
/// is written. REQUIRES: e.len <= the negotiated inline_bytes.
std::span<std::byte> frame_entry_begin_inline(outbox& out, std::uint64_t blob_id,
                                              std::uint64_t index, const Entry& e,
                                              std::span<const std::byte> meta,
                                              std::optional<std::uint64_t> sent_ns = std::nullopt);
/// The dtype code (compact_dtype_code) with which row `e` travels in the
/// compact form to a consumer whose max_meta_bytes is `max_meta_bytes`:
/// 0 for a pickle (whose dtype and shape are not part of its row). Empty
/// when it must go in the msgpack form: its dtype has no code (a tensor
/// row with no dtype included), or it has more dims than compact_dims_fit
/// allows. docs/wire.md "Compact entries".
std::optional<std::uint8_t> compact_code(const Entry& e, std::uint32_t max_meta_bytes) noexcept;
/// entry_begin for row `e` in the compact form (frame_flag_compact; only
/// on a connection that accepted feature_compact_entries), without inline
/// bytes; otherwise as frame_entry_begin. `code`: compact_code(e, the
/// consumer's max_meta_bytes), which must not be empty.
void frame_entry_begin_compact(outbox& out, std::uint64_t blob_id, std::uint64_t index,
                               const Entry& e, std::uint8_t code,
                               std::optional<std::uint64_t> sent_ns = std::nullopt);
/// The compact entry_begin carrying the entry's bytes (frame_flag_inline):
/// as frame_entry_begin_inline.
std::span<std::byte> frame_entry_begin_compact_inline(
    outbox& out, std::uint64_t blob_id, std::uint64_t index, const Entry& e, std::uint8_t code,
    std::optional<std::uint64_t> sent_ns = std::nullopt);
/// data frames covering blob offsets [off, off + bytes.size()), each at
/// most `chunk_bytes` of payload. `copy`: the payload is copied into the
/// outbox; else it is referenced (the caller keeps it valid until written)
/// and marked bulk when `bulk`, on CUDA device `device` when >= 0.
void frame_data(outbox& out, std::uint64_t blob_id, std::uint64_t off,
                std::span<const std::byte> bytes, std::uint32_t chunk_bytes, bool copy,
                bool bulk = false, int device = -1);
/// tail: exactly the write_tail bytes, copied.
void frame_tail(outbox& out, std::uint64_t blob_id, std::span<const std::byte> tail);
/// blob_abort with `reason` (cut to max_reason_bytes).
void frame_blob_abort(outbox& out, std::uint64_t blob_id, std::string_view reason);
/// ack: `credit` bytes returned, `blob_id` delivered (0: none).
void frame_ack(outbox& out, std::uint64_t credit, std::uint64_t blob_id);
/// A credit request (sender to consumer, feature_credit_grants): the
/// sender's waiting items need `credit` bytes in all.
void frame_credit_request(outbox& out, std::uint64_t credit);
/// close with `reason` (cut to max_reason_bytes).
void frame_close(outbox& out, std::string_view reason);

}  // namespace blobpipe
