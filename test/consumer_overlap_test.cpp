// How the consumer schedules posted reads (consumer_options
// payload_window; lib/pipeline/consumer.cpp), against a scripted message
// transport (as UCX's: data frames are bulk messages whose payloads are
// fetched) whose posted fetches land only when the test lands them, in any
// order, as UCX's rendezvous fetches may:
//
// - fetches of later entries are posted while earlier ones are in flight,
//   up to payload_window;
// - entries are yielded oldest first, whatever order their fetches end in,
//   and one whose bytes are in is yielded without waiting for another frame;
// - a frame that ends the blob waits for the blob's fetches, so its event
//   comes after the entries';
// - when the stream fails (a bad frame, close(), the stall watchdog, a
//   cancelled next(), the io_context destroyed) no entry behind a lost
//   fetch is yielded, and the buffer of a fetch cut short is retired
//   (transport::retire), as UCX may still land it after the close.
#define BOOST_TEST_MODULE consumer_overlap
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/transport/transport.hpp"
#include "blobpipe/protocol/wire.hpp"
#include "test/forwarding_transport.hpp"

using namespace blobpipe;

namespace {

/// A message transport that plays frames the test pushes: a data frame as
/// a bulk message (its header read, its payload fetched with post_read),
/// anything else as plain bytes. Fetches land when the test calls land(i),
/// not before. Like UCX, it may still write a fetch cut short by a close
/// (land_late), and keeps what retire() is given beyond its own life
/// (keep_retired).
class scripted_transport final : public transport {
 public:
  explicit scripted_transport(asio::any_io_executor ex) : ex_(ex), changed_(ex) {
    changed_.expires_at(asio::steady_timer::time_point::max());
  }

  void push(frame_header h, std::vector<std::byte> payload = {}) {
    h.length = static_cast<std::uint32_t>(payload.size());
    message m;
    m.bytes.resize(frame_header_size);
    encode_frame_header(h, m.bytes);
    if (h.type == frame_type::data) {
      m.bulk = std::move(payload);
    } else {
      m.bytes.insert(m.bytes.end(), payload.begin(), payload.end());
    }
    messages_.push_back(std::move(m));
    changed_.cancel();
  }
  /// A message of `h` (length as given) and `inline_payload`, announcing
  /// `bulk` as its bulk payload, whatever the frame: a peer's bug.
  void push_with_bulk(frame_header h, std::vector<std::byte> inline_payload,
                      std::vector<std::byte> bulk) {
    message m;
    m.bytes.resize(frame_header_size);
    encode_frame_header(h, m.bytes);
    m.bytes.insert(m.bytes.end(), inline_payload.begin(), inline_payload.end());
    m.bulk = std::move(bulk);
    messages_.push_back(std::move(m));
    changed_.cancel();
  }
  /// Posted fetches so far, and how many have landed.
  std::size_t posted() const { return fetches_.size(); }
  std::size_t landed() const {
    std::size_t n = 0;
    for (const auto& f : fetches_) n += f.landed;
    return n;
  }
  /// Lands fetch `i` (in post order): its bytes reach the destination.
  void land(std::size_t i) {
    auto& f = fetches_.at(i);
    std::memcpy(f.dest.data(), f.bytes.data(), f.bytes.size());
    f.landed = true;
    changed_.cancel();
  }
  /// Fetch `i` lands as it is posted (as a cma read does).
  void land_when_posted(std::size_t i) { at_once_.push_back(i); }
  /// Fetch `i`'s bytes reach its destination after its read was cut
  /// short: under ASan, a use-after-free unless that buffer was retired.
  void land_late(std::size_t i) {
    auto& f = fetches_.at(i);
    std::memcpy(f.dest.data(), f.bytes.data(), f.bytes.size());
  }
  /// Where fetch `i` lands.
  std::span<std::byte> dest(std::size_t i) const { return fetches_.at(i).dest; }
  using kept = std::vector<std::shared_ptr<const void>>;
  /// What retire() was given; outlives the transport, as UCX's runtime does.
  std::shared_ptr<const kept> keep_retired() const { return retired_; }
  void retire(std::shared_ptr<const void> owner) override {
    if (owner) retired_->push_back(std::move(owner));
  }

