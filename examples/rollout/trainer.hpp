// examples/rollout/trainer.hpp — the trainer side: accept the workers'
// connections, consume every stream to its end, check what arrived.
//
// Each accepted connection gets its own blobpipe::consumer, run by its own
// coroutine; all of them feed one checker (check.hpp) and one progress
// line. A connection is a worker once its handshake is done: one that
// fails it (garbage, a stray client) or says nothing for
// handshake_timeout is closed and noted, and the trainer keeps accepting
// until `connections` workers have come; then it stops listening and
// closes the connections still in their handshake. A worker quiet for
// idle_timeout ends with timed_out (a connection problem). A watchdog timer runs beside them: when it fires it closes the
// listener and every connection, which wakes each coroutine with `closed`
// (nothing is cancelled mid-frame). The trainer then prints throughput,
// time to first entry, the steady-state rate (progress.hpp) and one
// verdict: OK only when the checker is satisfied and nothing else failed.
//
//   auto t = std::make_shared<rollout::trainer>(ex, std::move(listener), std::move(check),
//                                               rollout::trainer_config{.connections = 4});
//   asio::co_spawn(ex, t->run(), [](std::exception_ptr, bool ok) { ... });
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <ostream>
#include <string>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "examples/rollout/check.hpp"
#include "examples/rollout/listener.hpp"
#include "examples/rollout/progress.hpp"

namespace rollout {

struct trainer_config {
  std::size_t connections = 4;  ///< take this many workers, then stop listening
  std::chrono::milliseconds timeout{60'000};  ///< give up after this long
  bool tty = false;             ///< redraw the progress line in place
  /// The workers run in another process (--listen): a timeout with fewer
  /// connections than expected may mean they were given another --workers.
  bool remote_workers = false;
  /// A connection whose handshake takes longer is closed and is not a
  /// worker (consumer_options::handshake_timeout).
  std::chrono::milliseconds handshake_timeout{10'000};
  /// A worker that sends nothing for this long is given up on (its stream
  /// ends with timed_out; consumer_options::idle_timeout). The example's
  /// workers stream without pause, so a quiet one is stuck.
  std::chrono::milliseconds idle_timeout{30'000};
};

class trainer : public std::enable_shared_from_this<trainer> {
 public:
  /// REQUIRES: held by a std::shared_ptr (run() keeps itself alive).
  trainer(asio::any_io_executor ex, std::unique_ptr<blobpipe::listener> l,
          std::unique_ptr<checker> check, trainer_config cfg, std::ostream& out);

  /// Accepts cfg.connections connections, consumes each to its end, prints
  /// the summary. True when every connection ended in order and the
  /// checker is satisfied.
  asio::awaitable<bool> run();

  /// No more connections will come (say, every worker of this process has
  /// ended): stop waiting in accept.
  void stop_accepting() noexcept;

  /// Ends the run now (say, on SIGINT): closes every connection; the
  /// summary reports what arrived and fails with "interrupted by `why`".
  void interrupt(std::string why);

 private:
  using clock = std::chrono::steady_clock;

  static asio::awaitable<void> consume(std::shared_ptr<trainer> self, std::size_t conn,
                                       std::unique_ptr<blobpipe::transport> t);
  static asio::awaitable<void> watchdog(std::shared_ptr<trainer> self);
  asio::awaitable<void> drain(std::size_t conn, blobpipe::consumer& c);
  void take_no_more(std::size_t last) noexcept;
  void stop() noexcept;
  bool print_summary();
  void print_timeout();
  void print_short_of_data();

  asio::any_io_executor ex_;
  std::unique_ptr<blobpipe::listener> listener_;
  std::unique_ptr<checker> check_;
  trainer_config cfg_;
  std::ostream& out_;
  progress progress_;
  steady_rate steady_;
  problem_log problems_;  // connection-level failures
  problem_log not_workers_;  // connections that failed their handshake

  bool accepting_ = true;
  bool stopping_ = false;   // our own close(): `closed` errors are expected
  bool timed_out_ = false;
  std::string interrupted_;  // interrupt()'s reason; empty if not interrupted
  std::size_t active_ = 0;  // consume() coroutines still running
  std::size_t accepted_ = 0;  // workers so far (connections whose handshake was done)
  std::size_t working_ = 0;   // workers whose stream has not ended
  std::size_t working_at_timeout_ = 0;  // streams still open when the watchdog fired
  asio::steady_timer idle_;      // cancelled when active_ drops to 0
  asio::steady_timer deadline_;  // the watchdog's timer
  // Closes connection `conn` (its transport before the handshake, its
  // consumer after), so stop() can wake whatever is pending there.
  std::map<std::size_t, std::function<void()>> closers_;
  std::set<std::size_t> handshaking_;  // connections whose handshake is not done

  std::optional<clock::time_point> first_accept_, first_entry_, last_data_;
};

}  // namespace rollout
