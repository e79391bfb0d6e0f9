// The sender's bulk payloads over UCX (transport::write_window,
// post_write_bulk): the chunks of an entry larger than chunk_bytes go up to
// the window's number in flight at once, never more, so their rendezvous
// overlap; every entry still arrives byte-identical and in order. A transport with a window of 1 (every
// other) has one at a time: its write starts only when waited for, so
// nothing written after it can pass it. Counted on the sender's transport.
//
// Coroutine lambdas are named locals of the (non-coroutine) test body.
#define BOOST_TEST_MODULE send_window
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>

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

class window_counting_transport final : public forwarding_transport {
 public:
  window_counting_transport(std::unique_ptr<transport> inner, in_flight_counts& counts)
      : forwarding_transport(std::move(inner)), counts_(&counts) {}
  payload_receipt post_write_bulk(std::span<const std::byte> header,
                                  std::span<const asio::const_buffer> payload) override {
    ++counts_->posted;
    counts_->most = std::max(counts_->most, ++counts_->now);
    return payload_receipt(std::make_unique<counted>(
        *counts_, forwarding_transport::post_write_bulk(header, payload)));
  }

 private:
  class counted final : public payload_receipt::pending {
   public:
    counted(in_flight_counts& counts, payload_receipt inner)
        : counts_(&counts), inner_(std::move(inner)) {}
    ~counted() override {
      if (!waited_) --counts_->now;
    }
    asio::awaitable<std::error_code> wait() override {
      const std::error_code ec = co_await inner_.wait();
      waited_ = true;
      --counts_->now;
      co_return ec;
    }
    bool ready() const noexcept override { return inner_.ready(); }

   private:
    in_flight_counts* counts_;
    payload_receipt inner_;
    bool waited_ = false;
  };

  in_flight_counts* counts_;
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
/// bulk payloads counted) and consumer over `l`.
asio::awaitable<endpoints> connect_counting(link_kind l, in_flight_counts& counts,
                                            transport_wrap wrap) {
  consumer_options copt;
  copt.window_bytes = 64 << 20;
  sender_options sopt;
  sopt.chunk_bytes = 256 << 10;
  co_return co_await connect(l, copt, sopt, [&counts, wrap](std::unique_ptr<transport> t) {
    if (wrap) t = wrap(std::move(t));
    return std::unique_ptr<transport>(
        std::make_unique<window_counting_transport>(std::move(t), counts));
  });
}

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
