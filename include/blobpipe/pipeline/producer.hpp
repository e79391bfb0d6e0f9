// blobpipe/pipeline/producer.hpp — streaming blobs out: sender and blob_writer.
//
// A `sender` owns one transport. Any number of coroutines open blobs on it
// and emit (key, value) pairs; each entry is planned incrementally
// (layout_builder: entry i's offset depends only on entries before it) and
// framed at once, before later values exist. `finish()` frames the index
// and footer (write_tail) last. One writer per connection hands everything
// queued to the transport in one gather write while producers go on (write
// combining; no timer, so a lone entry is never delayed).
//
//   auto [ec, s] = co_await blobpipe::sender::start(std::move(t));
//   auto blob = s.open_blob();                          // random uuid4 tag
//   co_await blob.emit("0@input_ids", blobpipe::value::tensor(ids));
//   co_await blob.emit("reward", blobpipe::value::tensor(reward, {}));
//   co_await blob.finish();
//   co_await s.shutdown();                              // orderly close
//
// Copies (docs/wire.md "Sender"): an entry of 1 to inline_bytes() bytes
// (the negotiated copy threshold; sender_options::inline_bytes, 64 KiB by
// default) is copied once, into its own entry_begin frame, and emit()
// completes at once: the value's memory may be reused right away, and one
// producer can have many small entries in flight. A larger entry goes out
// in data frames of at most chunk_bytes() that point at the value's own
// memory (zero copy), and emit() completes when every byte has been
// handed to the transport. A strided value above the threshold is the one
// exception: write_entry gathers it into a temporary of entry.len bytes,
// which is then sent the same way.
//
// Backpressure: the consumer grants a window (bytes of credit). An entry
// costs len + 2 * (key + meta) + entry_overhead_bytes of credit, a tail its
// length (docs/wire.md "Flow control"); before framing either, the sender
// waits until the credit it holds plus the new fits the window. An entry
// larger than the whole window is admitted alone, once nothing else is
// outstanding, so a small window never deadlocks. The window is no bound on
// the sender's memory (a consumer may grant 2^64 - 1 and read nothing):
// copied bytes queued for the writer beyond sender_options::max_queued_bytes
// make emit(), finish() and abort() wait too, under stall_timeout.
// Waiting suspends the producer (no busy loop, nothing dropped).
//
// Resend sessions (at-least-once on the wire, exactly once to the
// application): started with a connect function instead of a transport,
// the sender copies each entry and tail into a kept blob, holds it until
// the consumer acknowledges its delivery, and when the connection fails it
// connects again and sends every kept blob from its start. The consumer
// drops the ones it delivered already, by tag (blobpipe/pipeline/delivery.hpp).
// Kept bytes are bounded by resend_options::unacked_bytes; producers wait
// when it is full. This costs one copy of every byte sent. Device values
// are copied to the host into the kept blob.
//
//   auto connect = [ex]() { return blobpipe::tcp::connect(ex, host, port); };
//   auto [ec, s] = co_await blobpipe::sender::start(connect, {.resend = {.unacked_bytes = 64 << 20}});
//
// Threading: a sender and its blobs live on the transport's executor; call
// them from coroutines on that executor only.
// Source: docs/wire.md "Sender", "Flow control", "Delivery"; docs/reliability.md.
#pragma once

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>

#include <asio/awaitable.hpp>

#include "blobpipe/cuda.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/sender_session.hpp"
#include "blobpipe/protocol/wire.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe {

namespace detail {
struct sender_state;
struct blob_state;
}  // namespace detail

/// Makes one connection for a resend session; called again after each
/// failure. It must complete when cancelled (its coroutine's cancellation
/// slot is emitted when a stall_timeout passes first, when the caller of
/// sender::start is cancelled, and when the sender ends: close(),
/// shutdown()); docs/reliability.md "Timeouts". One that ignores it holds
/// sender::start for as long as it runs, and shutdown() for at most
/// handshake_timeout (then timed_out).
using connect_fn =
    std::function<asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>>()>;

