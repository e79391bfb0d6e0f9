// blobpipe/protocol/decoder.hpp — the push decoder of the wire protocol.
//
// Bytes in, events out, no I/O: the decoder takes a connection's bytes in
// any chunking, checks every frame against docs/wire.md and the limits,
// and reports what happened to a listener. It never reads a socket and
// never waits, so the consumer's I/O loop, the sender's ack reader, the
// fuzzers and most protocol tests all drive the same code (in the style of
// Arrow's ipc::MessageDecoder).
//
//   struct my_listener : blobpipe::decoder_listener { ... };
//   my_listener l;
//   blobpipe::decoder d(blobpipe::wire_role::sender, {}, l);   // reads a sender's frames
//   if (auto r = d.consume(bytes); !r) ...;                   // r.message() names the frame
//
// Large payloads land where they belong without a copy: after a frame
// header, payload_target() is the span the rest of the frame's payload
// goes to (an entry's own buffer at the chunk's offset, or the decoder's
// buffer for control frames); a caller holding no buffered bytes reads
// straight into it and calls commit_payload(n). Bytes passed to consume()
// are copied there instead. Message transports (UCX active messages, whose
// payload arrives later by rendezvous) feed the header with consume() and
// then land the payload with payload_target()/commit_payload().
//
// Window: the decoder counts the credit of every entry (len + key + meta +
// entry_overhead_bytes; compact_entry_credit for the compact form) and
// tail it admits against
// decoder_limits::window_bytes (docs/wire.md "Flow control"). An entry's
// credit is handed to the listener (entry_announcement::credit), which
// release()s it when the application drops the entry; a tail's the decoder
// releases itself once checked (take_returned_credit()). With
// feature_credit_grants negotiated (decoder_limits::features), the window
// is the credit granted and not yet released: grant() raises it, release()
// lowers it with the buffered bytes, and nothing beyond it is admitted
// (docs/wire_features.md "Credit grants").
//
// Memory: per open blob the decoder keeps a constant (the row being
// received, and a keyed digest of the rows announced, row_digest.hpp,
// against which the tail's index is checked), never the rows themselves;
// per frame, a
// control payload split across consume() calls (at most the frame's
// checked length) and a data payload's scratch when its entry is dropped
// (at most the chunk size).
//
// Threading: none; one decoder per connection direction, used by one
// thread at a time. Source: docs/wire.md "Consumer", "Flow control",
// "Limits".
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "blobpipe/errors.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/index.hpp"
#include "blobpipe/protocol/row_digest.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

/// What a decoder admits (docs/wire.md "Limits"); sizes in bytes.
struct decoder_limits {
  std::uint64_t window_bytes = 64ull << 20;        ///< credit buffered at once
  std::uint32_t max_chunk_bytes = default_chunk_bytes;  ///< data payload (negotiated)
  std::uint32_t inline_bytes = default_inline_bytes;    ///< largest inline entry (negotiated)
  std::uint32_t max_key_bytes = default_max_key_bytes;
  std::uint32_t max_meta_bytes = default_max_meta_bytes;
  std::uint64_t max_entry_bytes = 1ull << 32;      ///< one entry's len
  std::uint32_t max_tail_bytes = 256u << 20;       ///< index + footer
  std::uint64_t max_blob_bytes = 1ull << 32;       ///< data + tail
  std::uint32_t max_open_blobs = 4096;             ///< blobs begun, not ended
  std::uint64_t max_entries_per_blob = 1u << 24;
  std::uint32_t max_frame_bytes = default_max_frame_bytes;  ///< any frame's payload
  /// Features both sides accepted in the handshake (known_features bits):
  /// a frame form of any other feature is a violation.
  std::uint64_t features = 0;
};

