// lib/transport/acceptor.hpp — opening a listening TCP socket, shared by
// the TCP transport and the UCX transport's rendezvous listener (internal).
#pragma once

#include <system_error>

#include <asio/ip/tcp.hpp>

namespace blobpipe::detail {

/// Opens `a` on `ep`, binds and listens (backlog: the system's maximum).
/// SO_REUSEADDR is set, as Asio's acceptor constructor does: a port whose
/// old connections sit in TIME_WAIT (a restarted trainer) binds; a live
/// listener's does not. Returns the first error (asio::error::
/// address_in_use, access_denied, ...); `a` may be open then.
inline std::error_code open_acceptor(asio::ip::tcp::acceptor& a,
                                     const asio::ip::tcp::endpoint& ep) {
  std::error_code ec;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  return ec;
}

}  // namespace blobpipe::detail
