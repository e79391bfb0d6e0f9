// Consumer behaviour (blobpipe/pipeline/consumer.hpp) end to end over loopback and
// TCP: early entries, bounded memory, drops, malformed frames, close.
//
// Coroutine lambdas are named locals of the (non-coroutine) test body, so
// their captures outlive the coroutines, and none is nested in another
// coroutine (GCC 12 mis-compiles that with Boost.Test's __func__).
#define BOOST_TEST_MODULE consumer
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

const std::vector<link_kind> both = all_links();

bool same_bytes(std::span<const std::byte> a, const void* b, std::size_t n) {
  return a.size() == n && (n == 0 || std::memcmp(a.data(), b, n) == 0);
}

}  // namespace

// (a) Entries are yielded as soon as their bytes arrive, before the tail:
// the producer holds finish() back until the consumer has seen every entry.
BOOST_AUTO_TEST_CASE(consumer_yields_entry_before_tail) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      gate tail_gate(r.ex());
      bool tail_sent = false, completed = false;
      int entries_seen = 0;
      const auto a = ramp(1000, 1.0f);  // 4000 bytes: several 256-byte chunks
      const auto b = ramp(7, 50.0f);
      auto ep = r.await(connect(l, {}, {.chunk_bytes = 256}));
      auto produce = [&]() -> asio::awaitable<void> {
        auto blob = ep.s.open_blob();
        BLOBPIPE_CO_CHECK(blob.emit("a", value::tensor(a)));
        auto vb = value::tensor(b, {7});  // (no braced temporaries across co_await: GCC 12)
        BLOBPIPE_CO_CHECK(blob.emit("b", std::move(vb)));
        co_await tail_gate.wait();  // hold the tail back
        tail_sent = true;
        BLOBPIPE_CO_CHECK(blob.finish());
        BLOBPIPE_CO_CHECK(ep.s.shutdown());
      };
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          if (ev.kind == event_kind::entry_ready) {
            BOOST_TEST(!tail_sent);
            ++entries_seen;
            const auto& v = ev.entry->view;
            if (ev.entry->index == 0) {
              BOOST_TEST(v.entry->key == "a");
              BOOST_TEST(same_bytes(v.bytes, a.data(), a.size() * 4));
              BOOST_TEST(v.at<float>(999) == 1000.0f);
            } else {
              BOOST_TEST(v.entry->key == "b");
              BOOST_TEST(v.shape == (shape_t{7}));
              tail_gate.open();
            }
          } else if (ev.kind == event_kind::blob_complete) {
            BOOST_TEST(tail_sent);
            BOOST_TEST(ev.blob->index.entries.size() == 2u);
            completed = true;
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
      BOOST_TEST(entries_seen == 2);
      BOOST_TEST(completed);
    }
  }
}

// Entries of many rendezvous-sized chunks from two producers at once arrive
// byte-identical. Over UCX (payload_window() > 1) the consumer posts the
// next chunk's fetch while earlier ones are in flight; with
// payload_window = 1, or over a transport that allows one, it never does.
BOOST_AUTO_TEST_CASE(multi_chunk_entries_arrive_intact_with_fetches_overlapped) {
  struct variant {
    link_kind link;
    std::size_t window;
  };
  std::vector<variant> variants;
  for (link_kind l : both) variants.push_back({l, 4});
  variants.push_back({link_kind::ucx_tcp, 1});
  for (const variant& v : variants) {
    BOOST_TEST_CONTEXT(link_name(v.link) << ", payload_window " << v.window) {
      runner r;
      const auto x = ramp(256 << 10, 1.0f);  // 1 MiB: 16 chunks of 64 KiB
      const auto y = ramp(200 << 10, 9.0f);  // 800 KiB: 12.5 chunks
      consumer_options copt;
      copt.payload_window = v.window;
      auto ep = r.await(connect(v.link, copt, {.chunk_bytes = 64 << 10}));
      int producing = 2, entries = 0, mismatched = 0;
      consumer_stats st;
      auto produce = [&](const char* key, const std::vector<float>& data) {
        return [&, key]() -> asio::awaitable<void> {
          for (int i = 0; i < 2; ++i) {
            auto blob = ep.s.open_blob();
            BLOBPIPE_CO_CHECK(blob.emit(key, value::tensor(data)));
            BLOBPIPE_CO_CHECK(blob.finish());
          }
          if (--producing == 0) BLOBPIPE_CO_CHECK(ep.s.shutdown());
        };
      };
      auto px = produce("x", x);
      auto py = produce("y", y);
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          if (ev.kind == event_kind::end_of_stream) {
            BOOST_TEST(!ev.error, ev.error.message() << ": " << ev.reason);
            break;
          }
          if (ev.kind != event_kind::entry_ready) continue;
          ++entries;
          const auto& want = ev.entry->entry.key == "x" ? x : y;
          if (!same_bytes(ev.entry->view.bytes, want.data(), want.size() * 4)) ++mismatched;
        }
        st = ep.c.stats();
      };
      r.spawn(px());
      r.spawn(py());
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(entries == 4);
      BOOST_TEST(mismatched == 0);
      BOOST_TEST(st.blobs_completed == 4u);
      if (is_ucx(v.link) && v.window > 1)
        BOOST_TEST(st.chunks_overlapped > 0u);
      else
        BOOST_TEST(st.chunks_overlapped == 0u);
    }
  }
}