  asio::any_io_executor get_executor() const override { return ex_; }
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer>) override {
    co_return closed_ ? make_error_code(errc::closed) : std::error_code{};
  }
  bool sends_bulk() const noexcept override { return true; }
  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    while (messages_.empty() && !closed_) co_await wait_change();
    if (closed_) co_return std::tuple{make_error_code(errc::closed), read_result{}};
    message& m = messages_.front();
    const std::size_t n = std::min(buf.size(), m.bytes.size() - m.taken);
    std::memcpy(buf.data(), m.bytes.data() + m.taken, n);
    m.taken += n;
    read_result got{n, 0};
    if (m.taken == m.bytes.size()) {
      got.bulk_bytes = m.bulk.size();
      bulk_ = std::move(m.bulk);
      messages_.pop_front();
    }
    co_return std::tuple{std::error_code{}, got};
  }
  bool readable() const noexcept override { return closed_ || !messages_.empty(); }
  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) override {
    if (dest.size() != bulk_.size()) co_return make_error_code(errc::invalid_argument);
    std::memcpy(dest.data(), bulk_.data(), dest.size());
    bulk_.clear();
    co_return std::error_code{};
  }
  std::size_t read_window() const noexcept override {
    return std::numeric_limits<std::size_t>::max();
  }
  payload_receipt post_read(std::span<std::byte> dest) override {
    fetches_.push_back({dest, std::move(bulk_), false});
    bulk_.clear();
    const std::size_t i = fetches_.size() - 1;
    if (std::find(at_once_.begin(), at_once_.end(), i) != at_once_.end()) land(i);
    return payload_receipt(std::make_unique<receipt>(*this, i));
  }
  void close() noexcept override {
    closed_ = true;
    changed_.cancel();
  }
  bool is_open() const noexcept override { return !closed_; }

 private:
  struct message {
    std::vector<std::byte> bytes;  // read with read_some
    std::vector<std::byte> bulk;   // a data frame's payload, fetched
    std::size_t taken = 0;
  };
  struct fetch {
    std::span<std::byte> dest;
    std::vector<std::byte> bytes;
    bool landed = false;
  };
  class receipt final : public payload_receipt::pending {
   public:
    receipt(scripted_transport& t, std::size_t i) : t_(&t), i_(i) {}
    asio::awaitable<std::error_code> wait() override {
      while (!ready()) {
        co_await t_->wait_change();
        // As UCX's request_slot::wait: cancelled, it closes the
        // connection and waits on for the fetch to end.
        auto cs = co_await asio::this_coro::cancellation_state;
        if (cs.cancelled() != asio::cancellation_type::none) {
          co_await asio::this_coro::reset_cancellation_state();
          t_->close();
        }
      }
      co_return t_->fetches_[i_].landed ? std::error_code{} : make_error_code(errc::closed);
    }
    bool ready() const noexcept override { return t_->fetches_[i_].landed || t_->closed_; }

   private:
    scripted_transport* t_;
    std::size_t i_;
  };

  asio::awaitable<void> wait_change() {
    co_await changed_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    changed_.expires_at(asio::steady_timer::time_point::max());
  }

  asio::any_io_executor ex_;
  asio::steady_timer changed_;  // cancelled on every change: wakes all waiters
  std::deque<message> messages_;
  std::vector<std::byte> bulk_;  // the bulk payload read_some announced
  std::deque<fetch> fetches_;
  std::vector<std::size_t> at_once_;
  std::shared_ptr<kept> retired_ = std::make_shared<kept>();
  bool closed_ = false;
};

