// blobpipe/protocol/consumer_session.hpp — the receiving half of the wire
// protocol as a session without I/O, the twin of sender_session.
//
// One consumer_session holds everything a consumer decides about a
// connection: the push decoder and its limits, the hello exchange and the
// features it accepts, the window and credit grants, the credit the sender
// asked for, the held allowance's figures, the acks owed (credit returned
// and blobs delivered), the resend session's duplicate decision, and the
// close frame with the consumer's reason, and the clocks that end a
// connection whose sender makes no progress (stall_timeout, idle_timeout,
// held_timeout, credit pressure). Bytes go in through consume(); what
// happened comes out through a consumer_session_listener; frames to send
// (our hello, acks, close) collect in an outbox. It never reads a clock, a
// socket or a thread (nghttp2's session_mem_recv / mem_send): the time is
// passed in, and the caller's timer calls on_time() when next_deadline()
// says.
// Where an entry's bytes land (memory, a file, device memory) is the
// listener's business: the session asks it, as the decoder asks the
// session.
//
//   struct sinks : blobpipe::consumer_session_listener { ... };
//   sinks l;
//   blobpipe::consumer_session s({.limits = {...}}, l);
//   s.wait_begins(now, fetches);                     // about to read
//   auto took = s.consume_some(bytes, budget, now);   // events reach `l`
//   s.wait_ends(now);                                 // progress counted
//   if (s.acks_due()) s.frame_acks();                 // when the writer is free
//   write s.out().pieces(), then s.out().clear();
//   ... an entry the application dropped: s.release(credit);
//   ... the caller's timer, at s.next_deadline(now): s.on_time(now)
//
// Credit: without credit grants the window is the consumer's own
// (consumer_session_options::limits.window_bytes); released credit goes
// back to the sender in acks. With feature_credit_grants (a session that is
// `pooled`), the window is what a shared pool granted: the session asks the
// listener to join the pool, tells it of every request and release, and
// the pool's grants come back through grant(). A pool on other threads
// reads buffered_published() only.
//
// Threading: none; one session per connection, used by one thread at a
// time (buffered_published() may be read from any).
// Source: docs/wire.md "Consumer", "Flow control", "Delivery", "Closing";
// docs/wire_features.md "Credit grants"; docs/reliability.md "Held entries",
// "Timeouts".
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "blobpipe/errors.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/index.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/delivered_tags.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

namespace detail {
class progress_clocks;
}  // namespace detail

/// A blob between blob_begin and its end as the session sees it. The
/// listener makes it (consumer_session_listener::blob_begin), usually as
/// the base of its own blob state, and keeps it until blob_end().
struct session_blob {
  std::uint64_t id = 0;
  tag_t tag = NO_TAG;
  /// Resend sessions: delivered on an earlier connection; its frames are
  /// checked and dropped, and it is acknowledged at once.
  bool duplicate = false;
  /// The application was told it aborted (the listener's sink failed, or
  /// a duplicate): nothing more of it is reported.
  bool discard = false;
};

/// Receives a consumer_session's events, in frame order. Callbacks that
/// return a result may refuse with an error, which ends decoding.
class consumer_session_listener {
 public:
  virtual ~consumer_session_listener() = default;

  // ---- sinks ----------------------------------------------------------
  /// Blob `blob_id` begins (`duplicate`: the session decided it was
  /// delivered before, so its bytes are to be dropped). Returns the blob's
  /// state, which must stay valid until blob_end().
  virtual result<session_blob*> blob_begin(std::uint64_t blob_id, const tag_t& tag,
                                           bool duplicate) = 0;
  /// Where entry `a`'s entry->len bytes go: exactly that many, or empty to
  /// drop them. The entry holds `a.credit` until the caller release()s it.
  virtual result<std::span<std::byte>> entry_begin(session_blob& b,
                                                   const entry_announcement& a) = 0;
  /// Every byte of b's current entry is in its destination.
  virtual result<void> entry_complete(session_blob& b) = 0;
  /// The tail of `b` (not discarded) arrived and agrees with its entries.
  /// Returns true when the blob was delivered to the application, false
  /// when the sink failed and reported it aborted instead.
  virtual result<bool> blob_complete(session_blob& b, blob_index index,
                                     std::span<const std::byte> tail) = 0;
  /// `b` ends without its tail: report it aborted with `ec` and `reason`
  /// unless b.discard, then set b.discard. `resend`: the sender will send
  /// it again (docs/wire.md "Delivery").
  virtual void blob_abort(session_blob& b, std::error_code ec, std::string reason,
                          bool resend) = 0;
  /// The session is done with `b`: the listener may free it.
  virtual void blob_end(session_blob& b) = 0;
  /// `b` (just begun) belongs to group `g` (feature_blob_groups).
  virtual void blob_in_group(session_blob& b, const blob_group& g) = 0;
  /// The sender closed the stream in order, with `reason`.
  virtual void closed(std::string_view reason) = 0;