// Entries of one rendezvous-sized chunk each, from four producers at once,
// arrive intact and in order: within a blob by index, each blob's entries
// before its blob_complete. Over UCX the consumer may keep later entries'
// fetches in flight while an earlier one lands; whether they overlap in
// one process depends on timing (consumer_overlap_test checks the
// scheduling itself). Over TCP and loopback they never do.
BOOST_AUTO_TEST_CASE(single_chunk_entries_of_many_producers_arrive_in_order) {
  constexpr int producers = 4, entries_per_blob = 6;
  constexpr std::size_t floats = 64 << 10;  // 256 KiB: one chunk, rendezvous over UCX
  std::vector<std::vector<float>> sources;
  for (int p = 0; p < producers; ++p)
    for (int i = 0; i < entries_per_blob; ++i)
      sources.push_back(ramp(floats, float(1000 * p + 10 * i)));
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto ep = r.await(connect(l, {}, {}));
      int producing = producers, entries = 0, mismatched = 0, out_of_order = 0, completed = 0;
      std::map<std::uint64_t, std::size_t> next_index;  // per blob id
      consumer_stats st;
      auto produce = [&](int p) -> asio::awaitable<void> {
        auto blob = ep.s.open_blob();
        for (int i = 0; i < entries_per_blob; ++i) {
          auto v = value::tensor(sources[p * entries_per_blob + i]);
          BLOBPIPE_CO_CHECK(blob.emit("p" + std::to_string(p) + "e" + std::to_string(i),
                                      std::move(v)));
        }
        BLOBPIPE_CO_CHECK(blob.finish());
        if (--producing == 0) BLOBPIPE_CO_CHECK(ep.s.shutdown());
      };
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          if (ev.kind == event_kind::end_of_stream) {
            BOOST_TEST(!ev.error, ev.error.message() << ": " << ev.reason);
            break;
          }
          if (ev.kind == event_kind::blob_complete) {
            if (next_index[ev.blob_id] != std::size_t(entries_per_blob)) ++out_of_order;
            ++completed;
            continue;
          }
          if (ev.kind != event_kind::entry_ready) continue;
          ++entries;
          if (ev.entry->index != next_index[ev.blob_id]++) ++out_of_order;
          const auto& key = ev.entry->entry.key;  // "p<P>e<I>"
          const int p = key[1] - '0', i = key[3] - '0';
          const auto& want = sources.at(p * entries_per_blob + i);
          if (!same_bytes(ev.entry->view.bytes, want.data(), want.size() * 4)) ++mismatched;
        }
        st = ep.c.stats();
      };
      for (int p = 0; p < producers; ++p) r.spawn(produce(p));
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(entries == producers * entries_per_blob);
      BOOST_TEST(completed == producers);
      BOOST_TEST(mismatched == 0);
      BOOST_TEST(out_of_order == 0);
      if (!is_ucx(l)) BOOST_TEST(st.chunks_overlapped == 0u);
    }
  }
}

namespace {

// Sends one blob whose entry i ("e<i>") is a view of *sources[i], then
// shuts the sender down. With `taken`, entry i+1 is sent only once
// *taken exceeds i (the consumer's application has had entry i), so which
// entries are released before the next one arrives does not depend on
// how reads and turns happen to interleave.
asio::awaitable<void> send_blob_of(sender& s, const std::vector<const std::vector<float>*>& sources,
                                   const int* taken = nullptr) {
  auto ex = co_await asio::this_coro::executor;
  auto blob = s.open_blob();
  for (std::size_t i = 0; i < sources.size(); ++i) {
    auto v = value::tensor(*sources[i]);
    BLOBPIPE_CO_CHECK(blob.emit("e" + std::to_string(i), std::move(v)));
    if (!taken) continue;
    BLOBPIPE_CO_CHECK(s.flush());
    while (*taken <= static_cast<int>(i)) co_await asio::post(ex, asio::use_awaitable);
  }
  BLOBPIPE_CO_CHECK(blob.finish());
  BLOBPIPE_CO_CHECK(s.shutdown());
}

// Hands every entry to `on_entry` (the event's reference moved in, so the
// entry is dropped when on_entry lets go of it, before the next frame is
// read) until the stream ends; returns the end_of_stream event.
asio::awaitable<event> for_each_entry(
    consumer& c, std::function<void(std::shared_ptr<const received_entry>)> on_entry) {
  for (;;) {
    auto ev = co_await c.next();
    if (ev.kind == event_kind::end_of_stream) co_return ev;
    if (ev.kind == event_kind::entry_ready) on_entry(std::move(ev.entry));
  }
}

}  // namespace

// Released entry buffers are reused by later entries of the same size
// (consumer_options::recycle_bytes), never while an entry still holds one,
// and a reused buffer holds exactly the new entry's bytes: entry 0 is held
// for the whole run, entries 1..5 are dropped as soon as they arrive (each
// sent once the one before it was), so entries 2..5 land in entry 1's
// buffer and entry 0's bytes stay intact.
BOOST_AUTO_TEST_CASE(released_entry_buffers_are_reused_held_ones_never) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      const auto a = ramp(64 << 10, 1.0f);  // 256 KiB, above buffer_pool::min_bytes
      const auto b = ramp(64 << 10, 7.0f);  // the same size, other bytes
      const std::vector<const std::vector<float>*> sources = {&a, &b, &a, &b, &a, &b};
      auto ep = r.await(connect(l));
      std::shared_ptr<const received_entry> held;
      int entries = 0, mismatched = 0, shared_with_held = 0;
      event end;
      auto on_entry = [&](std::shared_ptr<const received_entry> e) {
        ++entries;
        const auto& want = *sources[e->index];
        if (!same_bytes(e->view.bytes, want.data(), want.size() * 4)) ++mismatched;
        if (e->index == 0)
          held = e;
        else if (held && e->view.bytes.data() == held->view.bytes.data())
          ++shared_with_held;
      };
      auto consume = [&]() -> asio::awaitable<void> { end = co_await for_each_entry(ep.c, on_entry); };
      r.spawn(send_blob_of(ep.s, sources, &entries));
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(!end.error, end.error.message() << ": " << end.reason);
      BOOST_TEST(entries == 6);
      BOOST_TEST(mismatched == 0);
      BOOST_TEST(shared_with_held == 0);
      BOOST_TEST_REQUIRE(held != nullptr);
      BOOST_TEST(same_bytes(held->view.bytes, a.data(), a.size() * 4));
      const auto st = ep.c.stats();
      BOOST_TEST(st.buffers_reused == 4u);
      BOOST_TEST(st.recycle_kept_bytes == std::uint64_t(256 << 10));  // entry 5's buffer
    }
  }
}

