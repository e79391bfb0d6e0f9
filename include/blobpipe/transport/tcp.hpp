// blobpipe/transport/tcp.hpp — the TCP transport (Asio sockets).
//
// A byte stream: each write() is one gather write of the caller's buffers
// (no staging copy; the sender combines many frames into one write),
// read_some() takes what has arrived, read_exact() reads straight into the
// caller's destination. Sockets run with TCP_NODELAY (a small control
// frame such as an ack must not wait behind Nagle), and with the kernel's
// buffer autotuning unless transport_options::socket_buffer_bytes asks
// for fixed buffers.
//
//   auto l = blobpipe::tcp::listen(ex, 0).value();     // ephemeral port
//   // consumer side                   // sender side
//   auto [ec, t] = co_await l.accept();  auto [ec, t] = co_await
//                                          blobpipe::tcp::connect(ex, "127.0.0.1", l.port());
//
// Source: docs/wire.md "Transport", "TCP".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe::tcp {

/// A listening socket that yields TCP transports (blobpipe::listener).
class listener final : public blobpipe::listener {
 public:
  listener(listener&&) noexcept;
  listener& operator=(listener&&) noexcept;
  ~listener() override;

  std::uint16_t port() const noexcept override;
  /// The transport has TCP_NODELAY set, its buffers sized by
  /// opt.socket_buffer_bytes, and lives on opt.executor when given (else
  /// on the listener's).
  /// Errors: closed (close() called); the system's EMFILE or ENFILE as is
  /// (compare with std::errc::too_many_files_open, _in_system): out of
  /// descriptors, the connection stays in the backlog until one is freed;
  /// peer_failed (accept failed otherwise).
  asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> accept(
      transport_options opt = {}) override;
  void close() noexcept override;

 private:
  struct impl;
  explicit listener(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
  friend result<listener> listen(asio::any_io_executor, std::uint16_t, const std::string&);
};

/// Listens on `address`:`port` (port 0 picks an ephemeral port).
/// Errors: invalid_argument (address does not parse), peer_failed (bind or
/// listen failed; the message names the OS error).
[[nodiscard]] result<listener> listen(asio::any_io_executor ex, std::uint16_t port,
                                      const std::string& address = "127.0.0.1");

/// Resolves `host` and connects to the first address that accepts. The
/// transport has TCP_NODELAY set and its buffers sized by
/// opt.socket_buffer_bytes.
/// Errors: peer_failed (resolve or connect failed), closed (cancelled).
asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> connect(
    asio::any_io_executor ex, std::string host, std::uint16_t port,
    transport_options opt = {});

}  // namespace blobpipe::tcp
