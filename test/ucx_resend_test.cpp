// Resend sessions over UCX (blobpipe/transport/ucx.hpp): the exactly-once stream of
// resend_test with the connection killed repeatedly, over UCX's tcp lane
// and its shared-memory alias (test/ucx_links.hpp); every connection must
// have used the named transport (a link this machine cannot offer skips).
#define BOOST_TEST_MODULE ucx_resend
#include <boost/test/unit_test.hpp>

#include "test/reliability_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

BOOST_AUTO_TEST_CASE(resend_over_ucx_delivers_every_blob_once_across_kills) {
  const std::uint64_t n = 2000;
  const int kills = 8;
  for (link_kind k : offered_links({link_kind::ucx_tcp, link_kind::ucx_sm})) {
    BOOST_TEST_CONTEXT(link_name(k)) {
      runner r;
      auto owned = std::make_unique<ucx_reconnect_link>(r.ex(), ucx_config(k));
      ucx_reconnect_link* ucx_l = owned.get();
      std::unique_ptr<reconnect_link> l = std::move(owned);
      l->wrap = [](std::unique_ptr<transport> t, int conn) -> std::unique_ptr<transport> {
        const std::uint64_t at = conn < kills ? 30 + (static_cast<std::uint64_t>(conn) * 131) % 500
                                              : kill_switch::never;
        return std::make_unique<kill_switch>(std::move(t), at);
      };
      auto log = std::make_shared<delivery_log>();
      delivery_checker check;
      // Stall timeouts on both ends turn a handshake that never completes
      // into a retry instead of a hang, so a regression fails the
      // connection count below rather than the whole run.
      consumer_options copt;
      copt.stall_timeout = std::chrono::seconds(2);
      auto server = [&]() -> asio::awaitable<void> {
        co_await serve(*l, log, check, [&] { return check.completed.size() >= n; }, copt);
      };
      std::error_code start_ec, ec, shut;
      sender_stats st;
      sender s;
      std::uint64_t sent = 0;
      auto produce = [&]() -> asio::awaitable<void> {
        sender_options opt;
        opt.chunk_bytes = 256;
        opt.resend.retry_delay = std::chrono::milliseconds(1);
        // A kill may cut a connection before any delivery ack is read on
        // it: each such one counts against max_attempts.
        opt.resend.max_attempts = kills + 1;
        opt.stall_timeout = std::chrono::seconds(2);
        auto [sec, started] = co_await sender::start(l->connector(), opt);
        start_ec = sec;
        s = std::move(started);
        if (!sec) {
          for (std::uint64_t i = 0; i < n && !ec; ++i) {
            auto spec = make_blob(i);
            ec = co_await send_blob(s, spec);
            ++sent;
          }
          shut = co_await s.shutdown();
          st = s.stats();
        }
        l->close();
      };
      r.spawn(server());
      r.spawn(produce());
      const bool finished = r.run(std::chrono::seconds(60));
      if (!finished) {
        const auto hung = s.stats();
        BOOST_TEST_MESSAGE("hung: " << sent << " sent, " << check.completed.size()
                                    << " complete, " << l->connections() << " connections, "
                                    << hung.reconnects << " reconnects, " << hung.blobs_delivered
                                    << " delivered, unacked " << s.unacked_bytes() << ", in flight "
                                    << s.in_flight_bytes() << ", error " << s.error().message());
      }
      BOOST_TEST_REQUIRE(finished);
      BOOST_TEST(!start_ec, start_ec.message());
      BOOST_TEST(!ec, ec.message());
      BOOST_TEST(!shut, shut.message());
      BOOST_TEST(check.all_once(n), check.first_problem);
      // Kills land on connections 0..7: one reconnect each, and every
      // reconnect's handshake completes, including a new endpoint reusing a
      // just-closed one's address, whose route the old connection's late
      // cleanup must not remove (else two or three runs in ten stall).
      BOOST_TEST(st.reconnects == static_cast<std::uint64_t>(kills));
      BOOST_TEST(l->connections() == kills + 1);
      // Every connection went over the transport the link names.
      BOOST_TEST(ucx_l->wrong_lane().empty(), ucx_l->wrong_lane());
      BOOST_TEST(ucx_l->lanes_checked() == l->connections());
      BOOST_TEST_MESSAGE(link_name(k) << ": " << l->connections() << " connections for "
                                      << st.reconnects << " reconnects");
    }
  }
}