// What is kept never exceeds recycle_bytes: an entry larger than it is
// freed, and the least recently released buffer goes when a new one would
// not fit. With recycle_bytes 0 nothing is kept or reused.
BOOST_AUTO_TEST_CASE(recycling_stays_within_recycle_bytes_and_can_be_off) {
  // Entries of 256 KiB, 192 KiB and 1 MiB, twice, then 128 KiB and
  // 256 KiB, each dropped at once. With 512 KiB: the second 256 KiB and
  // 192 KiB entries reuse the first ones' buffers (kept: 448 KiB); the
  // 1 MiB ones are never kept; the 128 KiB one evicts the least recently
  // released, the 256 KiB buffer (kept: 192 + 128 KiB), so the last entry
  // finds none to reuse and its buffer evicts the 192 KiB one (kept:
  // 128 + 256 KiB). Evicting the newest instead would reuse a third time.
  const std::vector<std::size_t> floats = {64 << 10, 48 << 10, 256 << 10, 64 << 10,
                                           48 << 10, 256 << 10, 32 << 10, 64 << 10};
  std::vector<std::vector<float>> values;  // entries are views: kept alive here
  std::vector<const std::vector<float>*> sources;
  for (std::size_t i = 0; i < floats.size(); ++i) values.push_back(ramp(floats[i], float(i)));
  for (const auto& v : values) sources.push_back(&v);
  for (std::uint64_t recycle : {std::uint64_t(512) << 10, std::uint64_t(0)}) {
    BOOST_TEST_CONTEXT("recycle_bytes " << recycle) {
      runner r;
      consumer_options copt;
      copt.recycle_bytes = recycle;
      auto ep = r.await(connect(link_kind::loopback, copt));
      std::uint64_t most_kept = 0;
      int entries = 0, mismatched = 0;
      event end;
      auto on_entry = [&](std::shared_ptr<const received_entry> e) {
        // Sampled before the entry goes: what earlier releases left kept.
        most_kept = std::max(most_kept, ep.c.stats().recycle_kept_bytes);
        ++entries;
        const auto& want = values[e->index];
        if (!same_bytes(e->view.bytes, want.data(), want.size() * 4)) ++mismatched;
      };
      auto consume = [&]() -> asio::awaitable<void> { end = co_await for_each_entry(ep.c, on_entry); };
      r.spawn(send_blob_of(ep.s, sources));
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(!end.error, end.error.message() << ": " << end.reason);
      BOOST_TEST(entries == int(floats.size()));
      BOOST_TEST(mismatched == 0);
      BOOST_TEST(most_kept <= recycle);
      const auto st = ep.c.stats();
      BOOST_TEST(st.buffers_reused == (recycle > 0 ? 2u : 0u));
      if (recycle > 0) {
        BOOST_TEST(most_kept == std::uint64_t(448) << 10);
        BOOST_TEST(st.recycle_kept_bytes == std::uint64_t(384) << 10);
      } else {
        BOOST_TEST(st.recycle_kept_bytes == 0u);
      }
    }
  }
}

// Entries dropped on another thread (a trainer hands them to its own
// threads) return their window credit all the same, without touching the
// consumer's state off its executor (the tsan build checks that): with a
// window of four entries, the sender can only finish if the credit of the
// entries dropped elsewhere comes back.
BOOST_AUTO_TEST_CASE(entries_dropped_on_another_thread_return_their_credit) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      const auto a = ramp(64 << 10, 3.0f);  // 256 KiB
      const std::vector<const std::vector<float>*> sources(32, &a);
      consumer_options copt;
      copt.window_bytes = 4 * a.size() * sizeof(float);
      auto ep = r.await(connect(l, copt));
      std::mutex mu;
      std::condition_variable cv;
      std::deque<std::shared_ptr<const received_entry>> handed;  // null: no more
      std::atomic<int> dropped{0}, mismatched{0};
      std::thread trainer([&] {
        for (;;) {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return !handed.empty(); });
          auto e = std::move(handed.front());
          handed.pop_front();
          lock.unlock();
          if (!e) break;
          if (!same_bytes(e->view.bytes, a.data(), a.size() * 4)) ++mismatched;
          e.reset();  // the last reference: released on this thread
          ++dropped;
        }
      });
      int entries = 0;
      auto hand = [&](std::shared_ptr<const received_entry> e) {
        if (e) ++entries;
        std::lock_guard lock(mu);
        handed.push_back(std::move(e));
        cv.notify_one();
      };
      event end;
      auto consume = [&]() -> asio::awaitable<void> { end = co_await for_each_entry(ep.c, hand); };
      r.spawn(send_blob_of(ep.s, sources));
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
      BOOST_TEST(entries == int(sources.size()));
      BOOST_TEST(dropped.load() == int(sources.size()));
      BOOST_TEST(mismatched.load() == 0);
    }
  }
}

// Cancelling a next() that waits for the sender ends the stream without
// throwing: the blob in flight is reported aborted and the stream ends. The entry is 4 MiB in 64 KiB chunks, so over UCX the
// cancellation most likely lands while chunks are posted: those are waited
// out before the stream ends (consumer.cpp, next()).
BOOST_AUTO_TEST_CASE(cancelled_next_ends_the_stream_without_throwing) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      const auto big = ramp(1 << 20, 3.0f);  // 4 MiB
      auto ep = r.await(connect(l, {}, {.chunk_bytes = 64 << 10}));
      asio::cancellation_signal cancel;
      bool threw = false, returned = false, producer_done = false;
      event first, after;
      auto produce = [&]() -> asio::awaitable<void> {
        auto blob = ep.s.open_blob();
        (void)co_await blob.emit("big", value::tensor(big));  // fails once the consumer ends
        producer_done = true;
      };
      auto canceller = [&]() -> asio::awaitable<void> {
        while (ep.c.stats().buffered_bytes == 0) co_await yield_n(1);  // entry begun
        co_await yield_n(3);
        cancel.emit(asio::cancellation_type::terminal);
      };
      asio::co_spawn(r.ctx, ep.c.next(),
                     asio::bind_cancellation_slot(cancel.slot(),
                                                  [&](std::exception_ptr e, event ev) {
                                                    threw = e != nullptr;
                                                    returned = true;
                                                    first = std::move(ev);
                                                  }));
      r.spawn(produce());
      r.spawn(canceller());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(returned);
      BOOST_TEST(!threw);
      auto rest = [&]() -> asio::awaitable<void> {
        after = co_await ep.c.next();
        while (after.kind != event_kind::end_of_stream) after = co_await ep.c.next();
      };
      r.spawn(rest());
      BOOST_TEST_REQUIRE(r.run());
      // The error is the interrupted wait's (operation_aborted, closed or
      // peer_failed, by transport and by where it was): any, but one.
      BOOST_TEST(first.kind == event_kind::blob_aborted);
      BOOST_TEST(first.error, "blob_aborted without an error");
      BOOST_TEST(!first.reason.empty(), "blob_aborted with an error but no reason");
      BOOST_TEST(after.kind == event_kind::end_of_stream);
      BOOST_TEST(after.error, "end_of_stream without an error");
      BOOST_TEST(!after.reason.empty(), "end_of_stream with an error but no reason");
      BOOST_TEST(producer_done);
    }
  }
}

