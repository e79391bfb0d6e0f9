// The sender's bulk payloads over UCX (transport::write_window,
// post_write_bulk): the chunks of an entry larger than chunk_bytes go up to
// the window's number in flight at once, never more, so their rendezvous
// overlap; every entry still arrives byte-identical and in order. A transport with a window of 1 (every
// other) has one at a time: its write starts only when waited for, so
// nothing written after it can pass it. Counted on the sender's transport.
// A producer cancelled with sends in flight returns once they have ended;
// a resend session's, once its kept entry is sent whole, still cancelled.
//
// Coroutine lambdas are named locals of the (non-coroutine) test body.
#define BOOST_TEST_MODULE send_window
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <tuple>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include "test/forwarding_transport.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// Bulk payloads in flight on the sender's transport: started by
/// post_write_bulk, not yet waited for to the end.
struct in_flight_counts {
  std::size_t now = 0;
  std::size_t most = 0;
  std::size_t posted = 0;
};

/// Receipts that pass it end only once the test opens it: a peer slow to
/// fetch the payloads, whatever the link does.
class receipt_gate {
 public:
  explicit receipt_gate(asio::any_io_executor ex) : timer_(std::move(ex)) {
    timer_.expires_at(asio::steady_timer::time_point::max());
  }
  void open() {
    open_ = true;
    timer_.cancel();
  }
  bool is_open() const noexcept { return open_; }
  asio::awaitable<void> pass() {
    while (!open_)
      (void)co_await timer_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }

 private:
  asio::steady_timer timer_;
  bool open_ = false;
};

class window_counting_transport final : public forwarding_transport {
 public:
  /// `gate`, when given, holds back the end of every receipt.
  window_counting_transport(std::unique_ptr<transport> inner, in_flight_counts& counts,
                            receipt_gate* gate = nullptr)
      : forwarding_transport(std::move(inner)), counts_(&counts), gate_(gate) {}
  payload_receipt post_write_bulk(std::span<const std::byte> header,
                                  std::span<const asio::const_buffer> payload) override {
    ++counts_->posted;
    counts_->most = std::max(counts_->most, ++counts_->now);
    return payload_receipt(std::make_unique<counted>(
        *counts_, gate_, forwarding_transport::post_write_bulk(header, payload)));
  }

 private:
  class counted final : public payload_receipt::pending {
   public:
    counted(in_flight_counts& counts, receipt_gate* gate, payload_receipt inner)
        : counts_(&counts), gate_(gate), inner_(std::move(inner)) {}
    ~counted() override {
      if (!waited_) --counts_->now;
    }
    asio::awaitable<std::error_code> wait() override {
      const std::error_code ec = co_await inner_.wait();
      if (gate_) co_await gate_->pass();
      waited_ = true;
      --counts_->now;
      co_return ec;
    }
    bool ready() const noexcept override {
      return (!gate_ || gate_->is_open()) && inner_.ready();
    }

   private:
    in_flight_counts* counts_;
    receipt_gate* gate_;
    payload_receipt inner_;
    bool waited_ = false;
  };

  in_flight_counts* counts_;
  receipt_gate* gate_;
};

/// A transport whose write window is cut to `window`.
class window_of final : public forwarding_transport {
 public:
  window_of(std::unique_ptr<transport> inner, std::size_t window)
      : forwarding_transport(std::move(inner)), window_(window) {}
  std::size_t write_window() const noexcept override { return window_; }

 private:
  std::size_t window_;
};

/// Bulk messages written as plain bytes, each started only when its
/// receipt is waited for (transport's own post_write_bulk, window 1): a
/// byte stream such as the in-process one, sending as UCX would.
class bulk_in_wait final : public forwarding_transport {
 public:
  using forwarding_transport::forwarding_transport;
  bool sends_bulk() const noexcept override { return true; }
  std::size_t write_window() const noexcept override { return 1; }
  payload_receipt post_write_bulk(std::span<const std::byte> header,
                                  std::span<const asio::const_buffer> payload) override {
    return transport::post_write_bulk(header, payload);
  }
};

