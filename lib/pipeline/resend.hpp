// Resend sessions (internal): the coroutines that reconnect and send kept
// blobs again. What is kept until the consumer acknowledges delivery, and
// what a new connection must be sent, is the sender_session's
// (blobpipe/protocol/sender_session.hpp). docs/wire.md "Delivery",
// docs/reliability.md.
//
// A kept blob is the unit of resending. Its producer appends entries (each
// copied whole before any of it is sent) and finally a tail or an abort;
// sync() sends whatever of it the current connection has not seen yet
// (the session begins it under a fresh blob id on each new connection). Sends
// happen only while the connection is live; after a failure the
// reconnector makes a new connection, re-syncs every kept blob oldest
// first, and only then lets producers send again, so blobs resent always
// begin before blobs that are new on that connection (the order the
// consumer's bounded de-duplication window relies on).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/protocol/wire.hpp"
#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/sender_state.hpp"
#include "lib/runtime/async_sync.hpp"

namespace blobpipe::detail {

struct attempt_wait;

struct resend_state {
  resend_state(const asio::any_io_executor& ex, connect_fn c)
      : connect(std::move(c)), kept_cv(ex), retry_wait(ex) {}

  connect_fn connect;
  session_id session = NO_SESSION;
  bool connected = false;  // a connection is installed and healthy
  bool live = false;       // ...and every kept blob was re-synced on it
  // Attempts in a row that delivered nothing while something waited for
  // delivery: failed connects and handshakes, and connections that ended
  // with no delivery ack on them while a blob was kept. max_attempts of
  // them end the session. `retries` counts every attempt in a row that
  // delivered nothing, a connection with nothing to deliver included (a
  // consumer that drops idle connections): each makes the next attempt
  // wait (retry_delay doubling), so a peer that accepts and closes cannot
  // make the sender spin, and an idle worker's session is not ended by it.
  std::uint32_t failures = 0;
  std::uint32_t retries = 0;
  bool delivered_here = false;  // a delivery ack came on the current connection
  std::error_code last_error;
  std::string last_reason;      // why the last attempt or connection ended
  async_condition kept_cv;  // kept blobs changed, or the connection came or went
  async_condition retry_wait;  // the backoff before a retry; the sender's end cuts it short
  // The connection attempt in flight: the sender's end ends it (its
  // connect cancelled, or its link closed), so no task outlives shutdown
  // by a handshake_timeout.
  std::weak_ptr<attempt_wait> attempt;
};

/// The retention steps of blob_writer's emit, finish and abort in a
/// resend session (b->kept is set; the caller holds b->lock).
///
/// retain_entry: keeps planned entry `planned` of `b` (its meta in
/// b->meta): admits its bytes (waiting for deliveries), copies them
/// (device values to the host), then syncs. Errors: the sender's,
/// operation_aborted, the copy's (the blob stays usable).
asio::awaitable<std::error_code> retain_entry(std::shared_ptr<blob_state> b,
                                              const planned_entry& planned,
                                              std::uint64_t emitted_ns);
/// Admits `n` more kept bytes for `kb` (listing it first, within the
/// consumer's de-duplication window), waiting for deliveries while the
/// session says no. Errors: the sender's, operation_aborted.
asio::awaitable<std::error_code> retain(std::shared_ptr<sender_state> s,
                                        std::shared_ptr<kept_blob> kb, std::uint64_t n);
/// Sends what the live connection has not seen of `kb` (not cancelled
/// midway by its caller). Returns the sender's error.
asio::awaitable<std::error_code> sync_kept(std::shared_ptr<sender_state> s,
                                           std::shared_ptr<kept_blob> kb);
/// The last handle of an open kept blob went away: abort it in the background.
void kept_dropped(const std::shared_ptr<sender_state>& s, std::shared_ptr<kept_blob> kb);

/// The stall watchdog fired: drop the connection and reconnect.
void resend_stalled(const std::shared_ptr<sender_state>& s);
/// Connection number `connection` failed with `ec` (`why`: what the
/// sender knows more, e.g. the consumer's close reason): close it and
/// connect again, counted as an attempt that delivered nothing unless a
/// delivery ack came on it (no-op when it was replaced already or the
/// sender ended).
void connection_lost(const std::shared_ptr<sender_state>& s, std::uint64_t connection,
                     std::error_code ec, std::string why = {});
/// sender_state::fail() of a resend session: stop reconnecting, wake waiters.
void resend_failed(sender_state& s) noexcept;
/// An ack came on the current connection; `delivered`: the blob it
/// delivered (the session let it go), or null (credit only: no delivery,
/// so it does not count as the connection working).
void resend_acked(sender_state& s, const std::shared_ptr<sender_blob>& delivered);

/// sender::start(connect_fn) and sender::shutdown() of a resend session.
asio::awaitable<std::error_code> resend_start(std::shared_ptr<sender_state> s);
asio::awaitable<std::error_code> resend_shutdown(std::shared_ptr<sender_state> s);

}  // namespace blobpipe::detail