// A next() cancelled while it waits for the sender's bytes ends the stream,
// and returns its end_of_stream only once the consumer's own coroutines
// (the acker, the session's timer) have ended: nothing of the consumer
// runs after it, cancelled or not.
BOOST_AUTO_TEST_CASE(a_cancelled_next_returns_the_end_only_after_the_consumers_tasks_ended) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto ep = r.await(connect(l));
      asio::cancellation_signal cancel;
      bool returned = false, threw = false;
      std::uint64_t running_at_return = ~std::uint64_t{0};
      event ended;
      auto canceller = [&]() -> asio::awaitable<void> {
        co_await yield_n(5);  // next() waits for bytes
        cancel.emit(asio::cancellation_type::terminal);
        while (!returned) co_await yield_n(1);
      };
      asio::co_spawn(r.ctx, ep.c.next(),
                     asio::bind_cancellation_slot(cancel.slot(),
                                                  [&](std::exception_ptr e, event ev) {
                                                    returned = true;
                                                    threw = e != nullptr;
                                                    running_at_return = ep.c.stats().tasks_running;
                                                    ended = std::move(ev);
                                                  }));
      r.spawn(canceller());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST_REQUIRE(returned);
      BOOST_TEST(!threw);
      BOOST_TEST(ended.kind == event_kind::end_of_stream);
      BOOST_TEST(running_at_return == 0u);
    }
  }
}

// (d) A slow consumer that holds entries keeps the buffered bytes within the
// window; producers wait for credit instead of anything being dropped.
BOOST_AUTO_TEST_CASE(slow_consumer_keeps_buffered_bytes_within_window) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      // Room for the 3 entries the consumer holds and the one it waits
      // for, with each entry's bookkeeping credit (entry_overhead_bytes).
      constexpr std::uint64_t window = 64 * 1024 + 4 * 512;
      constexpr int producers = 4, blobs_each = 3, entries_each = 6;
      const auto payload = ramp(4096, 3.0f);  // 16 KiB per entry
      int entries_seen = 0, completed = 0, producers_done = 0;
      std::uint64_t credit_waits = 0;
      consumer_stats st;
      consumer_options copt;
      copt.window_bytes = window;
      copt.held_bytes = 0;  // held entries keep their window credit
      auto ep = r.await(connect(l, copt, {.chunk_bytes = 4096}));
      auto produce = [&]() -> asio::awaitable<void> {
        for (int k = 0; k < blobs_each; ++k) {
          auto blob = ep.s.open_blob();
          for (int e = 0; e < entries_each; ++e)
            BLOBPIPE_CO_CHECK(blob.emit("e" + std::to_string(e), value::tensor(payload)));
          BLOBPIPE_CO_CHECK(blob.finish());
        }
        if (++producers_done == producers) {
          credit_waits = ep.s.stats().credit_waits;
          BLOBPIPE_CO_CHECK(ep.s.shutdown());
        }
      };
      auto consume = [&]() -> asio::awaitable<void> {
        std::deque<std::shared_ptr<const received_entry>> held;  // the slow part
        for (;;) {
          auto ev = co_await ep.c.next();
          co_await yield_n(5);
          if (ev.kind == event_kind::entry_ready) {
            ++entries_seen;
            BOOST_TEST(same_bytes(ev.entry->view.bytes, payload.data(), payload.size() * 4));
            held.push_back(std::move(ev.entry));
            if (held.size() > 3) held.pop_front();
          } else if (ev.kind == event_kind::blob_complete) {
            ++completed;
          } else {
            BOOST_TEST(ev.kind == event_kind::end_of_stream);
            BOOST_TEST(!ev.error, ev.reason);
            break;
          }
        }
        held.clear();
        st = ep.c.stats();
      };
      for (int p = 0; p < producers; ++p) r.spawn(produce());
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(entries_seen == producers * blobs_each * entries_each);
      BOOST_TEST(completed == producers * blobs_each);
      BOOST_TEST(st.buffered_high_water <= window);
      BOOST_TEST(st.buffered_high_water >= 3 * 16 * 1024u);  // it did hold entries
      BOOST_TEST(credit_waits > 0u);                          // producers did wait
      BOOST_TEST(st.buffered_bytes == 0u);
    }
  }
}

// An entry larger than the whole window is admitted alone instead of
// deadlocking.
BOOST_AUTO_TEST_CASE(entry_larger_than_window_is_admitted_alone) {
  runner r;
  const auto big = ramp(16384, 0.0f);  // 64 KiB
  const auto small = ramp(16, 0.0f);
  consumer_stats st;
  int entries = 0;
  consumer_options copt;
  copt.window_bytes = 4096;
  auto ep = r.await(connect(link_kind::loopback, copt, {.chunk_bytes = 1024}));
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    BLOBPIPE_CO_CHECK(blob.emit("small", value::tensor(small)));
    BLOBPIPE_CO_CHECK(blob.emit("big", value::tensor(big)));
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::end_of_stream) break;
      if (ev.kind == event_kind::entry_ready) ++entries;
    }
    st = ep.c.stats();
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(entries == 2);
  // Alone: nothing beside it (its credit: bytes, key, its compact meta of
  // one dim, bookkeeping).
  BOOST_TEST(st.buffered_high_water == compact_entry_credit(big.size() * 4, 3, 1));
}