frame_header header(frame_type type, std::uint64_t blob_id = 0, std::uint64_t arg = 0) {
  return frame_header{.type = type, .blob_id = blob_id, .arg = arg};
}

std::vector<std::byte> bytes_of(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<unsigned char>(seed + i));
  return v;
}

constexpr std::size_t entry_bytes = 64;  // one chunk each; a multiple of ALIGN

/// Pushes the sender's hello and blob 1's blob_begin.
void push_start(scripted_transport& t) {
  t.push(header(frame_type::hello), encode_hello(hello{}));
  const auto tag = make_tag("overlap").value();
  t.push(header(frame_type::blob_begin, 1), std::vector<std::byte>(tag.begin(), tag.end()));
}

/// Pushes entry `i` of blob 1 ("e<i>", uint8 x 64, bytes_of(64, i)): its
/// entry_begin and its one data frame.
void push_entry(scripted_transport& t, std::size_t i) {
  Entry e{.key = "e" + std::to_string(i), .off = i * entry_bytes, .len = entry_bytes,
          .kind = 'n', .dtype = "|u1", .shape = shape_t{std::int64_t(entry_bytes)}};
  t.push(header(frame_type::entry_begin, 1, i), encode_entry_begin(e.key, e.meta()));
  t.push(header(frame_type::data, 1, e.off), bytes_of(entry_bytes, int(i)));
}

/// A consumer over a scripted transport, driven by polling its io_context:
/// every event next() yields is kept, in order.
struct harness {
  asio::cancellation_signal cancel;  // cancels the coroutine calling next()
  asio::io_context ctx;              // (after `cancel`: destroyed first)
  scripted_transport* t = nullptr;   // owned by the consumer
  std::shared_ptr<const scripted_transport::kept> retired;
  consumer c;
  std::vector<event> events;
  bool ended = false;

  explicit harness(consumer_options opt = {}) {
    auto owned = std::make_unique<scripted_transport>(ctx.get_executor());
    t = owned.get();
    retired = t->keep_retired();
    push_start(*t);
    asio::co_spawn(ctx, run(std::move(owned), opt),
                   asio::bind_cancellation_slot(cancel.slot(), asio::detached));
    ctx.poll();
  }
  asio::awaitable<void> run(std::unique_ptr<transport> owned, consumer_options opt) {
    auto [ec, started] = co_await consumer::start(std::move(owned), opt);
    if (ec) {
      ended = true;
      co_return;
    }
    c = std::move(started);
    while (!ended) {
      events.push_back(co_await c.next());
      ended = events.back().kind == event_kind::end_of_stream;
    }
  }
  void poll() {
    ctx.restart();
    ctx.poll();
  }
  /// The keys of the entries yielded so far, in order ("-" for other events).
  std::string keys() const {
    std::string out;
    for (const auto& ev : events) {
      if (!out.empty()) out += ' ';
      out += ev.kind == event_kind::entry_ready ? ev.entry->entry.key : std::string("-");
    }
    return out;
  }
  /// Whether entry event `k` carries entry i's bytes.
  bool intact(std::size_t k, std::size_t i) const {
    const auto want = bytes_of(entry_bytes, int(i));
    const auto got = events.at(k).entry->view.bytes;
    return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0;
  }
};

}  // namespace

