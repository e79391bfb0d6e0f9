// consumer::next_batch() (blobpipe/pipeline/consumer.hpp): the events of
// one read at once, exactly the sequence next() yields, in batches of at
// most max_events; and the pool of small entries' blocks
// (consumer_options::recycle_small_entries): bounded, and fed from any
// thread.
//
// Coroutine lambdas are named locals of the (non-coroutine) test body, so
// their captures outlive the coroutines.
#define BOOST_TEST_MODULE consumer_batch
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/sender_session.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

// ---- a scripted stream --------------------------------------------------------

/// Entry `i` of blob `k`: `n` bytes of a pattern of (k, i).
std::vector<std::byte> pattern(std::size_t k, std::size_t i, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = std::byte((k * 31 + i * 7 + j) & 0xff);
  return v;
}

/// The whole stream after the hello, as sender_session frames it for
/// `limits`: blobs of inline and chunked entries, one aborted midway, then
/// a close frame.
std::vector<std::byte> scripted_stream(const sender_limits& limits) {
  // Entry sizes per blob; a negative count aborts the blob after that many.
  const std::vector<std::vector<std::size_t>> blobs = {
      std::vector<std::size_t>(40, 64),
      {300, 5000, 64, 70000, 8, 256, 257},
      {64, 64, 64},  // aborted after these
      std::vector<std::size_t>(200, 32),
  };
  const std::size_t aborted = 2;
  sender_session s;
  s.connect(limits);
  std::vector<std::byte> flat;
  auto take_out = [&] {
    for (const auto& p : s.out().pieces()) {
      const auto piece = p.bytes(s.out());
      flat.insert(flat.end(), piece.begin(), piece.end());
    }
    s.out().clear();
  };
  for (std::size_t k = 0; k < blobs.size(); ++k) {
    sender_blob b;
    layout_builder builder;
    for (std::size_t i = 0; i < blobs[k].size(); ++i) {
      const auto bytes = pattern(k, i, blobs[k][i]);
      auto pe = builder.add("e" + std::to_string(i),
                            value::tensor_bytes(bytes, "uint8",
                                                {static_cast<std::int64_t>(bytes.size())}));
      BOOST_REQUIRE(pe.has_value());
      const Entry& e = (*pe)->entry;
      const auto meta = e.meta();
      auto credit = s.plan_entry(b, e, meta);
      BOOST_REQUIRE(credit.has_value());
      BOOST_REQUIRE(s.take_credit(*credit));
      auto room = s.add_entry(b, e, meta, 0, entry_route::automatic);
      if (!room.empty()) {
        std::memcpy(room.data(), bytes.data(), bytes.size());
      } else {
        for (std::span<const std::byte> rest(bytes); !rest.empty();)
          rest = rest.subspan(s.add_chunk(b, rest));
      }
      BOOST_REQUIRE(s.entry_sent(b));
      take_out();  // the chunks point into `bytes`
    }
    if (k == aborted) {
      BOOST_REQUIRE(s.abort(b, "the producer gave up"));
    } else {
      auto plan = builder.finish(b.tag());
      BOOST_REQUIRE(plan.has_value());
      std::vector<std::byte> tail(tail_size(*plan));
      BOOST_REQUIRE(write_tail(*plan, tail).has_value());
      BOOST_REQUIRE(s.take_credit(tail.size()));
      BOOST_REQUIRE(s.finish(b, tail).has_value());
    }
    take_out();
  }
  frame_close(s.out(), "");
  take_out();
  return flat;
}

/// Says hello, then writes the scripted stream in pieces of seeded random
/// sizes (1 byte to 8 KiB; seed 0: all at once), letting the consumer run
/// between pieces, then reads acks until the consumer hangs up.
asio::awaitable<void> scripted_sender(std::unique_ptr<transport> t, unsigned seed,
                                      std::string& error) {
  std::error_code hec = co_await send_frame(*t, {.type = frame_type::hello}, encode_hello(hello{}));
  frame_reader in;
  auto [ec, reply] = co_await in.next(*t);
  auto h = decode_hello(reply.payload);
  if (hec || ec || !h) {
    error = "no hello from the consumer";
    co_return;
  }
  const auto flat = scripted_stream(sender_limits::from_hello(*h));
  std::mt19937 rng(seed);
  for (std::size_t at = 0; at < flat.size();) {
    const std::size_t n =
        seed == 0 ? flat.size() : std::min<std::size_t>(flat.size() - at, 1 + rng() % 8192);
    const asio::const_buffer buf(flat.data() + at, n);
    const std::error_code wec = co_await t->write(std::span(&buf, 1));
    if (wec) {
      error = "write: " + wec.message();
      co_return;
    }
    at += n;
    if (seed != 0) co_await yield_n(static_cast<int>(rng() % 3));
  }
  for (;;) {
    auto [rec, f] = co_await in.next(*t);
    if (rec) break;
  }
}