/// An entry_begin that passed every check.
struct entry_announcement {
  std::uint64_t blob_id = 0;
  std::uint64_t index = 0;   ///< row number in the blob
  const Entry* entry = nullptr;  ///< the row as announced (offsets from blob start)
  /// Window credit this entry holds until the application drops it
  /// (entry_credit(len, key, meta), or compact_entry_credit(len, key,
  /// ndim) for the compact form): pass it to decoder::release() then.
  std::uint64_t credit = 0;
  /// The sender's monotonic clock when it emitted the entry, nanoseconds
  /// (frame_flag_timestamp); empty when not stamped.
  std::optional<std::uint64_t> sent_ns;
  /// Set (to the same row as `entry`) when the entry is complete once
  /// announced (inline, or empty) and the decoder keeps nothing of its row
  /// after on_entry_begin returns: the listener may move the row out of
  /// *take instead of copying it. Null otherwise.
  Entry* take = nullptr;
  /// The row's dtype as the decoder's check found it, for the listener's
  /// view (view_valid_entry) without a second lookup by name, valid for
  /// the program's life: for a compact row its code's (format_dtype_of),
  /// for a torch row in the msgpack form lookup_dtype's; null for a 'p'
  /// row and a numpy row in the msgpack form (look it up then: lookup_dtype
  /// keeps those in a per-thread cache only). Equal in value to
  /// parse_dtype(entry->kind, dtype name).
  const dtype* type = nullptr;
};

/// Receives a decoder's events, in frame order. Every callback may refuse
/// with an error, which ends decoding (consume() returns it). `blob` is
/// the pointer on_blob_begin returned for that blob.
class decoder_listener {
 public:
  virtual ~decoder_listener() = default;
  /// The peer's hello, checked (magic, version, size, role). The listener
  /// negotiates and may call decoder::set_limits() before returning; the
  /// next frame is checked against the new limits.
  virtual result<void> on_hello(const hello& h) = 0;
  /// A blob begins. Returns a pointer of the listener's own, handed back
  /// with each later event of the blob (default: null).
  virtual result<void*> on_blob_begin(std::uint64_t blob_id, const tag_t& tag);
  /// Where the entry's entry->len bytes go: exactly that many bytes, or an
  /// empty span to drop them (default: drop).
  virtual result<std::span<std::byte>> on_entry_begin(void* blob, const entry_announcement& a);
  /// Every byte of the blob's current entry is in its destination (or was
  /// committed by the caller, see decoder::commit_payload).
  virtual result<void> on_entry_complete(void* blob, std::uint64_t blob_id);
  /// The tail arrived and agrees with the entries announced and the tag:
  /// `index` is the parsed index, `tail` the tail's bytes (index + footer).
  virtual result<void> on_blob_complete(void* blob, std::uint64_t blob_id, blob_index index,
                                        std::span<const std::byte> tail);
  /// The sender aborted the blob, with its reason (UTF-8, <= 4096 bytes).
  virtual result<void> on_blob_abort(void* blob, std::uint64_t blob_id, std::string_view reason);
  /// An ack (sender side): credit returned and the blob delivered (0: none).
  virtual result<void> on_ack(std::uint64_t credit, std::uint64_t blob_id);
  /// The blob (just begun: on_blob_begin came first) belongs to group `g`
  /// (feature_blob_groups).
  virtual result<void> on_blob_group(void* blob, std::uint64_t blob_id, const blob_group& g);
  /// A credit request (consumer side, feature_credit_grants): the sender's
  /// waiting items need `credit` bytes in all.
  virtual result<void> on_credit_request(std::uint64_t credit);
  /// The peer closed the connection in order, with its reason.
  virtual result<void> on_close(std::string_view reason);
};

/// The push decoder (see the file comment).
class decoder {
 public:
  /// Decodes frames sent by `from`: a consumer decodes wire_role::sender,
  /// a sender wire_role::consumer. `listener` must outlive the decoder.
  decoder(wire_role from, decoder_limits limits, decoder_listener& listener);
  decoder(const decoder&) = delete;
  decoder& operator=(const decoder&) = delete;

  /// Decodes `in` (any number of bytes, any chunking) and reports every
  /// frame it completes. Uses all of `in` unless it fails; after a failure
  /// every call returns the same error.
  /// Errors: protocol_violation (the message names the frame and field),
  /// or whatever a listener callback returned.
  result<void> consume(std::span<const std::byte> in);

  /// As consume(), but stops early once work() reaches `budget` (bytes of
  /// work, see work(), counted since the last reset_work(), not per call):
  /// at any step, so after a frame, between a frame's header and its
  /// payload, or within a payload. Returns how many bytes of `in` it took,
  /// 0 once work() >= budget: the caller calls reset_work() before the
  /// next turn and passes the rest again (any chunking is fine). Bytes after a close frame are refused whatever
  /// the budget. A caller sharing a thread among connections gives each a
  /// turn of at most `budget` this way, so a peer sending tiny frames gets
  /// no more decoding per turn than one sending large ones
  /// (docs/cluster.md "Fair turns", docs/wire.md "Limits").
  /// Errors: as consume().
  result<std::size_t> consume_some(std::span<const std::byte> in, std::uint64_t budget);

