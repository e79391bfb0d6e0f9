// blobpipe/protocol/sender_session.hpp — the sending half of the wire
// protocol as a session without I/O, the twin of the push decoder.
//
// One sender_session holds everything a sender decides: blob ids, each
// blob's state and entry indices, window credit, the counters, and in a
// resend session the blobs kept until the consumer acknowledges them and
// what a new connection must be sent again. Its calls (open a blob with a
// sender_blob, add an entry, finish, abort, take an ack or a credit grant,
// connect again) append frames to an outbox; it never waits, never reads
// a clock and never does I/O. The application owns the socket and the
// loop: it writes what the outbox holds, waits for credit when
// take_credit() says no, and feeds the consumer's bytes back in
// (consume(): its hello, checked against the offer, acks and close)
// (nghttp2's nghttp2_submit_* with nghttp2_session_mem_send; Arrow's IPC
// writer, one bookkeeper for the position). Where an entry's bytes live
// (host, strided, CUDA device memory) is the caller's business: the session
// sees only spans of bytes, or frames a chunk pointing at them.
//
//   blobpipe::sender_session s;
//   s.offer(our_hello, out);                          // write `out`, then read:
//   auto in = s.consume(bytes_from_the_consumer);     // in->hello: answered
//   s.connect(blobpipe::sender_limits::from_hello(*s.answer()));
//   blobpipe::sender_blob b(tag);
//   auto ok = s.check_emit(b, key.size());             // before planning
//   auto credit = s.plan_entry(b, row, meta);          // after planning
//   if (!s.take_credit(*credit)) { s.ask_credit(*credit); /* wait: on_ack */ }
//   auto room = s.add_entry(b, row, meta, now_ns, blobpipe::entry_route::automatic);
//   if (!room.empty()) std::memcpy(room.data(), bytes, row.len);      // inline
//   else for (std::size_t at = 0; at < row.len;) at += s.add_chunk(b, bytes.subspan(at));
//   s.entry_sent(b);
//   ... s.finish(b, tail) ...; write s.out().pieces(), then s.out().clear().
//
// After fail() every call refuses with that error (nghttp2: one failure
// never cascades into a second, different report).
//
// Threading: none; one session per sender, used by one thread at a time.
// Source: docs/wire.md "Sender", "Flow control", "Delivery";
// docs/wire_features.md "Credit grants".
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "blobpipe/errors.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

/// What the consumer's hello set for one connection; sizes in bytes.
struct sender_limits {
  std::uint32_t chunk_bytes = default_chunk_bytes;    ///< largest data payload
  std::uint32_t inline_bytes = default_inline_bytes;  ///< entries up to this go inline
  std::uint64_t window_bytes = 64ull << 20;           ///< credit (grants: initial grant)
  std::uint64_t features = 0;                         ///< accepted feature_* bits
  std::uint32_t max_key_bytes = default_max_key_bytes;
  std::uint32_t max_meta_bytes = default_max_meta_bytes;
  std::uint32_t dedup_window = 0;  ///< blobs the consumer remembers (resend sessions)
  /// Longest entry (its len) the consumer admits, from its hello's
  /// max_entry_bytes extension; 2^64 - 1 when it announced none.
  std::uint64_t max_entry_bytes = ~std::uint64_t{0};

  /// The limits a checked consumer hello gives. A malformed
  /// max_entry_bytes extension is left out here: the handshake refuses it
  /// (read_max_entry_bytes).
  static sender_limits from_hello(const hello& h);
};

