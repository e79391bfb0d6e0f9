// Resend sessions (internal): what a sender keeps until the consumer
// acknowledges delivery, and the coroutines that reconnect and send kept
// blobs again. docs/wire.md "Delivery", docs/reliability.md.
//
// A kept blob is the unit of resending. Its producer appends entries (each
// copied whole before any of it is sent) and finally a tail or an abort;
// sync() sends whatever of it the current connection has not seen yet,
// beginning the blob under a fresh blob id on each new connection. Sends
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
#include <asio/steady_timer.hpp>

#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/protocol/wire.hpp"
#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/sender_state.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

/// One entry kept for resending.
struct kept_entry {
  /// The row, with its source pointing at `bytes` (contiguous host memory).
  planned_entry planned;
  std::vector<std::byte> meta;   // Entry::meta() as sent in entry_begin
  std::vector<std::byte> bytes;  // the entry's len bytes (a contiguous copy)
  std::uint64_t emitted_ns = 0;  // when emit() was called (entry timestamps)
};

struct kept_blob {
  kept_blob(const asio::any_io_executor& ex, const tag_t& t) : tag(t), send_lock(ex) {}
  enum class end_kind { open, tail, abort };

  tag_t tag;
  std::optional<blob_group> group;  // blob_options::group
  std::deque<kept_entry> entries;  // deque: references survive push_back
  end_kind end = end_kind::open;
  std::vector<std::byte> tail;     // end_kind::tail: write_tail bytes
  std::string abort_reason;        // end_kind::abort
  std::uint64_t bytes = 0;         // counted against resend_options::unacked_bytes
  bool listed = false;             // in resend_state::kept
  bool delivered = false;          // acknowledged: nothing more to send
  // Progress on connection number `connection` (the blob is begun afresh
  // on a new one).
  async_mutex send_lock;           // one sync() of this blob at a time
  std::uint64_t connection = 0;
  std::uint64_t wire_id = 0;
  bool begun = false;
  std::size_t entries_sent = 0;
  bool end_sent = false;
  std::uint32_t attempts = 0;      // connections it was begun on
  bool sending = false;            // a sync() is using the bytes

  /// Frees the bytes (delivered; nothing will be sent again).
  void release() noexcept {
    entries.clear();
    entries.shrink_to_fit();
    tail = {};
  }

  /// Everything kept has gone out on connection number `c`.
  bool synced(std::uint64_t c) const noexcept {
    return connection == c && begun && (end == end_kind::abort || entries_sent == entries.size()) &&
           (end == end_kind::open || end_sent);
  }
};

struct resend_state {
  resend_state(const asio::any_io_executor& ex, connect_fn c)
      : connect(std::move(c)), kept_cv(ex), retry_timer(ex) {}

  connect_fn connect;
  session_id session = NO_SESSION;
  std::deque<std::shared_ptr<kept_blob>> kept;  // oldest first
  std::map<std::uint64_t, std::shared_ptr<kept_blob>> on_wire;  // this connection's ids
  std::uint64_t kept_bytes = 0;
  std::uint32_t max_kept_blobs = 1;  // the consumer's dedup_window
  bool connected = false;  // a connection is installed and healthy
  bool live = false;       // ...and every kept blob was re-synced on it
  std::uint32_t failures = 0;  // attempts since the last acknowledgement
  std::error_code last_error;
  async_condition kept_cv;  // kept changed, or the connection came or went
  asio::steady_timer retry_timer;
};

/// blob_writer's operations in a resend session (b->kept is set). The
/// caller holds b->lock. Device values are copied to the host first.
asio::awaitable<std::error_code> kept_emit(std::shared_ptr<blob_state> b, std::string key,
                                           value v);
asio::awaitable<std::error_code> kept_finish(std::shared_ptr<blob_state> b);
asio::awaitable<std::error_code> kept_abort(std::shared_ptr<blob_state> b, std::string reason);
/// The last handle of an open kept blob went away: abort it in the background.
void kept_dropped(const std::shared_ptr<sender_state>& s, std::shared_ptr<kept_blob> kb);

/// The stall watchdog fired: drop the connection and reconnect.
void resend_stalled(const std::shared_ptr<sender_state>& s);
/// Connection number `connection` failed with `ec`: close it and connect
/// again (no-op when it was replaced already or the sender ended).
void connection_lost(const std::shared_ptr<sender_state>& s, std::uint64_t connection,
                     std::error_code ec);
/// sender_state::fail() of a resend session: stop reconnecting, wake waiters.
void resend_failed(sender_state& s) noexcept;
/// An ack delivered `blob_id` (0: credit only) on the current connection.
/// Errors: protocol_violation (no blob of that id awaits delivery).
result<void> resend_acked(sender_state& s, std::uint64_t blob_id);

/// sender::start(connect_fn) and sender::shutdown() of a resend session.
asio::awaitable<std::error_code> resend_start(std::shared_ptr<sender_state> s);
asio::awaitable<std::error_code> resend_shutdown(std::shared_ptr<sender_state> s);

}  // namespace blobpipe::detail
