// rollout/listener.hpp — the trainer's listener over either transport.
//
// tcp::listener and ucx::listener have the same shape (port, accept,
// close) and both hand out std::unique_ptr<blobpipe::transport>, so the
// trainer holds one of them and never learns which.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>
#include <variant>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/tcp.hpp"
#include "blobpipe/ucx.hpp"

namespace rollout {

class any_listener {
 public:
  /// Listens on host:port with `transport` ("tcp" or "ucx"); port 0 picks
  /// an ephemeral port. Errors: those of tcp::listen / ucx::listen.
  static blobpipe::result<any_listener> listen(asio::any_io_executor ex, const std::string& transport,
                                               std::uint16_t port, const std::string& host) {
    if (transport == "ucx") {
      auto l = blobpipe::ucx::listen(ex, port, host);
      if (!l) return l.err();
      return any_listener(std::move(*l));
    }
    auto l = blobpipe::tcp::listen(ex, port, host);
    if (!l) return l.err();
    return any_listener(std::move(*l));
  }

  std::uint16_t port() const noexcept {
    return std::visit([](const auto& l) { return l.port(); }, l_);
  }
  asio::awaitable<std::tuple<std::error_code, std::unique_ptr<blobpipe::transport>>> accept() {
    if (auto* t = std::get_if<blobpipe::tcp::listener>(&l_)) co_return co_await t->accept();
    co_return co_await std::get<blobpipe::ucx::listener>(l_).accept();
  }
  void close() noexcept {
    std::visit([](auto& l) { l.close(); }, l_);
  }

 private:
  template <class L>
  explicit any_listener(L l) : l_(std::move(l)) {}
  std::variant<blobpipe::tcp::listener, blobpipe::ucx::listener> l_;
};

/// Connects to host:port with `transport` ("tcp" or "ucx").
inline asio::awaitable<std::tuple<std::error_code, std::unique_ptr<blobpipe::transport>>>
connect_transport(asio::any_io_executor ex, const std::string& transport, const std::string& host,
                  std::uint16_t port) {
  if (transport == "ucx") co_return co_await blobpipe::ucx::connect(ex, host, port);
  co_return co_await blobpipe::tcp::connect(ex, host, port);
}

}  // namespace rollout