/// One line per event: what next() and next_batch() must agree on.
std::string describe(const event& ev) {
  std::ostringstream o;
  o << ev.kind << " blob " << ev.blob_id << " err " << ev.error.value() << " '" << ev.reason
    << "'";
  if (ev.entry) {
    const auto& e = *ev.entry;
    o << " #" << e.index << " " << e.entry.key << " " << e.view.bytes.size() << " bytes";
    const auto want = pattern(ev.blob_id - 1, e.index, e.view.bytes.size());
    o << (std::memcmp(want.data(), e.view.bytes.data(), want.size()) == 0 ? " ok" : " WRONG");
  }
  if (ev.blob) o << " rows " << ev.blob->index.entries.size();
  return o.str();
}

enum class mode { one_at_a_time, batches, mixed };

struct take_result {
  std::vector<std::string> seen;
  std::size_t largest_batch = 0;
  std::size_t batches = 0;
  bool end_not_last = false;  // an end_of_stream came before another event of its batch
  std::string error;
};

/// Takes every event until end_of_stream (plus one more call, which must
/// repeat it), by `m`, with batches of at most `max_events`.
asio::awaitable<void> take_all(std::unique_ptr<transport> t, mode m, std::size_t max_events,
                               take_result& out) {
  auto [ec, c] = co_await consumer::start(std::move(t));
  if (ec) {
    out.error = "consumer::start: " + ec.message();
    co_return;
  }
  std::vector<event> batch;
  for (int call = 0;; ++call) {
    const bool one = m == mode::one_at_a_time || (m == mode::mixed && call % 2 == 1);
    batch.clear();
    if (one) {
      event ev = co_await c.next();
      batch.push_back(std::move(ev));
    } else {
      const std::size_t n = co_await c.next_batch(batch, max_events);
      if (n != batch.size()) out.error = "next_batch's count differs from what it appended";
      ++out.batches;
      out.largest_batch = std::max(out.largest_batch, n);
    }
    bool ended = false;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      out.seen.push_back(describe(batch[i]));
      if (batch[i].kind != event_kind::end_of_stream) continue;
      ended = true;
      if (i + 1 != batch.size()) out.end_not_last = true;
    }
    if (ended) break;
  }
  // Every later call repeats the end, alone.
  batch.clear();
  const std::size_t again = co_await c.next_batch(batch, max_events);
  if (again != 1 || batch.size() != 1 || batch[0].kind != event_kind::end_of_stream)
    out.error = "the end was not repeated alone";
}

take_result run_script(link_kind l, unsigned seed, mode m, std::size_t max_events) {
  runner r;
  take_result got;
  std::string send_error;
  auto [a, b] = r.await(raw_pair(l));
  r.spawn(scripted_sender(std::move(a), seed, send_error));
  r.spawn(take_all(std::move(b), m, max_events, got));
  BOOST_TEST_REQUIRE(r.run(), "hung");
  BOOST_TEST_REQUIRE(send_error.empty(), send_error);
  BOOST_TEST_REQUIRE(got.error.empty(), got.error);
  return got;
}

}  // namespace

