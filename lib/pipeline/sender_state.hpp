// Shared state of a sender and its blobs (internal), and the loops every
// kind of sender shares. What is decided (blob ids and states, entry
// indices, credit, counters, what a resend session keeps) is the sans-IO
// sender_session's (blobpipe/protocol/sender_session.hpp); what is here
// waits and writes: one credit wait, one entry path (begin_entry: inline
// below the threshold, else send_entry_bytes, one chunk loop) and one ack reader, for plain
// and resend sessions, host and device values alike.
// Coroutines hold the state by shared_ptr, never by raw `this`.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/sender_session.hpp"
#include "blobpipe/transport/transport.hpp"
#include "lib/pipeline/send_queue.hpp"
#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/task_group.hpp"
#include "lib/runtime/watchdog.hpp"

namespace blobpipe::detail {

struct resend_state;  // lib/pipeline/resend.hpp

/// A blob of a resend session: the session's state of it (kept until
/// delivered, possibly after its writer went away) and the lock that lets
/// one coroutine at a time frame it.
struct kept_blob : sender_blob {
  kept_blob(const asio::any_io_executor& ex, const tag_t& t, std::optional<blob_group> g)
      : sender_blob(t, g), send_lock(ex) {}
  async_mutex send_lock;  // one sync() of this blob at a time
};

struct sender_state : std::enable_shared_from_this<sender_state> {
  /// `resend`: a resend session (sender::start with a connect function).
  sender_state(asio::any_io_executor e, sender_options o, bool resend = false);
  ~sender_state();

  /// Ends the sender with `ec` (the first error wins) and wakes every waiter.
  void fail(std::error_code ec) noexcept;
  /// Ends the sender with protocol_violation and `what`.
  void violation(std::string what);
  /// What the consumer's bytes brought on the current connection (the
  /// session's consume()): waiting producers woken, a resend session told
  /// of its deliveries.
  void take(const sender_input& in);
  /// The counters: the session's, the I/O side's (io) and the tasks.
  sender_stats stats() const noexcept;

  asio::any_io_executor ex;
  sender_options opt;
  // The current connection's queue. A resend session replaces it after a
  // failure (a coroutine still using the old one holds its own shared_ptr).
  std::shared_ptr<send_queue> queue;
  // Blob ids and states, credit, what a resend session keeps, the
  // counters; frames into queue->frames(). Its connection() is the
  // current connection's number.
  sender_session session;
  std::error_code error;             // set once; every later call returns it
  std::string message;               // what broke, for protocol violations
  bool closing = false;              // shutdown() sent `close`
  bool reader_done = false;          // the ack reader has ended
  async_condition credit_cv;         // in_flight fell, or the connection ended
  async_condition reader_cv;         // reader_done became true
  // What the session does not decide: where entries' bytes came from
  // (gathered, device_*) and the replaced queues' high water.
  sender_io_counts io;
  watchdog stall_watch;              // opt.stall_timeout
  // Its coroutines: the watchdog (watch), the ack reader (read_acks), a
  // resend session's reconnect and sync. Each ends when what it waits on
  // closes (the link, the watchdog's stop(), the session's conditions).
  task_group tasks;
  std::string timeout_reason;        // set when the watchdog fired
  std::unique_ptr<resend_state> resend;  // resend sessions only
  // The last finished blob's planned-entry storage, emptied, which the
  // next blob's layout_builder plans into: a blob as large as the last
  // does not grow (and move) its entries. Kept up to spare_entries_bytes.
  std::vector<planned_entry> spare_entries;
};

/// Most capacity, in bytes, sender_state::spare_entries keeps between blobs.
inline constexpr std::size_t spare_entries_bytes = std::size_t{1} << 20;

struct blob_state {
  blob_state(std::shared_ptr<sender_state> s, const blob_options& o);
  ~blob_state();  // aborts a begun, unfinished blob

  /// The session's state of the blob.
  sender_blob& wire() noexcept { return kept ? *kept : own; }

  std::shared_ptr<sender_state> sender;
  sender_blob own;                  // plain senders
  std::shared_ptr<kept_blob> kept;  // resend sessions (outlives the writer until delivered)
  layout_builder builder;
  async_mutex lock;      // one emit/finish/abort at a time, in call order
  std::vector<std::byte> meta;     // the entry being emitted: its Entry::meta()
  std::string last_error;  // why the last emit failed (blob_writer::last_error)
};

/// Reads the consumer's bytes on one link and hands them to the session
/// (sender_session::consume decodes and checks them): the I/O half only.
struct ack_reader {
  explicit ack_reader(std::shared_ptr<transport> l) : link(std::move(l)) {}