/// Resend sessions only (sender::start with a connect_fn).
struct resend_options {
  /// Most bytes kept for resending (entries, tails, and their entry_begin
  /// payloads), bytes. A producer whose entry does not fit waits for
  /// deliveries, except for the oldest kept blob, which always proceeds
  /// (so blobs larger than the budget, or many open blobs, cannot deadlock).
  std::uint64_t unacked_bytes = 256ull << 20;
  /// Connection attempts in a row that deliver nothing before the sender
  /// gives up: failed connects and handshakes, and connections that end
  /// with no delivery acknowledgement on them while a blob is kept (a
  /// consumer that completes the handshake and then closes, goes silent
  /// past stall_timeout, or refuses the same blob each time). A delivery
  /// resets the count; a connection dropped while nothing is kept (an idle
  /// worker whose consumer closes idle connections) does not count. Past
  /// it the sender fails with the last attempt's error (peer_closed,
  /// peer_failed, timed_out, ...), and failure_reason() says "no blob
  /// delivered on N connection attempts in a row (max_attempts N); the
  /// last: ..." with the cause (the consumer's close reason, the limit
  /// that passed); before any handshake succeeded (sender::start), "no
  /// handshake with the consumer on N connection attempts in a row
  /// (max_attempts N); the last: ...", with the hint "is the consumer
  /// listening and accepting?" unless one answered and refused the hello.
  /// Each such attempt makes the next one wait (below).
  std::uint32_t max_attempts = 8;
  /// Wait before a retry: `retry_delay`, doubling up to `max_retry_delay`;
  /// no wait is longer than `max_retry_delay`, so a `retry_delay` above it
  /// waits `max_retry_delay`. The first reconnect after a connection that
  /// delivered broke is immediate.
  std::chrono::milliseconds retry_delay{10};
  std::chrono::milliseconds max_retry_delay{1000};
};