/// A started sender (its transport wrapped by `wrap` when given, then its
/// bulk payloads counted, their ends held by `gate` when given) and
/// consumer over `l`.
asio::awaitable<endpoints> connect_counting(link_kind l, in_flight_counts& counts,
                                            transport_wrap wrap, receipt_gate* gate = nullptr) {
  consumer_options copt;
  copt.window_bytes = 64 << 20;
  sender_options sopt;
  sopt.chunk_bytes = 256 << 10;
  co_return co_await connect(l, copt, sopt, [&counts, wrap, gate](std::unique_ptr<transport> t) {
    if (wrap) t = wrap(std::move(t));
    return std::unique_ptr<transport>(
        std::make_unique<window_counting_transport>(std::move(t), counts, gate));
  });
}

/// One emit of `values` as entry "e" of `blob`, spawned on `r` with a
/// cancellation signal of its own (`cancel`): the sends in flight
/// (`counts`) when the emit returned, what it returned, whether its
/// coroutine was still cancelled after it, and what the coroutine threw
/// (a cancelled one throws operation_aborted at its next co_await). Lives
/// until the spawned coroutine ends.
struct cancellable_emit {
  asio::cancellation_signal cancel;
  std::optional<std::size_t> in_flight_at_return;  // set when emit returned
  std::error_code emitted;
  bool still_cancelled = false;
  bool ended = false;  // the coroutine
  std::error_code thrown;

  void spawn(runner& r, blob_writer& blob, const std::vector<float>& values,
             const in_flight_counts& counts) {
    asio::co_spawn(r.ctx, produce(this, &blob, &values, &counts),
                   asio::bind_cancellation_slot(cancel.slot(), [this](std::exception_ptr e) {
                     ended = true;
                     if (!e) return;
                     try {
                       std::rethrow_exception(e);
                     } catch (const std::system_error& x) {
                       thrown = x.code();
                     }
                   }));
  }

 private:
  static asio::awaitable<void> produce(cancellable_emit* self, blob_writer* blob,
                                       const std::vector<float>* values,
                                       const in_flight_counts* counts) {
    self->emitted = co_await blob->emit("e", value::tensor(*values));
    self->in_flight_at_return = counts->now;
    const auto cs = co_await asio::this_coro::cancellation_state;
    self->still_cancelled = cs.cancelled() != asio::cancellation_type::none;
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  }
};

/// Sends `n` entries of 4 MiB in one blob over `l`, in chunks of 256 KiB
/// (16 bulk payloads each), the sender's transport wrapped by `wrap`;
/// checks each arrives whole and in order. The counts of the sender's
/// transport.
in_flight_counts send_entries(link_kind l, int n, transport_wrap wrap = {}) {
  in_flight_counts counts;
  runner r;
  auto ep = r.await(connect_counting(l, counts, std::move(wrap)));
  std::vector<std::vector<float>> values;
  for (int i = 0; i < n; ++i) values.push_back(ramp(1 << 20, float(i)));
  int arrived = 0;
  bool complete = false;
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    for (int i = 0; i < n; ++i) {
      auto v = value::tensor(values[static_cast<std::size_t>(i)]);
      BLOBPIPE_CO_CHECK(blob.emit("e" + std::to_string(i), std::move(v)));
    }
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::entry_ready) {
        const auto i = static_cast<std::size_t>(arrived++);
        const auto& v = ev.entry->view;
        BOOST_TEST(v.entry->key == "e" + std::to_string(i));
        BOOST_TEST((v.bytes.size() == values[i].size() * sizeof(float) &&
                    std::memcmp(v.bytes.data(), values[i].data(), v.bytes.size()) == 0),
                   "entry " << i << " arrived changed");
      } else if (ev.kind == event_kind::blob_complete) {
        complete = true;
      } else {
        BOOST_TEST(ev.kind == event_kind::end_of_stream);
        BOOST_TEST(!ev.error, ev.error.message() << ": " << ev.reason);
        break;
      }
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(arrived == n);
  BOOST_TEST(complete);
  BOOST_TEST(counts.now == 0u, "every bulk payload waited for");
  return counts;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ucx_keeps_up_to_its_write_window_of_bulk_payloads_in_flight) {
  for (link_kind l : offered_links({link_kind::ucx_tcp, link_kind::ucx_sm})) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      // 16 chunks of each entry written at once: more than a window's worth.
      const auto counts = send_entries(l, 2);
      BOOST_TEST(counts.posted == 32u);
      // The producer queues 8 chunks ahead: the window fills, never more.
      BOOST_TEST(counts.most == 8u, counts.most << " in flight, not the window of 8");
    }
  }
}

