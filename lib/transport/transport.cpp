#include "blobpipe/transport/transport.hpp"

#include <array>
#include <utility>

#include <asio/error.hpp>

#include "lib/transport/io_error.hpp"

namespace blobpipe {

asio::awaitable<std::error_code> send_frame(transport& t, const frame_header& h,
                                            std::span<const std::byte> payload) {
  std::array<asio::const_buffer, 1> bufs{asio::const_buffer(payload.data(), payload.size())};
  co_return co_await t.send(h, std::span<const asio::const_buffer>(bufs.data(),
                                                                   payload.empty() ? 0 : 1));
}

asio::awaitable<std::error_code> payload_receipt::wait() {
  if (p_) {
    auto p = std::move(p_);  // a second wait() finds nothing
    co_return co_await p->wait();
  }
  if (std::exchange(ended_, false)) co_return done_;
  co_return make_error_code(errc::invalid_argument);
}

namespace {

// transport's default post_payload: nothing starts until wait().
class deferred_payload final : public payload_receipt::pending {
 public:
  deferred_payload(transport& t, std::span<std::byte> dest) : t_(&t), dest_(dest) {}
  // Never waited for: the payload was never read, so the stream cannot go
  // on (payload_receipt's contract: dropping a receipt closes).
  ~deferred_payload() override {
    if (!waited_) t_->close();
  }
  asio::awaitable<std::error_code> wait() override {
    waited_ = true;
    return t_->receive_payload(dest_);
  }

 private:
  transport* t_;
  std::span<std::byte> dest_;
  bool waited_ = false;
};

}  // namespace

payload_receipt transport::post_payload(std::span<std::byte> dest) {
  return payload_receipt(std::make_unique<deferred_payload>(*this, dest));
}

asio::awaitable<std::error_code> transport::send_device(const frame_header&,
                                                       std::span<const asio::const_buffer>,
                                                       int) {
  last_error_ = "send_device: this transport does not accept device memory";
  co_return make_error_code(errc::invalid_argument);
}

asio::awaitable<std::error_code> transport::receive_payload_device(std::span<std::byte>, int) {
  last_error_ = "receive_payload_device: this transport does not accept device memory";
  co_return make_error_code(errc::invalid_argument);
}

namespace detail {

std::error_code map_io_error(std::error_code ec, bool closed_by_us) noexcept {
  if (closed_by_us) return make_error_code(errc::closed);
  if (ec == asio::error::eof || ec == asio::error::broken_pipe)
    return make_error_code(errc::peer_closed);
  return make_error_code(errc::peer_failed);
}

}  // namespace detail
}  // namespace blobpipe
