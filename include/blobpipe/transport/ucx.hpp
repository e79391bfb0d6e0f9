// blobpipe/transport/ucx.hpp — the UCX transport (ucp active messages, UCX 1.13).
//
// The same byte transport as blobpipe/transport/tcp.hpp, over UCX: any
// transport UCX selects (tcp; on one host the shared-memory ones, posix,
// sysv, cma). Each write() is one active message sent eagerly, carrying
// many small frames; each write_bulk() is one active message whose AM
// header is the frame header and whose data is the payload, from the
// caller's own buffers (one buffer: contiguous; several: UCP_DATATYPE_IOV),
// never through a staging copy, by rendezvous when large. On the
// receiving side read_some() copies plain bytes out of UCX's receive
// buffer and stops after a bulk message's header; a rendezvous payload is
// then fetched by ucp_am_recv_data_nbx straight into the destination that
// read_exact() or post_read() names, and an eager one is copied once from
// UCX's buffer into it.
//
//   auto l = blobpipe::ucx::listen(ex, 0).value();   // ephemeral port
//   // consumer side                      // sender side
//   auto [ec, t] = co_await l.accept();     auto [ec, t] = co_await
//                                             blobpipe::ucx::connect(ex, "127.0.0.1", l.port());
//
// Event loop: every io_context (more exactly, every execution context an
// executor belongs to) gets one UCX context and one single-threaded worker,
// created by the first listen/connect on it and released with the last
// transport or listener (a connect that failed keeps it, and run(), 2 s longer:
// docs/ucx.md "Foreign bytes"). The worker's event fd (ucp_worker_get_efd) is
// awaited by an asio::posix::stream_descriptor: progress until idle, arm
// (ucp_worker_arm; busy means progress again), await readable. An idle
// connection costs no CPU and no thread is added.
//
// Choosing the UCX transports: UCX reads UCX_TLS, UCX_NET_DEVICES, ... from
// the environment; options::config overrides them for one io_context. Any
// transport UCX can connect with a worker address will do: tcp, the shared
// memory ones on one host (UCX_TLS=sm alone works there), RDMA ones.
// Because every endpoint runs in peer error mode, blobpipe turns on what
// UCX 1.13 requires of the shared memory transports in that mode
// (MM_ERROR_HANDLING, MEMORY_INVALIDATE), unless told otherwise. A
// listen() on one address confines UCX's own tcp transport (its listening
// ports) to that address's interface, unless UCX_NET_DEVICES is set
// (options::tcp_on_listen_interface_only). docs/ucx.md has the details.
//
// Connecting: listen() opens a TCP socket of blobpipe's own, not UCX's
// sockaddr listener (ucp_listener_create), whose connection manager UCX
// 1.13.1 let sixteen stray bytes abort the process with. Each connection
// is a short rendezvous over it: a checked hello each way carrying the
// two workers' addresses, an endpoint each (ucp_ep_create with the
// peer's worker address, numbered so that UCX pairs the two), and an
// active message proving they paired; then the socket stays open as the
// connection's link, whose end says the peer went. Anything else on the
// socket, or silence past options::handshake_timeout, closes it; the
// listener goes on. docs/ucx.md "Connecting".
//
// Closing: close() says goodbye (an AM the peer answers) and then closes
// the endpoint in flush mode (ucp_ep_close_nbx), so the peer sees
// peer_closed; with operations in flight, or after a peer failure, the
// endpoint is forced closed (UCP_EP_CLOSE_FLAG_FORCE) and they complete
// with `closed`. close() never blocks: the handshake finishes on the
// executor.
//
// Device memory: with a UCX built with its CUDA modules (cuda_copy,
// cuda_ipc), accepts_device_memory() is true and write_bulk_device /
// read_exact_device hand CUDA buffers to UCX
// (UCS_MEMORY_TYPE_CUDA). Debian's 1.13 has none: they then fail with
// invalid_argument, as transport.hpp's defaults do.
//
// Errors: as every transport (blobpipe/transport/transport.hpp). peer_closed: the peer
// closed its transport (an orderly goodbye); peer_failed: the peer's
// process or link failed (UCX's error handler fired, UCP_ERR_HANDLING_MODE_PEER,
// or the rendezvous socket ended before a goodbye).
// Messages already received before either are still delivered.
//
// Source: docs/ucx.md; UCX examples/ucp_hello_world.c (worker addresses).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe::ucx {