  /// Each frame completed costs at least this much work, bytes: a frame
  /// shorter than this (header and payload) is charged the difference.
  static constexpr std::uint64_t frame_work_floor_bytes = 4096;
  /// Work done since the last reset_work(), bytes: every byte decoded
  /// (consume, consume_some, commit_payload), plus for each frame
  /// completed the difference up to frame_work_floor_bytes. A budget of B
  /// bytes of work thus completes at most B / frame_work_floor_bytes
  /// frames (64 for a 256 KiB turn), whatever their size.
  std::uint64_t work() const noexcept { return work_; }
  /// Starts counting work() from 0 (a new turn).
  void reset_work() noexcept { work_ = 0; }

  /// Bytes needed to finish the current frame header or payload (>= 1
  /// while decoding; 0 after a close frame or a failure).
  std::size_t next_required_size() const noexcept;

  /// Whether a frame's payload is being received, and how much is left.
  bool in_payload() const noexcept { return state_ == state::payload; }
  std::uint64_t payload_remaining() const noexcept { return payload_left_; }
  /// Whether that payload is entry bytes (a data frame), which only the
  /// application reads: a caller may commit it before it has landed (a
  /// posted UCX fetch), provided it holds the entry back until then.
  /// Control payloads (entry_begin, tail, ...) must be in place before
  /// commit_payload().
  bool payload_is_entry_bytes() const noexcept { return sink_ == sink::entry; }
  /// The blob whose entry bytes the current payload carries (0: none).
  std::uint64_t payload_blob_id() const noexcept {
    return state_ == state::payload && sink_ == sink::entry && cur_blob_ ? cur_blob_->id : 0;
  }
  /// Where the rest of the current payload goes (payload_remaining()
  /// bytes). REQUIRES: in_payload().
  std::span<std::byte> payload_target();
  /// The caller wrote `n` bytes at payload_target() (see
  /// payload_is_entry_bytes for entry bytes still landing).
  /// REQUIRES: in_payload(), n <= payload_remaining().
  /// Errors: as consume().
  result<void> commit_payload(std::size_t n);

  /// Applies negotiated limits (from on_hello: chunk and inline sizes).
  void set_limits(const decoder_limits& l) noexcept { limits_ = l; }
  const decoder_limits& limits() const noexcept { return limits_; }

  /// Credit given back by the application (entry_announcement::credit).
  /// With feature_credit_grants, the window shrinks by as much: released
  /// credit is the pool's, not the sender's, until granted again.
  void release(std::uint64_t credit) noexcept;
  /// Credit granted to the sender in an ack (feature_credit_grants only):
  /// the window grows by `credit`.
  /// Saturates at 2^64 - 1 rather than wrap (a window that wrapped would
  /// refuse every entry, or admit any).
  void grant(std::uint64_t credit) noexcept {
    limits_.window_bytes += std::min(credit, ~std::uint64_t{0} - limits_.window_bytes);
  }
  /// Credit buffered now, bytes.
  std::uint64_t buffered_bytes() const noexcept { return buffered_; }
  /// Credit the decoder released itself since the last call (checked
  /// tails), to return to the sender in an ack.
  std::uint64_t take_returned_credit() noexcept;

  /// A close frame was decoded (no further byte is allowed).
  bool closed() const noexcept { return state_ == state::closed; }
  /// Whether the peer owes bytes: a frame begun, or a blob open.
  bool owes_bytes() const noexcept;
  /// Whether a frame is begun and not yet whole (header or payload).
  bool in_frame() const noexcept { return header_have_ != 0 || state_ == state::payload; }
  std::size_t open_blobs() const noexcept { return blobs_.size(); }
  /// The most heap the decoder keeps for one open blob with no entry open
  /// (its state, the keyed digest of its rows inside it), bytes. Not
  /// counted against the
  /// window: max_open_blobs of them cost a connection at most
  /// max_open_blobs * open_blob_bytes (16 MiB at the defaults) beyond it.
  /// An open entry's key and meta count in its credit; a completed entry's
  /// row is not kept. docs/wire.md "Limits", decoder_budget_test.
  static constexpr std::size_t open_blob_bytes = 4096;
  /// Entries announced (not inline) and not yet complete: bytes the
  /// sender owes, their credit taken already.
  std::size_t entries_open() const noexcept { return entries_open_; }
  /// Bytes decoded so far that the window admitted for the application:
  /// entry bytes (data payloads, inline entries, including entries whose
  /// bytes are dropped) and tails, counted as they arrive. Control frames
  /// (hello, blob_begin, entry_begin's key and meta, blob_abort, acks,
  /// close) are not counted, so a stream of them makes no progress: this is
  /// the byte half of a peer's progress (docs/reliability.md "Timeouts").
  std::uint64_t admitted_bytes() const noexcept { return admitted_bytes_; }

