// The fan-in server's state (internal): its connections, the merged event
// queue, the credit pool, the group tracker and the counters. One
// coroutine accepts, one per connection pumps its consumer's events into
// the queue, and next() takes them out; all hold the state by shared_ptr.
//
// Tasks: every coroutine the server starts belongs to one of its two task
// groups, and next() joins both before it yields end_of_stream.
//   `tasks`:  the accept loop (ended by closing the listener) and each
//             connection's serve() (on its cx; ended by closing its
//             consumer, or its transport during the handshake). Never
//             cancelled: a transport wait cancelled midway can leave its
//             work to nobody.
//   `timers`: the group timer and the credit watch, which wait only on a
//             timer or a condition: close() cancels them, and so does
//             next() once nothing more can come.
//
// Threads (server_options::threads): the state's home is `ex`, the
// application's executor. Everything here is touched on it only, except a
// connection's conn_io (its `cx`: a receive thread's io_context, or `ex`
// itself) and the atomics. A connection's pump runs on its cx and hands
// each event home (at_home); home reaches a connection's conn_io through
// on_conn. With one thread both are plain calls. A connection's life is
// its conn_home::state (conn_lifecycle.hpp), moved by server_state::move
// only, which also keeps the live and closing counts.
#pragma once

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/cluster/server.hpp"
#include "lib/cluster/conn_lifecycle.hpp"
#include "lib/cluster/group_tracker.hpp"
#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/task_group.hpp"

namespace blobpipe::detail {

/// The server's receive threads (server_options::threads >= 2): one
/// io_context each, run by its own thread until finish().
struct receive_threads {
  explicit receive_threads(std::size_t n);
  /// finish().
  ~receive_threads();
  /// The next thread (an index into ctx), in turn.
  std::size_t next() noexcept;
  /// Lets each thread's run() end once its work is done (its connections
  /// closed) and joins them; past finish_limit, stops what is left.
  /// REQUIRES: not called on one of these threads.
  void finish() noexcept;

  /// How long finish() lets closed connections wind down.
  static constexpr std::chrono::seconds finish_limit{10};

  std::vector<std::unique_ptr<asio::io_context>> ctx;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::size_t turn = 0;
  std::mutex m;
  std::condition_variable done_cv;
  std::size_t done = 0;  // threads whose run() returned (under m)
};

/// What only home touches of a connection (server_state::ex).
struct conn_home {
  conn_state state = conn_state::handshaking;  // moved by server_state::move only
  std::uint64_t pool_member = 0;  // its consumer's credit_pool id, once open
  std::size_t queued = 0;         // its events in the queue, not yet yielded
  endpoint_metrics metrics;       // as yielded by next()
  std::chrono::steady_clock::time_point accepted{};
  // Its last event (opened, an entry, a blob's end): what makes it useful
  // when slots run out (server_options::idle_reclaim_after).
  std::chrono::steady_clock::time_point useful{};
  // next() yielded an event of it since the application last waited: the
  // next wait is told to its consumer (consumer::application_waits). One
  // that yielded nothing since was told already, so a wait crosses to
  // the receive threads only for the connections it concerns.
  bool yielded_since_wait = false;
};

/// What only the connection's executor (`cx`) touches.
struct conn_io {
  std::optional<consumer> c;  // once its handshake finished
  transport* raw = nullptr;   // during the handshake (to close it)
  bool reclaimed = false;     // home gave its slot away: end it
  std::string closed_why;     // why home reclaimed it as idle (its connection_closed says)
  // Its pump waits here at server_options::max_queued_events_per_connection;
  // home wakes it through on_conn.
  std::optional<async_condition> room;
};

/// A connection's events on their way home from its receive thread, in
/// order: the thread adds them, and one post per batch takes them home
/// (however many an input step decoded), where a post per event was one
/// wake of the home thread each.
struct homebound_events {
  std::mutex mu;             // guards both (the connection's thread and home)
  std::vector<event> queue;  // handed over, not yet taken home
  bool posted = false;       // a take home is on its way
};

/// One connection: its home part and its io part, each touched on its own
/// executor only (server_state::at_home and on_conn are the one way
/// across), what both read and is fixed once accepted, and two atomics.
struct server_conn {
  // Fixed at accept (info->session: set at home as it opens).
  std::shared_ptr<connection_info> info;
  // Where its transport and consumer live: a receive thread, or home.
  asio::any_io_executor cx;
  bool at_home = true;     // cx is home: calls between the two are plain calls
  std::size_t thread = 0;  // connection_stats::thread
  conn_home home;
  conn_io io;
  // Published by its cx for stats() (consumer_stats::credit_requests).
  std::atomic<std::uint64_t> credit_requests{0};
  // Its events that hold no credit (all but entry_ready) handed home and
  // not yet yielded: its pump adds, home subtracts (uncredited_left).
  std::atomic<std::size_t> uncredited_queued{0};
  // With a receive thread of its own: its events going home.
  homebound_events homebound;
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
  bool finished() const noexcept {
    return accept_done && lifecycle.live() == 0 && lifecycle.closing() == 0;
  }
  /// Moves `cn` to `to` (conn_lifecycle::move); whether it did. An illegal
  /// transition is a bug: asserted in debug builds, refused in release.
  bool move(server_conn& cn, conn_state to) noexcept {
    const bool moved = lifecycle.move(cn.home.state, to);
    assert(moved && "illegal server connection transition");
    return moved;
  }
  /// Closes `c` if the server drains and no blob is open on it.
  void drain_one(conn_io& c) noexcept;
  void close_listener() noexcept;
  /// One of `cn`'s events that hold no credit left the queue (yielded or
  /// dropped): wakes its pump if it waited for room.
  void uncredited_left(const std::shared_ptr<server_conn>& cn);
  /// Starts the credit watch (run_credit_watch) unless it runs.
  void watch_credit();