/// How the io_context's UCX context is created.
struct options {
  /// UCX configuration overrides: (name without the "UCX_" prefix, value),
  /// applied with ucp_config_modify on top of the environment, e.g.
  /// {{"TLS", "tcp,posix,cma"}, {"RNDV_THRESH", "64k"}}. They take effect
  /// when the io_context's UCX context is created, i.e. at its first
  /// listen/connect; a later call naming different overrides while that
  /// context lives fails with invalid_argument. Empty: use the environment,
  /// or the existing context as it is.
  std::vector<std::pair<std::string, std::string>> config;

  /// After the worker last had events, keep progressing it between other
  /// handlers for this long before arming it and sleeping on its event fd
  /// (microseconds). A busy connection is then not put to sleep and
  /// signalled awake between messages (about 1.5x throughput on shared
  /// memory here); an idle one costs CPU for at most this long after its
  /// last message. 0: arm as soon as a progress pass finds nothing.
  /// Like `config`, fixed when the io_context's UCX context is created.
  std::chrono::microseconds busy_poll{200};

  /// When a listen() on one interface's IPv4 address (not 0.0.0.0)
  /// creates the io_context's UCX context: confine UCX's own tcp transport,
  /// whose listening ports forged bytes can abort the process with
  /// (docs/ucx.md "Foreign bytes"), to that interface.
  /// blobpipe sets UCX_NET_DEVICES to that interface plus every network
  /// device of UCX's other transports (RDMA ones stay), found through UCT
  /// (uct_md_query_tl_resources). Never when UCX_NET_DEVICES is in the
  /// environment, `config` names NET_DEVICES, or a ucx.conf UCX reads sets
  /// it to anything but UCX's default "all" (ucp_config_read): the user's
  /// choice stands.
  /// Nothing changes when UCX's tcp does not use that interface. Later
  /// listen() calls on the same io_context must then use that interface
  /// too (invalid_argument otherwise: UCX's tcp could not reach them).
  /// false: UCX's tcp listens on every interface it finds, as UCX does by
  /// itself. Like `config`, fixed when the io_context's UCX context is
  /// created.
  bool tcp_on_listen_interface_only = true;

  // The two below apply to each listen/connect call that passes them (not
  // fixed with the io_context's UCX context).

  /// The longest a rendezvous may take: listen's side from taking the
  /// socket from the OS until the connection is ready for accept(),
  /// connect's from its TCP connect until it completes. Past it the socket
  /// is closed (connect: timed_out). 0: no limit.
  std::chrono::milliseconds handshake_timeout{10000};
  /// listen: most connections taken from the OS and not yet handed over by
  /// accept() (rendezvous in progress and connections waiting for
  /// accept()). When it is reached, the oldest rendezvous still in
  /// progress is closed to make room (counters().reclaimed), so silent or
  /// slow peers lose their slots before an honest one is turned away; only
  /// when every pending connection has finished its rendezvous is a new
  /// one closed at once (over_cap). Bounds what silent or slow peers can
  /// hold: with the defaults, 64 sockets for at most 10 s each.
  std::size_t max_pending = 64;
};

/// What a listener has done (listener::counters()).
struct listener_counters {
  std::uint64_t connections_ready = 0;  ///< rendezvous done: handed to accept()
  /// Closed without being handed over: bytes that were not a rendezvous,
  /// a peer that went, endpoints UCX could not create or pair.
  std::uint64_t refused = 0;
  std::uint64_t timed_out = 0;   ///< rendezvous past options::handshake_timeout
  std::uint64_t over_cap = 0;    ///< closed at once: options::max_pending reached
  /// Rendezvous closed unfinished to make room: the listener was at
  /// options::max_pending and this was the oldest still under way.
  std::uint64_t reclaimed = 0;
};

/// A listener that yields UCX transports (blobpipe::listener): a TCP
/// socket on which each connection runs the rendezvous (see the file
/// comment) in the background, so a client's connect() completes before
/// accept() is called.
class listener final : public blobpipe::listener {
 public:
  listener(listener&&) noexcept;
  listener& operator=(listener&&) noexcept;
  ~listener() override;

  std::uint16_t port() const noexcept override;
  /// Errors: closed (close() called, before or while waiting);
  /// operation_aborted (the awaiting coroutine was cancelled).
  asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> accept(
      transport_options opt = {}) override;
  /// Stops accepting at once and lets the port go; connections not yet
  /// accepted are closed too (those whose rendezvous was running see their
  /// connect fail with peer_failed; those done see peer_closed).
  void close() noexcept override;

