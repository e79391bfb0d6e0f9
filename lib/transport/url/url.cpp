// Endpoints by URL (blobpipe/transport/url.hpp): parsing, and listen /
// connect dispatched to the transport the scheme names.
#include "blobpipe/transport/url.hpp"

#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <charconv>

#include "blobpipe/transport/tcp.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "lib/transport/url/inproc.hpp"

namespace blobpipe {
namespace {

using connect_result = std::tuple<std::error_code, std::unique_ptr<transport>>;

error bad(std::string_view url, const std::string& what) {
  return make_error(errc::invalid_argument, "URL " + quote(url) + ": " + what);
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

/// The first character of `s` that `ok` refuses, or npos.
template <class Ok>
std::size_t first_bad(std::string_view s, Ok ok) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (!ok(s[i])) return i;
  return std::string_view::npos;
}

/// tcp:// and ucx://: "HOST:PORT" or "[IPv6]:PORT", nothing after.
result<endpoint_url> parse_authority(std::string_view url, endpoint_url u, std::string_view rest) {
  std::string_view host, after;
  if (rest.starts_with('[')) {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) return bad(url, "host: '[' without ']'");
    host = rest.substr(1, close - 1);
    after = rest.substr(close + 1);
    std::error_code ec;
    (void)asio::ip::make_address_v6(std::string(host), ec);
    if (ec)
      return bad(url, "host " + quote("[" + std::string(host) + "]") + " is not an IPv6 address");
  } else {
    const auto end = rest.find_first_of(":/?#");
    host = rest.substr(0, end);
    after = end == std::string_view::npos ? std::string_view{} : rest.substr(end);
    if (host.empty()) {
      if (rest.find(':', 1) != std::string_view::npos && rest.starts_with(':'))
        return bad(url, "an IPv6 host needs brackets ([::1]:PORT)");
      return bad(url, "empty host");
    }
    if (after.starts_with(':') && after.find(':', 1) != std::string_view::npos &&
        after.find_first_of("/?#") > after.find(':', 1))
      return bad(url, "an IPv6 host needs brackets ([::1]:PORT)");
    if (auto i = first_bad(host, is_name_char); i != std::string_view::npos)
      return bad(url, "host " + quote(host) + " has " + quote(host.substr(i, 1)) +
                          " (a name, an IPv4 address, or [IPv6])");
  }
  if (after.empty()) return bad(url, "no port (expected HOST:PORT)");
  if (!after.starts_with(':'))
    return bad(url, "unexpected " + quote(after) + " after the host (expected :PORT)");
  std::string_view port = after.substr(1);
  std::string_view tail;
  if (const auto end = port.find_first_of("/?#"); end != std::string_view::npos) {
    tail = port.substr(end);
    port = port.substr(0, end);
  }
  unsigned value = 0;
  const auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || port.size() > 5 || ec != std::errc{} || p != port.data() + port.size() ||
      value > 65535)
    return bad(url, "port " + quote(port) + " is not a number from 0 to 65535");
  if (!tail.empty()) return bad(url, "unexpected " + quote(tail) + " after the port");
  u.host = std::string(host);
  u.port = static_cast<std::uint16_t>(value);
  return u;
}

/// The address to listen on for `host`: an IP literal as it is; a name
/// resolved, taking its first IPv4 address (over tcp its first address
/// when it has no IPv4 one). Errors: invalid_argument (no such name).
result<std::string> listen_address(asio::any_io_executor ex, const endpoint_url& u) {
  std::error_code ec;
  (void)asio::ip::make_address(u.host, ec);
  if (!ec) return u.host;
  asio::ip::tcp::resolver resolver(ex);
  auto found = u.scheme == url_scheme::ucx ? resolver.resolve(asio::ip::tcp::v4(), u.host, "0", ec)
                                           : resolver.resolve(u.host, "0", ec);
  if (ec || found.empty())
    return {errc::invalid_argument, "listen on " + u.str() + ": cannot resolve " + quote(u.host) +
                                        (ec ? ": " + ec.message() : std::string())};
  for (const auto& e : found)
    if (e.endpoint().address().is_v4()) return e.endpoint().address().to_string();
  return found.begin()->endpoint().address().to_string();
}

template <class Listener>
result<std::unique_ptr<listener>> own(result<Listener> l) {
  if (!l) return l.err();
  return std::unique_ptr<listener>(std::make_unique<Listener>(std::move(*l)));
}

asio::awaitable<connect_result> connect_to(asio::any_io_executor ex, endpoint_url u,
                                           transport_options opt) {
  switch (u.scheme) {
    case url_scheme::inproc:
      co_return detail::inproc_connect(ex, u.host, opt);
    case url_scheme::ucx:
      co_return co_await ucx::connect(ex, u.host, u.port, opt);
    case url_scheme::tcp:
      break;
  }
  co_return co_await tcp::connect(ex, u.host, u.port, opt);
}

