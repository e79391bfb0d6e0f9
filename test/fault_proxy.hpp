// test/fault_proxy.hpp — a TCP proxy that breaks the wire on purpose.
//
// Sits between a sender and a consumer (sender -> proxy -> consumer
// listener). The sender-to-consumer direction is read frame by frame (the
// 24-byte header gives the payload length); the other direction (hello,
// acks) is copied as it comes. At a chosen frame of a chosen connection the
// proxy injects one fault:
//
//   reset            RST both sockets before the frame (a frame boundary)
//   reset_mid        forward the header and half the payload, then RST both
//   truncate         forward the header and half the payload, then FIN to
//                    the consumer (a truncated tail, say) and RST the sender
//   stall            stop forwarding (both directions), sockets stay open
//   stall_mid        forward the header and half the payload, then stall
//   duplicate        forward the frame twice
//   swap             forward the next frame first, then this one
//
// and `one_byte_writes` forwards every byte in a write of its own. Real
// sockets, real resets: the endpoints run exactly the code they run
// between machines. Frame 0 of a connection is the sender's hello.
//
//   fault_proxy p(r.ex(), consumer_listener.port(), [](int conn) {
//     return fault_plan{.at_frame = 5, .what = fault::reset};
//   });
//   r.spawn(p.run());   ... connect the sender to p.port() ...   p.stop();
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/protocol/wire.hpp"

namespace blobpipe::testing {

enum class fault { none, reset, reset_mid, truncate, stall, stall_mid, duplicate, swap };

struct fault_plan {
  std::size_t at_frame = std::numeric_limits<std::size_t>::max();
  fault what = fault::none;
  bool one_byte_writes = false;
};

class fault_proxy {
 public:
  using plan_for = std::function<fault_plan(int connection)>;

  fault_proxy(asio::any_io_executor ex, std::uint16_t upstream_port, plan_for plans)
      : ex_(ex), acceptor_(ex, {asio::ip::make_address("127.0.0.1"), 0}),
        upstream_port_(upstream_port), plans_(std::move(plans)) {}

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  int connections() const { return accepted_; }
  /// Frames forwarded sender -> consumer on all connections (faults excluded).
  std::size_t frames_forwarded() const { return *frames_; }
  /// Their types, in order (a clean run's list tells where each tail is).
  const std::vector<frame_type>& trace() const { return *trace_; }

  /// Accepts connections until stop().
  asio::awaitable<void> run() {
    for (;;) {
      auto [ec, client] = co_await acceptor_.async_accept(tuple);
      if (ec || stopped_) co_return;
      auto c = std::make_shared<conn>(ex_, std::move(client), plans_(accepted_++), frames_,
                                      trace_);
      links_.push_back(c);
      asio::co_spawn(ex_, start(c, upstream_port_), asio::detached);
    }
  }

  /// Stops accepting and closes every connection (stalled ones included).
  void stop() {
    stopped_ = true;
    std::error_code ignored;
    acceptor_.close(ignored);
    for (auto& w : links_)
      if (auto c = w.lock()) c->close();
  }

 private:
  static constexpr auto tuple = asio::experimental::as_tuple(asio::use_awaitable);
  using socket = asio::ip::tcp::socket;

  struct conn {
    conn(asio::any_io_executor ex, socket c, fault_plan p, std::shared_ptr<std::size_t> f,
         std::shared_ptr<std::vector<frame_type>> tr)
        : client(std::move(c)), upstream(ex), hold(ex), plan(p), frames(std::move(f)),
          trace(std::move(tr)) {
      hold.expires_at(asio::steady_timer::time_point::max());
    }
    socket client, upstream;
    asio::steady_timer hold;  // a stall waits here until close()
    fault_plan plan;
    std::shared_ptr<std::size_t> frames;
    std::shared_ptr<std::vector<frame_type>> trace;
    bool closed = false;
    bool stalled = false;  // stall: neither direction forwards any more

    void close() {
      if (closed) return;
      closed = true;
      std::error_code ignored;
      client.close(ignored);
      upstream.close(ignored);
      hold.cancel();
    }
    void reset() {  // RST instead of FIN: linger on, timeout 0
      if (closed) return;
      std::error_code ignored;
      client.set_option(asio::socket_base::linger(true, 0), ignored);
      upstream.set_option(asio::socket_base::linger(true, 0), ignored);
      close();
    }
  };