 private:
  enum class state { hello, header, payload, closed, failed };
  enum class sink { assemble, entry };

  struct open_blob {
    std::uint64_t id = 0;
    tag_t tag = NO_TAG;
    void* user = nullptr;
    std::uint64_t entries = 0;          // announced
    // Of the rows announced, each in canonical form (append_index_row).
    row_digest rows{row_digest::process_key()};
    std::uint64_t data_end = 0;         // aligned end of the last entry
    std::uint64_t max_index_bytes = 5;  // no index of these rows encodes longer
    // The entry announced and receiving data frames while entry_open;
    // empty otherwise.
    Entry current;
    bool entry_open = false;
    std::uint64_t received = 0;
    std::byte* dest = nullptr;          // null: drop its bytes
  };

  result<void> fail(error e);
  /// One step of consume_some(): a header (or part), or a payload (or part).
  result<void> step(std::span<const std::byte>& in);
  /// commit_payload() without counting the bytes as work (consume counts
  /// them itself).
  result<void> commit(std::size_t n);
  /// `n` bytes of the current payload arrive: counts them in
  /// admitted_bytes() when they are entry bytes or a tail's.
  void count_admitted(std::size_t n) noexcept;
  /// A frame is complete: charges it up to frame_work_floor_bytes.
  void frame_done() noexcept;
  result<void> on_header(std::span<const std::byte> bytes);
  result<void> check_hello_prefix();
  result<void> start_payload(sink k);
  result<void> finish_payload(std::span<const std::byte> payload);
  result<void> advance_entry(std::size_t n);
  result<void> on_hello_frame(std::span<const std::byte> p);
  result<void> on_blob_begin(std::span<const std::byte> p);
  result<void> on_entry_begin(std::span<const std::byte> p);
  result<void> on_tail(std::span<const std::byte> p);
  result<void> on_blob_abort(std::span<const std::byte> p);
  result<void> on_close(std::span<const std::byte> p);
  result<void> check_header(const frame_header& h);
  result<void> check_window(std::uint64_t n, const char* what) const;
  open_blob* find(std::uint64_t id) noexcept;
  void end_blob(std::map<std::uint64_t, open_blob>::iterator it) noexcept;

  wire_role from_;
  decoder_limits limits_;
  decoder_listener* listener_;
  state state_ = state::hello;
  std::optional<error> failure_;
  // The frame being decoded.
  frame_header cur_;
  std::array<std::byte, frame_header_size> header_buf_{};
  std::size_t header_have_ = 0;
  sink sink_ = sink::assemble;
  std::uint64_t payload_left_ = 0;
  std::vector<std::byte> assembly_;  // control payloads split across calls
  std::size_t assembly_have_ = 0;
  std::vector<std::byte> scratch_;   // data of a dropped entry
  std::vector<std::byte> row_;       // a row in canonical form, for the digest
  open_blob* cur_blob_ = nullptr;    // data frames: the blob they fill
  // Blobs.
  std::map<std::uint64_t, open_blob> blobs_;
  open_blob* last_ = nullptr;        // the most recent find(), a hint
  std::uint64_t last_blob_id_ = 0;
  // Window.
  std::uint64_t buffered_ = 0;
  std::size_t entries_open_ = 0;  // open_blob::entry_open set, over all blobs
  std::uint64_t returned_ = 0;
  std::uint64_t admitted_bytes_ = 0;  // admitted_bytes()
  // Work since reset_work() (work()).
  std::uint64_t work_ = 0;
};

}  // namespace blobpipe
