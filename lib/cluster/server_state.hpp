// The fan-in server's state (internal): its connections, the merged event
// queue, the credit pool, the group tracker and the counters. One
// coroutine accepts, one per connection pumps its consumer's events into
// the queue, and next() takes them out; all on one executor, holding the
// state by shared_ptr.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_set>

#include <asio/steady_timer.hpp>

#include "blobpipe/cluster/server.hpp"
#include "lib/cluster/group_tracker.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

struct server_conn {
  std::shared_ptr<connection_info> info;
  std::optional<consumer> c;   // once its handshake finished
  transport* raw = nullptr;    // during the handshake (to close it)
  bool ended = false;          // its end_of_stream came
  endpoint_metrics metrics;    // as yielded by next()
  std::chrono::steady_clock::time_point accepted{};
  // Its last event (opened, an entry, a blob's end): what makes it useful
  // when slots run out (server_options::idle_reclaim_after).
  std::chrono::steady_clock::time_point useful{};
  std::string closed_why;      // set when the server reclaimed its slot
  bool reclaimed = false;      // counted out early; its events still coming
};

struct server_state : std::enable_shared_from_this<server_state> {
  server_state(asio::any_io_executor e, std::unique_ptr<listener> l, server_options o);

  /// Queues `ev` for next() and wakes it.
  void push(server_event ev);
  /// Queues the outcomes of a group.
  void push_groups(const std::vector<group_outcome>& outcomes);
  /// Runs the group timer while groups are open.
  void watch_groups();
  /// Counts what next() yields (per connection and first entry).
  void account(const server_event& ev);
  /// Forgets ended connections whose bytes were all released.
  void sweep();
  /// True once nothing more can come: no listener, no connection.
  bool finished() const noexcept { return accept_done && live == 0 && closing == 0; }
  /// Closes `c` if the server drains and no blob is open on it.
  void drain_one(server_conn& c) noexcept;
  void close_listener() noexcept;

  asio::any_io_executor ex;
  server_options opt;
  std::unique_ptr<listener> lis;
  std::string url;
  std::shared_ptr<credit_pool> pool;
  std::map<std::uint64_t, std::shared_ptr<server_conn>> conns;
  std::uint64_t next_id = 0;
  std::uint64_t live = 0;  // connections not ended (handshakes included)
  std::uint64_t closing = 0;  // reclaimed idle connections whose events are still coming
  std::deque<server_event> queue;
  async_condition ready;
  bool accepting = true;
  bool accept_done = false;  // the accept loop has ended
  bool draining = false;
  bool closed = false;
  group_tracker groups;
  asio::steady_timer group_timer;
  bool group_timer_running = false;
  // Resend sessions seen (a second connection of one is a reconnect).
  std::unordered_set<std::string> sessions;
  std::deque<std::string> session_order;
  // Counters.
  server_stats counts;          // accepted, refused, handshake_failures, groups
  endpoint_metrics retired;     // connections forgotten by sweep()
  std::chrono::steady_clock::time_point started{};  // the first connection
  bool any_connection = false;
  std::optional<double> first_entry_s;  // from `started` to the first entry yielded
};

}  // namespace blobpipe::detail