  static asio::awaitable<void> start(std::shared_ptr<conn> c, std::uint16_t port) {
    auto [ec] = co_await c->upstream.async_connect(
        {asio::ip::make_address("127.0.0.1"), port}, tuple);
    if (ec) {
      c->close();
      co_return;
    }
    std::error_code ignored;
    c->upstream.set_option(asio::ip::tcp::no_delay(true), ignored);
    c->client.set_option(asio::ip::tcp::no_delay(true), ignored);
    asio::co_spawn(c->client.get_executor(), pump_back(c), asio::detached);
    co_await pump_frames(c);
  }

  /// consumer -> sender: bytes as they come.
  static asio::awaitable<void> pump_back(std::shared_ptr<conn> c) {
    std::array<std::byte, 4096> buf;
    for (;;) {
      auto [ec, n] = co_await c->upstream.async_read_some(asio::buffer(buf), tuple);
      if (ec) break;
      if (c->stalled) {
        co_await c->hold.async_wait(tuple);
        break;
      }
      auto [wec, w] = co_await asio::async_write(c->client, asio::buffer(buf.data(), n), tuple);
      if (wec) break;
    }
    // A stalled proxy keeps the other socket open; otherwise pass the end on.
    if (!c->stalled) c->close();
  }

  static asio::awaitable<bool> put(conn& c, std::span<const std::byte> bytes) {
    if (!c.plan.one_byte_writes) {
      auto [ec, n] = co_await asio::async_write(c.upstream, asio::buffer(bytes.data(), bytes.size()),
                                                tuple);
      co_return !ec;
    }
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      auto [ec, n] = co_await asio::async_write(c.upstream, asio::buffer(bytes.data() + i, 1), tuple);
      if (ec) co_return false;
    }
    co_return true;
  }

  /// Reads one whole frame (header + payload) from the sender.
  static asio::awaitable<bool> take(conn& c, std::vector<std::byte>& frame) {
    frame.resize(frame_header_size);
    auto [ec, n] = co_await asio::async_read(c.client, asio::buffer(frame), tuple);
    if (ec) co_return false;
    std::uint32_t len;
    std::memcpy(&len, frame.data() + 4, 4);  // little-endian hosts only (tests)
    frame.resize(frame_header_size + len);
    if (len == 0) co_return true;
    auto [pec, pn] = co_await asio::async_read(
        c.client, asio::buffer(frame.data() + frame_header_size, len), tuple);
    co_return !pec;
  }

  /// sender -> consumer, frame by frame, with the plan's fault.
  static asio::awaitable<void> pump_frames(std::shared_ptr<conn> c) {
    std::vector<std::byte> frame, next;
    for (std::size_t k = 0;; ++k) {
      const bool took_frame = co_await take(*c, frame);
      if (!took_frame) break;
      const std::span<const std::byte> whole(frame);
      const auto half = whole.first(frame_header_size + (frame.size() - frame_header_size) / 2);
      if (k == c->plan.at_frame) {
        switch (c->plan.what) {
          case fault::none: break;
          case fault::reset:
            c->reset();
            co_return;
          case fault::reset_mid:
            co_await put(*c, half);
            c->reset();
            co_return;
          case fault::truncate: {
            co_await put(*c, half);
            std::error_code ignored;
            c->upstream.shutdown(socket::shutdown_send, ignored);  // FIN, mid-frame
            c->client.set_option(asio::socket_base::linger(true, 0), ignored);
            c->client.close(ignored);
            co_await c->hold.async_wait(tuple);  // until the consumer hangs up
            c->close();
            co_return;
          }
          case fault::stall_mid:
            co_await put(*c, half);
            [[fallthrough]];
          case fault::stall:
            c->stalled = true;
            co_await c->hold.async_wait(tuple);
            c->close();
            co_return;
          case fault::duplicate: {
            const bool put_once = co_await put(*c, whole);
            if (put_once) ++*c->frames;
            break;  // and once more below
          }
          case fault::swap: {
            const bool took = co_await take(*c, next);
            if (!took) break;
            const bool put_next = co_await put(*c, next);
            if (put_next) ++*c->frames;
            break;  // then this frame below
          }
        }
      }
      const bool forwarded = co_await put(*c, whole);
      if (!forwarded) break;
      ++*c->frames;
      c->trace->push_back(static_cast<frame_type>(frame[0]));
    }
    c->close();
  }

  asio::any_io_executor ex_;
  asio::ip::tcp::acceptor acceptor_;
  std::uint16_t upstream_port_;
  plan_for plans_;
  int accepted_ = 0;
  bool stopped_ = false;
  std::shared_ptr<std::size_t> frames_ = std::make_shared<std::size_t>(0);
  std::shared_ptr<std::vector<frame_type>> trace_ =
      std::make_shared<std::vector<frame_type>>();
  std::vector<std::weak_ptr<conn>> links_;
};

}  // namespace blobpipe::testing
