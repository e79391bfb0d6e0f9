// The public UCX transport API (blobpipe/transport/ucx.hpp): listener, listen,
// connect, and the transport object over a connection.
#include "blobpipe/transport/ucx.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <set>

#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "lib/transport/acceptor.hpp"
#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/task_group.hpp"
#include "lib/transport/ucx/connection.hpp"
#include "lib/transport/ucx/devices.hpp"
#include "lib/transport/ucx/rendezvous.hpp"
#include "lib/transport/ucx/runtime.hpp"
#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx {
namespace {

using blobpipe::detail::accept_retry_pause;
using detail::connection;
using blobpipe::detail::pause;
using detail::runtime;

/// "ucx://ip:port" of a TCP endpoint (the rendezvous socket's far end;
/// IPv6 in brackets).
std::string address_url(const asio::ip::tcp::endpoint& e) {
  const auto ip = e.address();
  return "ucx://" + (ip.is_v6() ? "[" + ip.to_string() + "]" : ip.to_string()) + ":" +
         std::to_string(e.port());
}
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

// The transport object: a connection and the runtime it lives on.
class ucx_transport final : public transport {
 public:
  ucx_transport(std::shared_ptr<runtime> rt, std::shared_ptr<connection> c)
      : rt_(std::move(rt)), c_(std::move(c)) {}
  ~ucx_transport() override { c_->close(); }

  asio::any_io_executor get_executor() const override { return rt_->executor(); }

  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    auto ec = co_await c_->send({}, bytes);
    note(ec);
    co_return ec;
  }

  bool sends_bulk() const noexcept override { return true; }

  asio::awaitable<std::error_code> write_bulk(std::span<const std::byte> header,
                                              std::span<const asio::const_buffer> payload) override {
    auto ec = co_await c_->send(header, payload);
    note(ec);
    co_return ec;
  }

  // Bulk messages in flight at once: the rendezvous of the next payloads
  // start while earlier ones are fetched (bench/ucx_bench's frames keep
  // the same window, as ucx_perftest keeps one of sends).
  std::size_t write_window() const noexcept override { return 8; }

  payload_receipt post_write_bulk(std::span<const std::byte> header,
                                  std::span<const asio::const_buffer> payload) override {
    // The receipt first: once the send started, nothing may throw before
    // it is held (dropped, it closes the connection so UCX reads no more).
    auto w = std::make_unique<posted_write>(*this);
    w->start(header, payload);
    return payload_receipt(std::move(w));
  }