// (e) A connection dropped mid-blob: the completed blob stays complete, the
// open one is reported aborted, and the stream ends with the error.
BOOST_AUTO_TEST_CASE(dropped_connection_aborts_open_blob_and_keeps_completed) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      gate drop(r.ex());
      std::vector<event_kind> kinds;
      std::vector<std::uint64_t> ids;
      event last;
      std::error_code late;
      const auto x = ramp(100, 1.0f);
      auto ep = r.await(connect(l));
      auto produce = [&]() -> asio::awaitable<void> {
        auto one = ep.s.open_blob();
        BLOBPIPE_CO_CHECK(one.emit("x", value::tensor(x)));
        BLOBPIPE_CO_CHECK(one.finish());
        auto two = ep.s.open_blob();
        BLOBPIPE_CO_CHECK(two.emit("x", value::tensor(x)));
        co_await drop.wait();
        ep.s.close();  // the connection drops with blob two open
        late = co_await two.emit("y", value::tensor(x));
      };
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          kinds.push_back(ev.kind);
          ids.push_back(ev.blob_id);
          if (ev.kind == event_kind::entry_ready && ev.blob_id == 2) drop.open();
          if (ev.kind == event_kind::blob_aborted)
            BOOST_TEST((ev.error == errc::peer_closed || ev.error == errc::peer_failed));
          if (ev.kind == event_kind::end_of_stream) {
            last = ev;
            break;
          }
        }
      };
      r.spawn(produce());
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      const std::vector<event_kind> want = {event_kind::entry_ready, event_kind::blob_complete,
                                            event_kind::entry_ready, event_kind::blob_aborted,
                                            event_kind::end_of_stream};
      BOOST_TEST(kinds == want, boost::test_tools::per_element());
      BOOST_TEST_REQUIRE(ids.size() == want.size());
      BOOST_TEST(ids[1] == 1u);
      BOOST_TEST(ids[3] == 2u);
      BOOST_TEST((last.error == errc::peer_closed || last.error == errc::peer_failed));
      BOOST_TEST((late == errc::closed));
    }
  }
}

// Closing the consumer wakes its pending next() and fails a producer that
// waits for window credit.
BOOST_AUTO_TEST_CASE(consumer_close_ends_pending_next_and_waiting_producer) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      std::error_code producer_ec;
      event last;
      std::vector<event_kind> kinds;
      std::vector<std::string> reasons;
      const auto x = ramp(1024, 0.0f);  // 4 KiB
      consumer_options copt;
      copt.window_bytes = 4096;
      copt.held_bytes = 0;  // the entry held keeps its credit
      auto ep = r.await(connect(l, copt));
      bool waiting = false;
      auto produce = [&]() -> asio::awaitable<void> {
        auto blob = ep.s.open_blob();
        BLOBPIPE_CO_CHECK(blob.emit("x0", value::tensor(x)));
        waiting = true;
        // The consumer holds x0, so this waits for credit until the close.
        producer_ec = co_await blob.emit("x1", value::tensor(x));
      };
      auto consume = [&]() -> asio::awaitable<void> {
        auto first = co_await ep.c.next();  // held: its credit never returns
        BOOST_TEST(first.kind == event_kind::entry_ready);
        for (;;) {
          auto ev = co_await ep.c.next();  // pending when close() runs
          kinds.push_back(ev.kind);
          reasons.push_back(ev.reason);
          if (ev.kind == event_kind::end_of_stream) {
            last = ev;
            break;
          }
        }
      };
      auto closer = [&]() -> asio::awaitable<void> {
        while (!waiting) co_await yield_n(1);
        co_await yield_n(20);
        BOOST_TEST(producer_ec == std::error_code{});  // still waiting
        ep.c.close();
      };
      r.spawn(produce());
      r.spawn(consume());
      r.spawn(closer());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((last.error == errc::closed));
      BOOST_TEST_REQUIRE(kinds.size() == 2u);  // blob aborted, then end
      BOOST_TEST(kinds[0] == event_kind::blob_aborted);
      // Our own close comes with no words; the events still say why.
      BOOST_TEST(!reasons[0].empty(), "blob_aborted without a reason");
      BOOST_TEST(!last.reason.empty(), "end_of_stream without a reason");
      BOOST_TEST((producer_ec == errc::peer_closed || producer_ec == errc::peer_failed));
    }
  }
}

// ---- (f) malformed frames -------------------------------------------------

namespace {

using script = std::function<asio::awaitable<void>(transport&)>;

asio::awaitable<void> put(transport& t, frame_header h, std::span<const std::byte> p = {}) {
  h.length = static_cast<std::uint32_t>(p.size());
  (void)co_await send_frame(t, h, p);  // the consumer may hang up: ignore
}

asio::awaitable<void> evil_hello(transport& t, hello h = {}) {
  co_await put(t, {.type = frame_type::hello}, encode_hello(h));
  frame_reader in;
  auto [ec, reply] = co_await in.next(t);  // the consumer's hello, if it answers
  (void)ec;
}

asio::awaitable<void> begin_blob(transport& t, std::uint64_t id) {
  tag_t tag{};
  tag[0] = std::byte{7};
  co_await put(t, {.type = frame_type::blob_begin, .blob_id = id}, tag);
}

Entry f32_entry(std::string key, std::uint64_t off, std::int64_t n) {
  Entry e;
  e.key = std::move(key);
  e.off = off;
  e.len = static_cast<std::uint64_t>(n) * 4;
  e.kind = 't';
  e.dtype = "float32";
  e.shape = shape_t{n};
  return e;
}

asio::awaitable<void> begin_entry(transport& t, std::uint64_t id, std::uint64_t index,
                                  Entry e) {
  co_await put(t, {.type = frame_type::entry_begin, .blob_id = id, .arg = index},
               encode_entry_begin(e.key, e.meta()));
}

/// Drains the evil side until the consumer hangs up, so the verdict is the
/// consumer's own.
asio::awaitable<void> drain(transport& t) {
  frame_reader in;
  for (;;) {
    auto [ec, f] = co_await in.next(t);
    if (ec) break;
  }
}

struct outcome {
  std::error_code start_error;
  std::vector<event> events;
  bool any_complete() const {
    for (auto& e : events)
      if (e.kind == event_kind::blob_complete) return true;
    return false;
  }
  const event& last() const { return events.back(); }
};

asio::awaitable<void> collect(consumer& c, outcome& out) {
  for (;;) {
    out.events.push_back(co_await c.next());
    if (out.events.back().kind == event_kind::end_of_stream) break;
  }
}

outcome run_evil(link_kind l, script evil, consumer_options opt = {},
                 transport_options topt = {}) {
  runner r;
  outcome out;
  auto [a, b] = r.await(raw_pair(l, topt));
  consumer c;
  auto play = [&]() -> asio::awaitable<void> {
    co_await evil(*a);
    co_await drain(*a);
  };
  auto judge = [&]() -> asio::awaitable<void> {
    auto [ec, started] = co_await consumer::start(std::move(b), opt);
    out.start_error = ec;
    if (ec) co_return;
    c = std::move(started);
    co_await collect(c, out);
  };
  r.spawn(play());
  r.spawn(judge());
  BOOST_TEST_REQUIRE(r.run());
  return out;
}

void expect_violation(const outcome& o, std::size_t aborted_blobs) {
  BOOST_TEST(!o.start_error);
  BOOST_TEST_REQUIRE(!o.events.empty());
  BOOST_TEST(o.last().kind == event_kind::end_of_stream);
  BOOST_TEST((o.last().error == errc::protocol_violation), o.last().reason);
  BOOST_TEST(!o.last().reason.empty());
  BOOST_TEST(!o.any_complete());
  std::size_t aborted = 0;
  for (auto& e : o.events)
    if (e.kind == event_kind::blob_aborted) {
      ++aborted;
      BOOST_TEST((e.error == errc::protocol_violation));
    }
  BOOST_TEST(aborted == aborted_blobs);
}

}  // namespace

