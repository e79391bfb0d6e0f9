// rollout/listener.hpp — where the trainer listens and the workers connect,
// as endpoint URLs (blobpipe/transport/url.hpp).
//
// --transport NAME with --listen/--connect HOST:PORT become the URL
// NAME://HOST:PORT; blobpipe::listen and blobpipe::connect pick the
// transport from it, so the trainer holds a blobpipe::listener and the
// workers a blobpipe::transport without knowing which.
#pragma once

#include <cstdint>
#include <string>

#include <asio/any_io_executor.hpp>
#include <asio/ip/tcp.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "blobpipe/transport/url.hpp"

namespace rollout {

/// "host:port", or "[host]:port" for an IPv6 address.
inline std::string host_port(const std::string& host, std::uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

/// The URL of HOST:PORT over `transport` ("tcp" or "ucx", as
/// parse_options accepts them): "tcp://127.0.0.1:5555".
inline std::string endpoint_url(const std::string& transport, const std::string& host,
                                std::uint16_t port) {
  return transport + "://" + host_port(host, port);
}

/// --connect's HOST checked before any worker starts, so that what no
/// retry can fix is said once: an address UCX refuses (IPv6,
/// ucx::check_host), a name that does not resolve. The workers still
/// connect by name (over tcp each of its addresses is tried).
/// Errors: invalid_argument (either case).
inline blobpipe::result<void> check_connect_host(asio::any_io_executor ex,
                                                 const std::string& host,
                                                 const std::string& transport) {
  if (transport == "ucx") {
    if (auto ok = blobpipe::ucx::check_host(host); !ok) return ok;
  }
  std::error_code ec;
  asio::ip::tcp::resolver resolver(ex);
  auto found = resolver.resolve(host, "0", ec);
  if (ec || found.empty())
    return {blobpipe::errc::invalid_argument,
            "cannot resolve '" + host + "'" + (ec ? ": " + ec.message() : std::string())};
  return {};
}

}  // namespace rollout