// Six one-chunk entries queued: four fetches go out at once (the window),
// landing newest first yields nothing until the oldest is in, then the
// entries come oldest first, each with its own bytes; the last two are
// yielded as they land, with no frame after them.
BOOST_AUTO_TEST_CASE(later_entries_fetch_while_earlier_land_and_yield_oldest_first) {
  consumer_options opt;
  opt.payload_window = 4;
  harness h(opt);
  for (std::size_t i = 0; i < 6; ++i) push_entry(*h.t, i);
  h.poll();
  BOOST_TEST(h.t->posted() == 4u);  // e0..e3 in flight, e4's frames wait
  BOOST_TEST(h.events.empty());
  for (std::size_t i : {3, 2, 1}) h.t->land(i);
  h.poll();
  BOOST_TEST(h.events.empty(), "yielded before e0 landed: " << h.keys());
  h.t->land(0);
  h.poll();
  BOOST_TEST(h.keys() == "e0 e1 e2 e3");
  BOOST_TEST(h.t->posted() == 6u);
  h.t->land(5);
  h.poll();
  BOOST_TEST(h.keys() == "e0 e1 e2 e3");
  h.t->land(4);
  h.poll();
  BOOST_TEST(h.keys() == "e0 e1 e2 e3 e4 e5");
  for (std::size_t k = 0; k < h.events.size(); ++k) BOOST_TEST(h.intact(k, k), "e" << k);
  BOOST_TEST(h.c.stats().chunks_overlapped == 4u);  // e1..e3 behind e0, e5 behind e4
  h.t->push(header(frame_type::close));
  h.poll();
  BOOST_TEST(h.ended);
  BOOST_TEST(h.events.size() == 8u);  // + blob 1 aborted (left open) + end_of_stream
}

// payload_window 0 would never fetch a payload: consumer::start refuses it
// (consumer.hpp: invalid_argument, options out of range) before it reads
// a byte.
BOOST_AUTO_TEST_CASE(payload_window_zero_is_refused_at_start) {
  asio::io_context ctx;
  consumer_options opt;
  opt.payload_window = 0;
  auto owned = std::make_unique<scripted_transport>(ctx.get_executor());
  push_start(*owned);  // a valid hello waiting: only the option can refuse
  std::optional<std::error_code> got;
  asio::co_spawn(ctx, consumer::start(std::move(owned), opt),
                 [&](std::exception_ptr, std::tuple<std::error_code, consumer> r) {
                   got = std::get<0>(r);
                 });
  ctx.poll();
  BOOST_TEST_REQUIRE(got.has_value(), "start did not refuse payload_window 0 at once");
  BOOST_TEST((*got == errc::invalid_argument), got->message());
}

// consumer_options::landing (docs/cuda.md "Consumer"): assemble_mode other
// than none, or pool_depth 0, is refused at start as invalid_argument,
// before any device is asked for, so with or without a GPU.
BOOST_AUTO_TEST_CASE(device_landing_options_out_of_range_are_refused_at_start) {
  for (const bool assembled : {true, false}) {
    BOOST_TEST_CONTEXT((assembled ? "assemble_mode::memory" : "pool_depth 0")) {
      asio::io_context ctx;
      consumer_options opt;
      opt.landing.enabled = true;
      if (assembled) opt.assemble = assemble_mode::memory;
      else opt.landing.pool_depth = 0;
      auto owned = std::make_unique<scripted_transport>(ctx.get_executor());
      push_start(*owned);  // a valid hello waiting: only the option can refuse
      std::optional<std::error_code> got;
      asio::co_spawn(ctx, consumer::start(std::move(owned), opt),
                     [&](std::exception_ptr, std::tuple<std::error_code, consumer> r) {
                       got = std::get<0>(r);
                     });
      ctx.poll();
      BOOST_TEST_REQUIRE(got.has_value(), "start did not refuse the landing options at once");
      BOOST_TEST((*got == errc::invalid_argument), got->message());
    }
  }
}

// payload_window 1: each fetch lands before the next frame is read.
BOOST_AUTO_TEST_CASE(payload_window_one_fetches_one_entry_at_a_time) {
  consumer_options opt;
  opt.payload_window = 1;
  harness h(opt);
  for (std::size_t i = 0; i < 3; ++i) push_entry(*h.t, i);
  h.poll();
  BOOST_TEST(h.t->posted() <= 1u);
  for (std::size_t i = 0; i < 3; ++i) {
    if (h.t->posted() > i) h.t->land(i);
    h.poll();
  }
  BOOST_TEST(h.keys() == "e0 e1 e2");
  BOOST_TEST(h.c.stats().chunks_overlapped == 0u);
}

