// sender::shutdown's orderly end (docs/wire.md "Closing"): the consumer
// answers the sender's `close` by closing its end, and the ack reader may
// see that before the writer has recorded the write that carried the
// `close` (two threads, two io_contexts: the in-process transport wakes
// each end on its own). The transport's outcome of that write decides,
// not the order in which the sender's io_context runs the two wake-ups.
// Both io_contexts are polled by hand here, one handler at a time where
// the order matters, so the interleaving is the same every run.
#define BOOST_TEST_MODULE sender_shutdown_test
#include <boost/test/unit_test.hpp>

#include <optional>

#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>

#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// The consumer's hello for `offer`: as sender_handshake_test's valid
/// reply (no credit grants, 1 MiB window).
hello reply_to(const hello& offer) {
  hello r{.role = wire_role::consumer};
  r.max_chunk_bytes = std::min<std::uint32_t>(offer.max_chunk_bytes, 1u << 20);
  r.inline_bytes = std::min<std::uint32_t>(offer.inline_bytes, 1u << 10);
  r.window_bytes = 1u << 20;
  r.features = offer.features & ~feature_credit_grants;
  return r;
}

/// Plays the consumer on `t`: answers the hello, reads frames, and closes
/// its end when the sender's `close` arrives (as the library's consumer).
asio::awaitable<void> consumer_script(transport& t, int& frames_read, bool& saw_close) {
  frame_reader in;
  auto [ec, f] = co_await in.next(t);
  BOOST_TEST_REQUIRE(!ec, ec.message());
  auto offer = decode_hello(f.payload);
  BOOST_TEST_REQUIRE(offer.has_value());
  (void)co_await send_frame(t, {.type = frame_type::hello}, encode_hello(reply_to(*offer)));
  for (;;) {
    auto [rec, g] = co_await in.next(t);
    if (rec) co_return;
    ++frames_read;
    if (g.header.type == frame_type::close) {
      saw_close = true;
      t.close();
      co_return;
    }
  }
}

asio::awaitable<void> start_sender(std::unique_ptr<transport> link, std::optional<sender>& out) {
  auto [ec, started] = co_await sender::start(std::move(link), sender_options{});
  BOOST_TEST_REQUIRE(!ec, ec.message());
  out.emplace(std::move(started));
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_consumer_closing_before_the_close_write_is_recorded_is_an_orderly_end) {
  asio::io_context sender_io, consumer_io;
  auto sender_work = asio::make_work_guard(sender_io);
  auto consumer_work = asio::make_work_guard(consumer_io);
  auto [a, b] = loopback::make_pair(sender_io.get_executor(), consumer_io.get_executor());
  std::unique_ptr<transport> consumer_end = std::move(b);

  int frames_read = 0;
  bool saw_close = false;
  asio::co_spawn(consumer_io, consumer_script(*consumer_end, frames_read, saw_close),
                 asio::detached);
  std::optional<sender> s;
  asio::co_spawn(sender_io, start_sender(std::move(a), s), asio::detached);
  for (int i = 0; i < 100 && !s; ++i) {
    sender_io.poll();
    consumer_io.poll();
  }
  BOOST_TEST_REQUIRE(s.has_value());
  sender_io.poll();  // the ack reader waits for the consumer's bytes

  // 1. A blob's frames are in flight (the consumer has not read them), and
  //    shutdown frames `close` behind them and waits for it to be written.
  const auto x = ramp(10, 0.0f);
  auto blob = [&]() -> asio::awaitable<void> {
    auto w = s->open_blob();
    BLOBPIPE_CO_CHECK(w.emit("x", value::tensor(x)));
    BLOBPIPE_CO_CHECK(w.finish());
  };
  asio::co_spawn(sender_io, blob, asio::detached);
  sender_io.poll();
  std::optional<std::error_code> shut;
  auto shutdown = [&]() -> asio::awaitable<void> { shut = co_await s->shutdown(); };
  asio::co_spawn(sender_io, shutdown, asio::detached);
  sender_io.poll();
  BOOST_TEST_REQUIRE(!shut.has_value());

  // 2. The consumer reads the blob (the sender's writer is woken: queued on
  //    sender_io), then sends an ack (the ack reader is woken behind it).
  consumer_io.poll();
  BOOST_TEST_REQUIRE(frames_read > 0);
  BOOST_TEST_REQUIRE(!saw_close);
  auto ack = [&]() -> asio::awaitable<void> {
    (void)co_await send_frame(*consumer_end, {.type = frame_type::ack});
  };
  asio::co_spawn(consumer_io, ack, asio::detached);
  consumer_io.poll();

  // 3. The writer records the blob's write (waking shutdown's wait, queued
  //    behind the ack reader) and writes `close`.
  BOOST_TEST_REQUIRE(sender_io.poll_one() == 1u);

  // 4. The consumer reads `close` (the writer's wake-up queued last) and
  //    closes its end: the ack reader sees that before the writer has
  //    recorded the write of `close`.
  consumer_io.poll();
  BOOST_TEST_REQUIRE(saw_close);

  for (int i = 0; i < 100 && !shut; ++i) {
    sender_io.poll();
    consumer_io.poll();
  }
  BOOST_TEST_REQUIRE(shut.has_value());
  BOOST_TEST(!*shut, "shutdown: " << shut->message() << " (" << s->failure_reason() << ")");
  s.reset();
  sender_io.poll();
  consumer_io.poll();
}