struct sender_options {
  /// Largest data frame payload proposed in the handshake, bytes; the
  /// consumer may lower it. Entries longer than this go out in chunks.
  std::uint32_t chunk_bytes = default_chunk_bytes;
  /// The copy threshold proposed in the handshake, bytes (<=
  /// max_inline_bytes); the consumer may lower it. Entries of 1 to this
  /// many bytes are copied into their entry_begin and emit() returns at
  /// once; longer ones are sent from the value's memory (zero copy).
  std::uint32_t inline_bytes = default_inline_bytes;
  /// The sender's own bound on copied bytes (headers, inline entries,
  /// tails, aborts) framed and not yet written, bytes, whatever window the
  /// consumer grants: emit(), finish() and abort() wait before framing
  /// while more than this waits for the writer. Producers frame the next
  /// batch while one is written, so at most twice this plus one item each
  /// is held (sender_stats::queued_high_water). The wait is on the
  /// consumer, under stall_timeout: a consumer that grants any window and
  /// reads nothing ends in timed_out (a resend session reconnects), never
  /// in growth. A resend session's kept bytes have their own bound
  /// (resend_options::unacked_bytes).
  std::size_t max_queued_bytes = std::size_t{4} << 20;
  /// Offer feature_entry_timestamps (docs/wire_features.md): when the
  /// consumer accepts it, each entry_begin carries the steady clock at
  /// emit() (8 bytes; one clock read per entry), for its emit ->
  /// entry_ready latency. Device values are stamped alike.
  bool entry_timestamps = true;
  /// Longest the sender waits on the consumer with nothing arriving from it
  /// and no send completing (0: no limit): a send the consumer does not
  /// read, a producer waiting for window credit or for a delivery, the
  /// handshake, shutdown. Exceeded: a plain sender fails with timed_out; a
  /// resend session drops the connection and reconnects. Covers waits for
  /// the application on the far side too (credit comes back only when it
  /// releases entries), so set it above the longest it may hold entries.
  /// 0 by default because a trainer may rightly hold its workers for a
  /// whole training step; with 0, a consumer that reads and never
  /// acknowledges or returns credit holds a producer for as long as it
  /// stays connected (a resend session included: max_attempts counts only
  /// connections that end). Set it whenever the far side is not trusted.
  std::chrono::milliseconds stall_timeout{0};
  /// The longest a handshake may take: writing this side's hello and
  /// waiting for the consumer's (0: no limit). Past it the connection is
  /// closed: start() fails with timed_out; a resend session counts a
  /// failed attempt and connects again (the connect itself is the connect
  /// function's to bound). On by default, so a peer that accepts the
  /// connection and never answers does not hold the sender.
  std::chrono::milliseconds handshake_timeout{10'000};
  // `{}` below changes nothing at run time; it lets callers name only the
  // fields they set (`{.chunk_bytes = 256}`) without GCC's
  // -Wmissing-field-initializers, which skips members that have one.
  resend_options resend{};
  /// Device values (value::memory, docs/cuda.md): the pinned ring each
  /// staged entry borrows. emit of a device value fails with
  /// invalid_argument when pinned_chunk_bytes < 64 or pool_depth is 0.
  cuda::staging_options staging{};
};

/// The longest a resend session's connection attempts take before it
/// gives up (sender::start fails, or a reconnect does), in milliseconds,
/// when every connect returns at once and every handshake hangs (a
/// listener that accepts and never answers): max_attempts times the
/// handshake's bound (handshake_timeout, or stall_timeout when that is set
/// and shorter), plus the waits between attempts (retry_delay doubling up
/// to max_retry_delay; max_attempts - 1 of them). 0 when neither timeout
/// is set: then a hanging handshake has no bound. The connect function's
/// own time (say, a TCP connect to an address that drops packets) is its
/// to bound and is not counted. Use it to say how long a sender will try.
[[nodiscard]] std::chrono::milliseconds resend_give_up_bound(const sender_options& o);

/// What a sender's I/O side counts, beside its session's decisions
/// (sender_counts): where entries' bytes came from, and its queue.
struct sender_io_counts {
  std::uint64_t gathered_entries = 0; ///< strided values copied via write_entry
  // Device values (docs/cuda.md).
  std::uint64_t device_entries = 0;   ///< entries read from CUDA device memory
  std::uint64_t device_chunks = 0;    ///< device-to-host copies into pinned buffers
  std::uint64_t device_direct_entries = 0;  ///< given to a transport as device memory
  /// Most device-to-host copies in flight (issued, not yet reported done)
  /// as a staged chunk was handed to the transport: the overlap of copy
  /// and network. At most pool_depth - 1; how many are still running then
  /// depends on the copy engine's speed against the network's.
  std::uint64_t device_prefetch_high_water = 0;
  /// Most copied bytes framed and not yet written at once (see
  /// sender_options::max_queued_bytes), bytes, over every connection.
  std::uint64_t queued_high_water = 0;
};

/// Counters for tests and benchmarks: what the sender's session decided
/// (sender_counts: entries, bytes, credit waits and requests, blobs,
/// first_entry_ns, and for resend sessions reconnects, blobs_resent,
/// blobs_delivered, budget_waits), what its I/O side saw
/// (sender_io_counts), and its tasks.
struct sender_stats : sender_counts, sender_io_counts {
  /// The sender's own coroutines still running (its writer, ack reader,
  /// stall watchdog, a resend session's reconnect and re-sync): 0 once
  /// shutdown() has returned, which waits for them.
  std::uint64_t tasks_running = 0;
};

/// What sender::open_blob takes.
struct blob_options {
  tag_t tag = random_tag();  ///< unique per sender in a resend session
  /// The blob's group (feature_blob_groups): the consumer reports the
  /// group complete once `size` blobs naming it have completed (a fan-in
  /// server gathers them across its connections). REQUIRES: size >= 1.
  /// On a connection whose consumer does not accept groups, the blob's
  /// emit/finish fail with invalid_argument.
  std::optional<blob_group> group;
};

/// One blob being streamed. A cheap handle (copies refer to the same blob).
/// Calls on one blob are serialised in call order: emit from several
/// coroutines is allowed, each entry goes out whole.
/// If the last handle goes away before finish() or abort(), the blob is
/// aborted ("blob_writer dropped").
class blob_writer {
 public:
  blob_writer() = default;