  // ---- credit and output ----------------------------------------------
  /// A pooled session negotiated credit grants: join the pool. Returns
  /// the initial grant, bytes.
  virtual std::uint64_t pool_join() = 0;
  /// A pooled session's sender waits for `credit` bytes in all.
  virtual void pool_request(std::uint64_t credit) = 0;
  /// A pooled session released `credit` bytes (0: only its buffered
  /// figure changed).
  virtual void pool_released(std::uint64_t credit) = 0;
  /// Acks (or the close frame) became due: frame_acks() when the writer
  /// is free. Called once until frame_acks() or frame_close() takes them.
  virtual void acks_due() = 0;
  /// A pooled session's sender holds credit other connections wait for
  /// and does not use (credit_pool::pressed). Asked by on_time().
  virtual bool pool_pressed() = 0;
};

/// Session options; sizes in bytes.
struct consumer_session_options {
  /// What the decoder admits; window_bytes is the window offered (ignored
  /// by a pooled session, whose window is the pool's grant).
  decoder_limits limits;
  /// Optional features accepted when offered (feature_entry_timestamps,
  /// feature_blob_groups, feature_compact_entries; feature_credit_grants
  /// is accepted only pooled).
  std::uint64_t accept_features = feature_blob_groups | feature_compact_entries;
  /// Credit comes from a shared pool (feature_credit_grants required of
  /// the sender: its own window would be outside the pool's budget).
  bool pooled = false;
  /// The held allowance (consumer_options::held_bytes): yielded entries'
  /// credit that may move out of the window. 0: none.
  std::uint64_t held_bytes = 0;
  /// One entry larger than held_bytes may move alone into an empty
  /// allowance (the default allowance, unpooled); else held_bytes caps.
  bool one_larger_alone = false;
  /// Resend sessions: the log of delivered tags (null: none kept, no
  /// duplicate is dropped) and how many it remembers per session (our
  /// hello's dedup_window).
  std::shared_ptr<delivered_tags> delivered;
  std::uint32_t dedup_window = 0;
  /// The clocks (docs/reliability.md "Timeouts"), 0 disabling each:
  /// longest wait without progress while the sender owes bytes or holds
  /// credit others need; longest wait with nothing arriving; longest wait
  /// with nothing arriving while the application holds what the sender
  /// may wait for.
  std::chrono::milliseconds stall_timeout{0};
  std::chrono::milliseconds idle_timeout{0};
  std::chrono::milliseconds held_timeout{0};
  /// The application says when it waits (application_waits()): only then
  /// does holding count against held_timeout, and a yielded entry moves
  /// into the held allowance only once delivered.
  bool waits_reported = false;
};

/// What the session counted.
struct consumer_session_counts {
  std::uint64_t credit_requests = 0;     ///< credit request frames
  std::uint64_t duplicates_dropped = 0;  ///< resent blobs delivered before
  std::uint64_t acks_sent = 0;           ///< ack frames framed
  std::uint64_t buffered_high_water = 0; ///< most credit buffered at once, bytes
  std::uint64_t held_high_water = 0;     ///< most held allowance in use, bytes
  std::uint64_t items_completed = 0;     ///< entries and blobs completed (progress)
};

/// A clock of the session's that expired (on_time).
struct clock_expiry {
  enum class limit { stall, idle, held, pressed };
  limit which = limit::stall;
  /// The reason to end the stream with, naming the option
  /// ("... (stall_timeout)").
  std::string reason;
};

/// The sans-IO receiving half (see the file comment).
class consumer_session final : private decoder_listener {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  /// `listener` must outlive the session.
  consumer_session(consumer_session_options opt, consumer_session_listener& listener);
  ~consumer_session() override;
  consumer_session(const consumer_session&) = delete;
  consumer_session& operator=(const consumer_session&) = delete;