  // Each write() is one eager message: beyond this, UCX's eager protocol
  // fragments it anyway and a rendezvous would serve better.
  std::size_t max_write_bytes() const noexcept override { return std::size_t{256} << 10; }

  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    auto r = co_await c_->read_some(buf);
    note(std::get<0>(r));
    co_return r;
  }

  bool readable() const noexcept override { return c_->readable(); }

  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) override {
    auto ec = co_await c_->read_exact(dest);
    note(ec);
    co_return ec;
  }

  // Fetches of rendezvous payloads may overlap without bound: each lands
  // in its own destination, which the caller keeps.
  std::size_t read_window() const noexcept override {
    return std::numeric_limits<std::size_t>::max();
  }

  payload_receipt post_read(std::span<std::byte> dest) override {
    if (!c_->bulk_pending()) return transport::post_read(dest);  // plain bytes: at wait()
    // The receipt first, as in post_write_bulk; one done at once (an eager
    // copy, or a failure) needs none.
    auto r = std::make_unique<posted>(*this);
    if (!r->start(dest)) {
      note(r->error());
      return payload_receipt(r->error());
    }
    return payload_receipt(std::move(r));
  }

  void retire(std::shared_ptr<const void> owner) override { rt_->retire(std::move(owner)); }

  void close() noexcept override { c_->close(); }
  bool is_open() const noexcept override { return c_->is_open(); }

  // CUDA device memory: UCX moves it itself when built with a CUDA module
  // (cuda_copy, cuda_ipc); UCX finds the device from the pointer, so
  // `device` is not needed here.
  bool accepts_device_memory() const noexcept override { return rt_->cuda_memory(); }

  asio::awaitable<std::error_code> write_bulk_device(std::span<const std::byte> header,
                                                     std::span<const asio::const_buffer> payload,
                                                     int device) override {
    if (!rt_->cuda_memory())
      co_return co_await transport::write_bulk_device(header, payload, device);
    auto ec = co_await c_->send(header, payload, UCS_MEMORY_TYPE_CUDA);
    note(ec);
    co_return ec;
  }

  asio::awaitable<std::error_code> read_exact_device(std::span<std::byte> dest,
                                                     int device) override {
    if (!rt_->cuda_memory()) co_return co_await transport::read_exact_device(dest, device);
    auto ec = co_await c_->read_exact(dest, UCS_MEMORY_TYPE_CUDA);
    note(ec);
    co_return ec;
  }

  const connection& conn() const noexcept { return *c_; }

 private:
  // A bulk payload read in flight; the connection outlives it (shared).
  class posted final : public payload_receipt::pending {
   public:
    explicit posted(ucx_transport& t) : t_(&t), c_(t.c_) {}
    ~posted() override { c_->drop_payload(pp_); }
    /// Starts the copy or fetch into `dest`: whether it is still in
    /// flight (else it ended, with error()).
    bool start(std::span<std::byte> dest) {
      pp_ = c_->post_payload(dest);
      return pp_.slot != nullptr;
    }
    std::error_code error() const noexcept { return pp_.ec; }
    asio::awaitable<std::error_code> wait() override {
      auto ec = co_await c_->wait_payload(pp_);
      t_->note(ec);
      co_return ec;
    }
    bool ready() const noexcept override { return c_->payload_ready(pp_); }

   private:
    ucx_transport* t_;
    std::shared_ptr<connection> c_;
    connection::posted_payload pp_;
  };

  class posted_write final : public payload_receipt::pending {
   public:
    explicit posted_write(ucx_transport& t) : t_(&t), c_(t.c_) {}
    ~posted_write() override { c_->drop_send(ps_); }
    void start(std::span<const std::byte> header, std::span<const asio::const_buffer> payload) {
      ps_ = c_->post_send(header, payload);
    }
    asio::awaitable<std::error_code> wait() override {
      auto ec = co_await c_->wait_send(ps_);
      t_->note(ec);
      co_return ec;
    }
    bool ready() const noexcept override { return connection::send_ready(ps_); }

   private:
    ucx_transport* t_;
    std::shared_ptr<connection> c_;
    connection::posted_send ps_;
  };

  void note(std::error_code ec) {
    if (ec && !c_->error_text().empty()) last_error_ = c_->error_text();
  }

  // Runtime first: destroyed last.
  std::shared_ptr<runtime> rt_;
  std::shared_ptr<connection> c_;
};

std::tuple<std::error_code, std::unique_ptr<transport>> failed(errc e) {
  return {make_error_code(e), nullptr};
}

// UCX 1.13 cannot use an IPv6 connection manager address with its tcp
// transport: the accepting side's wireup connects to the peer's tcp
// interface at the IPv6 address, which listens on IPv4 only, is refused,
// and the worker later aborts in ucp_worker_destroy (free(): invalid
// pointer, or an assertion in tcp_sockcm_ep.c). The rendezvous does not
// hand UCX that address, but UCX's tcp lanes still choose their own
// address family (UCX_TCP_AF_PRIO), untried over IPv6; so blobpipe takes
// IPv4 only, a v4-mapped IPv6 address as its IPv4 address. Empty when
// usable; else why not.
std::string ipv4_only(asio::ip::address& a) {
  if (a.is_v4()) return {};
  if (a.to_v6().is_v4_mapped()) {
    a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    return {};
  }
  return "IPv6 address '" + a.to_string() +
         "': UCX 1.13's tcp transport cannot connect over IPv6 (docs/ucx.md); use an IPv4 address";
}

}  // namespace