BOOST_AUTO_TEST_CASE(consumer_rejects_bad_handshake) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      auto bad_version = run_evil(l, [](transport& t) -> asio::awaitable<void> {
        auto p = encode_hello({});
        p[4] = std::byte{9};  // version 9
        co_await put(t, {.type = frame_type::hello}, p);
      });
      BOOST_TEST((bad_version.start_error == errc::protocol_violation));
      auto bad_magic = run_evil(l, [](transport& t) -> asio::awaitable<void> {
        auto p = encode_hello({});
        p[0] = std::byte{'X'};
        co_await put(t, {.type = frame_type::hello}, p);
      });
      BOOST_TEST((bad_magic.start_error == errc::protocol_violation));
      auto not_hello = run_evil(l, [](transport& t) -> asio::awaitable<void> {
        co_await begin_blob(t, 1);
      });
      BOOST_TEST((not_hello.start_error == errc::protocol_violation));
      auto wrong_role = run_evil(l, [](transport& t) -> asio::awaitable<void> {
        co_await evil_hello(t, {.role = wire_role::consumer});
      });
      BOOST_TEST((wrong_role.start_error == errc::protocol_violation));
    }
  }
}

namespace {

/// Plays raw bytes at a TCP consumer: `before_reply` first, then (after the
/// consumer's hello, if `expect_reply`) `after_reply`.
outcome run_raw_tcp(std::vector<std::byte> before_reply, bool expect_reply,
                    std::vector<std::byte> after_reply) {
  runner r;
  outcome out;
  auto lis = tcp::listen(r.ex(), 0).value();
  asio::ip::tcp::socket raw(r.ex());
  consumer c;
  auto play = [&]() -> asio::awaitable<void> {
    co_await raw.async_connect({asio::ip::make_address("127.0.0.1"), lis.port()},
                               asio::use_awaitable);
    co_await asio::async_write(raw, asio::buffer(before_reply), asio::use_awaitable);
    if (expect_reply) {
      std::array<std::byte, frame_header_size + hello_size> reply;
      co_await asio::async_read(raw, asio::buffer(reply), asio::use_awaitable);
      co_await asio::async_write(raw, asio::buffer(after_reply), asio::use_awaitable);
    }
    std::array<std::byte, 64> sink;
    for (;;) {  // until the consumer hangs up
      auto [ec, n] = co_await raw.async_read_some(
          asio::buffer(sink), asio::experimental::as_tuple(asio::use_awaitable));
      if (ec) break;
    }
  };
  auto judge = [&]() -> asio::awaitable<void> {
    auto [aec, t] = co_await lis.accept();
    BOOST_TEST_REQUIRE(!aec);
    auto [ec, started] = co_await consumer::start(std::move(t));
    out.start_error = ec;
    if (ec) co_return;
    c = std::move(started);
    co_await collect(c, out);
  };
  r.spawn(play());
  r.spawn(judge());
  BOOST_TEST_REQUIRE(r.run());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(consumer_rejects_garbage_bytes_on_tcp) {
  // Not a blobpipe peer at all: an HTTP request where the hello should be.
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  auto bytes = std::as_bytes(std::span(http));
  auto o = run_raw_tcp({bytes.begin(), bytes.end()}, false, {});
  BOOST_TEST((o.start_error == errc::protocol_violation));
}

// A sender that writes its whole stream (hello, a blob, close) before the
// consumer's hello reply, and then hangs up without reading it. Its bytes
// are all in the consumer's socket: they are decoded, the blob completes,
// and the stream ends as the close frame says, not as "handshake: closed";
// the reply that could not be written does not matter to a sender that is
// gone. With `hang_up` false the sender waits for the consumer to hang up,
// as a pipelining but polite peer.
BOOST_AUTO_TEST_CASE(a_stream_written_before_the_hello_reply_is_decoded) {
  const tag_t tag = [] {
    tag_t t{};
    t[0] = std::byte{7};
    return t;
  }();
  // 400 B: the whole stream comes in the hello's read; 16 KB: in several
  // (and fits the socket buffers unread).
  for (const std::size_t n : {100, 4000}) {
  const std::vector<float> x(n, 1.5f);
  outbox o;
  frame_hello(o, hello{});
  frame_blob_begin(o, 1, tag);
  layout_builder b;
  const planned_entry* pe = b.add("x", value::tensor(x)).value();
  frame_entry_begin(o, 1, 0, pe->entry, pe->entry.meta());
  frame_data(o, 1, pe->entry.off, std::as_bytes(std::span(x)), default_chunk_bytes, true);
  const auto plan = b.finish(tag).value();
  std::vector<std::byte> tail(tail_size(plan));
  BOOST_TEST_REQUIRE(write_tail(plan, tail).has_value());
  frame_tail(o, 1, tail);
  frame_close(o, "all sent");
  std::vector<std::byte> stream;
  for (const auto& piece : o.pieces()) {
    const auto bytes = piece.bytes(o);
    stream.insert(stream.end(), bytes.begin(), bytes.end());
  }
  for (bool hang_up : {true, false}) {
    BOOST_TEST_CONTEXT(n * 4 << " bytes, hang_up " << hang_up) {
      runner r;
      outcome out;
      auto lis = tcp::listen(r.ex(), 0).value();
      asio::ip::tcp::socket raw(r.ex());
      consumer c;
      bool written = false;
      asio::steady_timer sent(r.ex(), asio::steady_timer::time_point::max());
      auto play = [&]() -> asio::awaitable<void> {
        co_await raw.async_connect({asio::ip::make_address("127.0.0.1"), lis.port()},
                                   asio::use_awaitable);
        co_await asio::async_write(raw, asio::buffer(stream), asio::use_awaitable);
        written = true;
        sent.cancel();
        if (hang_up) {
          raw.close();  // never reads the reply: the consumer's hello hits a closed socket
          co_return;
        }
        std::array<std::byte, 64> sink;
        for (;;) {
          auto [ec, n] = co_await raw.async_read_some(
              asio::buffer(sink), asio::experimental::as_tuple(asio::use_awaitable));
          if (ec) break;
        }
      };
      auto judge = [&]() -> asio::awaitable<void> {
        auto [aec, t] = co_await lis.accept();
        BOOST_TEST_REQUIRE(!aec);
        // The whole stream is in the socket before the consumer reads it.
        if (!written) co_await sent.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        auto [ec, started] = co_await consumer::start(std::move(t));
        out.start_error = ec;
        if (ec) co_return;
        c = std::move(started);
        co_await collect(c, out);
      };
      r.spawn(play());
      r.spawn(judge());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(!out.start_error, out.start_error.message());
      BOOST_TEST_REQUIRE(!out.events.empty());
      BOOST_TEST(out.any_complete());
      BOOST_TEST((out.last().kind == event_kind::end_of_stream));
      BOOST_TEST(!out.last().error, out.last().error.message() << ": " << out.last().reason);
      BOOST_TEST(out.last().reason == "all sent");
    }
  }
  }
}

// The decoder's refusals themselves, each named, in every chunking, are
// //test:decoder_test's (no socket needed); here: what a live consumer makes
// of one.
BOOST_AUTO_TEST_CASE(consumer_ends_the_stream_on_a_decoder_refusal) {
  // Its open blob is aborted with protocol_violation, and end_of_stream
  // carries the decoder's message, naming the frame and field.
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      auto o = run_evil(l, [](transport& t) -> asio::awaitable<void> {
        co_await evil_hello(t);
        co_await begin_blob(t, 1);
        co_await begin_entry(t, 1, 0, f32_entry("x", 0, 25));  // [0, 100)
        std::vector<std::byte> chunk(4);
        co_await put(t, {.type = frame_type::data, .blob_id = 1, .arg = 200}, chunk);
      });
      expect_violation(o, 1);
      BOOST_TEST(o.last().reason.find("data: offset 200 for entry 'x' [0, 100), expected 0") !=
                     std::string::npos,
                 o.last().reason);
    }
  }
}