  // ---- input ----------------------------------------------------------
  /// Decodes `in` whole at time `now`. Errors: as decoder::consume.
  result<void> consume(std::span<const std::byte> in, time_point now);
  /// Decodes `in` until the turn's `budget` of work is spent
  /// (decoder::consume_some); returns the bytes taken.
  result<std::size_t> consume_some(std::span<const std::byte> in, std::uint64_t budget,
                                   time_point now);
  /// A payload landed straight at payload_target(): `n` bytes of it.
  result<void> commit_payload(std::size_t n, time_point now);
  /// Where the rest of the current payload goes. REQUIRES: in_payload().
  std::span<std::byte> payload_target() { return frames_.payload_target(); }
  void reset_work() noexcept { frames_.reset_work(); }
  /// The decoder, for its figures (in_frame, open_blobs, limits, work...).
  const decoder& frames() const noexcept { return frames_; }

  // ---- the handshake --------------------------------------------------
  /// The sender's hello, once decoded and accepted.
  const std::optional<hello>& peer() const noexcept { return peer_; }
  /// The hello this side answered with (framed into out() when the
  /// sender's came); features and window as negotiated.
  const hello& answer() const noexcept { return answer_; }
  /// The sender's resend session (NO_SESSION: a plain sender).
  const session_id& session() const noexcept { return answer_.session; }

  // ---- credit ---------------------------------------------------------
  // Calls that take `now` may change what the clocks see: `now` must be
  // the time while clocks_running(); otherwise it is not used (what they
  // changed is seen when the next wait begins), so a caller reads its
  // clock only then.

  /// The pool granted `credit` bytes: the window grows, the sender is told
  /// in the next ack, and a request the unused credit now covers is met.
  void grant(std::uint64_t credit, time_point now) noexcept;
  /// An entry of `credit` bytes, never yielded, was dropped: the window
  /// takes it back; the sender gets it in an ack, or a pooled session
  /// hands it to the pool.
  void release(std::uint64_t credit) noexcept;
  /// As release(), for an entry that was yielded (counted by yielded()).
  void release_yielded(std::uint64_t credit, time_point now) noexcept;
  /// An event was yielded to the application: for an entry, its `credit`
  /// bytes (0 for any other event). Ends an application_waits().
  void yielded(std::uint64_t credit) noexcept {
    held_in_window_ += credit;
    app_waiting_ = false;
  }
  /// Moves a yielded entry of `credit` bytes into the held allowance if it
  /// fits (its credit goes back as release_yielded()); false if not.
  bool hold(std::uint64_t credit, time_point now) noexcept;
  /// A held entry of `credit` bytes was dropped: its allowance is free.
  void release_held(std::uint64_t credit, time_point now) noexcept;
  /// What the sender's last credit request asks and is not yet met, bytes.
  std::uint64_t credit_wanted() const noexcept { return credit_wanted_; }
  std::uint64_t buffered_bytes() const noexcept { return frames_.buffered_bytes(); }
  std::uint64_t window_bytes() const noexcept { return frames_.limits().window_bytes; }
  /// Credit of yielded entries in the held allowance / still in the window.
  std::uint64_t held_credit() const noexcept { return held_credit_; }
  std::uint64_t held_in_window() const noexcept { return held_in_window_; }
  /// Whether the sender holds unused credit now: the window is not full,
  /// no request of it waits, and the application holds nothing of it.
  bool sender_has_credit() const noexcept;
  /// buffered_bytes() as of the last call that changed it, for a pool's
  /// calls from other threads (shared: may be read after the session is gone).
  const std::shared_ptr<std::atomic<std::uint64_t>>& buffered_published() const noexcept {
    return buffered_published_;
  }

  // ---- output ---------------------------------------------------------
  outbox& out() noexcept { return out_; }
  /// Whether acks are owed and not yet framed.
  bool acks_due() const noexcept {
    return !acks_stopped_ && (ack_credit_ != 0 || !delivered_ids_.empty());
  }
  /// Frames the acks owed into out(): one ack per delivered blob (the
  /// first carrying the credit; resend sessions keep one ack per blob), or
  /// one for the credit alone.
  void frame_acks();
  /// Ends the acks: nothing more is queued or framed.
  void stop_acks() noexcept { acks_stopped_ = true; }
  bool acks_stopped() const noexcept { return acks_stopped_; }
  /// Refuses the stream: acks end and the close frame with `reason` is due
  /// (frame_close()). Returns false when already refused (the first
  /// reason stands).
  bool refuse(std::string reason);
  /// The reason refuse() gave, if any.
  const std::optional<std::string>& refusal() const noexcept { return refusal_; }
  /// Frames the close frame with refusal()'s reason into out().
  /// REQUIRES: refusal().
  void frame_close();

