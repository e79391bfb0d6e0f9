// Frame transports (blobpipe/transport.hpp, loopback.hpp, tcp.hpp, ucx.hpp):
// the same behaviour on every link of all_links() (loopback, TCP and the
// five UCX configurations): frames whole and in order, payload straight
// into the destination, FIFO fairness between senders, close wakes
// everyone. UCX-only cases are in ucx_transport_test.cpp.
#define BOOST_TEST_MODULE transport
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <deque>

#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {
const std::vector<link_kind> both = all_links();
}

BOOST_AUTO_TEST_CASE(transport_delivers_scatter_gather_frame_into_destination) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      const std::string p1 = "hello, ", p2 = "frames";
      std::vector<std::byte> dest(p1.size() + p2.size());
      frame_header got;
      auto send = [&]() -> asio::awaitable<void> {
        const std::array<asio::const_buffer, 2> bufs{asio::buffer(p1), asio::buffer(p2)};
        frame_header h{.type = frame_type::data, .length = 13, .blob_id = 3, .arg = 64};
        BLOBPIPE_CO_CHECK(a->send(h, bufs));
        BLOBPIPE_CO_CHECK(send_frame(*a, {.type = frame_type::ack, .arg = 5}, {}));
      };
      auto receive = [&]() -> asio::awaitable<void> {
        auto [ec, h] = co_await b->receive_header();
        BOOST_TEST(!ec);
        got = h;
        BLOBPIPE_CO_CHECK(b->receive_payload(dest));
        auto [ec2, h2] = co_await b->receive_header();
        BOOST_TEST(!ec2);
        BOOST_TEST((h2.type == frame_type::ack && h2.arg == 5u && h2.length == 0u));
      };
      r.spawn(send());
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((got == frame_header{.type = frame_type::data, .length = 13, .blob_id = 3,
                                      .arg = 64}));
      BOOST_TEST(std::memcmp(dest.data(), "hello, frames", 13) == 0);
    }
  }
}

// post_payload: a receipt completes as receive_payload does. Where the
// transport allows it (payload_window() > 1: UCX) several frames' payloads
// are posted before the first is waited for, each landing in its own
// buffer; elsewhere each is waited for before the next header. Empty and
// already-waited receipts are invalid_argument.
BOOST_AUTO_TEST_CASE(posted_payloads_land_intact_and_overlap_where_allowed) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      constexpr int frames = 6;
      std::vector<std::vector<std::byte>> sent(frames), got(frames);
      for (int i = 0; i < frames; ++i) {
        sent[i].resize(300000 + static_cast<std::size_t>(i) * 1000);  // rendezvous over UCX
        for (std::size_t j = 0; j < sent[i].size(); ++j)
          sent[i][j] = static_cast<std::byte>((j * 7 + static_cast<std::size_t>(i)) & 0xff);
      }
      const std::size_t window = std::min<std::size_t>(b->payload_window(), 4);
      std::size_t most_outstanding = 0;
      std::error_code empty_ec, second_ec;
      auto send = [&]() -> asio::awaitable<void> {
        for (int i = 0; i < frames; ++i) {
          frame_header h{.type = frame_type::data,
                         .length = static_cast<std::uint32_t>(sent[i].size()),
                         .blob_id = static_cast<std::uint64_t>(i)};
          BLOBPIPE_CO_CHECK(send_frame(*a, h, sent[i]));
        }
      };
      auto receive = [&]() -> asio::awaitable<void> {
        std::deque<payload_receipt> posted;
        for (int i = 0; i < frames; ++i) {
          auto [ec, h] = co_await b->receive_header();
          BOOST_TEST_REQUIRE(!ec);
          BOOST_TEST(h.blob_id == static_cast<std::uint64_t>(i));
          got[i].resize(h.length);
          posted.push_back(b->post_payload(got[i]));
          most_outstanding = std::max(most_outstanding, posted.size());
          while (posted.size() >= window) {
            auto oldest = std::move(posted.front());
            posted.pop_front();
            BLOBPIPE_CO_CHECK(oldest.wait());
            second_ec = co_await oldest.wait();
          }
        }
        while (!posted.empty()) {
          BLOBPIPE_CO_CHECK(posted.front().wait());
          posted.pop_front();
        }
        empty_ec = co_await payload_receipt{}.wait();
      };
      r.spawn(send());
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      for (int i = 0; i < frames; ++i) BOOST_TEST((got[i] == sent[i]), "frame " << i);
      BOOST_TEST(most_outstanding == (is_ucx(l) ? 4u : 1u));
      BOOST_TEST((empty_ec == errc::invalid_argument));
      BOOST_TEST((second_ec == errc::invalid_argument));
    }
  }
}

BOOST_AUTO_TEST_CASE(concurrent_senders_take_turns_frame_by_frame) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      std::vector<std::uint64_t> order;
      auto send = [&](std::uint64_t id) -> asio::awaitable<void> {
        for (int i = 0; i < 4; ++i)
          BLOBPIPE_CO_CHECK(send_frame(*a, {.type = frame_type::ack, .blob_id = id}, {}));
      };
      auto receive = [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 8; ++i) {
          auto [ec, h] = co_await b->receive_header();
          BOOST_TEST_REQUIRE(!ec);
          order.push_back(h.blob_id);
        }
      };
      r.spawn(send(1));
      r.spawn(send(2));
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      int switches = 0;
      for (std::size_t i = 1; i < order.size(); ++i) switches += order[i] != order[i - 1];
      BOOST_TEST(switches >= 3);  // interleaved, not 1,1,1,1,2,2,2,2
    }
  }
}

BOOST_AUTO_TEST_CASE(close_wakes_pending_receive_on_both_ends) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      std::error_code mine, theirs;
      auto wait_a = [&]() -> asio::awaitable<void> {
        auto [ec, h] = co_await a->receive_header();
        mine = ec;
      };
      auto wait_b = [&]() -> asio::awaitable<void> {
        auto [ec, h] = co_await b->receive_header();
        theirs = ec;
      };
      auto closer = [&]() -> asio::awaitable<void> {
        co_await yield_n(10);
        a->close();
      };
      r.spawn(wait_a());
      r.spawn(wait_b());
      r.spawn(closer());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((mine == errc::closed));
      BOOST_TEST((theirs == errc::peer_closed));
      std::error_code after;
      auto late = [&]() -> asio::awaitable<void> {
        after = co_await send_frame(*a, {.type = frame_type::ack}, {});
      };
      r.spawn(late());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((after == errc::closed));
    }
  }
}

BOOST_AUTO_TEST_CASE(transport_rejects_header_over_max_frame_bytes) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l, {.max_frame_bytes = 16}));
      std::error_code ec_seen;
      std::vector<std::byte> big(17);
      auto send = [&]() -> asio::awaitable<void> {
        (void)co_await send_frame(*a, {.type = frame_type::tail, .length = 17}, big);
      };
      auto receive = [&]() -> asio::awaitable<void> {
        auto [ec, h] = co_await b->receive_header();
        ec_seen = ec;
      };
      r.spawn(send());
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((ec_seen == errc::protocol_violation));
      BOOST_TEST(!b->last_error().empty());
      BOOST_TEST(!b->is_open());
    }
  }
}

BOOST_AUTO_TEST_CASE(listen_rejects_bad_address) {
  asio::io_context ctx;
  auto l = tcp::listen(ctx.get_executor(), 0, "not-an-address");
  BOOST_TEST((l.code() == errc::invalid_argument));
}