// The batches' events, one after another, are exactly next()'s sequence,
// whatever the chunking of the bytes, over loopback and TCP, and mixed
// with next(); a batch ends with end_of_stream when it holds one, and holds
// several events when a read brought several.
BOOST_AUTO_TEST_CASE(batches_yield_exactly_the_sequence_next_yields) {
  const auto want = run_script(link_kind::loopback, 0, mode::one_at_a_time, 1).seen;
  BOOST_TEST_REQUIRE(want.size() == 40 + 1 + 7 + 1 + 3 + 1 + 200 + 1 + 1);
  for (const auto& line : want) BOOST_TEST(line.find("WRONG") == std::string::npos, line);
  BOOST_TEST(want.back().find("end_of_stream") == 0);
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    for (unsigned seed : {0u, 1u, 2u, 3u, 4u, 5u}) {
      for (mode m : {mode::one_at_a_time, mode::batches, mode::mixed}) {
        BOOST_TEST_CONTEXT(link_name(l) << " seed " << seed << " mode " << int(m)) {
          const auto got = run_script(l, seed, m, default_batch_events);
          BOOST_TEST(got.seen == want, boost::test_tools::per_element());
          BOOST_TEST(!got.end_not_last);
          // Written at once over loopback, a read holds many events.
          if (seed == 0 && m == mode::batches && l == link_kind::loopback)
            BOOST_TEST(got.largest_batch > 40u);
        }
      }
    }
  }
}

// max_events bounds a batch; what is left comes in the next calls, in order.
BOOST_AUTO_TEST_CASE(a_batch_holds_at_most_max_events) {
  const auto want = run_script(link_kind::loopback, 0, mode::one_at_a_time, 1).seen;
  for (std::size_t max_events : {1u, 4u, 100u}) {
    BOOST_TEST_CONTEXT("max_events " << max_events) {
      const auto got = run_script(link_kind::loopback, 0, mode::batches, max_events);
      BOOST_TEST(got.seen == want, boost::test_tools::per_element());
      BOOST_TEST(got.largest_batch == max_events);
      BOOST_TEST(!got.end_not_last);
    }
  }
}

// ---- pooled small entry blocks ------------------------------------------------

namespace {

/// Emits `blobs` blobs of `per_blob` small entries (64 bytes), each blob
/// once `go` says so (null: at once), then shuts down.
asio::awaitable<void> send_small_blobs(sender& s, std::size_t blobs, std::size_t per_blob,
                                       const std::vector<std::byte>& bytes,
                                       const std::atomic<int>* go = nullptr) {
  auto ex = co_await asio::this_coro::executor;
  for (std::size_t k = 0; k < blobs; ++k) {
    while (go && go->load() < static_cast<int>(k)) co_await asio::post(ex, asio::use_awaitable);
    auto blob = s.open_blob();
    for (std::size_t i = 0; i < per_blob; ++i) {
      auto v = value::tensor_bytes(bytes, "uint8", {static_cast<std::int64_t>(bytes.size())});
      BLOBPIPE_CO_CHECK(blob.emit("e", std::move(v)));
    }
    BLOBPIPE_CO_CHECK(blob.finish());
  }
  BLOBPIPE_CO_CHECK(s.shutdown());
}

}  // namespace

// At most recycle_small_entries blocks are kept: 100 entries held until
// their blob completed, then dropped together, leave that many kept (the
// rest are freed), which the next blob's entries reuse; 0 keeps none.
BOOST_AUTO_TEST_CASE(kept_small_entry_blocks_stay_within_recycle_small_entries) {
  const std::vector<std::byte> bytes(64, std::byte{0x33});
  for (std::uint64_t keep : {std::uint64_t{8}, std::uint64_t{0}}) {
    BOOST_TEST_CONTEXT("recycle_small_entries " << keep) {
      runner r;
      consumer_options copt;
      copt.recycle_small_entries = keep;
      auto ep = r.await(connect(link_kind::loopback, copt));
      std::atomic<int> go{0};
      std::uint64_t kept_after_first = 0;
      std::uint64_t reused_in_first = 0;
      int entries = 0, wrong = 0;
      auto consume = [&]() -> asio::awaitable<void> {
        std::vector<std::shared_ptr<const received_entry>> held;
        for (;;) {
          event ev = co_await ep.c.next();
          if (ev.kind == event_kind::end_of_stream) {
            BOOST_TEST(!ev.error, ev.reason);
            co_return;
          }
          if (ev.kind == event_kind::entry_ready) {
            ++entries;
            if (ev.entry->view.bytes.size() != 64 ||
                std::memcmp(ev.entry->view.bytes.data(), bytes.data(), 64) != 0)
              ++wrong;
            held.push_back(std::move(ev.entry));
          }
          if (ev.kind != event_kind::blob_complete) continue;
          held.clear();
          if (++go == 1) {
            kept_after_first = ep.c.stats().small_entry_kept_bytes;
            reused_in_first = ep.c.stats().small_entries_reused;
          }
        }
      };
      r.spawn(send_small_blobs(ep.s, 2, 100, bytes, &go));
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(entries == 200);
      BOOST_TEST(wrong == 0);
      BOOST_TEST(reused_in_first == 0u);  // all 100 were out at once
      const auto st = ep.c.stats();
      if (keep == 0) {
        BOOST_TEST(kept_after_first == 0u);
        BOOST_TEST(st.small_entries_reused == 0u);
        BOOST_TEST(st.small_entry_kept_bytes == 0u);
      } else {
        // Eight blocks of one size, each about 1.2 KB.
        BOOST_TEST(kept_after_first % keep == 0u);
        BOOST_TEST(kept_after_first >= keep * 1024);
        BOOST_TEST(kept_after_first <= keep * 2048);
        BOOST_TEST(st.small_entries_reused == keep);  // the second blob took all eight
        BOOST_TEST(st.small_entry_kept_bytes == kept_after_first);
      }
    }
  }
}