// A blob_abort read while the blob's last entry is still landing: the
// entry is yielded first, then the abort.
BOOST_AUTO_TEST_CASE(frame_ending_the_blob_waits_for_its_fetches) {
  harness h;
  push_entry(*h.t, 0);
  const std::string why = "producer gave up";
  h.t->push(header(frame_type::blob_abort, 1),
            std::vector<std::byte>(reinterpret_cast<const std::byte*>(why.data()),
                                   reinterpret_cast<const std::byte*>(why.data() + why.size())));
  h.poll();
  BOOST_TEST(h.t->posted() == 1u);
  BOOST_TEST(h.events.empty());
  h.t->land(0);
  h.poll();
  BOOST_TEST_REQUIRE(h.events.size() == 2u);
  BOOST_TEST(h.keys() == "e0 -");
  BOOST_TEST((h.events[1].kind == event_kind::blob_aborted));
  BOOST_TEST(h.events[1].reason == why);
}

// An orderly close read while an entry's fetch is in flight: the entry
// lands and is yielded before the end (then its blob, left open, is
// aborted, and the stream ends).
BOOST_AUTO_TEST_CASE(a_close_read_while_a_fetch_is_in_flight_yields_the_entry_first) {
  harness h;
  push_entry(*h.t, 0);
  h.t->push(header(frame_type::close));
  h.poll();
  BOOST_TEST(h.t->posted() == 1u);
  BOOST_TEST(h.events.empty(), "yielded before e0 landed: " << h.keys());
  // Ended already, e0's buffer would be retired: landing in it is no test.
  BOOST_TEST_REQUIRE(!h.ended, "the stream ended before e0 landed: " << h.keys());
  h.t->land(0);
  h.poll();
  BOOST_TEST(h.ended);
  BOOST_TEST(h.keys() == "e0 - -");
  BOOST_TEST_REQUIRE(!h.events.empty());
  BOOST_TEST(h.intact(0, 0));
}

// A failure with fetches in flight: the stream ends with it, the blob is
// aborted, and no entry behind one whose bytes never came is yielded (e1
// landed, but e0 before it did not). The buffers of e0 and e2, whose
// fetches were cut short, are retired: writing into them afterwards (as
// UCX may) is no use-after-free (recycling off, so ASan would see one).
BOOST_AUTO_TEST_CASE(failure_with_fetches_in_flight_yields_nothing_behind_a_lost_one) {
  consumer_options opt;
  opt.recycle_bytes = 0;
  harness h(opt);
  h.t->land_when_posted(1);
  for (std::size_t i = 0; i < 3; ++i) push_entry(*h.t, i);
  h.t->push(header(frame_type::data, 99, 0), bytes_of(8, 0));  // data for an unknown blob
  h.poll();
  BOOST_TEST(h.t->posted() == 3u);
  BOOST_TEST(h.t->landed() == 1u);
  BOOST_TEST(h.ended);
  BOOST_TEST(h.keys() == "- -");
  BOOST_TEST_REQUIRE(h.events.size() == 2u);
  BOOST_TEST((h.events[0].kind == event_kind::blob_aborted));
  BOOST_TEST((h.events[1].error == errc::protocol_violation), h.events[1].reason);
  BOOST_TEST(h.retired->size() == 2u);
  h.t->land_late(0);
  h.t->land_late(2);
}

