// TCP transport (docs/wire.md "Transport"): a byte stream. One gather write per
// write() (the sender combines many frames into one), reads of whatever has
// arrived, and exact reads straight into the caller's destination.
#include "blobpipe/transport/tcp.hpp"

#include <array>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <limits>
#include <vector>

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "lib/transport/acceptor.hpp"
#include "lib/transport/io_error.hpp"

namespace blobpipe::tcp {
namespace {

constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

/// Completion condition for whole writes and exact reads: until done or
/// failed, with no limit per system call. Asio's own (transfer_all) hands
/// the socket at most 64 KiB per sendmsg/recvmsg, which made a 16 MiB
/// entry 256 system calls and 256 reactor round trips on each side
/// (docs/performance.md "Large entries").
constexpr auto all_at_once = [](const std::error_code& ec, std::size_t) -> std::size_t {
  return ec ? 0 : std::size_t{1} << 30;
};

class tcp_transport final : public transport {
 public:
  tcp_transport(asio::ip::tcp::socket s) : sock_(std::move(s)) {}
  ~tcp_transport() override { close(); }

  asio::any_io_executor get_executor() const override {
    return const_cast<asio::ip::tcp::socket&>(sock_).get_executor();
  }

  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    if (closed_) co_return closed_error();
    auto [ec, n] = co_await asio::async_write(sock_, bytes, all_at_once, use_tuple);
    if (ec) co_return fail(ec, "write");  // a partial write poisons the stream
    co_return std::error_code{};
  }

  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    if (closed_) co_return std::tuple{closed_error(), read_result{}};
    auto [ec, n] = co_await sock_.async_read_some(asio::buffer(buf.data(), buf.size()), use_tuple);
    if (ec) co_return std::tuple{fail(ec, "read"), read_result{}};
    co_return std::tuple{std::error_code{}, read_result{n, 0}};
  }

  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) override {
    if (closed_) co_return closed_error();
    auto [ec, n] =
        co_await asio::async_read(sock_, asio::buffer(dest.data(), dest.size()), all_at_once, use_tuple);
    if (ec) co_return fail(ec, "read");
    co_return std::error_code{};
  }

  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    std::error_code ignored;
    sock_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
  }

  bool is_open() const noexcept override { return !closed_ && !peer_gone_; }

 private:
  std::error_code fail(std::error_code io, const char* what) {
    // Once the peer is known gone, every operation reports that, not
    // `closed`: closing the socket here is not the user closing it (a
    // read pending while a write hit the reset would say `closed`).
    if (peer_gone_) return peer_error_;
    auto ec = detail::map_io_error(io, closed_);
    if (!closed_) {
      last_error_ = std::string(what) + ": " + io.message();
      peer_gone_ = true;
      peer_error_ = ec;
      close();
    }
    return ec;
  }

  /// What an operation on a closed transport reports.
  std::error_code closed_error() const {
    return peer_gone_ ? peer_error_ : make_error_code(errc::closed);
  }

  asio::ip::tcp::socket sock_;
  bool closed_ = false;
  bool peer_gone_ = false;
  std::error_code peer_error_;  // peer_closed or peer_failed, once peer_gone_
};

/// The system's largest SO_SNDBUF and SO_RCVBUF an unprivileged socket
/// may ask for (net.core.wmem_max, rmem_max), bytes; 0 where unreadable.
struct buffer_limits {
  std::uint64_t send = 0;
  std::uint64_t receive = 0;
};

std::uint64_t read_sysctl(const char* path) {
  std::ifstream in(path);
  std::uint64_t v = 0;
  return (in >> v) ? v : 0;
}

const buffer_limits& system_buffer_limits() {
  static const buffer_limits limits{read_sysctl("/proc/sys/net/core/wmem_max"),
                                    read_sysctl("/proc/sys/net/core/rmem_max")};
  return limits;
}

