#include "blobpipe/transport/transport.hpp"

#include <utility>
#include <vector>

#include <asio/error.hpp>

#include "lib/transport/io_error.hpp"

namespace blobpipe {

asio::awaitable<std::error_code> payload_receipt::wait() {
  if (p_) {
    auto p = std::move(p_);  // a second wait() finds nothing
    co_return co_await p->wait();
  }
  if (std::exchange(ended_, false)) co_return done_;
  co_return make_error_code(errc::invalid_argument);
}

asio::awaitable<std::error_code> transport::write_bulk(std::span<const std::byte> header,
                                                       std::span<const asio::const_buffer> payload) {
  std::vector<asio::const_buffer> bufs;
  bufs.reserve(1 + payload.size());
  bufs.emplace_back(header.data(), header.size());
  bufs.insert(bufs.end(), payload.begin(), payload.end());
  co_return co_await write(bufs);
}

namespace {

// transport's default post_read: nothing starts until wait().
class deferred_read final : public payload_receipt::pending {
 public:
  deferred_read(transport& t, std::span<std::byte> dest) : t_(&t), dest_(dest) {}
  // Never waited for: the bytes were never read, so the stream cannot go
  // on (payload_receipt's contract: dropping a receipt closes).
  ~deferred_read() override {
    if (!waited_) t_->close();
  }
  asio::awaitable<std::error_code> wait() override {
    waited_ = true;
    return t_->read_exact(dest_);
  }

 private:
  transport* t_;
  std::span<std::byte> dest_;
  bool waited_ = false;
};

// transport's default post_write_bulk: nothing starts until wait().
class deferred_write final : public payload_receipt::pending {
 public:
  deferred_write(transport& t, std::span<const std::byte> header,
                 std::span<const asio::const_buffer> payload)
      : t_(&t), header_(header), payload_(payload) {}
  // Never waited for: the message was never written, so the stream
  // cannot go on.
  ~deferred_write() override {
    if (!waited_) t_->close();
  }
  asio::awaitable<std::error_code> wait() override {
    waited_ = true;
    return t_->write_bulk(header_, payload_);
  }

 private:
  transport* t_;
  std::span<const std::byte> header_;
  std::span<const asio::const_buffer> payload_;
  bool waited_ = false;
};

}  // namespace

payload_receipt transport::post_read(std::span<std::byte> dest) {
  return payload_receipt(std::make_unique<deferred_read>(*this, dest));
}

payload_receipt transport::post_write_bulk(std::span<const std::byte> header,
                                           std::span<const asio::const_buffer> payload) {
  return payload_receipt(std::make_unique<deferred_write>(*this, header, payload));
}

asio::awaitable<std::error_code> transport::write_bulk_device(std::span<const std::byte>,
                                                              std::span<const asio::const_buffer>,
                                                              int) {
  last_error_ = "write_bulk_device: this transport does not accept device memory";
  co_return make_error_code(errc::invalid_argument);
}

asio::awaitable<std::error_code> transport::read_exact_device(std::span<std::byte>, int) {
  last_error_ = "read_exact_device: this transport does not accept device memory";
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