// The stream ended while next() waits for e0's fetch and e1's has landed:
// by close(), by the stall watchdog, by cancelling next(). Each time e1 is
// not yielded, and e0's buffer is retired.
BOOST_AUTO_TEST_CASE(stream_ended_while_a_fetch_is_pending_yields_nothing_behind_it) {
  enum class by { close, stall, cancel };
  for (by how : {by::close, by::stall, by::cancel}) {
    BOOST_TEST_CONTEXT("ended by " << int(how)) {
      consumer_options opt;
      opt.recycle_bytes = 0;
      if (how == by::stall) opt.stall_timeout = std::chrono::milliseconds(40);
      harness h(opt);
      push_entry(*h.t, 0);
      push_entry(*h.t, 1);
      h.poll();
      BOOST_TEST(h.t->posted() == 2u);
      h.t->land(1);
      h.poll();
      BOOST_TEST(h.events.empty());
      if (how == by::close) h.c.close();
      if (how == by::cancel) h.cancel.emit(asio::cancellation_type::terminal);
      h.ctx.restart();
      h.ctx.run_for(std::chrono::milliseconds(how == by::stall ? 500 : 50));
      BOOST_TEST_REQUIRE(h.ended);
      BOOST_TEST(h.keys() == "- -");  // blob 1 aborted, end_of_stream
      if (how == by::stall)
        BOOST_TEST((h.events.back().error == errc::timed_out), h.events.back().reason);
      BOOST_TEST(h.retired->size() == 1u);
      h.t->land_late(0);
    }
  }
}

// An entry of two chunks whose first fetch is cut short by close() while
// its last (small, so at once, as an eager payload is) has landed: the
// entry's buffer is retired all the same, since UCX may still land the
// first chunk into it.
BOOST_AUTO_TEST_CASE(cut_short_first_chunk_retires_its_entry_whose_last_landed) {
  consumer_options opt;
  opt.recycle_bytes = 0;
  opt.max_chunk_bytes = 64;  // the 128-byte entry goes as two data frames
  harness h(opt);
  Entry e{.key = "two", .off = 0, .len = 128, .kind = 'n', .dtype = "|u1",
          .shape = shape_t{128}};
  h.t->land_when_posted(1);  // the last chunk
  h.t->push(header(frame_type::entry_begin, 1, 0), encode_entry_begin(e.key, e.meta()));
  h.t->push(header(frame_type::data, 1, 0), bytes_of(64, 0));
  h.t->push(header(frame_type::data, 1, 64), bytes_of(64, 64));
  h.poll();
  BOOST_TEST_REQUIRE(h.t->posted() == 2u);
  h.c.close();
  h.ctx.restart();
  h.ctx.run_for(std::chrono::milliseconds(50));
  BOOST_TEST_REQUIRE(h.ended);
  BOOST_TEST(h.keys() == "- -");
  BOOST_TEST(h.retired->size() >= 1u);
  h.t->land_late(0);
}

// Test decorators (test/forwarding_transport.hpp) pass readable(),
// sends_bulk() and read_window() through, so the fault and resend suites
// over UCX schedule as UCX does.
BOOST_AUTO_TEST_CASE(forwarding_transport_passes_message_queries_through) {
  asio::io_context ctx;
  auto inner = std::make_unique<scripted_transport>(ctx.get_executor());
  scripted_transport* t = inner.get();
  blobpipe::testing::forwarding_transport fw(std::move(inner));
  BOOST_TEST(!fw.readable());
  BOOST_TEST(fw.sends_bulk());
  BOOST_TEST(fw.read_window() == std::numeric_limits<std::size_t>::max());
  t->push(header(frame_type::hello), encode_hello(hello{}));
  BOOST_TEST(fw.readable());
}