  /// Plans `v` as the next entry and frames it: entry_begin carrying the
  /// bytes when 0 < len <= inline_bytes() (completes at once: `v` was
  /// copied), else entry_begin and data frames of at most chunk_bytes()
  /// pointing at `v`'s memory (completes when every byte was handed to the
  /// transport; `v`'s memory must stay valid and unchanged until then).
  /// Device memory (v.memory cuda_device, or automatic finding device
  /// memory): the bytes are copied to pinned host buffers chunk by chunk,
  /// each copy overlapping the send of the chunk before (docs/cuda.md).
  /// REQUIRES: the device bytes are written (the kernels that produce them
  /// have finished, or ran on the legacy default stream, which the staging
  /// stream waits for).
  /// Errors: those of layout_builder::add (invalid_argument, unknown_kind,
  /// unknown_dtype, too_large; the blob stays usable), closed (blob finished
  /// or aborted, or the sender closed), peer_closed (last_error() gives the
  /// consumer's close reason when it sent one), peer_failed, timed_out
  /// (stall_timeout passed while it waited for credit or for room in the
  /// sender's own queue, sender_options::max_queued_bytes),
  /// protocol_violation (the consumer broke the protocol), invalid_argument
  /// (key longer than the consumer's max_key_bytes; an entry longer than
  /// its max_entry_bytes, refused before any byte is framed, the blob
  /// stays usable: "... over the consumer's max_entry_bytes N"), cuda_failure (device
  /// memory: before anything is sent, e.g. "no CUDA device" — the blob stays
  /// usable; or once the entry was announced, e.g. a failed copy — the blob
  /// is aborted with the CUDA message, the sender stays usable).
  /// last_error() has the message.
  /// Resend session: completes once the entry is copied into the kept blob
  /// (after waiting for resend_options::unacked_bytes if it is full; device
  /// values are copied to the host) and, while connected, framed; a broken
  /// connection is not an error here (the copy goes out again) until the
  /// session gives up (resend_options::max_attempts).
  asio::awaitable<std::error_code> emit(std::string key, value v);

  /// Ends the blob: index + v3 footer from write_tail, as one tail frame
  /// (copied; completes once queued: sender::flush() or shutdown() wait
  /// for the writer). Errors: too_large (the footer cannot address the
  /// blob; the blob is aborted), closed, peer_closed, peer_failed,
  /// protocol_violation.
  /// Resend session: as emit; the blob's delivery is confirmed by
  /// sender::shutdown() (or sender_stats::blobs_delivered), not here.
  asio::awaitable<std::error_code> finish();

  /// Abandons the blob; the consumer reports it aborted with `reason`
  /// (truncated to max_reason_bytes). No-op after finish() or abort().
  /// Errors: closed, peer_closed, peer_failed.
  asio::awaitable<std::error_code> abort(std::string reason);

  /// One line on why the last emit failed (e.g. the CUDA error string);
  /// empty after a success. For logs: tests compare codes.
  const std::string& last_error() const noexcept;

  const tag_t& tag() const noexcept;
  /// blob_id on the wire: given when blob_begin is framed (at the blob's
  /// first emit, finish or abort), so ids rise in the order blobs begin;
  /// 0 before. Resend session: on the current connection.
  std::uint64_t id() const noexcept;
  std::size_t entry_count() const noexcept;
  explicit operator bool() const noexcept { return state_ != nullptr; }

 private:
  friend class sender;
  explicit blob_writer(std::shared_ptr<detail::blob_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::blob_state> state_;
};

/// Owns a transport and streams blobs over it. Move-only; destroying it,
/// or assigning another sender over it, closes its connection (as
/// close()).
class sender {
 public:
  sender() = default;
  sender(sender&&) noexcept = default;
  sender& operator=(sender&&) noexcept;
  ~sender();

  /// Runs the handshake (sends hello, waits for the consumer's) and starts
  /// reading acknowledgements. On error the transport is closed and the
  /// sender returned is failed: error() is the error, failure_reason()
  /// says why (the limit that ended the handshake, what a bad hello
  /// broke), and every call fails with it; for invalid_argument it is
  /// empty (no state).
  /// Errors: protocol_violation (bad hello: magic, version, role, chunk),
  /// timed_out (handshake_timeout or stall_timeout passed), peer_closed,
  /// peer_failed, closed.
  static asio::awaitable<std::tuple<std::error_code, sender>> start(
      std::unique_ptr<transport> t, sender_options opt = {});

  /// Starts a resend session: connects with `connect` (retrying as
  /// opt.resend says) and runs the handshake with a new random session id.
  /// Afterwards a failed connection is replaced transparently: emit,
  /// finish and abort keep succeeding while the sender reconnects, and
  /// every blob ended (finished or aborted) reaches the consumer exactly
  /// once. REQUIRES: every blob's tag is unique in the session and not
  /// NO_TAG (open_blob's default random tag is). Errors: those of
  /// connect and of the handshake after max_attempts tries,
  /// protocol_violation (the consumer keeps no delivery log). On error
  /// the sender returned is failed, as above: failure_reason() names the
  /// attempts, max_attempts and the last attempt's cause.
  static asio::awaitable<std::tuple<std::error_code, sender>> start(
      connect_fn connect, sender_options opt = {});