  std::shared_ptr<transport> link;
  std::array<std::byte, 4096> buffer{};
  std::uint64_t attempt = 0;     // the session's handshake attempt on this link
  std::uint64_t connection = 0;  // its connection number, once installed
  std::string message;           // why the consumer's bytes were refused
};

/// Reads what the consumer sent next on `r`'s link and feeds it to the
/// session, unless a later attempt replaced the link. Errors: the
/// transport's, closed (replaced), protocol_violation (`r.message` says
/// why; the link is closed).
asio::awaitable<std::error_code> read_consumer(std::shared_ptr<sender_state> s,
                                               std::shared_ptr<ack_reader> r);

/// The handshake on `link` (every kind of sender): the session frames our
/// hello (chunk_bytes, inline_bytes, features, the resend session's id),
/// which is written, then reads until the session has checked the
/// consumer's. Errors: protocol_violation, timed_out (handshake_timeout),
/// and the transport's.
asio::awaitable<std::tuple<std::error_code, std::shared_ptr<ack_reader>>> handshake(
    std::shared_ptr<sender_state> s, std::shared_ptr<transport> link);

/// Makes `link` (handshake done by `reader`) the sender's connection:
/// negotiated limits, a fresh send queue, the ack reader running.
void install(const std::shared_ptr<sender_state>& s, std::shared_ptr<ack_reader> reader);

/// Why the consumer ended the stream, for the sender's error: its close
/// frame's `reason` (escaped: the peer's own words), or that it gave none.
std::string closed_by_consumer(std::string_view reason);

/// The features a sender with `opt` offers in its hello.
std::uint64_t offered_features(const sender_options& opt) noexcept;

/// The steady clock in nanoseconds (the entry timestamps' clock).
inline std::uint64_t steady_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Waits until `n` bytes of credit fit on connection `q`, then takes them
/// (the session's take_credit; with credit grants it asks the consumer).
/// Errors: the sender's error, operation_aborted (cancelled), closed (`q`
/// is no longer the connection: a resend session reconnected).
asio::awaitable<std::error_code> acquire_credit(std::shared_ptr<sender_state> s,
                                                std::shared_ptr<send_queue> q, std::uint64_t n);

/// Waits while more than max_queued_bytes copied bytes wait for the
/// writer of `q` (the sender's own bound, whatever window the consumer
/// grants), as a wait on the consumer: stall_timeout applies. Call before
/// framing copied bytes. Errors: the connection's (the sender's error
/// once it failed), operation_aborted (cancelled).
asio::awaitable<std::error_code> wait_room(std::shared_ptr<sender_state> s,
                                           std::shared_ptr<send_queue> q);

/// Ends the sender (closed, unless it failed before: fail() keeps the
/// first error) and waits until its tasks and its writer have ended:
/// what shutdown() does last, so that nothing of the sender runs after it
/// returns. Each task ends on what fail() closes or stops (the link, the
/// watchdog, the session's conditions, a connection attempt in flight);
/// none is cancelled, as a coroutine cancelled inside a UCX wait would
/// leave its request to nobody. The wait for the tasks is bounded by
/// handshake_timeout (0: none): past it, with a task still running (a
/// connect function that ignores its cancellation), it returns timed_out
/// and the failure reason names the limit; that task runs on, holding the
/// state. Errors: timed_out.
asio::awaitable<std::error_code> end_tasks(std::shared_ptr<sender_state> s);

/// Why the sender failed, for a blob_writer's last_error(): its
/// failure_reason when it has one, else its error's message.
std::string failure_text(const sender_state& s);

/// Frames host entry `pe` of blob `b` on `q` through the session
/// (sender_session::add_entry), the part that never waits: entry_begin,
/// with its bytes inline when the session says so (copied: a strided value,
/// pe.contiguous false, is gathered with write_entry). Returns true when
/// the entry went whole (inline, or empty); false when its bytes follow in
/// data frames (send_entry_bytes). A plain function, so that emit's usual
/// path (a small entry) costs no coroutine frame of its own. Credit must be
/// taken already, and `q` must be the session's connection. `emitted_ns`:
/// when the producer emitted it (steady_ns()).
bool begin_entry(sender_state& s, send_queue& q, sender_blob& b, const planned_entry& pe,
                 std::span<const std::byte> meta, std::uint64_t emitted_ns);

/// The data frames of host entry `pe` after begin_entry returned false
/// (send_chunks; a strided value gathered once into a temporary first).
/// Errors: the connection's; invalid_argument (a strided value whose
/// gather failed).
asio::awaitable<std::error_code> send_entry_bytes(std::shared_ptr<sender_state> s,
                                                  std::shared_ptr<send_queue> q, sender_blob& b,
                                                  const planned_entry& pe);

/// The one chunk loop: the data frames of b's current entry from `bytes`
/// (the next bytes it needs, in order), pointing at them (zero copy; on
/// CUDA device `device` when >= 0, for a transport that accepts it).
/// Completes once the transport has taken every byte, so `bytes` may be
/// reused. A few chunks are queued ahead, so producers' chunks
/// interleave. If the awaiting coroutine is cancelled with bytes still
/// queued, the connection is closed (a frame cannot be taken back and the
/// memory may go). Errors: the connection's, closed.
asio::awaitable<std::error_code> send_chunks(std::shared_ptr<sender_state> s,
                                             std::shared_ptr<send_queue> q, sender_blob& b,
                                             std::span<const std::byte> bytes, int device = -1);

}  // namespace blobpipe::detail
