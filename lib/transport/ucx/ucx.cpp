// The public UCX transport API (blobpipe/ucx.hpp): listener, listen,
// connect, and the transport object over a connection.
#include "blobpipe/transport/ucx.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <string>

#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "lib/transport/async_sync.hpp"
#include "lib/transport/ucx/connection.hpp"
#include "lib/transport/ucx/runtime.hpp"
#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx {
namespace {

using detail::connection;
using detail::runtime;

/// "ucx://ip:port" of a socket address (IPv4 or IPv6); "" for another family.
std::string address_url(const sockaddr_storage& a) {
  char ip[INET6_ADDRSTRLEN] = {};
  std::uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, ip, sizeof ip);
    port = ntohs(v4.sin_port);
    return "ucx://" + std::string(ip) + ":" + std::to_string(port);
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, ip, sizeof ip);
    port = ntohs(v6.sin6_port);
    return "ucx://[" + std::string(ip) + "]:" + std::to_string(port);
  }
  return {};
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
    auto pp = c_->post_payload(dest);
    if (!pp.slot) {
      note(pp.ec);
      return payload_receipt(pp.ec);
    }
    return payload_receipt(std::make_unique<posted>(*this, std::move(pp)));
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
    posted(ucx_transport& t, connection::posted_payload pp)
        : t_(&t), c_(t.c_), pp_(std::move(pp)) {}
    ~posted() override { c_->drop_payload(pp_); }
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

// ucp_ep_params for the parts both sides share: peer error mode, so a
// failing peer is reported (err_handler) rather than left hanging.
ucp_ep_params_t ep_params(connection& c) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler = c.err_handler();
  return p;
}

// UCX 1.13 cannot use an IPv6 connection manager address with its tcp
// transport: the accepting side's wireup connects to the peer's tcp
// interface at the IPv6 address, which listens on IPv4 only, is refused,
// and the worker later aborts in ucp_worker_destroy (free(): invalid
// pointer, or an assertion in tcp_sockcm_ep.c). So blobpipe takes IPv4
// only, a v4-mapped IPv6 address as its IPv4 address. Empty when usable;
// else why not.
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

// Closing a listener: UCX 1.13 must not destroy a ucp_listener while a
// connection to it is half accepted (the TCP connection manager took the
// socket but has not yet read the client's request): the request then
// arrives on UCX's async thread for the freed listener and the process
// dies in ucp_cm_server_conn_request_cb (seen when more clients connect
// than a trainer accepts before it closes its listener). So close() stops
// accepting at once, but the ucp_listener lingers, rejecting every request
// that still comes (ucp_listener_reject: the client's connect fails), and
// is destroyed only after close_linger without one. Like a closing
// connection, the lingering listener keeps the runtime (and so the
// io_context's run()) alive that long.
struct listener::impl : std::enable_shared_from_this<listener::impl> {
  explicit impl(std::shared_ptr<runtime> r)
      : rt(std::move(r)), ready(rt->executor()), linger(rt->executor()) {}
  // Not closed (never owned by a listener object): nothing can be half
  // accepted that anyone waits for; the handle goes with the runtime.
  ~impl() = default;

  // Inside ucp_worker_progress: only queue the request; endpoints are
  // created (or, once closed, the requests rejected) from the executor's
  // queue.
  static void on_conn_request(ucp_conn_request_h req, void* arg) {
    auto* self = static_cast<impl*>(arg);
    self->requests.push_back(req);
    asio::post(self->rt->executor(), [weak = self->weak_from_this()] {
      if (auto s = weak.lock()) s->take_requests();
    });
  }

  void take_requests() {
    if (closed) {
      reject_requests();
      return;
    }
    while (!requests.empty()) {
      ucp_conn_request_h req = requests.front();
      requests.pop_front();
      // The client's address, for transport::peer_address (before the
      // request is consumed by ucp_ep_create).
      ucp_conn_request_attr_t attr{};
      attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      std::string peer;
      if (ucp_conn_request_query(req, &attr) == UCS_OK) peer = address_url(attr.client_address);
      auto c = connection::make(*rt, {});
      auto p = ep_params(*c);
      p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
      p.conn_request = req;
      ucp_ep_h ep = nullptr;
      if (ucp_ep_create(rt->worker(), &p, &ep) != UCS_OK) continue;  // the client sees it fail
      c->attach(ep);
      backlog.push_back(std::move(c));
      backlog_peers.push_back(std::move(peer));
      ready.notify_all();
    }
    rt->kick();
  }