  listener_counters counters() const noexcept;
  /// One line on the last connection refused or timed out; empty if none.
  std::string last_refusal() const;

 private:
  struct impl;
  explicit listener(std::shared_ptr<impl> p);
  std::shared_ptr<impl> impl_;
  friend result<listener> listen(asio::any_io_executor, std::uint16_t, const std::string&,
                                 const options&);
};

/// Listens on `address`:`port` (an IPv4 literal, or a v4-mapped IPv6 one;
/// port 0 picks an ephemeral port; SO_REUSEADDR, so a port whose old
/// connections sit in TIME_WAIT binds). IPv6 is refused: UCX 1.13's tcp
/// transport cannot connect over it (docs/ucx.md). Creates the
/// io_context's UCX context and worker on the first call (ucp_init,
/// ucp_worker_create); on one address other than 0.0.0.0, with UCX's tcp
/// transport confined to that address's interface
/// (options::tcp_on_listen_interface_only).
/// Errors: invalid_argument (address does not parse or is IPv6; config
/// differing from the io_context's live UCX context; an unknown UCX config
/// name; max_pending 0; an address on another interface than the one the
/// io_context's UCX tcp is confined to, or 0.0.0.0 then), peer_failed (UCX
/// could not be initialised, or the socket could not listen, e.g. the port
/// is in use; the message says so).
[[nodiscard]] result<listener> listen(asio::any_io_executor ex, std::uint16_t port,
                                      const std::string& address = "127.0.0.1",
                                      const options& opt = {});

/// Whether connect() takes `host`: a name (resolved to IPv4 addresses), an
/// IPv4 literal or a v4-mapped IPv6 one. Nothing is resolved here.
/// Errors: invalid_argument (an IPv6 literal: UCX 1.13's tcp transport
/// cannot connect over it; docs/ucx.md "Gaps"; the message says so).
[[nodiscard]] result<void> check_host(const std::string& host);

/// Resolves `host` to IPv4 addresses (asio resolver; an IPv6 literal is
/// refused, see check_host), connects a TCP socket to the first that
/// accepts and runs the rendezvous over it: the endpoint is created from
/// the listener's worker address (ucp_ep_create, error mode
/// UCP_ERR_HANDLING_MODE_PEER with an err_handler), and connect completes
/// once UCX has connected it (ucp_ep_flush_nbx) and the listener has seen
/// it paired. Creates the io_context's UCX context and worker on the first
/// call, as listen.
/// Errors: peer_failed (resolve failed, nobody listens, the listener
/// refused or went, UCX could not be initialised or reach the peer),
/// protocol_violation (what answered is not a blobpipe UCX listener),
/// timed_out (uopt.handshake_timeout passed), invalid_argument (config as
/// for listen; an IPv6 literal `host`; a `host` not on this host from an
/// io_context whose UCX has the loopback interface as its only network
/// device, its first listen having been on 127.0.0.1: docs/ucx.md
/// "Foreign bytes"), closed (the awaiting coroutine was cancelled).
asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> connect(
    asio::any_io_executor ex, std::string host, std::uint16_t port, transport_options opt = {},
    options uopt = {});

/// What one UCX transport has moved so far (for benchmarks and tests).
struct stats {
  std::uint64_t messages_sent = 0;      ///< active messages: writes and bulk writes
  std::uint64_t messages_received = 0;
  /// Bulk payloads received by rendezvous, i.e. fetched by
  /// ucp_am_recv_data_nbx straight into the destination (count, bytes).
  std::uint64_t rndv_payloads = 0;
  std::uint64_t rndv_bytes = 0;
  /// Bulk payloads that arrived eagerly and were copied once from UCX's
  /// receive buffer into the destination (count, bytes).
  std::uint64_t eager_payloads = 0;
  std::uint64_t eager_bytes = 0;
};

/// The counters of `t`. Errors: invalid_argument (`t` is not a UCX transport).
[[nodiscard]] result<stats> get_stats(const transport& t);

/// UCX's description of the endpoint's lanes and transports
/// (ucp_ep_print_info), e.g. to check which of UCX_TLS was selected.
/// Errors: invalid_argument (not a UCX transport), closed (no endpoint).
[[nodiscard]] result<std::string> describe(const transport& t);

}  // namespace blobpipe::ucx