  // ---- clocks ---------------------------------------------------------
  /// A wait on the sender begins at `now` (the caller is about to read,
  /// or to wait for a posted read to land): the clocks run until
  /// wait_ends(). `fetches`: reads posted and not yet landed, whose bytes
  /// the sender owes.
  void wait_begins(time_point now, bool fetches) noexcept;
  /// The wait ended at `now`: what it brought counts as progress if it
  /// completed an entry or a blob, or brought progress_bytes (1 MiB) more
  /// of admitted entry and tail bytes; any bytes end a silence.
  void wait_ends(time_point now) noexcept;
  /// The application waits for the next event (waits_reported).
  void application_waits(time_point now) noexcept;
  /// Whether a clock is set and not stopped: wait_begins() and
  /// wait_ends() need the real time.
  bool clocks_set() const noexcept;
  /// Whether a wait is open and a clock is set: calls that take `now` then
  /// need the real time.
  bool clocks_running() const noexcept;
  /// When the caller's timer should next call on_time() (a quarter of the
  /// shortest limit from `now`); none when no limit is set or after
  /// stop_clocks().
  std::optional<time_point> next_deadline(time_point now) const noexcept;
  /// The caller's timer fired at `now`: the clock that expired, with the
  /// reason to end the stream with, or none. Nothing expires while no wait
  /// is open. In this order: idle, stall, pressed (asks the listener's
  /// pool_pressed()), held.
  std::optional<clock_expiry> on_time(time_point now);
  /// No clock expires from now on; idempotent.
  void stop_clocks() noexcept;

  const consumer_session_counts& counts() const noexcept { return counts_; }

 private:
  // decoder_listener
  result<void> on_hello(const hello& h) override;
  result<void*> on_blob_begin(std::uint64_t blob_id, const tag_t& tag) override;
  result<std::span<std::byte>> on_entry_begin(void* blob, const entry_announcement& a) override;
  result<void> on_entry_complete(void* blob, std::uint64_t blob_id) override;
  result<void> on_blob_complete(void* blob, std::uint64_t blob_id, blob_index index,
                                std::span<const std::byte> tail) override;
  result<void> on_blob_abort(void* blob, std::uint64_t blob_id, std::string_view reason) override;
  result<void> on_close(std::string_view reason) override;
  result<void> on_blob_group(void* blob, std::uint64_t blob_id, const blob_group& g) override;
  result<void> on_credit_request(std::uint64_t credit) override;

  /// Whether the sender's unused credit covers `wanted` bytes.
  bool unused_credit_covers(std::uint64_t wanted) const noexcept;
  /// Takes the credit the decoder released itself (checked tails).
  void collect_returned_credit() noexcept;
  void return_credit(std::uint64_t credit) noexcept;
  void acknowledge(std::uint64_t blob_id);
  /// A blob reached its end for good: recorded and acknowledged
  /// (resend sessions).
  void delivered(const session_blob& b);
  void publish() noexcept {
    buffered_published_->store(frames_.buffered_bytes(), std::memory_order_relaxed);
  }
  /// Tells the clocks whether the sender owes bytes and whether the
  /// application holds what it waits for, as of `now` (while a wait is
  /// open; else wait_begins() does).
  void watch(time_point now) noexcept;

  consumer_session_options opt_;
  consumer_session_listener& listener_;
  decoder frames_;
  std::optional<hello> peer_;
  hello answer_;
  // Credit.
  std::uint64_t credit_wanted_ = 0;
  std::uint64_t held_credit_ = 0;
  std::uint64_t held_in_window_ = 0;
  std::shared_ptr<std::atomic<std::uint64_t>> buffered_published_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  // Acks and the close frame.
  outbox out_;
  std::uint64_t ack_credit_ = 0;
  std::deque<std::uint64_t> delivered_ids_;
  bool acks_announced_ = false;  // acks_due() told since the last frame_acks()
  bool acks_stopped_ = false;
  std::optional<std::string> refusal_;
  consumer_session_counts counts_;
  // Clocks.
  std::unique_ptr<detail::progress_clocks> clocks_;
  time_point now_{};        // the time of the consume call in progress
  bool fetches_ = false;    // reads posted, not landed (wait_begins)
  bool app_waiting_ = false;  // application_waits() since the last yield
};

}  // namespace blobpipe