/// What the session counted: everything it decides (sender_stats adds
/// what the I/O side sees). Each entry and tail is counted once: when it
/// is framed, or in a resend session when it is kept (never again when a
/// reconnect sends it a second time).
struct sender_counts {
  std::uint64_t entries_sent = 0;
  std::uint64_t data_frames_sent = 0;
  std::uint64_t bytes_sent = 0;       ///< entry + tail payload bytes
  /// Times a producer waited for the window (ask_credit(), note_credit_wait()).
  std::uint64_t credit_waits = 0;
  /// Credit requests sent (feature_credit_grants: a pooled consumer).
  std::uint64_t credit_requests = 0;
  std::uint64_t blobs_sent = 0;       ///< tails framed (blob_writer::finish; resend: kept)
  std::uint64_t blobs_aborted = 0;    ///< aborts framed (abort(), a dropped writer; resend: kept)
  /// The steady clock (nanoseconds since its epoch) when the first entry
  /// was emitted (its emitted_ns); 0 before.
  std::uint64_t first_entry_ns = 0;
  // Resend sessions.
  std::uint64_t reconnects = 0;       ///< connections made after the first (connect())
  std::uint64_t blobs_resent = 0;     ///< kept blobs sent again on a new connection
  std::uint64_t blobs_delivered = 0;  ///< delivery acknowledgements taken
  std::uint64_t budget_waits = 0;     ///< times a producer waited for unacked_bytes
};

/// How an entry's bytes go out (add_entry).
enum class entry_route {
  automatic,  ///< inline when 1 <= len <= inline_bytes, else data frames
  chunks,     ///< always data frames (bytes the caller cannot copy at once: device memory)
};

/// An entry kept for resending (resend sessions).
struct kept_entry {
  Entry entry;                    ///< the row (offsets from blob start)
  std::vector<std::byte> meta;    ///< Entry::meta() as sent in entry_begin
  std::vector<std::byte> bytes;   ///< the entry's len bytes, contiguous host memory
  std::uint64_t emitted_ns = 0;   ///< when it was emitted (entry timestamps)
};

/// One blob's state. The caller holds it; only a sender_session changes it.
class sender_blob {
 public:
  explicit sender_blob(const tag_t& tag = random_tag(),
                       std::optional<blob_group> group = std::nullopt)
      : tag_(tag), group_(group) {}

  const tag_t& tag() const noexcept { return tag_; }
  const std::optional<blob_group>& group() const noexcept { return group_; }
  /// blob_id on the connection it was last begun on; 0 before.
  std::uint64_t id() const noexcept { return id_; }
  /// Entries framed on that connection (the next entry's index).
  std::uint64_t entries() const noexcept { return next_index_; }
  /// finish() or abort() was called.
  bool ended() const noexcept { return ended_; }
  /// An entry was planned and did not go out whole: only abort() is left.
  bool broken() const noexcept { return broken_; }
  /// Resend sessions: the consumer acknowledged it.
  bool delivered() const noexcept { return delivered_; }
  /// Resend sessions: bytes of it counted against the unacked budget.
  std::uint64_t kept_bytes() const noexcept { return kept_bytes_; }
  /// Resend sessions: the entries kept, oldest first (deque: references
  /// stay valid while others are added).
  const std::deque<kept_entry>& kept() const noexcept { return kept_; }

 private:
  friend class sender_session;
  enum class end_kind : std::uint8_t { open, tail, abort };

  tag_t tag_;
  std::optional<blob_group> group_;
  std::uint64_t connection_ = 0;   // the connection it was begun on (0: none)
  std::uint64_t id_ = 0;
  std::uint64_t next_index_ = 0;
  std::uint64_t entry_left_ = 0;   // bytes of the current entry not yet framed
  std::uint64_t entry_off_ = 0;    // blob offset of its next data byte
  // The form chosen for the entry being planned (sender_session::form_of):
  // valid for that Entry object on connection form_connection_ until
  // add_entry() or keep_entry() takes it.
  const Entry* form_entry_ = nullptr;
  std::uint64_t form_connection_ = 0;
  std::optional<std::uint8_t> form_code_;
  bool ended_ = false;
  bool end_framed_ = false;        // tail or abort framed on connection_
  bool broken_ = false;
  // Resend sessions.
  end_kind end_ = end_kind::open;
  std::deque<kept_entry> kept_;
  std::vector<std::byte> tail_;
  std::string abort_reason_;
  std::uint64_t kept_bytes_ = 0;
  std::uint32_t attempts_ = 0;     // connections it was begun on
  bool listed_ = false;            // in the session's kept list
  bool delivered_ = false;
  bool sending_ = false;           // the caller is framing from kept_ (begin_sync)
};