  /// Runs `f` on home: a plain call for a connection at home, else
  /// dispatched to `ex` (from a receive thread: posted, in order).
  template <class F>
  void at_home(const server_conn& cn, F&& f) {
    if (cn.at_home) f();
    else asio::dispatch(ex, std::forward<F>(f));
  }
  /// Runs `f` on connection `cn`'s executor (a plain call at home).
  template <class F>
  static void on_conn(const server_conn& cn, F&& f) {
    if (cn.at_home) f();
    else asio::dispatch(cn.cx, std::forward<F>(f));
  }

  // Declared first, destroyed last: the connections' transports and
  // consumers (in conns) go before the io_contexts they live on.
  std::shared_ptr<receive_threads> rx;  // null: every connection at home
  asio::any_io_executor ex;
  server_options opt;
  std::unique_ptr<listener> lis;
  std::string url;
  std::shared_ptr<credit_pool> pool;
  std::map<std::uint64_t, std::shared_ptr<server_conn>> conns;
  std::uint64_t next_id = 0;
  conn_lifecycle lifecycle;  // the connections' states counted: live, closing
  std::deque<server_event> queue;
  async_condition ready;
  bool accepting = true;
  bool accept_done = false;  // the accept loop has ended
  // Set at home, read by the connections' pumps too.
  std::atomic<bool> draining{false};
  std::atomic<bool> closed{false};
  group_tracker groups;
  // The group timer waits on it until the next group's deadline; notified
  // when no group is left open (its loop then ends).
  async_condition groups_changed;
  bool group_timer_running = false;
  // The credit watch: while a credit request waits for free budget
  // (credit_pool::starved), idle connections holding unused credit are
  // reclaimed. `credit_watch_due`: the pool's callback posted a start
  // (set on any thread; shared, so the callback never holds the state).
  bool credit_watch_running = false;
  std::shared_ptr<std::atomic<bool>> credit_watch_due =
      std::make_shared<std::atomic<bool>>(false);
  // Resend sessions seen (a second connection of one is a reconnect).
  std::unordered_set<std::string> sessions;
  std::deque<std::string> session_order;
  // Counters.
  server_stats counts;          // accepted, refused, handshake_failures, groups
  endpoint_metrics retired;     // connections forgotten by sweep()
  std::chrono::steady_clock::time_point started{};  // the first connection
  bool any_connection = false;
  std::optional<double> first_entry_s;  // from `started` to the first entry yielded
  // Declared last, so that the tasks' home (ex) is set first.
  task_group tasks;   // accept_loop, serve (see the top of this file)
  task_group timers;  // run_group_timer, run_credit_watch
};

}  // namespace blobpipe::detail
