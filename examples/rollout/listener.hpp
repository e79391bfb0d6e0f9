// rollout/listener.hpp — the trainer's listener and the workers' connect,
// over either transport.
//
// tcp::listener and ucx::listener both implement blobpipe::listener and
// hand out std::unique_ptr<blobpipe::transport>, so the trainer holds a
// blobpipe::listener and never learns which transport it is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/tcp.hpp"
#include "blobpipe/transport/ucx.hpp"

namespace rollout {

/// "host:port", or "[host]:port" for an IPv6 address.
inline std::string host_port(const std::string& host, std::uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

/// The address to listen on for --listen's HOST: an IP address as it is;
/// a name resolved as --connect resolves it, taking its first IPv4 address
/// (or, over tcp, its first address when it has no IPv4 one).
/// Errors: invalid_argument (the name does not resolve).
inline blobpipe::result<std::string> listen_address(asio::any_io_executor ex,
                                                    const std::string& host,
                                                    const std::string& transport) {
  std::error_code ec;
  (void)asio::ip::make_address(host, ec);
  if (!ec) return host;
  asio::ip::tcp::resolver resolver(ex);
  auto found = transport == "ucx" ? resolver.resolve(asio::ip::tcp::v4(), host, "0", ec)
                                  : resolver.resolve(host, "0", ec);
  if (ec || found.empty()) {
    return {blobpipe::errc::invalid_argument,
            "cannot resolve '" + host + "'" + (ec ? ": " + ec.message() : std::string())};
  }
  for (const auto& e : found)
    if (e.endpoint().address().is_v4()) return e.endpoint().address().to_string();
  return found.begin()->endpoint().address().to_string();
}

/// --connect's HOST checked before any worker starts, so that what no
/// retry can fix is said once: an address the transport refuses (over ucx
/// IPv6, ucx::check_host), a name that does not resolve as listen_address
/// resolves it. The workers still connect by name (over tcp each of its
/// addresses is tried).
/// Errors: invalid_argument (either case).
inline blobpipe::result<void> check_connect_host(asio::any_io_executor ex,
                                                 const std::string& host,
                                                 const std::string& transport) {
  if (transport == "ucx") {
    if (auto ok = blobpipe::ucx::check_host(host); !ok) return ok;
  }
  if (auto found = listen_address(ex, host, transport); !found) return found.err();
  return {};
}

/// A listen() result as an owned blobpipe::listener.
template <class Listener>
blobpipe::result<std::unique_ptr<blobpipe::listener>> own(blobpipe::result<Listener> l) {
  if (!l) return l.err();
  return std::unique_ptr<blobpipe::listener>(std::make_unique<Listener>(std::move(*l)));
}

/// Listens on host:port with `transport` ("tcp" or "ucx"); port 0 picks an
/// ephemeral port. Errors: those of tcp::listen / ucx::listen.
inline blobpipe::result<std::unique_ptr<blobpipe::listener>> listen_transport(
    asio::any_io_executor ex, const std::string& transport, std::uint16_t port,
    const std::string& host) {
  if (transport == "ucx") return own(blobpipe::ucx::listen(ex, port, host));
  return own(blobpipe::tcp::listen(ex, port, host));
}

/// Connects to host:port with `transport` ("tcp" or "ucx").
inline asio::awaitable<std::tuple<std::error_code, std::unique_ptr<blobpipe::transport>>>
connect_transport(asio::any_io_executor ex, const std::string& transport, const std::string& host,
                  std::uint16_t port) {
  if (transport == "ucx") co_return co_await blobpipe::ucx::connect(ex, host, port);
  co_return co_await blobpipe::tcp::connect(ex, host, port);
}

}  // namespace rollout