/// What a resend session frames next for a kept blob (next_step).
enum class sync_step {
  none,   ///< nothing: synced, or delivered before it was begun here
  entry,  ///< kept entry blob.entries(): take kept_credit(), then send_kept_entry
  tail,   ///< the tail: take tail_bytes() of credit, then send_kept_end
  abort,  ///< blob_abort (aborted, or delivered meanwhile): send_kept_end, no credit
};

/// Session options.
struct sender_session_options {
  /// A resend session: keeps every blob until acknowledged and sends the
  /// unacknowledged ones again on each new connection.
  bool resend = false;
  /// Resend sessions: most kept bytes (entries, tails, their keys and
  /// meta); admit() refuses beyond it except for the oldest kept blob.
  std::uint64_t unacked_bytes = 256ull << 20;
};

/// What the consumer's bytes brought (sender_session::consume).
struct sender_input {
  /// Its hello arrived and passed the sender's checks: answer() holds it,
  /// and connect() with its limits makes the attempt the connection.
  bool hello = false;
  /// Acks taken: credit returned or granted (deliveries below).
  std::uint64_t acks = 0;
  /// Blobs that delivery acks let go (resend sessions), in ack order.
  std::vector<std::shared_ptr<sender_blob>> delivered;
  /// Its close frame arrived: close_reason() holds the reason.
  bool closed = false;
};

/// The sans-IO sender (see the file comment).
class sender_session {
 public:
  explicit sender_session(sender_session_options opt = {}) : opt_(opt) {}
  sender_session(const sender_session&) = delete;
  sender_session& operator=(const sender_session&) = delete;

  /// A new connection with `limits` (after its handshake): blob ids count
  /// from 1 again, no credit is held or asked for, and blobs begun on the
  /// previous connection count as not begun. `out`: where frames go from
  /// now on (default: the session's own outbox); it must outlive its use.
  void connect(const sender_limits& limits, outbox* out = nullptr);
  /// Begins a handshake on a new link: frames our hello `mine` into `out`
  /// and readies consume() for that link's bytes (a fresh decoder; what
  /// was read on an earlier link is forgotten, its close reason included).
  /// Returns the attempt's number (attempt()).
  std::uint64_t offer(const hello& mine, outbox& out);
  /// The handshake attempt whose bytes consume() takes (0: none). A reader
  /// of an earlier link compares it with its own and stops feeding.
  std::uint64_t attempt() const noexcept { return attempt_; }
  /// Takes bytes the consumer sent on the current attempt, in any
  /// chunking: its hello, checked against the offer (docs/wire.md
  /// "Handshake": at the sender, a chunk or inline threshold above the
  /// proposal, a zero window without credit grants, a feature not offered,
  /// a session not echoed or no delivery log for it, a malformed
  /// max_entry_bytes extension; a resend session's kept entry it would
  /// refuse, check_kept); then, once connect() made the attempt
  /// the connection, its acks (on_ack); and its close frame (the reason
  /// kept). Errors: protocol_violation (the message names the check or the
  /// frame: "hello: chunk N above the proposal", "ack before the
  /// handshake ended", the decoder's, check_kept's), or on_ack's; after one, every
  /// call returns it (the caller ends the connection).
  result<sender_input> consume(std::span<const std::byte> in);
  /// The consumer's hello on the current attempt, once checked.
  const std::optional<hello>& answer() const noexcept { return answer_; }
  /// Its close frame arrived on the current attempt.
  bool peer_closed() const noexcept { return peer_closed_; }
  /// That frame's reason: the consumer's words, raw (escape before
  /// printing); empty when it gave none or before it came.
  const std::string& close_reason() const noexcept { return close_reason_; }
  /// The sender's checks of a consumer's hello `answer` to `offer` (see
  /// consume()). Errors: protocol_violation.
  static result<void> check_answer(const hello& offer, const hello& answer);
  /// A resend session: whether every entry it keeps to send again fits a
  /// consumer with `limits` (its key within max_key_bytes, the meta of
  /// the form that consumer takes within max_meta_bytes, its bytes within
  /// max_entry_bytes; docs/wire.md "Compact entries", "Resend"). consume()
  /// runs it on a resend session's answer, before the attempt can become
  /// the connection: a consumer that would refuse a kept entry mid-stream
  /// is refused at the handshake instead, and the attempt fails (counted
  /// towards max_attempts). Errors: protocol_violation (a hello this
  /// session cannot go on with, as check_answer's), naming the blob's tag,
  /// the entry and the limit.
  result<void> check_kept(const sender_limits& limits) const;