/// parse_url, and a port to connect to.
result<endpoint_url> parse_target(std::string_view url) {
  auto u = parse_url(url);
  if (u && u->scheme != url_scheme::inproc && u->port == 0)
    return bad(url, "port 0 (a listener's placeholder) cannot be connected to");
  return u;
}

}  // namespace

const char* scheme_name(url_scheme s) noexcept {
  switch (s) {
    case url_scheme::tcp:
      return "tcp";
    case url_scheme::ucx:
      return "ucx";
    case url_scheme::inproc:
      return "inproc";
  }
  return "unknown";
}

std::string endpoint_url::str() const {
  std::string out = std::string(scheme_name(scheme)) + "://";
  if (scheme == url_scheme::inproc) return out + host;
  const bool v6 = host.find(':') != std::string::npos;
  return out + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

result<endpoint_url> parse_url(std::string_view url) {
  const auto sep = url.find("://");
  if (sep == std::string_view::npos)
    return bad(url, "no scheme (expected tcp://, ucx:// or inproc://)");
  const std::string_view scheme = url.substr(0, sep);
  const std::string_view rest = url.substr(sep + 3);
  endpoint_url u;
  if (scheme == "tcp") {
    u.scheme = url_scheme::tcp;
  } else if (scheme == "ucx") {
    u.scheme = url_scheme::ucx;
  } else if (scheme == "inproc") {
    u.scheme = url_scheme::inproc;
    if (rest.empty()) return bad(url, "empty inproc name");
    if (auto i = first_bad(rest, is_name_char); i != std::string_view::npos)
      return bad(url, "inproc name " + quote(rest) + " has " + quote(rest.substr(i, 1)) +
                          " (allowed: A-Z a-z 0-9 . _ -)");
    u.host = std::string(rest);
    return u;
  } else {
    return bad(url, "unknown scheme " + quote(scheme) + " (expected tcp, ucx or inproc)");
  }
  return parse_authority(url, std::move(u), rest);
}

// ---- url_listener ------------------------------------------------------------

url_listener::url_listener(std::unique_ptr<listener> inner, endpoint_url bound)
    : inner_(std::move(inner)), bound_(std::move(bound)), url_(bound_.str()) {}

url_listener::~url_listener() { close(); }

std::uint16_t url_listener::port() const noexcept { return inner_->port(); }

asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> url_listener::accept(
    transport_options opt) {
  co_return co_await inner_->accept(opt);
}

void url_listener::close() noexcept { inner_->close(); }

result<std::unique_ptr<url_listener>> listen(asio::any_io_executor ex, std::string_view url) {
  auto u = parse_url(url);
  if (!u) return u.err();
  result<std::unique_ptr<listener>> inner = std::unique_ptr<listener>{};
  if (u->scheme == url_scheme::inproc) {
    inner = detail::inproc_listen(ex, u->host);
  } else {
    auto addr = listen_address(ex, *u);
    if (!addr) return addr.err();
    u->host = *addr;
    inner = u->scheme == url_scheme::ucx ? own(ucx::listen(ex, u->port, *addr))
                                         : own(tcp::listen(ex, u->port, *addr));
  }
  if (!inner) return inner.err();
  u->port = (*inner)->port();
  return std::make_unique<url_listener>(std::move(*inner), std::move(*u));
}

asio::awaitable<connect_result> connect_url(asio::any_io_executor ex, std::string url,
                                            transport_options opt) {
  auto u = parse_target(url);
  if (!u) co_return connect_result{u.code(), nullptr};
  co_return co_await connect_to(std::move(ex), std::move(*u), opt);
}

result<endpoint_url> check_connect_url(asio::any_io_executor ex, std::string_view url) {
  auto u = parse_target(url);
  if (!u || u->scheme == url_scheme::inproc) return u;
  if (u->scheme == url_scheme::ucx) {
    if (auto ok = ucx::check_host(u->host); !ok)
      return make_error(errc::invalid_argument, "connect to " + u->str() + ": " + ok.message());
  }
  std::error_code ec;
  asio::ip::tcp::resolver resolver(ex);
  auto found = resolver.resolve(u->host, "0", ec);
  if (ec || found.empty())
    return {errc::invalid_argument, "connect to " + u->str() + ": cannot resolve " +
                                        quote(u->host) + (ec ? ": " + ec.message() : std::string())};
  return u;
}

result<connect_function> connector(asio::any_io_executor ex, std::string_view url,
                                   transport_options opt) {
  auto u = parse_target(url);
  if (!u) return u.err();
  return connect_function(
      [ex = std::move(ex), u = std::move(*u), opt] { return connect_to(ex, u, opt); });
}

}  // namespace blobpipe
