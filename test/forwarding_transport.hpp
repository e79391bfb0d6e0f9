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
  asio::awaitable<std::error_code> send(const frame_header& h,
                                        std::span<const asio::const_buffer> payload) override {
    return inner_->send(h, payload);
  }
  asio::awaitable<std::tuple<std::error_code, frame_header>> receive_header() override {
    return inner_->receive_header();
  }
  bool header_ready() const noexcept override { return inner_->header_ready(); }
  asio::awaitable<std::error_code> receive_payload(std::span<std::byte> dest) override {
    return inner_->receive_payload(dest);
  }
  std::size_t payload_window() const noexcept override { return inner_->payload_window(); }
  payload_receipt post_payload(std::span<std::byte> dest) override {
    return inner_->post_payload(dest);
  }
  void retire(std::shared_ptr<const void> owner) override { inner_->retire(std::move(owner)); }
  void close() noexcept override { inner_->close(); }
  bool is_open() const noexcept override { return inner_->is_open(); }
  bool accepts_device_memory() const noexcept override { return inner_->accepts_device_memory(); }
  asio::awaitable<std::error_code> send_device(const frame_header& h,
                                               std::span<const asio::const_buffer> payload,
                                               int device) override {
    return inner_->send_device(h, payload, device);
  }
  asio::awaitable<std::error_code> receive_payload_device(std::span<std::byte> dest,
                                                          int device) override {
    return inner_->receive_payload_device(dest, device);
  }

 protected:
  transport& inner() noexcept { return *inner_; }

 private:
  std::unique_ptr<transport> inner_;
};

}  // namespace blobpipe::testing