// A window of 1 (the default of transport::write_window) has one bulk
// payload at a time; one of 3 fills to 3 (16 chunks are queued ahead of
// it), never more; the stream arrives as with any window.
BOOST_AUTO_TEST_CASE(a_window_of_w_has_w_bulk_payloads_in_flight) {
  for (link_kind l : offered_links({link_kind::ucx_tcp})) {
    for (std::size_t window : {1u, 3u}) {
      BOOST_TEST_CONTEXT(link_name(l) << ", window " << window) {
        const auto counts = send_entries(l, 2, [window](std::unique_ptr<transport> t) {
          return std::unique_ptr<transport>(std::make_unique<window_of>(std::move(t), window));
        });
        BOOST_TEST(counts.posted == 32u);
        BOOST_TEST(counts.most == window);
      }
    }
  }
}

// transport's own post_write_bulk starts the write only in wait(), and the
// send queue waits for it before writing on: over a byte stream every
// chunk lands where its frame header says (a chunk passed by the next
// frame's header would be a protocol violation).
BOOST_AUTO_TEST_CASE(a_bulk_write_that_starts_when_waited_for_keeps_its_place) {
  const auto counts = send_entries(link_kind::loopback, 2, [](std::unique_ptr<transport> t) {
    return std::unique_ptr<transport>(std::make_unique<bulk_in_wait>(std::move(t)));
  });
  BOOST_TEST(counts.posted == 32u);
  BOOST_TEST(counts.most == 1u);
}

// A producer stopped while its chunks are in flight ends only once no send
// reads its memory any more, whatever stopped it. The queue fails and
// closes the transport, and the sends in flight end (here when the test
// opens the gate, 200 ms after the stop) before emit returns `closed`. A
// cancelled producer stays cancelled (its next co_await throws
// operation_aborted): the cancellation neither ends that wait nor is lost.
BOOST_AUTO_TEST_CASE(a_stopped_producer_ends_once_no_send_reads_its_memory) {
  for (link_kind l : offered_links({link_kind::ucx_tcp})) {
    for (const bool cancelled : {true, false}) {
      BOOST_TEST_CONTEXT(link_name(l) << (cancelled ? ", cancelled" : ", sender closed")) {
        in_flight_counts counts;
        runner r;
        receipt_gate gate(r.ex());
        auto ep = r.await(connect_counting(l, counts, {}, &gate));
        const auto values = ramp(1 << 20, 1.f);  // 4 MiB: 16 chunks
        auto blob = ep.s.open_blob();
        cancellable_emit e;
        e.spawn(r, blob, values, counts);
        // The window fills (8 chunks in flight, none ended), then the
        // producer is stopped.
        for (int i = 0; i < 600 && counts.now < 8; ++i)
          r.ctx.run_for(std::chrono::milliseconds(10));
        BOOST_TEST_REQUIRE(counts.now == 8u, counts.now << " in flight");
        BOOST_TEST_REQUIRE(!e.in_flight_at_return);
        if (cancelled) e.cancel.emit(asio::cancellation_type::terminal);
        else ep.s.close();
        r.ctx.run_for(std::chrono::milliseconds(200));
        BOOST_TEST(!e.in_flight_at_return, "emit ended with " << counts.now
                                                         << " sends reading its memory");
        gate.open();
        for (int i = 0; i < 600 && !e.ended; ++i)
          r.ctx.run_for(std::chrono::milliseconds(10));
        BOOST_TEST_REQUIRE(e.in_flight_at_return.has_value());
        BOOST_TEST(*e.in_flight_at_return == 0u);
        BOOST_TEST(e.thrown == (cancelled ? std::error_code(asio::error::operation_aborted)
                                          : std::error_code{}),
                   e.thrown.message());
        BOOST_TEST(e.emitted == make_error_code(errc::closed), e.emitted.message());
        BOOST_TEST(e.still_cancelled == cancelled);
      }
    }
  }
}