  /// Connections made so far (the current one's number; 0: none).
  std::uint64_t connection() const noexcept { return connection_; }
  const sender_limits& limits() const noexcept { return limits_; }
  outbox& out() noexcept { return *out_; }

  /// Ends the session with `ec` (the first error wins).
  void fail(std::error_code ec) noexcept {
    if (!error_) error_ = ec;
  }
  std::error_code error() const noexcept { return error_; }

  // ---- blobs ----------------------------------------------------------

  /// Whether `b` may be finished (before its tail is planned).
  /// Errors: invalid_argument (a group on a connection without
  /// feature_blob_groups; resend sessions: NO_TAG), closed (ended or
  /// broken), the session's error.
  result<void> check_finish(const sender_blob& b) const;
  /// Whether `b` may take an entry with a key of `key_bytes` and
  /// `entry_bytes` bytes (its len; before it is planned: a refusal leaves
  /// the blob usable and frames nothing).
  /// Errors: the session's error; closed (ended or broken);
  /// invalid_argument ("key ... max_key_bytes"; "... over the consumer's
  /// max_entry_bytes N": the consumer would refuse the entry mid-stream
  /// and close; "group ... blob groups":
  /// a group on a connection without feature_blob_groups, plain sessions;
  /// "NO_TAG": resend sessions identify blobs by tag).
  result<void> check_emit(const sender_blob& b, std::size_t key_bytes,
                          std::uint64_t entry_bytes = 0) const;
  /// The dtype code with which `e` goes in the compact form on this
  /// connection (feature_compact_entries accepted, and compact_code()
  /// gives one); empty: the msgpack form, with its Entry::meta().
  std::optional<std::uint8_t> compact_code_for(const Entry& e) const noexcept;
  /// Whether plan_entry() and add_entry() need e's Entry::meta(): not for
  /// an entry going in the compact form, unless this is a resend session
  /// (a kept entry may go again on a connection without the feature).
  /// Where it is not needed, `meta` may be empty. The form chosen for `e`
  /// is kept with `b` for plan_entry() and add_entry() of the same `e`
  /// on this connection (its dtype is looked up once per entry).
  bool needs_meta(sender_blob& b, const Entry& e) noexcept;
  /// The entry `e` (with its Entry::meta() `meta`, where needs_meta) was
  /// planned: `b` is broken until entry_sent(). Returns its credit:
  /// compact_entry_credit in the compact form, else entry_credit.
  /// Errors: invalid_argument ("meta ... max_meta_bytes"), too_large (the
  /// credit overflows 64 bits).
  result<std::uint64_t> plan_entry(sender_blob& b, const Entry& e,
                                   std::span<const std::byte> meta);
  /// Frames blob_begin (once per connection) and entry_begin for `e` as
  /// entry b.entries(), in the compact form where compact_code_for(e)
  /// gives a code (else with `meta`), stamped with `emitted_ns` when the
  /// consumer accepted feature_entry_timestamps. Returns the e.len bytes to fill inside the
  /// frame when it goes inline (route automatic, 1 <= len <= inline_bytes);
  /// else empty, and the bytes follow through add_chunk().
  /// REQUIRES: its credit taken; no entry of `b` being framed.
  std::span<std::byte> add_entry(sender_blob& b, const Entry& e, std::span<const std::byte> meta,
                                 std::uint64_t emitted_ns, entry_route route);
  /// Frames the next data frame of b's current entry from the front of
  /// `bytes` (at most chunk_bytes, at most what the entry still needs),
  /// pointing at them (zero copy; `bulk`, `device`: outbox::piece).
  /// Returns the bytes framed: 0 when no entry of `b` needs any.
  std::size_t add_chunk(sender_blob& b, std::span<const std::byte> bytes, bool bulk = false,
                        int device = -1);
  /// Every byte of b's current entry has been framed and handed over:
  /// the blob takes its next entry. Returns false (and changes nothing)
  /// when bytes are still to be framed.
  bool entry_sent(sender_blob& b) noexcept;
  /// Ends `b` with its tail (write_tail's bytes, copied), counted as sent
  /// now. A plain session frames it (REQUIRES: tail.size() credit
  /// taken); a resend session keeps it until the blob is delivered
  /// (REQUIRES: the bytes admitted), and next_step() says when to frame it.
  /// Errors: the session's error; closed (ended, broken, or an entry still
  /// open).
  result<void> finish(sender_blob& b, std::span<const std::byte> tail);
  /// Ends `b` with an abort and `reason` (cut to max_reason_bytes). A
  /// plain session frames blob_abort when `b` was begun on this connection
  /// and not ended there; a resend session keeps the abort when some
  /// consumer may have heard of `b` (it was begun on some connection: it
  /// must then be synced, send_kept_end), else forgets `b` now. Returns
  /// whether the caller has something to write (framed, or to sync).
  /// No-op (false) once ended.
  bool abort(sender_blob& b, std::string_view reason);