// ---- listener ----------------------------------------------------------------

// The accept loop takes sockets from the OS as they come and runs each
// one's rendezvous in the background (rendezvous.hpp), so a client's
// connect completes before accept() is called; finished ones wait in
// `backlog`. `pending` counts both (what options::max_pending caps).
struct listener::impl : std::enable_shared_from_this<listener::impl> {
  impl(std::shared_ptr<runtime> r, const options& o)
      : rt(std::move(r)),
        acceptor(rt->executor()),
        ready(rt->executor()),
        tasks(rt->executor()),
        handshake_timeout(o.handshake_timeout),
        max_pending(o.max_pending) {}

  // `self` is a parameter, so the coroutine's frame owns the listener from
  // its creation: one closed before the loop first runs stays alive.
  static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self) {
    impl& l = *self;
    while (!l.closed) {
      auto [ec, sock] = co_await l.acceptor.async_accept(use_tuple);
      if (l.closed) co_return;
      if (ec) {
        // EMFILE and the like: refusing this one must not end the loop,
        // but must not spin either.
        (void)co_await pause(accept_retry_pause);
        continue;
      }
      // Full: the oldest rendezvous still under way (a silent or trickling
      // peer: an honest one takes a round trip or two) gives way first;
      // only when every slot holds a finished one is this one refused.
      if (l.pending >= l.max_pending && !l.reclaim_a_rendezvous()) {
        ++l.counters.over_cap;
        l.last_refusal = "over max_pending (" + std::to_string(l.max_pending) + ")";
        std::error_code ignored;
        sock.close(ignored);
        continue;
      }
      ++l.pending;
      auto a = std::make_shared<detail::rv_attempt>(l.acceptor.get_executor());
      a->sock = std::move(sock);
      if (l.order.size() > 2 * l.max_pending)
        std::erase_if(l.order, [](const auto& w) { return w.expired(); });
      l.order.push_back(a);
      l.tasks.spawn(l.serve(self, a));
    }
  }

  // `self` (this listener) is a parameter for the reason given above.
  asio::awaitable<void> serve([[maybe_unused]] std::shared_ptr<impl> self,
                              std::shared_ptr<detail::rv_attempt> a) {
    auto rt_hold = rt;  // close() lets go of `rt`; this rendezvous may still need it
    attempts.insert(a);
    // The client's address, for transport::peer_address.
    std::error_code peer_ec;
    const auto far = a->sock.remote_endpoint(peer_ec);
    std::string peer = peer_ec ? std::string() : address_url(far);
    a->arm(handshake_timeout);
    auto [ec, c] = co_await detail::serve_rendezvous(rt_hold, a);
    attempts.erase(a);
    if (a->reclaimed) {  // counted out when it was reclaimed
      if (c) c->close();
      co_return;
    }
    if (ec || closed) {
      if (c) c->close();
      --pending;
      if (!closed) {
        ++(ec == errc::timed_out ? counters.timed_out : counters.refused);
        last_refusal = a->why.empty() ? ec.message() : a->why;
      }
      co_return;
    }
    ++counters.connections_ready;
    backlog.push_back(std::move(c));
    backlog_peers.push_back(std::move(peer));
    ready.notify_all();
  }

  // Closes the oldest rendezvous still under way and counts it out.
  // False when none is (every pending one is finished, in `backlog`).
  bool reclaim_a_rendezvous() {
    while (!order.empty()) {
      auto a = order.front().lock();
      order.pop_front();
      if (!a || a->reclaimed || !attempts.count(a)) continue;
      a->reclaimed = true;
      a->why = "closed to make room: max_pending (" + std::to_string(max_pending) +
               ") reached and this rendezvous the oldest unfinished";
      --pending;
      ++counters.reclaimed;
      a->abort(false);
      return true;
    }
    return false;
  }

  void close() noexcept {
    if (closed) return;
    closed = true;
    std::error_code ignored;
    acceptor.close(ignored);
    for (auto& c : backlog) c->close();
    pending -= backlog.size();
    backlog.clear();
    backlog_peers.clear();
    for (const auto& a : std::set(attempts)) a->abort(false);
    ready.notify_all();
    // A closed listener, like a closed acceptor, must not keep the
    // io_context running: let go of the runtime (rendezvous still ending
    // and closing connections hold it themselves until done).
    rt.reset();
  }

  // Runtime first: destroyed last.
  std::shared_ptr<runtime> rt;
  asio::ip::tcp::acceptor acceptor;
  std::uint16_t port = 0;
  std::deque<std::shared_ptr<connection>> backlog;
  std::deque<std::string> backlog_peers;  // peer_address of each, in step
  std::set<std::shared_ptr<detail::rv_attempt>> attempts;
  std::deque<std::weak_ptr<detail::rv_attempt>> order;  // attempts, oldest first
  blobpipe::detail::async_condition ready;
  // The accept loop and each rendezvous (serve). close() ends them by
  // closing what they wait on (the acceptor, abort()), not by cancelling:
  // a rendezvous cancelled inside a UCX wait would leave its request and
  // endpoint to nobody.
  blobpipe::detail::task_group tasks;
  std::chrono::milliseconds handshake_timeout;
  std::size_t max_pending;
  std::size_t pending = 0;
  listener_counters counters;
  std::string last_refusal;
  bool closed = false;
};