/// Asks for `bytes` of send and receive buffer where the system grants it
/// whole (transport_options::socket_buffer_bytes); leaves autotuning at 0
/// and otherwise. Each direction is decided alone.
void size_buffers(asio::ip::tcp::socket& s, std::uint32_t bytes) {
  if (bytes == 0) return;
  if (bytes > static_cast<std::uint32_t>(std::numeric_limits<int>::max())) return;
  const auto& max = system_buffer_limits();
  const int size = static_cast<int>(bytes);
  std::error_code ignored;
  if (bytes <= max.send) s.set_option(asio::socket_base::send_buffer_size(size), ignored);
  if (bytes <= max.receive) s.set_option(asio::socket_base::receive_buffer_size(size), ignored);
}

std::unique_ptr<transport> wrap(asio::ip::tcp::socket s, const transport_options& opt) {
  std::error_code ignored;
  // Small control frames (ack, tail) must not wait behind Nagle.
  s.set_option(asio::ip::tcp::no_delay(true), ignored);
  size_buffers(s, opt.socket_buffer_bytes);
  std::error_code ec;
  const auto peer = s.remote_endpoint(ec);
  auto t = std::make_unique<tcp_transport>(std::move(s));
  if (!ec) {
    const auto a = peer.address();
    t->set_peer_address("tcp://" + (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) +
                        ":" + std::to_string(peer.port()));
  }
  return t;
}

}  // namespace

struct listener::impl {
  explicit impl(asio::any_io_executor ex) : acceptor(std::move(ex)) {}
  asio::ip::tcp::acceptor acceptor;
  bool closed = false;
};

listener::listener(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
listener::listener(listener&&) noexcept = default;
listener& listener::operator=(listener&&) noexcept = default;
listener::~listener() { close(); }

std::uint16_t listener::port() const noexcept {
  std::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> listener::accept(
    transport_options opt) {
  if (!impl_ || impl_->closed)
    co_return std::tuple{make_error_code(errc::closed), std::unique_ptr<transport>{}};
  // The socket is made on opt.executor (a receive thread's io_context)
  // while this coroutine stays on the acceptor's.
  auto ex = opt.executor ? opt.executor : impl_->acceptor.get_executor();
  auto [ec, sock] = co_await impl_->acceptor.async_accept(ex, use_tuple);
  const bool closed = !impl_ || impl_->closed;
  // Out of descriptors: the caller can free one (a fan-in server closes a
  // connection still in its handshake), so it is told which, as a generic
  // code (Asio's category maps EMFILE to one, but not ENFILE).
  if (ec && !closed && (ec.value() == EMFILE || ec.value() == ENFILE))
    co_return std::tuple{std::make_error_code(ec.value() == EMFILE
                                                  ? std::errc::too_many_files_open
                                                  : std::errc::too_many_files_open_in_system),
                         std::unique_ptr<transport>{}};
  if (ec) co_return std::tuple{detail::map_io_error(ec, closed), std::unique_ptr<transport>{}};
  co_return std::tuple{std::error_code{}, wrap(std::move(sock), opt)};
}

void listener::close() noexcept {
  if (!impl_ || impl_->closed) return;
  impl_->closed = true;
  std::error_code ignored;
  impl_->acceptor.close(ignored);
}

result<listener> listen(asio::any_io_executor ex, std::uint16_t port,
                        const std::string& address) {
  std::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec) return {errc::invalid_argument, "listen: bad address '" + address + "'"};
  auto p = std::make_unique<listener::impl>(std::move(ex));
  ec = detail::open_acceptor(p->acceptor, asio::ip::tcp::endpoint(addr, port));
  if (!ec) return listener(std::move(p));
  return {errc::peer_failed, "listen on " + address + ":" + std::to_string(port) + ": " +
                                 ec.message()};
}

asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> connect(
    asio::any_io_executor ex, std::string host, std::uint16_t port, transport_options opt) {
  asio::ip::tcp::resolver resolver(ex);
  auto [rec, endpoints] = co_await resolver.async_resolve(host, std::to_string(port), use_tuple);
  if (rec) co_return std::tuple{make_error_code(errc::peer_failed), std::unique_ptr<transport>{}};
  asio::ip::tcp::socket sock(ex);
  auto [cec, ep] = co_await asio::async_connect(sock, endpoints, use_tuple);
  if (cec) co_return std::tuple{make_error_code(errc::peer_failed), std::unique_ptr<transport>{}};
  co_return std::tuple{std::error_code{}, wrap(std::move(sock), opt)};
}

}  // namespace blobpipe::tcp
