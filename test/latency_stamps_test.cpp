// Entry timestamps from the server's future (docs/cluster.md "Metrics",
// docs/wire_features.md bit 0): a sender whose steady clock is ahead of the
// server's (another host's) stamps entries the server cannot subtract its
// own clock from. Those stamps are dropped, not recorded as a latency that
// wrapped around to 584 years. The sender here is real; a transport
// decorator moves every entry_begin's stamp an hour into the future, as a
// host whose clock runs ahead would send it.
#define BOOST_TEST_MODULE latency_stamps_test
#include <boost/test/unit_test.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "test/cluster_fixture.hpp"
#include "test/forwarding_transport.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

std::uint64_t steady_now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Rewrites the 8-byte stamp that begins a stamped entry_begin's payload
/// (frame_flag_timestamp, little-endian) to `stamp`, whatever the writes'
/// sizes. Sends no bulk writes, so every frame passes through write().
class stamp_rewriter : public forwarding_transport {
 public:
  /// `rewritten` counts the stamps replaced; it outlives this transport,
  /// which the sender releases when it shuts down.
  stamp_rewriter(std::unique_ptr<transport> inner, std::uint64_t stamp, int& rewritten)
      : forwarding_transport(std::move(inner)), rewritten_(rewritten) {
    for (int i = 0; i < 8; ++i) stamp_[i] = static_cast<std::byte>(stamp >> (8 * i));
  }
  bool sends_bulk() const noexcept override { return false; }
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    buf_.clear();
    for (const auto& b : bytes) {
      const auto* p = static_cast<const std::byte*>(b.data());
      buf_.insert(buf_.end(), p, p + b.size());
    }
    rewrite(buf_);
    std::array<asio::const_buffer, 1> one{asio::buffer(buf_.data(), buf_.size())};
    co_return co_await forwarding_transport::write(one);
  }

 private:
  void rewrite(std::span<std::byte> b) {
    std::size_t at = 0;
    while (at < b.size()) {
      if (payload_left_ != 0) {
        if (stamp_at_ < 8) {
          b[at] = stamp_[stamp_at_++];
          if (stamp_at_ == 8) ++rewritten_;
          --payload_left_;
          ++at;
          continue;
        }
        const std::size_t n = std::min<std::uint64_t>(payload_left_, b.size() - at);
        payload_left_ -= n;
        at += n;
        continue;
      }
      head_[have_++] = b[at++];
      if (have_ < frame_header_size) continue;
      have_ = 0;
      auto h = decode_frame_header(head_, ~std::uint32_t{0});
      BOOST_TEST_REQUIRE(h.has_value(), "the sender's stream is not frames");
      payload_left_ = h->length;
      const bool stamped = h->type == frame_type::entry_begin && (h->flags & frame_flag_timestamp);
      stamp_at_ = stamped ? 0 : 8;
    }
  }

  int& rewritten_;
  std::array<std::byte, 8> stamp_{};
  std::array<std::byte, frame_header_size> head_{};
  std::size_t have_ = 0;
  std::uint64_t payload_left_ = 0;
  std::size_t stamp_at_ = 8;  // 8: not in a stamp
  std::vector<std::byte> buf_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(stamps_from_the_servers_future_are_not_recorded_as_latency) {
  runner r;
  auto srv = server::listen(r.ex(), "inproc://latency-stamps-future").value();
  std::vector<seen> got;
  r.spawn(collect_into(srv, 1, got));
  int rewritten = 0;
  auto one_sender = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [cec, t] = co_await blobpipe::connect(ex, srv.url());
    BOOST_TEST_REQUIRE(!cec, cec.message());
    auto w = std::make_unique<stamp_rewriter>(std::move(t),
                                              steady_now_ns() + 3600ull * 1'000'000'000ull,
                                              rewritten);
    auto [sec, s] = co_await sender::start(std::move(w), {});
    BOOST_TEST_REQUIRE(!sec, sec.message());
    BLOBPIPE_CO_CHECK(stream_blobs(s, {.who = 3, .blobs = 2, .entries = 3, .bytes = 500, .group = {}}));
    BLOBPIPE_CO_CHECK(s.shutdown());
  };
  r.spawn(one_sender());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(all_bytes_ok(got), "an entry's bytes or key were not its own");
  BOOST_TEST(rewritten == 6, "entries stamped (the sender stamps by default)");
  const auto st = srv.stats();
  BOOST_TEST(st.total.entries == 6u);
  BOOST_TEST(st.total.latency.count() == 0u,
             "a stamp from the server's future was recorded as a latency, the largest "
                 << st.total.latency.max() << " ns");
}