listener::listener(std::shared_ptr<impl> p) : impl_(std::move(p)) {}
listener::listener(listener&&) noexcept = default;
listener& listener::operator=(listener&&) noexcept = default;
listener::~listener() { close(); }

std::uint16_t listener::port() const noexcept { return impl_ ? impl_->port : 0; }

listener_counters listener::counters() const noexcept {
  return impl_ ? impl_->counters : listener_counters{};
}

std::string listener::last_refusal() const { return impl_ ? impl_->last_refusal : std::string{}; }

asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> listener::accept(
    transport_options opt) {
  auto p = impl_;  // alive across the wait even if this listener is moved from
  if (!p) co_return failed(errc::closed);
  while (p->backlog.empty() && !p->closed) {
    if (co_await p->ready.wait())
      co_return std::tuple{std::error_code(asio::error::operation_aborted),
                           std::unique_ptr<transport>{}};
  }
  if (p->closed) co_return failed(errc::closed);
  auto c = std::move(p->backlog.front());
  p->backlog.pop_front();
  auto peer = std::move(p->backlog_peers.front());
  p->backlog_peers.pop_front();
  --p->pending;
  c->set_options(opt);
  auto t = std::make_unique<ucx_transport>(p->rt, c);
  t->set_peer_address(std::move(peer));
  co_return std::tuple{std::error_code{}, std::unique_ptr<transport>(std::move(t))};
}

void listener::close() noexcept {
  if (impl_) impl_->close();
}

result<listener> listen(asio::any_io_executor ex, std::uint16_t port, const std::string& address,
                        const options& opt) {
  std::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec) return {errc::invalid_argument, "ucx listen: bad address '" + address + "'"};
  if (auto why = ipv4_only(addr); !why.empty()) return {errc::invalid_argument, "ucx listen: " + why};
  if (opt.max_pending == 0) return {errc::invalid_argument, "ucx listen: max_pending is 0"};
  auto rt = runtime::of(ex, opt, addr.to_v4());
  if (!rt) return rt.err();

  auto p = std::make_shared<listener::impl>(*rt, opt);
  auto& a = p->acceptor;
  ec = blobpipe::detail::open_acceptor(a, asio::ip::tcp::endpoint(addr, port));
  if (ec) {
    std::string why = "ucx listen on " + address + ":" + std::to_string(port);
    if (ec == asio::error::address_in_use) why += ": the port is in use";
    return {errc::peer_failed, why + " (" + ec.message() + ")"};
  }
  p->port = a.local_endpoint(ec).port();
  p->tasks.spawn(listener::impl::accept_loop(p));
  return listener(std::move(p));
}

