// What a consumer makes of a sender that breaks its rules, seen from the
// sender's side of the wire (a scripted raw peer): the close frame that
// tells the sender why the stream ended (docs/wire.md "Closing"), and what
// counts as a sender's progress for stall_timeout (docs/reliability.md
// "Timeouts"): control frames that complete nothing, such as blob_begin +
// blob_abort pairs, do not.
//
// Coroutine lambdas are named locals of the (non-coroutine) test body, so
// their captures outlive the coroutines, and none is nested in another
// coroutine (GCC 12 mis-compiles that with Boost.Test's __func__).
#define BOOST_TEST_MODULE consumer_refusal
#include <asio/steady_timer.hpp>
#include <boost/test/unit_test.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;
using namespace std::chrono_literals;

namespace {

const std::vector<link_kind> links = {link_kind::loopback, link_kind::tcp};

asio::awaitable<void> put(transport& t, frame_header h, std::span<const std::byte> p = {}) {
  (void)co_await send_frame(t, h, p);  // the consumer may hang up: ignore
}

/// The sender's hello, then (unless `pipelined`: the stream goes on
/// without waiting) the consumer's hello reply, read with `in`.
asio::awaitable<void> say_hello(transport& t, frame_reader& in, bool pipelined = false) {
  co_await put(t, {.type = frame_type::hello}, encode_hello({}));
  if (pipelined) co_return;
  auto [ec, reply] = co_await in.next(t);
  BOOST_TEST(!ec);
  BOOST_TEST((reply.header.type == frame_type::hello));
}

asio::awaitable<void> begin_blob(transport& t, std::uint64_t id) {
  tag_t tag{};
  tag[0] = std::byte{7};
  co_await put(t, {.type = frame_type::blob_begin, .blob_id = id}, tag);
}

asio::awaitable<void> begin_entry(transport& t, std::uint64_t id, std::uint64_t len) {
  Entry e;
  e.key = "x";
  e.len = len;
  e.kind = 'n';
  e.dtype = "|u1";
  e.shape = shape_t{static_cast<std::int64_t>(len)};
  co_await put(t, {.type = frame_type::entry_begin, .blob_id = id},
               encode_entry_begin(e.key, e.meta()));
}

/// What the scripted sender read from the consumer after its hello.
struct heard {
  bool closed_by_frame = false;  ///< a close frame came
  std::string close_reason;      ///< its reason
  std::error_code end;           ///< how reading ended after it
  bool hung_up = false;          ///< the consumer's side is gone
};

/// Reads the consumer's frames until it hangs up, recording its close frame.
asio::awaitable<void> listen(transport& t, frame_reader& in, heard& h) {
  for (;;) {
    auto [ec, f] = co_await in.next(t);
    if (ec) {
      h.end = ec;
      break;
    }
    if (f.header.type == frame_type::close) {
      h.closed_by_frame = true;
      h.close_reason.assign(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
    }
  }
  h.hung_up = true;
}

/// Collects the consumer's events until end_of_stream; `running` is then
/// how many of the consumer's own coroutines still run (none should).
asio::awaitable<void> collect(consumer& c, event& last, std::uint64_t* running = nullptr) {
  for (;;) {
    last = co_await c.next();
    if (last.kind == event_kind::end_of_stream) break;
  }
  if (running) *running = c.stats().tasks_running;
}

/// Starts a consumer on `t` with `opt` into `c` and collects its events
/// (collect).
asio::awaitable<void> judge(std::unique_ptr<transport> t, consumer_options opt, consumer& c,
                            event& last, std::uint64_t* running = nullptr) {
  auto [ec, started] = co_await consumer::start(std::move(t), std::move(opt));
  BOOST_TEST_REQUIRE(!ec);
  c = std::move(started);
  co_await collect(c, last, running);
}

}  // namespace

// A limit refused: the sender reads the consumer's reason, which names the
// limit, before the connection ends; the consumer's own end says the same.
// Also when the refused frames came with the hello, before its reply.
BOOST_AUTO_TEST_CASE(a_stream_refused_for_a_limit_tells_the_sender_why_in_a_close_frame) {
  for (link_kind l : all_links()) {
    for (bool pipelined : {false, true}) {
      // In process, a write completes once the peer reads: two ends writing
      // at once wait for each other.
      if (pipelined && l == link_kind::loopback) continue;
      BOOST_TEST_CONTEXT(link_name(l) << (pipelined ? " pipelined" : "")) {
        runner r;
        auto [a, b] = r.await(raw_pair(l));
        consumer_options opt;
        opt.max_entry_bytes = 64;
        consumer c;
        event last;
        heard h;
        frame_reader in;
        auto sender = [&]() -> asio::awaitable<void> {
          co_await say_hello(*a, in, pipelined);
          co_await begin_blob(*a, 1);
          co_await begin_entry(*a, 1, 100);  // over max_entry_bytes
          co_await listen(*a, in, h);
        };
        r.spawn(sender());
        r.spawn(judge(std::move(b), opt, c, last));
        BOOST_TEST_REQUIRE(r.run());
        BOOST_TEST((last.error == errc::protocol_violation), last.reason);
        BOOST_TEST(h.closed_by_frame);
        BOOST_TEST(h.close_reason.find("max_entry_bytes 64") != std::string::npos, h.close_reason);
        BOOST_TEST(last.reason.find("max_entry_bytes 64") != std::string::npos, last.reason);
        BOOST_TEST(h.hung_up);
      }
    }
  }
}

// A sender that holds an entry open and sends only blob_begin + blob_abort
// pairs (each a blob that ends, but with nothing completed and no entry
// byte) makes no progress: stall_timeout ends it, and it is told so. Were
// an abort progress, the pairs would keep it until the script's end, an
// orderly close, a second later.
BOOST_AUTO_TEST_CASE(blob_begin_abort_pairs_are_no_progress_and_the_stall_is_told) {
  for (link_kind l : links) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      consumer_options opt;
      opt.stall_timeout = 100ms;
      consumer c;
      event last;
      heard h;
      frame_reader in;
      int pairs = 0;
      auto sender = [&]() -> asio::awaitable<void> {
        co_await say_hello(*a, in);
        r.spawn(listen(*a, in, h));
        co_await begin_blob(*a, 1);
        co_await begin_entry(*a, 1, 1000);  // owed from now on
        asio::steady_timer pace(co_await asio::this_coro::executor);
        const std::string reason(4000, 'r');
        for (std::uint64_t id = 2; id < 50 && !h.hung_up; ++id) {  // 50 pairs, 20 ms apart
          co_await begin_blob(*a, id);
          co_await put(*a, {.type = frame_type::blob_abort, .blob_id = id},
                       std::as_bytes(std::span(reason)));
          ++pairs;
          pace.expires_after(20ms);
          co_await pace.async_wait(asio::use_awaitable);
        }
        if (!h.hung_up) co_await put(*a, {.type = frame_type::close});
      };
      r.spawn(sender());
      r.spawn(judge(std::move(b), opt, c, last));
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((last.error == errc::timed_out), last.reason);
      BOOST_TEST(last.reason.find("stall_timeout") != std::string::npos, last.reason);
      BOOST_TEST(pairs < 49);  // ended while the pairs still came
      BOOST_TEST(h.closed_by_frame);
      BOOST_TEST(h.close_reason.find("stall_timeout") != std::string::npos, h.close_reason);
    }
  }
}