  // ---- credit ---------------------------------------------------------

  /// Takes `n` bytes of window credit if they fit now. Without credit
  /// grants one entry larger than the whole window goes alone, once
  /// nothing is outstanding (so a small window never deadlocks); with
  /// grants nothing goes beyond the credit granted.
  bool take_credit(std::uint64_t n) noexcept;
  /// A producer waits for `n` bytes: counted once per wait; with credit
  /// grants added to what the others wait for and asked of the consumer
  /// (a credit request frame). Pair with withdraw_credit() when it ends.
  void ask_credit(std::uint64_t n);
  /// The wait for `n` asked on connection `connection` ended.
  void withdraw_credit(std::uint64_t n, std::uint64_t connection) noexcept;
  /// Takes the consumer's ack: `credit` returned (with grants: granted;
  /// what is held comes back first, the rest widens the window, saturating
  /// at 2^64 - 1), `blob_id` delivered (0: none). Returns the blob
  /// delivered (resend sessions), else null.
  /// Errors: protocol_violation ("ack returns N credit bytes, M in
  /// flight"; "ack delivers blob N to a sender without a resend session";
  /// "ack for blob N, not awaiting delivery").
  result<std::shared_ptr<sender_blob>> on_ack(std::uint64_t credit, std::uint64_t blob_id);
  /// Credit taken and not yet returned, bytes.
  std::uint64_t in_flight() const noexcept { return in_flight_; }
  /// The window (with grants: granted so far), bytes.
  std::uint64_t window_bytes() const noexcept { return limits_.window_bytes; }
  /// What waiting producers asked for (credit grants), bytes.
  std::uint64_t credit_wanted() const noexcept { return credit_wanted_; }

  // ---- resend sessions ------------------------------------------------