namespace {

// A resend session's producer cancelled while its kept entry is on the
// wire: the entry is sent whole on the same connection (half an entry on
// a live connection would break it), the emit returns once it is, and the
// producer is still cancelled afterwards, its cancellation neither lost
// nor ending the send early (docs/reliability.md "producer cancelled
// mid-blob"). Over `l`, the sender's transport wrapped by `wrap` when
// given, with `window` bulk payloads in flight once the gate holds them.
void cancel_a_resend_producer_mid_entry(link_kind l, transport_wrap wrap, std::size_t window) {
  in_flight_counts counts;
  runner r;
  receipt_gate gate(r.ex());
  consumer_options copt;
  copt.window_bytes = 64 << 20;
  copt.delivered = std::make_shared<delivery_log>();
  sender_options sopt;
  sopt.chunk_bytes = 256 << 10;
  sopt.resend.unacked_bytes = 64 << 20;
  std::optional<consumer> c;
  int connects = 0;  // a second would mean the entry was cut short
  connect_fn connect_once = [&]()
      -> asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> {
    if (connects++ > 0)
      co_return std::tuple{make_error_code(errc::peer_failed), std::unique_ptr<transport>()};
    auto [a, b] = co_await raw_pair(l);
    asio::co_spawn(r.ctx, consumer::start(std::move(b), copt),
                   [&](std::exception_ptr, auto started) {
                     if (!std::get<0>(started)) c = std::move(std::get<1>(started));
                   });
    if (wrap) a = wrap(std::move(a));
    co_return std::tuple{std::error_code{},
                         std::unique_ptr<transport>(std::make_unique<window_counting_transport>(
                             std::move(a), counts, &gate))};
  };
  auto [sec, s] = r.await(sender::start(connect_once, sopt));
  BOOST_TEST_REQUIRE(!sec, sec.message());
  for (int i = 0; i < 600 && !c; ++i) r.ctx.run_for(std::chrono::milliseconds(10));
  BOOST_TEST_REQUIRE(c.has_value());
  const auto values = ramp(1 << 20, 2.f);  // 4 MiB: 16 chunks
  bool arrived_whole = false;
  // Reads all along, as a trainer does (an in-process write ends once
  // read, a UCX send once the consumer's worker has answered the fetch),
  // until the stream ends.
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await c->next();
      if (ev.kind == event_kind::entry_ready) {
        const auto& v = ev.entry->view;
        arrived_whole = v.bytes.size() == values.size() * sizeof(float) &&
                        std::memcmp(v.bytes.data(), values.data(), v.bytes.size()) == 0;
      }
      if (ev.kind == event_kind::end_of_stream) co_return;
    }
  };
  r.spawn(consume());
  auto blob = s.open_blob();
  cancellable_emit e;
  e.spawn(r, blob, values, counts);
  for (int i = 0; i < 600 && counts.now < window; ++i) r.ctx.run_for(std::chrono::milliseconds(10));
  BOOST_TEST_REQUIRE(counts.now == window, counts.now << " in flight, " << counts.posted
                                                    << " posted, emit "
                                                    << (e.ended ? "ended" : "waiting"));
  e.cancel.emit(asio::cancellation_type::terminal);
  r.ctx.run_for(std::chrono::milliseconds(200));
  BOOST_TEST(!e.in_flight_at_return, "emit returned before its kept entry was sent");
  gate.open();
  for (int i = 0; i < 600 && !(e.ended && arrived_whole); ++i)
    r.ctx.run_for(std::chrono::milliseconds(10));
  BOOST_TEST_REQUIRE(e.ended, "emit still waiting: " << counts.now << " in flight, entry "
                                                     << (arrived_whole ? "arrived" : "not arrived"));
  BOOST_TEST(!e.emitted, e.emitted.message());
  BOOST_TEST(arrived_whole, "the kept entry arrived whole");
  BOOST_TEST(e.still_cancelled, "the producer's cancellation was lost");
  BOOST_TEST(e.thrown == std::error_code(asio::error::operation_aborted), e.thrown.message());
  BOOST_TEST(connects == 1, "the connection broke: " << connects << " connects");
  BOOST_TEST(counts.now == 0u, "every bulk payload waited for");
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_cancelled_resend_producer_sends_its_kept_entry_whole_and_stays_cancelled) {
  BOOST_TEST_CONTEXT("loopback, one bulk payload at a time") {
    cancel_a_resend_producer_mid_entry(link_kind::loopback, [](std::unique_ptr<transport> t) {
      return std::unique_ptr<transport>(std::make_unique<bulk_in_wait>(std::move(t)));
    }, 1);
  }
  for (link_kind l : offered_links({link_kind::ucx_tcp}))
    BOOST_TEST_CONTEXT(link_name(l)) { cancel_a_resend_producer_mid_entry(l, {}, 8); }
}