// Small entries dropped on another thread give their blocks back to the
// consumer's pool (the tsan build checks the hand-over), and later entries
// reuse them with their own bytes intact: the window holds about twenty
// entries, so the sender finishes only as entries dropped there come back.
BOOST_AUTO_TEST_CASE(small_entries_dropped_on_another_thread_return_their_blocks) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      consumer_options copt;
      copt.window_bytes = 8 << 10;
      auto ep = r.await(connect(l, copt));
      std::mutex mu;
      std::condition_variable cv;
      std::deque<std::shared_ptr<const received_entry>> handed;  // null: no more
      std::atomic<int> dropped{0}, wrong{0};
      std::thread trainer([&] {
        for (;;) {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return !handed.empty(); });
          auto e = std::move(handed.front());
          handed.pop_front();
          lock.unlock();
          if (!e) break;
          const auto b = e->view.bytes;
          if (b.size() != 64 || std::to_integer<int>(b[0]) != int(e->blob_id & 0xff) ||
              std::to_integer<int>(b[63]) != int(e->blob_id & 0xff))
            ++wrong;
          e.reset();  // the last reference: dropped on this thread
          ++dropped;
        }
      });
      auto hand = [&](std::shared_ptr<const received_entry> e) {
        std::lock_guard lock(mu);
        handed.push_back(std::move(e));
        cv.notify_one();
      };
      int entries = 0;
      event end;
      auto consume = [&]() -> asio::awaitable<void> {
        std::vector<event> batch;
        for (;;) {
          batch.clear();
          co_await ep.c.next_batch(batch);
          for (auto& ev : batch) {
            if (ev.kind == event_kind::entry_ready) {
              ++entries;
              hand(std::move(ev.entry));
            }
            if (ev.kind == event_kind::end_of_stream) end = ev;
          }
          if (batch.back().kind == event_kind::end_of_stream) co_return;
        }
      };
      // Blob k's bytes are all k: a block reused with stale bytes shows.
      auto send = [&]() -> asio::awaitable<void> {
        for (std::size_t k = 1; k <= 10; ++k) {
          const std::vector<std::byte> bytes(64, std::byte(k));
          auto blob = ep.s.open_blob();
          for (int i = 0; i < 50; ++i) {
            auto v = value::tensor_bytes(bytes, "uint8", {64});
            BLOBPIPE_CO_CHECK(blob.emit("e", std::move(v)));
          }
          BLOBPIPE_CO_CHECK(blob.finish());
        }
        BLOBPIPE_CO_CHECK(ep.s.shutdown());
      };
      r.spawn(send());
      r.spawn(consume());
      bool ran = false;
      try {
        ran = r.run();
      } catch (...) {
        hand(nullptr);
        trainer.join();
        throw;
      }
      hand(nullptr);
      trainer.join();
      BOOST_TEST_REQUIRE(ran);
      BOOST_TEST(!end.error, end.error.message() << ": " << end.reason);
      BOOST_TEST(entries == 500);
      BOOST_TEST(dropped.load() == 500);
      BOOST_TEST(wrong.load() == 0);
      BOOST_TEST(ep.c.stats().small_entries_reused > 0u);
    }
  }
}