// The application drops the consumer between next() calls, with the
// fetches of e1..e3 in flight: their buffers are retired, so fetches UCX
// still lands after the close write into live memory.
BOOST_AUTO_TEST_CASE(consumer_dropped_with_fetches_in_flight_retires_their_buffers) {
  asio::io_context ctx;
  auto owned = std::make_unique<scripted_transport>(ctx.get_executor());
  scripted_transport* t = owned.get();
  const auto retired = t->keep_retired();
  push_start(*t);
  for (std::size_t i = 0; i < 4; ++i) push_entry(*t, i);
  consumer_options opt;
  opt.recycle_bytes = 0;
  std::string first;
  std::vector<std::span<std::byte>> dests;
  auto take_one = [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await consumer::start(std::move(owned), opt);
    if (ec) co_return;
    auto ev = co_await c.next();
    if (ev.kind == event_kind::entry_ready) first = ev.entry->entry.key;
    for (std::size_t i = 1; i < t->posted(); ++i) dests.push_back(t->dest(i));
  };  // the consumer goes here, with e1..e3 posted
  asio::co_spawn(ctx, take_one(), asio::detached);
  ctx.poll();
  BOOST_TEST(t->posted() == 4u);
  t->land(0);
  ctx.restart();
  ctx.run_for(std::chrono::milliseconds(50));
  BOOST_TEST(first == "e0");
  BOOST_TEST_REQUIRE(dests.size() == 3u);
  BOOST_TEST(retired->size() >= 3u);
  for (auto d : dests) std::memset(d.data(), 0xab, d.size());  // landing late
}

// The io_context destroyed while next() waits for e0's fetch: the
// coroutine goes with it, and e0's buffer is still retired.
BOOST_AUTO_TEST_CASE(io_context_destroyed_while_next_waits_for_a_fetch) {
  std::shared_ptr<const scripted_transport::kept> retired;
  std::span<std::byte> dest;
  {
    asio::io_context ctx;
    auto owned = std::make_unique<scripted_transport>(ctx.get_executor());
    scripted_transport* t = owned.get();
    retired = t->keep_retired();
    push_start(*t);
    push_entry(*t, 0);
    consumer_options opt;
    opt.recycle_bytes = 0;
    auto consume = [&]() -> asio::awaitable<void> {
      auto [ec, c] = co_await consumer::start(std::move(owned), opt);
      if (ec) co_return;
      for (;;) (void)co_await c.next();
    };
    asio::co_spawn(ctx, consume(), asio::detached);
    ctx.poll();
    BOOST_TEST_REQUIRE(t->posted() == 1u);
    dest = t->dest(0);
  }
  BOOST_TEST(retired->size() >= 1u);
  std::memset(dest.data(), 0xab, dest.size());  // landing late
}

// transport.hpp read_result::bulk_bytes: a bulk payload is exactly the rest
// of the frame whose header ends the bytes read with it. One that is not (a
// data frame announcing 64 bytes with a bulk payload of 32, a blob_abort
// with one) ends the stream with protocol_violation, before a byte of it is
// read.
BOOST_AUTO_TEST_CASE(a_bulk_payload_apart_from_its_frame_is_a_protocol_violation) {
  for (const bool data : {true, false}) {
    BOOST_TEST_CONTEXT((data ? "a data frame of 64 bytes" : "a blob_abort")) {
      harness h;
      Entry e{.key = "e0", .off = 0, .len = entry_bytes, .kind = 'n', .dtype = "|u1",
              .shape = shape_t{std::int64_t(entry_bytes)}};
      h.t->push(header(frame_type::entry_begin, 1, 0), encode_entry_begin(e.key, e.meta()));
      if (data) {
        frame_header d = header(frame_type::data, 1, 0);
        d.length = entry_bytes;
        h.t->push_with_bulk(d, {}, bytes_of(32, 0));
      } else {
        frame_header a = header(frame_type::blob_abort, 1);
        a.length = 1;
        h.t->push_with_bulk(a, {std::byte{'x'}}, bytes_of(32, 0));
      }
      h.poll();
      BOOST_TEST_REQUIRE(h.ended);
      BOOST_TEST(h.t->posted() == 0u);
      BOOST_TEST_REQUIRE(!h.events.empty());
      const event& last = h.events.back();
      BOOST_TEST((last.kind == event_kind::end_of_stream));
      BOOST_TEST((last.error == errc::protocol_violation), last.reason);
      BOOST_TEST(last.reason.find("a bulk payload of 32 bytes apart from its frame") !=
                     std::string::npos,
                 last.reason);
    }
  }
}
