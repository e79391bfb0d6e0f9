// The UCX runtime of one execution context (io_context): a UCX context, one
// single-threaded worker, and the loop that drives the worker from Asio.
//
// The loop: progress until idle (ucp_worker_progress returns 0), arm
// (ucp_worker_arm; UCS_ERR_BUSY means events arrived meanwhile: progress
// again), then await the worker's event fd as readable through an
// asio::posix::stream_descriptor. No thread is added and an idle worker
// costs no CPU. "Idle" spans executor turns: a pass that found events, or
// runs less than options::busy_poll after the last one that did, does
// not arm but queues another pass, so the coroutines it woke run first
// and a busy connection keeps being progressed without a sleep and a
// wake-up signal per message; a later pass that finds nothing arms.
// Starting an operation adds a request UCX must progress, so callers
// kick() the loop, which queues one more pass.
//
// UCX callbacks (active messages, endpoint errors, request completions) run
// inside ucp_worker_progress, where calling back into UCX is not allowed:
// they only record state, wake waiters and post follow-up work.
//
// Lifetime: transports and listeners own their runtime (shared_ptr); the
// execution context's registry only points at it, so the runtime, its
// worker and the pending wait on the event fd end with the last transport,
// and io_context::run() can return. A connection that is still closing its
// endpoint keeps the runtime alive until the close ends (bounded by
// close_linger).
//
// Source: UCX examples/ucp_hello_world.c (test_poll_wait).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/address_v4.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <ucp/api/ucp.h>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/transport/ucx/handles.hpp"
#include "lib/transport/ucx/pairing.hpp"

namespace blobpipe::ucx::detail {

class connection;

/// Active message ids on blobpipe's worker.
inline constexpr unsigned am_message = 0;      ///< header: none (bytes) or a bulk header; data
inline constexpr unsigned am_goodbye = 1;      ///< "closing, nothing more follows"
inline constexpr unsigned am_goodbye_ack = 2;  ///< answer: the closer may disconnect
/// Rendezvous (rendezvous.hpp): the connecting side's first message on its
/// new endpoint; header: the nonce the listener sent; no data.
inline constexpr unsigned am_verify = 3;

/// Bytes of a rendezvous nonce (am_verify's header).
inline constexpr std::size_t nonce_bytes = 16;
using nonce = std::array<std::byte, nonce_bytes>;

/// How long an orderly close (goodbye, flush, ucp_ep_close_nbx) may take
/// before the endpoint is forced closed.
inline constexpr std::chrono::milliseconds close_linger{2000};
/// How long a worker outlives a rendezvous that failed: UCX may still be
/// wiring the peer's endpoint up toward it (see connection::close_now).
inline constexpr std::chrono::milliseconds failed_wireup_linger{2000};
/// How long runtime::retire keeps memory a cut-short fetch may still reach.
inline constexpr std::chrono::seconds retire_linger{10};

using config_list = std::vector<std::pair<std::string, std::string>>;

class runtime : public std::enable_shared_from_this<runtime> {
  struct passkey {};

 public:
  /// The runtime of `ex`'s execution context, created (ucp_init,
  /// ucp_worker_create, AM handlers, event fd) with `opt` if none lives.
  /// `listening_on`: the address of the listen() asking (none: connect).
  /// Created for a listen() on one interface's address, its tcp transport
  /// is confined to that interface (options::tcp_on_listen_interface_only;
  /// devices.hpp), and every later listen() must be on that interface.
  /// Errors: invalid_argument (`opt.config` differs from the live
  /// runtime's, or UCX rejects a name; a listen on another interface, or
  /// on 0.0.0.0, than the one the live runtime's tcp is confined to),
  /// peer_failed (UCX could not be initialised).
  static result<std::shared_ptr<runtime>> of(
      const asio::any_io_executor& ex, const options& opt,
      std::optional<asio::ip::address_v4> listening_on = std::nullopt);

  runtime(passkey, asio::any_io_executor ex, detail::context ctx, detail::worker w, int efd_copy,
          config_list config, std::chrono::microseconds busy_poll, std::vector<std::byte> address,
          std::string tcp_interface, bool loopback_only);
  ~runtime();
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  const asio::any_io_executor& executor() const noexcept { return ex_; }
  ucp_worker_h worker() const noexcept { return worker_.get(); }
  /// The one interface UCX's tcp transport was confined to when this
  /// runtime was created (UCX_NET_DEVICES set by blobpipe); empty when it
  /// was not (it uses every interface UCX finds, or the user's setting).
  const std::string& tcp_interface() const noexcept { return tcp_interface_; }
  /// Whether this runtime's network devices are the loopback interface
  /// alone: its tcp confined to the loopback interface (a listen on
  /// 127.0.0.1) with no other transport's network device (no RDMA port).
  /// Such a runtime cannot reach another host: connect() refuses one.
  bool loopback_only() const noexcept { return loopback_only_; }
  /// Whether this UCX can move CUDA device memory itself (a CUDA module,
  /// cuda_copy or cuda_ipc, is loaded: ucp_context_query memory_types).
  bool cuda_memory() const noexcept;