// ---- connect -------------------------------------------------------------------

result<void> check_host(const std::string& host) {
  std::error_code ec;
  auto literal = asio::ip::make_address(host, ec);
  if (ec) return {};  // a name: connect resolves it to IPv4 addresses
  if (auto why = ipv4_only(literal); !why.empty()) return {errc::invalid_argument, why};
  return {};
}

asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> connect(
    asio::any_io_executor ex, std::string host, std::uint16_t port, transport_options opt,
    options uopt) {
  // An IPv6 literal is refused (check_host); a name resolves to IPv4 only.
  if (!check_host(host)) co_return failed(errc::invalid_argument);
  auto rt = runtime::of(ex, uopt);
  if (!rt)
    co_return failed(rt.code() == make_error_code(errc::invalid_argument) ? errc::invalid_argument
                                                                          : errc::peer_failed);
  auto keep = *rt;  // the runtime lives across the waits below

  asio::ip::tcp::resolver resolver(ex);
  auto [rec, endpoints] =
      co_await resolver.async_resolve(asio::ip::tcp::v4(), host, std::to_string(port), use_tuple);
  if (rec || endpoints.empty()) co_return failed(errc::peer_failed);
  // A runtime whose only network device is the loopback interface (its
  // first listen was on 127.0.0.1) cannot reach another host: UCX's wireup
  // would fail after the rendezvous. Refused now, unless an address is
  // this host's own (0.0.0.0 included: Linux connects it locally).
  if (keep->loopback_only() &&
      std::none_of(endpoints.begin(), endpoints.end(), [](const auto& e) {
        const auto addr = e.endpoint().address().to_v4();
        return addr.is_loopback() || addr.is_unspecified() || !detail::interface_of(addr).empty();
      }))
    co_return failed(errc::invalid_argument);

  auto a = std::make_shared<detail::rv_attempt>(ex);
  a->arm(uopt.handshake_timeout);  // the TCP connect too: a SYN into the void waits minutes
  auto [cec, where] = co_await asio::async_connect(a->sock, endpoints, use_tuple);
  if (cec) co_return failed(a->timed_out ? errc::timed_out : errc::peer_failed);
  std::error_code ignored;
  a->sock.set_option(asio::ip::tcp::no_delay(true), ignored);
  auto [ec, c] = co_await detail::join_rendezvous(keep, a, opt);
  if (ec) co_return std::tuple{ec, std::unique_ptr<transport>{}};
  auto t = std::make_unique<ucx_transport>(keep, c);
  t->set_peer_address(address_url(where));
  co_return std::tuple{std::error_code{}, std::unique_ptr<transport>(std::move(t))};
}

// ---- introspection -------------------------------------------------------------

result<stats> get_stats(const transport& t) {
  auto* u = dynamic_cast<const ucx_transport*>(&t);
  if (!u) return {errc::invalid_argument, "get_stats: not a UCX transport"};
  return u->conn().counters();
}

result<std::string> describe(const transport& t) {
  auto* u = dynamic_cast<const ucx_transport*>(&t);
  if (!u) return {errc::invalid_argument, "describe: not a UCX transport"};
  ucp_ep_h ep = u->conn().endpoint_handle();
  if (!ep) return {errc::closed, "describe: the endpoint is closed"};
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (!f) return {errc::invalid_argument, "describe: open_memstream failed"};
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out(text, size);
  std::free(text);
  return out;
}

}  // namespace blobpipe::ucx