/// What the README's loop saw: it keeps the previous event, and the last
/// entry's value, while it awaits the next one.
struct readme_loop_seen {
  int entries = 0, completed = 0;
  event end;
  consumer_stats st;
  std::error_code send_error;  ///< the sender's first error (it stops there)
};

/// Sends `blobs` blobs, each of `values` (keys v0, v1, ...), and runs the
/// README's loop over them to the end of the stream.
readme_loop_seen run_readme_loop(link_kind l, const consumer_options& copt, int blobs,
                                 const std::vector<std::vector<float>>& values) {
  runner r;
  auto ep = r.await(connect(l, copt));
  readme_loop_seen seen;
  auto produce = [&]() -> asio::awaitable<void> {
    for (int k = 0; k < blobs && !seen.send_error; ++k) {
      auto blob = ep.s.open_blob();
      for (std::size_t v = 0; v < values.size() && !seen.send_error; ++v)
        seen.send_error = co_await blob.emit("v" + std::to_string(v), value::tensor(values[v]));
      if (!seen.send_error) seen.send_error = co_await blob.finish();
    }
    if (!seen.send_error) seen.send_error = co_await ep.s.shutdown();
  };
  auto consume = [&]() -> asio::awaitable<void> {
    event ev;                                     // `for ev in consumer`
    std::shared_ptr<const received_entry> value;  // `case EntryReady(tag, entry, value)`
    for (;;) {
      ev = co_await ep.c.next();  // the previous ev and value are alive meanwhile
      if (ev.kind == event_kind::entry_ready) {
        ++seen.entries;
        value = ev.entry;
      } else if (ev.kind == event_kind::blob_complete) {
        ++seen.completed;
      } else if (ev.kind == event_kind::end_of_stream) {
        break;
      }
    }
    seen.st = ep.c.stats();
    seen.end = ev;
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  return seen;
}

// With the default window (64 MiB) and held allowance (64 MiB), two blobs
// of two 40 MiB entries complete: the held entries leave the window
// (docs/reliability.md "Held entries"). Without the allowance the sender
// waits forever for the credit the loop holds (held_timeout then ends the
// stream: the test fails, not hangs).
BOOST_AUTO_TEST_CASE(readme_loop_holding_previous_entry_completes_with_default_window) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      consumer_options copt;
      copt.held_timeout = std::chrono::seconds(5);  // a hang guard for the mutant
      const auto seen =
          run_readme_loop(l, copt, 2, {ramp(10 << 20, 1.0f), ramp(10 << 20, 5.0f)});  // 40 MiB each
      BOOST_TEST(!seen.end.error, seen.end.error.message() << ": " << seen.end.reason);
      BOOST_TEST(!seen.send_error, seen.send_error.message());
      BOOST_TEST(seen.entries == 4);
      BOOST_TEST(seen.completed == 2);
      BOOST_TEST(seen.st.held_high_water > 0u);  // entries did move out of the window
      BOOST_TEST(seen.st.held_high_water <= default_window_bytes);
      BOOST_TEST(seen.st.buffered_high_water <= default_window_bytes);
    }
  }
}