// An orderly end and the application's close() send no close frame: the
// sender's orderly end is its own, and the application's reasons are not
// the sender's business (docs/wire.md "Closing").
BOOST_AUTO_TEST_CASE(an_orderly_end_or_the_applications_close_sends_no_close_frame) {
  for (link_kind l : links) {
    for (bool app_closes : {false, true}) {
      BOOST_TEST_CONTEXT(link_name(l) << (app_closes ? " close()" : " orderly")) {
        runner r;
        auto [a, b] = r.await(raw_pair(l));
        consumer c;
        event last;
        heard h;
        frame_reader in;
        auto sender = [&]() -> asio::awaitable<void> {
          co_await say_hello(*a, in);
          if (!app_closes) co_await put(*a, {.type = frame_type::close});
          co_await listen(*a, in, h);
        };
        auto judge_and_close = [&]() -> asio::awaitable<void> {
          auto [ec, started] = co_await consumer::start(std::move(b), {});
          BOOST_TEST_REQUIRE(!ec);
          c = std::move(started);
          if (app_closes) c.close();
          co_await collect(c, last);
        };
        r.spawn(sender());
        r.spawn(judge_and_close());
        BOOST_TEST_REQUIRE(r.run());
        BOOST_TEST(h.hung_up);
        BOOST_TEST(!h.closed_by_frame, h.close_reason);
      }
    }
  }
}

// A sender that reads nothing cannot hold a refused connection open: the
// in-process transport's write completes only once the peer reads, so the
// close frame waits, and close_linger (1 s) later the consumer closes
// regardless. The poll below bounds a hang; it asserts no duration.
BOOST_AUTO_TEST_CASE(a_sender_that_reads_nothing_cannot_hold_a_refused_connection_open) {
  runner r;
  auto [a, b] = r.await(raw_pair(link_kind::loopback));
  consumer_options opt;
  opt.max_entry_bytes = 64;
  consumer c;
  event last;
  bool closed_seen = false;
  std::uint64_t running = 1;
  frame_reader in;
  auto sender = [&]() -> asio::awaitable<void> {
    co_await say_hello(*a, in);
    co_await begin_blob(*a, 1);
    co_await begin_entry(*a, 1, 100);  // over max_entry_bytes
    asio::steady_timer poll(co_await asio::this_coro::executor);
    for (int i = 0; i < 500 && a->is_open(); ++i) {  // reads nothing, for up to 10 s
      poll.expires_after(20ms);
      co_await poll.async_wait(asio::use_awaitable);
    }
    closed_seen = !a->is_open();
  };
  r.spawn(sender());
  r.spawn(judge(std::move(b), opt, c, last, &running));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST((last.error == errc::protocol_violation), last.reason);
  BOOST_TEST(closed_seen);
  // end_of_stream came once the acker, whose close frame waited on the
  // sender, had ended (consumer_stats::tasks_running).
  BOOST_TEST(running == 0u);
}