  /// Lists `b` among the kept blobs when the consumer's dedup_window has
  /// room (none listed, or fewer than the window). Returns false when the
  /// caller must wait for a delivery. True at once when listed already.
  bool list(const std::shared_ptr<sender_blob>& b);
  /// Admits `n` more kept bytes for listed `b` if they fit unacked_bytes
  /// (the oldest listed blob always fits: its delivery frees the rest).
  /// Returns false when the caller must wait for a delivery.
  bool admit(sender_blob& b, std::uint64_t n) noexcept;
  /// Gives back `n` admitted bytes that were not kept after all.
  void refund(sender_blob& b, std::uint64_t n) noexcept;
  /// A producer waited for the budget (counted).
  void note_budget_wait() noexcept { ++counts_.budget_waits; }
  /// A producer waited for credit without asking (its connection was
  /// failing): counted as ask_credit() counts.
  void note_credit_wait() noexcept { ++counts_.credit_waits; }
  /// What a resend session keeps where a plain one frames (add_entry):
  /// an entry, its bytes admitted and copied, counted as sent now. Its
  /// tail and abort go through finish() and abort(), as a plain
  /// session's do.
  void keep_entry(sender_blob& b, kept_entry e);
  /// What to frame next for kept blob `b` on this connection, beginning it
  /// there first when it has not been (blob_begin under a fresh id; counted
  /// as resent from its second connection on).
  sync_step next_step(sender_blob& b);
  /// The credit of kept entry b.entries() in the form this connection
  /// sends it in (compact_entry_credit or entry_credit).
  std::uint64_t kept_credit(const sender_blob& b) const noexcept;
  /// Frames kept entry b.entries() (blob_begin first when needed): returns
  /// its inline room, empty when it goes in data frames from
  /// b.kept()[i].bytes (add_chunk). REQUIRES: next_step() said entry, its
  /// credit taken.
  std::span<std::byte> send_kept_entry(sender_blob& b);
  /// Frames the tail or the abort (`step`, as next_step() named it; the
  /// abort says "delivered already" when the consumer had the blob
  /// meanwhile). REQUIRES: tail_bytes() of credit taken for a tail.
  void send_kept_end(sender_blob& b, sync_step step);
  /// Bytes of b's kept tail.
  std::size_t tail_bytes(const sender_blob& b) const noexcept { return b.tail_.size(); }
  /// Whether everything kept of `b` went out on this connection.
  bool synced(const sender_blob& b) const noexcept;
  /// The kept blobs this connection has not seen all of, oldest first.
  std::vector<std::shared_ptr<sender_blob>> to_resync() const;
  /// The caller frames from b's kept bytes (they stay until end_sync).
  void begin_sync(sender_blob& b) noexcept { b.sending_ = true; }
  /// Frees b's bytes if it was delivered meanwhile.
  void end_sync(sender_blob& b) noexcept;
  /// Lets `b` go (its bytes freed unless being framed).
  void forget(const std::shared_ptr<sender_blob>& b);
  /// Whether any kept blob has ended (finish or abort) and awaits delivery.
  bool ended_pending() const noexcept;
  std::uint64_t kept_bytes() const noexcept { return kept_bytes_; }
  std::size_t kept_blobs() const noexcept { return kept_.size(); }

  const sender_counts& counts() const noexcept { return counts_; }

 private:
  void begin(sender_blob& b);
  void release(sender_blob& b) noexcept;
  /// compact_code_for(e), kept with `b` for the same `e` on this
  /// connection until add_entry() or keep_entry() takes it.
  std::optional<std::uint8_t> form_of(sender_blob& b, const Entry& e) noexcept;
  // abort() of a resend session: keeps the abort, or forgets a blob no
  // consumer heard of. REQUIRES: b ended by the caller just now.
  bool keep_abort(sender_blob& b, std::string_view reason);

  /// Routes the decoder's events of the consumer's frames to the session.
  class consumer_frames final : public decoder_listener {
   public:
    explicit consumer_frames(sender_session& s) : s_(s) {}
    result<void> on_hello(const hello& h) override;
    result<void> on_ack(std::uint64_t credit, std::uint64_t blob_id) override;
    result<void> on_close(std::string_view reason) override;

   private:
    sender_session& s_;
  };

  sender_session_options opt_;
  sender_limits limits_;
  outbox own_;
  outbox* out_ = &own_;
  std::uint64_t connection_ = 0;
  std::uint64_t next_blob_id_ = 1;
  std::uint64_t in_flight_ = 0;
  std::uint64_t credit_wanted_ = 0;
  std::error_code error_;
  sender_counts counts_;
  // The consumer's frames on the current attempt (offer()).
  consumer_frames frames_listener_{*this};
  std::unique_ptr<decoder> frames_;
  hello offer_;
  std::uint64_t attempt_ = 0;
  std::uint64_t connected_attempt_ = 0;  // the attempt connect() made the connection
  std::optional<hello> answer_;
  bool peer_closed_ = false;
  std::string close_reason_;
  sender_input input_;  // what the consume() in progress gathers
  // Resend sessions.
  std::deque<std::shared_ptr<sender_blob>> kept_;  // oldest first
  std::map<std::uint64_t, sender_blob*> on_wire_;  // this connection's ids (blobs in kept_)
  std::uint64_t kept_bytes_ = 0;
};

}  // namespace blobpipe