// The same loop when each entry is larger than the window and the held
// allowance (fresh-user review, 2026-12-04): a window of 1 MiB, entries of
// 3 MiB, each admitted alone. The entry the loop keeps moves into the
// empty allowance alone, so the next one is admitted; before, it kept its
// window credit and the stream stalled until held_timeout. Entry credit
// stays within one entry in the window plus one in the allowance.
BOOST_AUTO_TEST_CASE(readme_loop_holding_previous_entry_larger_than_window_and_allowance_completes) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      consumer_options copt;
      copt.window_bytes = 1 << 20;
      copt.held_timeout = std::chrono::seconds(3);  // a hang guard for the mutant
      const auto seen = run_readme_loop(l, copt, 3, {ramp(768 << 10, 1.0f)});  // 3 MiB
      BOOST_TEST(!seen.end.error, seen.end.error.message() << ": " << seen.end.reason);
      BOOST_TEST(!seen.send_error, seen.send_error.message());
      BOOST_TEST(seen.entries == 3);
      BOOST_TEST(seen.completed == 3);
      const std::uint64_t one = 3u << 20;
      BOOST_TEST(seen.st.held_high_water >= one);  // an entry larger than the allowance moved
      BOOST_TEST(seen.st.held_high_water < 2 * one);  // alone
      BOOST_TEST(seen.st.buffered_high_water < 2 * one);
    }
  }
}

// An explicit held_bytes is a cap: there the entry the loop keeps, larger
// than the allowance, keeps its window credit, and the stream ends with
// timed_out (held_timeout) naming held_bytes, as documented.
BOOST_AUTO_TEST_CASE(an_explicit_held_bytes_is_a_cap_even_for_one_larger_entry) {
  consumer_options copt;
  copt.window_bytes = 1 << 20;
  copt.held_bytes = 1 << 20;
  copt.held_timeout = std::chrono::milliseconds(300);
  const auto seen = run_readme_loop(link_kind::loopback, copt, 3, {ramp(768 << 10, 1.0f)});
  BOOST_TEST(seen.end.error == make_error_code(errc::timed_out), seen.end.error.message());
  BOOST_TEST(seen.end.reason.find("held_bytes") != std::string::npos, seen.end.reason);
  BOOST_TEST(seen.entries < 3);
  BOOST_TEST(bool(seen.send_error));  // the sender, waiting for credit, learns of the end
}

// An application that holds every entry, more than the window and the
// held allowance together, while it waits for the next one: the stream
// ends with timed_out (held_timeout) and a reason naming the window, the
// bytes held and the option to raise, instead of waiting forever. Until
// then the entry credit it holds stays within window + held_bytes.
BOOST_AUTO_TEST_CASE(holding_past_held_allowance_ends_stream_naming_window_and_held_bytes) {
  for (link_kind l : {link_kind::loopback, link_kind::tcp}) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      constexpr std::uint64_t window = 256 << 10, held = 256 << 10;
      const auto payload = ramp(25 << 10, 2.0f);  // 100 KiB per entry
      consumer_options copt;
      copt.window_bytes = window;
      copt.held_bytes = held;
      copt.held_timeout = std::chrono::milliseconds(200);
      auto ep = r.await(connect(l, copt, {.chunk_bytes = 64 << 10}));
      std::vector<std::shared_ptr<const received_entry>> kept;  // never dropped
      std::uint64_t most_buffered = 0, most_held = 0;
      std::error_code emit_error;
      event end;
      auto produce = [&]() -> asio::awaitable<void> {
        auto blob = ep.s.open_blob();
        for (int e = 0; e < 12 && !emit_error; ++e)
          emit_error = co_await blob.emit("e" + std::to_string(e), value::tensor(payload));
      };
      auto consume = [&]() -> asio::awaitable<void> {
        for (;;) {
          auto ev = co_await ep.c.next();
          const auto st = ep.c.stats();
          most_buffered = std::max(most_buffered, st.buffered_bytes);
          most_held = std::max(most_held, st.held_bytes);
          if (ev.kind == event_kind::entry_ready) kept.push_back(ev.entry);
          if (ev.kind == event_kind::end_of_stream) {
            end = ev;
            break;
          }
        }
      };
      r.spawn(produce());
      r.spawn(consume());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(end.error == make_error_code(errc::timed_out), end.error.message());
      BOOST_TEST(end.reason.find("held_bytes") != std::string::npos, end.reason);
      BOOST_TEST(end.reason.find("window") != std::string::npos, end.reason);
      BOOST_TEST(end.reason.find("held_timeout") != std::string::npos, end.reason);
      BOOST_TEST(bool(emit_error));  // the sender, waiting for credit, learns of the end
      // It held more than the window alone allows, and no more than both.
      BOOST_TEST(kept.size() >= 3u);
      BOOST_TEST(most_buffered <= window);
      BOOST_TEST(most_held <= held);
      BOOST_TEST(most_held > 0u);
    }
  }
}

// A consumer's clocks stop with its stream (consumer_state::end): once
// next() has reported end_of_stream, nothing of the consumer's waits on the
// io_context, whatever its limits (held_timeout is 30 s by default; the
// idle and stall limits here are a minute), though the consumer lives on.
BOOST_AUTO_TEST_CASE(clocks_stop_with_the_stream) {
  runner r;
  consumer_options copt;
  copt.idle_timeout = std::chrono::minutes(1);
  copt.stall_timeout = std::chrono::minutes(1);
  auto ep = r.await(connect(link_kind::loopback, copt));
  const auto a = ramp(100, 1.0f);
  event end;
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    BLOBPIPE_CO_CHECK(blob.emit("a", value::tensor(a)));
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind != event_kind::end_of_stream) continue;
      end = std::move(ev);
      break;
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST(!end.error, end.error.message() << ": " << end.reason);
  // The io_context runs out of work long before any limit.
  r.ctx.restart();
  r.ctx.run_for(std::chrono::seconds(10));
  BOOST_TEST(r.ctx.stopped(), "work is left on the io_context after end_of_stream");
}