  /// Runs one more progress pass soon (from the executor's queue).
  void kick();
  /// Runs a progress pass now. REQUIRES: called from a coroutine or
  /// handler, not from inside a UCX callback.
  void progress_now() { progress_pass(); }

  /// Routes active messages arriving on `ep` to `c` (see on_am).
  void attach(ucp_ep_h ep, connection* c);
  /// Forgets the route of `ep` if it still leads to `c`: UCX may reuse a
  /// released endpoint's address for a new endpoint at once, whose route
  /// must survive the old connection's late cleanup.
  void detach(ucp_ep_h ep, const connection* c) noexcept;
  /// The connection of `ep`; null when none (closed, or not one of ours).
  connection* find(ucp_ep_h ep) const noexcept;

  /// Keeps a closing connection (and so this runtime) alive until
  /// release(); see connection::close.
  void retain(std::shared_ptr<connection> c);
  void release(const connection* c) noexcept;

  /// transport::retire: keeps `owner` for retire_linger (dropped by a
  /// later progress pass, or with the runtime after its worker).
  void retire(std::shared_ptr<const void> owner);

  /// Keeps this runtime (its worker) alive for `d` more, whoever else
  /// still owns it: see connection::close_now.
  void hold_for(std::chrono::milliseconds d);

  /// Called when the execution context shuts down: force-closes every
  /// endpoint and drops the closing connections, so nothing leaks.
  void shutdown() noexcept;

  // ---- the rendezvous (rendezvous.hpp) ----

  /// This worker's address (ucp_worker_get_address), packed once.
  std::span<const std::byte> address() const noexcept { return address_; }
  /// Endpoints toward other workers' addresses, numbered as UCX pairs them.
  detail::pairing& pairs() noexcept { return pairs_; }
  /// Held by a connecting side from creating its endpoint until the
  /// listener has created the other (so no second endpoint toward the same
  /// worker takes a number in between).
  blobpipe::detail::async_mutex& pairing_lock() noexcept { return pairing_lock_; }

  /// Loopback: the listener creates both endpoints of a connection to its
  /// own worker and parks the connecting side's here under a key, for the
  /// connecting coroutine to take (same runtime). take() returns null for
  /// an unknown key.
  std::uint64_t park(std::shared_ptr<connection> c);
  std::shared_ptr<connection> take(std::uint64_t key) noexcept;

  /// The listener's side of a connection awaits am_verify carrying `n` on
  /// its endpoint: connection::on_verify is called when it comes (on that
  /// endpoint or, if the endpoints did not pair, another).
  void expect_verify(const nonce& n, connection* c);
  void forget_verify(const nonce& n) noexcept;
  /// From the am_verify callback.
  void on_verify(ucp_ep_h reply_ep, std::span<const std::byte> header) noexcept;

 private:
  /// Progress until idle; arm only when the pass found nothing, else run
  /// another pass from the executor's queue (see runtime.cpp). Armed, it
  /// waits on the event fd (wait_fd) unless a wait is outstanding already.
  void progress_pass();
  /// Runs a pass when the event fd becomes readable.
  void wait_fd();
  ucs_status_t set_am_handler(unsigned id);

  // Declared in acquisition order: destruction is UCX's reverse teardown.
  asio::any_io_executor ex_;
  // Memory cut-short fetches may still write into (retire), oldest first;
  // declared before the worker, so it outlives it.
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::shared_ptr<const void>>>
      retired_;
  detail::context context_;
  detail::worker worker_;
  asio::posix::stream_descriptor efd_;  // a dup of the worker's event fd
  config_list config_;  // the caller's overrides, as options::config gave them
  std::string tcp_interface_;
  bool loopback_only_ = false;
  std::unordered_map<ucp_ep_h, connection*> eps_;
  std::unordered_map<const connection*, std::shared_ptr<connection>> closing_;
  std::vector<std::byte> address_;
  detail::pairing pairs_;
  blobpipe::detail::async_mutex pairing_lock_;
  std::map<std::uint64_t, std::shared_ptr<connection>> parked_;
  std::uint64_t next_park_key_ = 1;
  std::map<nonce, connection*> verifying_;
  std::chrono::microseconds busy_poll_;
  std::chrono::steady_clock::time_point last_events_{};
  // Passes in a row that ended with ucp_worker_arm BUSY and no events, and
  // the timer that spaces them out once there are too many (progress_pass).
  static constexpr unsigned busy_passes_before_backoff = 1000;
  static constexpr std::chrono::milliseconds busy_backoff{1};
  unsigned busy_without_events_ = 0;
  std::optional<blobpipe::detail::deadline> backoff_;  // the next pass, after busy_backoff
  bool kick_posted_ = false;
  bool fd_waiting_ = false;  // an efd_ wait is outstanding
  bool in_progress_ = false;
};

}  // namespace blobpipe::ucx::detail
