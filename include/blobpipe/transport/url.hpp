// blobpipe/transport/url.hpp — endpoints named by URL.
//
// One string picks the transport and the address, so a program (or its
// command line) names where to listen and where to connect without knowing
// which transport that is:
//
//   tcp://HOST:PORT      TCP (blobpipe/transport/tcp.hpp)
//   ucx://HOST:PORT      UCX (blobpipe/transport/ucx.hpp; IPv4 only)
//   inproc://NAME        the in-process transport (loopback.hpp): a listener
//                        registered under NAME in this process
//
// HOST is a name, an IPv4 address, or an IPv6 address in brackets
// ([::1]). PORT 0, when listening, picks a free port: the listener reports
// it (port(), url()).
//
//   auto l = blobpipe::listen(ex, "tcp://127.0.0.1:0").value();
//   std::cout << l->url();                                // tcp://127.0.0.1:40123
//   auto [ec, t] = co_await l->accept();                  // consumer side
//   auto [ec2, t2] = co_await blobpipe::connect(ex, l->url());   // sender side
//   auto reconnect = blobpipe::connector(ex, l->url()).value();  // a connect_fn
//
// A malformed URL or an unknown scheme is invalid_argument, with a message
// that names the part (scheme, host, port, name, or what follows them).
// Source: RFC 3986 authority syntax (the subset above).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe {

enum class url_scheme { tcp, ucx, inproc };

/// "tcp", "ucx" or "inproc".
const char* scheme_name(url_scheme s) noexcept;

/// A parsed endpoint URL.
struct endpoint_url {
  url_scheme scheme = url_scheme::tcp;
  /// tcp, ucx: a host name or an IP literal (IPv6 without its brackets).
  /// inproc: the name.
  std::string host;
  std::uint16_t port = 0;  ///< tcp, ucx; 0 for inproc
  /// The URL again, canonical ("tcp://[::1]:5555", "inproc://trainer-0").
  std::string str() const;
  friend bool operator==(const endpoint_url&, const endpoint_url&) = default;
};

/// Parses `url`. Errors: invalid_argument, the message naming the part:
/// no "://", an unknown scheme, an empty or malformed host (a bracket
/// without an IPv6 address, a character no host name has), a missing,
/// non-numeric or out-of-range port, an inproc name that is empty or holds
/// a character outside [A-Za-z0-9._-], or anything after the port or name
/// (a path, a query).
[[nodiscard]] result<endpoint_url> parse_url(std::string_view url);

/// A listener made from a URL (blobpipe::listener), knowing its own URL.
class url_listener final : public listener {
 public:
  url_listener(std::unique_ptr<listener> inner, endpoint_url bound);
  ~url_listener() override;

  /// The bound port (after listening on port 0: the one picked); 0 for inproc.
  std::uint16_t port() const noexcept override;
  /// The URL a peer connects to: the host as listened on (a name resolved
  /// to its address) and the bound port.
  const std::string& url() const noexcept { return url_; }
  const endpoint_url& endpoint() const noexcept { return bound_; }
  /// Every transport has peer_address() set. Errors: those of the
  /// transport's listener (closed after close()).
  asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> accept(
      transport_options opt = {}) override;
  void close() noexcept override;

 private:
  std::unique_ptr<listener> inner_;
  endpoint_url bound_;
  std::string url_;
};

/// Listens at `url`. A host name is resolved (its first IPv4 address; over
/// tcp its first address when it has none); tcp://0.0.0.0:PORT listens on
/// every interface. inproc://NAME registers NAME in this process until the
/// listener is closed or destroyed; accepted transports live on `ex`.
/// Errors: invalid_argument (parse_url's; a name that does not resolve;
/// ucx and an IPv6 address), peer_failed (the port or inproc name is in
/// use, or UCX could not start; the message says which).
[[nodiscard]] result<std::unique_ptr<url_listener>> listen(asio::any_io_executor ex,
                                                           std::string_view url);

/// Connects to `url`; the transport lives on `ex` and has peer_address()
/// set. inproc: completes at once when a listener has the name (the
/// connection waits in its backlog until accepted).
/// Errors: invalid_argument (the URL does not parse, port 0; parse_url or
/// connector() give the message), peer_failed (nobody listens there, the
/// name does not resolve), and those of tcp::connect / ucx::connect.
asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> connect_url(
    asio::any_io_executor ex, std::string url, transport_options opt = {});

/// connect_url(ex, url, opt). A template only so that it never takes part
/// in Asio's execution::connect lookup: that customisation point finds
/// `connect` by argument-dependent lookup, so a non-template
/// blobpipe::connect(any_io_executor, ...) would be tried with any
/// blobpipe type as the executor, and GCC 12 reports the recursive
/// executor check that follows as an error.
template <class Executor>
asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> connect(
    const Executor& ex, std::string url, transport_options opt = {}) {
  return connect_url(asio::any_io_executor(ex), std::move(url), opt);
}

/// What no connection attempt to `url` can fix, checked once before any:
/// the URL parses with a port to connect to (not 0), the host is one the
/// scheme can use (ucx: no IPv6 literal, ucx::check_host) and it resolves
/// (tcp, ucx; this blocks while the name is looked up). Returns the
/// parsed URL. Errors: invalid_argument, the message saying which
/// ("connect to URL: cannot resolve 'HOST': ...", or parse_url's).
[[nodiscard]] result<endpoint_url> check_connect_url(asio::any_io_executor ex,
                                                     std::string_view url);

/// What sender::start(connect_fn) takes (blobpipe/pipeline/producer.hpp):
/// makes one connection each call.
using connect_function =
    std::function<asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>>()>;

/// A connect function for `url`, parsed once here so that a bad URL is
/// reported now, with its message, rather than at each attempt.
/// Errors: invalid_argument (as parse_url; port 0).
[[nodiscard]] result<connect_function> connector(asio::any_io_executor ex, std::string_view url,
                                                 transport_options opt = {});

}  // namespace blobpipe
