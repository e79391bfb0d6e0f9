// test/forwarding_transport.hpp — a transport that hands every call to the
// transport it wraps. Test decorators (a connection that dies after N
// frames, one that claims device memory) derive from it and override only
// what they change, so a virtual added to blobpipe::transport reaches the
// wrapped transport under every decorator.
#pragma once

#include <memory>
#include <utility>

#include "blobpipe/transport/transport.hpp"

namespace blobpipe::testing {

class forwarding_transport : public transport {
 public:
  explicit forwarding_transport(std::unique_ptr<transport> inner) : inner_(std::move(inner)) {}

  asio::any_io_executor get_executor() const override { return inner_->get_executor(); }
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    return inner_->write(bytes);
  }
  bool sends_bulk() const noexcept override { return inner_->sends_bulk(); }
  asio::awaitable<std::error_code> write_bulk(std::span<const std::byte> header,
                                              std::span<const asio::const_buffer> payload) override {
    return inner_->write_bulk(header, payload);
  }
  // Straight to the inner transport, like post_read: a decorator that
  // overrides write_bulk() must override post_write_bulk() too (or return
  // transport::post_write_bulk(), which calls write_bulk() in wait(), and
  // a write_window() of 1).
  std::size_t write_window() const noexcept override { return inner_->write_window(); }
  payload_receipt post_write_bulk(std::span<const std::byte> header,
                                  std::span<const asio::const_buffer> payload) override {
    return inner_->post_write_bulk(header, payload);
  }
  std::size_t max_write_bytes() const noexcept override { return inner_->max_write_bytes(); }
  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    return inner_->read_some(buf);
  }
  bool readable() const noexcept override { return inner_->readable(); }
  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) override {
    return inner_->read_exact(dest);
  }
  std::size_t read_window() const noexcept override { return inner_->read_window(); }
  payload_receipt post_read(std::span<std::byte> dest) override { return inner_->post_read(dest); }
  void retire(std::shared_ptr<const void> owner) override { inner_->retire(std::move(owner)); }
  void close() noexcept override { inner_->close(); }
  bool is_open() const noexcept override { return inner_->is_open(); }
  bool accepts_device_memory() const noexcept override { return inner_->accepts_device_memory(); }
  asio::awaitable<std::error_code> write_bulk_device(std::span<const std::byte> header,
                                                     std::span<const asio::const_buffer> payload,
                                                     int device) override {
    return inner_->write_bulk_device(header, payload, device);
  }
  asio::awaitable<std::error_code> read_exact_device(std::span<std::byte> dest,
                                                     int device) override {
    return inner_->read_exact_device(dest, device);
  }

 protected:
  transport& inner() noexcept { return *inner_; }

 private:
  std::unique_ptr<transport> inner_;
};

}  // namespace blobpipe::testing