  // Rejects what is queued and (re)starts the linger: the ucp_listener
  // goes once close_linger passes without a request.
  void reject_requests() {
    if (!handle.get()) return;  // gone already; UCX queues nothing for it any more
    for (auto req : requests) ucp_listener_reject(handle.get(), req);
    requests.clear();
    rt->kick();
    linger.expires_after(detail::close_linger);
    linger.async_wait([self = shared_from_this()](std::error_code ec) {
      if (ec) return;  // restarted by a later request (or shut down)
      // A request queued just now (its take_requests not run yet) is
      // rejected first, and the linger starts over.
      if (!self->requests.empty()) return self->reject_requests();
      self->handle.reset();
      // A closed listener, like a closed acceptor, must not keep the
      // io_context running once it is gone: let go of the runtime
      // (closing connections keep it alive themselves until done).
      self->rt.reset();
    });
  }

  void close() noexcept {
    if (closed) return;
    closed = true;
    for (auto& c : backlog) c->close();
    backlog.clear();
    backlog_peers.clear();
    ready.notify_all();
    reject_requests();
  }

  // Runtime first: destroyed last.
  std::shared_ptr<runtime> rt;
  detail::listener_handle handle;
  std::uint16_t port = 0;
  std::deque<ucp_conn_request_h> requests;
  std::deque<std::shared_ptr<connection>> backlog;
  std::deque<std::string> backlog_peers;  // peer_address of each, in step
  blobpipe::detail::async_condition ready;
  asio::steady_timer linger;  // see "Closing a listener"
  bool closed = false;
};

listener::listener(std::shared_ptr<impl> p) : impl_(std::move(p)) {}
listener::listener(listener&&) noexcept = default;
listener& listener::operator=(listener&&) noexcept = default;
listener::~listener() { close(); }

std::uint16_t listener::port() const noexcept { return impl_ ? impl_->port : 0; }

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
  auto rt = runtime::of(ex, opt);
  if (!rt) return rt.err();
  asio::ip::tcp::endpoint ep(addr, port);

  auto p = std::make_shared<listener::impl>(*rt);
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(ep.data());
  lp.sockaddr.addrlen = static_cast<socklen_t>(ep.size());
  lp.conn_handler.cb = &listener::impl::on_conn_request;
  lp.conn_handler.arg = p.get();
  ucp_listener_h h = nullptr;
  if (auto st = ucp_listener_create((*rt)->worker(), &lp, &h); st != UCS_OK) {
    std::string where = "ucx listen on " + address + ":" + std::to_string(port);
    // UCX reports a failed bind (EADDRINUSE) as "Device is busy".
    if (st == UCS_ERR_BUSY) where += ": the port is in use";
    return {errc::peer_failed, detail::status_message(where.c_str(), st)};
  }
  p->handle = detail::listener_handle(h);

  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (auto st = ucp_listener_query(h, &attr); st != UCS_OK)
    return {errc::peer_failed, detail::status_message("ucp_listener_query", st)};
  if (attr.sockaddr.ss_family == AF_INET)
    p->port = ntohs(reinterpret_cast<const sockaddr_in&>(attr.sockaddr).sin_port);
  else
    p->port = ntohs(reinterpret_cast<const sockaddr_in6&>(attr.sockaddr).sin6_port);
  (*rt)->kick();
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
  asio::ip::tcp::endpoint target = endpoints.begin()->endpoint();

  auto c = connection::make(*keep, opt);
  auto p = ep_params(*c);
  p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(target.data());
  p.sockaddr.addrlen = static_cast<socklen_t>(target.size());
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(keep->worker(), &p, &ep) != UCS_OK) co_return failed(errc::peer_failed);
  c->attach(ep);
  auto t = std::make_unique<ucx_transport>(keep, c);
  {
    sockaddr_storage a{};
    std::memcpy(&a, target.data(), std::min<std::size_t>(target.size(), sizeof a));
    t->set_peer_address(address_url(a));
  }
  if (auto ec = co_await c->wait_connected())
    co_return std::tuple{ec, std::unique_ptr<transport>{}};
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