// max_events 0 still takes one event a call (the first, waited for).
BOOST_AUTO_TEST_CASE(a_batch_of_max_events_0_holds_one_event) {
  runner r;
  const std::vector<std::byte> bytes(64, std::byte{1});
  auto ep = r.await(connect(link_kind::loopback));
  int entries = 0, not_one = 0;
  auto take = [&]() -> asio::awaitable<void> {
    std::vector<event> b;
    for (;;) {
      b.clear();
      const std::size_t n = co_await ep.c.next_batch(b, 0);
      if (n != 1 || b.size() != 1) ++not_one;
      if (b.empty()) co_return;
      if (b[0].kind == event_kind::entry_ready) ++entries;
      if (b[0].kind == event_kind::end_of_stream) {
        BOOST_TEST(!b[0].error, b[0].reason);
        co_return;
      }
    }
  };
  r.spawn(send_small_blobs(ep.s, 3, 50, bytes));
  r.spawn(take());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(not_one == 0);
  BOOST_TEST(entries == 150);
}

// A next_batch() cancelled while it waits for the sender's bytes does not
// throw: the stream ends, its end_of_stream is the batch, and a later call
// repeats it (as next()).
BOOST_AUTO_TEST_CASE(a_cancelled_next_batch_ends_the_stream_without_throwing) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto ep = r.await(connect(l));
      asio::cancellation_signal cancel;
      bool returned = false, threw = false;
      std::vector<event> batch;
      std::size_t n = 0;
      auto canceller = [&]() -> asio::awaitable<void> {
        co_await yield_n(5);  // next_batch() waits for bytes
        cancel.emit(asio::cancellation_type::terminal);
        while (!returned) co_await yield_n(1);
      };
      asio::co_spawn(r.ctx, ep.c.next_batch(batch),
                     asio::bind_cancellation_slot(cancel.slot(),
                                                  [&](std::exception_ptr e, std::size_t k) {
                                                    returned = true;
                                                    threw = e != nullptr;
                                                    n = k;
                                                  }));
      r.spawn(canceller());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST_REQUIRE(returned);
      BOOST_TEST(!threw);
      BOOST_TEST(n == 1u);
      BOOST_TEST_REQUIRE(batch.size() == 1u);
      BOOST_TEST(batch[0].kind == event_kind::end_of_stream);
      std::vector<event> again;
      auto later = [&]() -> asio::awaitable<void> { (void)co_await ep.c.next_batch(again); };
      r.spawn(later());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST_REQUIRE(again.size() == 1u);
      BOOST_TEST(again[0].kind == event_kind::end_of_stream);
    }
  }
}

// Small entries held past the consumer's end (its pool of blocks with
// them) and then dropped on another thread, while the io_context lives:
// their blocks go back to the pool they came from, which lives until the
// last (asan: no use after free, no leak; tsan: the hand-over).
BOOST_AUTO_TEST_CASE(small_entries_outliving_their_consumer_drop_on_another_thread) {
  runner r;
  std::vector<std::shared_ptr<const received_entry>> held;
  const std::vector<std::byte> bytes(64, std::byte{7});
  consumer_options copt;
  copt.recycle_small_entries = 4;
  {
    auto ep = r.await(connect(link_kind::loopback, copt));
    auto take = [&]() -> asio::awaitable<void> {
      std::vector<event> b;
      for (;;) {
        b.clear();
        co_await ep.c.next_batch(b);
        for (auto& ev : b) {
          if (ev.entry) held.push_back(std::move(ev.entry));
          if (ev.kind == event_kind::end_of_stream) co_return;
        }
        // Some dropped here, so that the pool keeps blocks.
        if (held.size() > 20) held.erase(held.begin(), held.begin() + 10);
      }
    };
    r.spawn(send_small_blobs(ep.s, 2, 30, bytes));
    r.spawn(take());
    BOOST_TEST_REQUIRE(r.run());
  }  // the sender and the consumer are gone
  BOOST_TEST_REQUIRE(!held.empty());
  for (const auto& h : held)
    BOOST_TEST((h->view.bytes.size() == 64u &&
                std::memcmp(h->view.bytes.data(), bytes.data(), 64) == 0));
  std::thread other([&] { held.clear(); });
  other.join();
  r.run();  // what the drops posted
}