  /// Opens a blob with `tag` (default: a random uuid4). Nothing is sent until
  /// the first emit, finish or abort. REQUIRES: a started sender.
  blob_writer open_blob(const tag_t& tag = random_tag());
  /// Opens a blob with a tag and, optionally, a group (blob_options).
  blob_writer open_blob(const blob_options& opt);

  /// Waits until every frame queued so far (entries, tails, aborts of
  /// every blob) has been handed to the transport.
  /// Errors: closed, peer_closed, peer_failed, protocol_violation, timed_out.
  asio::awaitable<std::error_code> flush();

  /// Orderly close: sends `close`, then waits until the consumer has read
  /// everything and closed its end. Blobs still open are aborted by the
  /// consumer. Errors: closed, peer_failed, protocol_violation.
  /// Resend session: first waits until every ended blob was delivered
  /// (reconnecting as needed); blobs still open are abandoned.
  /// It returns once the sender's own coroutines have ended
  /// (sender_stats::tasks_running is 0): nothing of the sender runs on
  /// its executor after it, except when the awaiting coroutine was
  /// cancelled (operation_aborted), or when a task did not end within
  /// handshake_timeout of the sender's end (a connect_fn that ignores its
  /// cancellation): then it returns timed_out, failure_reason() says
  /// "shutdown: the sender's tasks ... did not end within N ms
  /// (handshake_timeout)", and that task runs on, holding only the
  /// sender's state (a sender that failed before returns its own error).
  /// Once its tasks have ended, a failed sender lets its transport go (a
  /// sender whose start failed, at once): error() and failure_reason()
  /// stay readable without holding a closed connection.
  asio::awaitable<std::error_code> shutdown();

  /// Closes now: every pending emit/finish/abort/shutdown completes with
  /// `closed`; blobs in flight are reported aborted by the consumer.
  void close() noexcept;

  /// The first error that ended the connection; empty while healthy.
  std::error_code error() const noexcept;
  /// Why, in one line, when the sender knows more than error() says: its
  /// stall_timeout fired ("nothing from the consumer for N ms
  /// (stall_timeout)"), what a protocol violation broke, the consumer's
  /// close frame ("the consumer closed the stream: REASON", its reason
  /// escaped; error() peer_closed), or why a resend session gave up
  /// (resend_options::max_attempts). Empty otherwise. Read it on the
  /// sender's executor.
  const std::string& failure_reason() const noexcept;

  /// Negotiated data frame size, copy threshold and the consumer's
  /// window, bytes.
  std::uint32_t chunk_bytes() const noexcept;
  std::uint32_t inline_bytes() const noexcept;
  std::uint64_t window_bytes() const noexcept;
  /// The consumer's key limit from its handshake, bytes: emit refuses a
  /// longer key (invalid_argument).
  std::uint32_t max_key_bytes() const noexcept;
  /// The consumer's limit on an entry's meta (its index row: msgpack of
  /// offset, length, kind, dtype and shape; in the compact form, 12 + 8
  /// per dimension) from its handshake, bytes: emit refuses an entry whose
  /// meta is longer in the form it would go in (invalid_argument;
  /// last_error() names both sizes; an entry that fits the compact form
  /// goes in it, docs/wire.md "Compact entries"). A shape of many
  /// dimensions is what makes it long.
  std::uint32_t max_meta_bytes() const noexcept;
  /// The optional features negotiated with the consumer (feature_* bits,
  /// docs/wire_features.md); 0 for a sender that was never started.
  std::uint64_t features() const noexcept;
  /// The consumer's limit on one entry's length from its handshake (its
  /// hello's max_entry_bytes extension, docs/wire.md "Hello extensions"),
  /// bytes: emit refuses a longer entry at once (invalid_argument), before
  /// framing any of it. 2^64 - 1 when the consumer announced none; 0 for a
  /// sender that was never started.
  std::uint64_t max_entry_bytes() const noexcept;
  /// Credit taken (entries and tails framed) and not yet released by the
  /// consumer, bytes.
  std::uint64_t in_flight_bytes() const noexcept;
  /// Resend session: bytes kept until delivered (0 otherwise).
  std::uint64_t unacked_bytes() const noexcept;
  sender_stats stats() const noexcept;

 private:
  explicit sender(std::shared_ptr<detail::sender_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::sender_state> state_;
};

}  // namespace blobpipe
