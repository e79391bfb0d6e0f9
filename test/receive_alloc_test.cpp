// Heap allocations of the consumer's receive path per small entry
// (docs/performance.md "Per small entry, instructions": none of its own
// once warm), counted with the counting allocator (heap_counter.hpp),
// not timed. A scripted sender writes blobs of 64-byte inline entries,
// framed by the sans-IO sender_session as a sender frames them, over the
// in-process loopback transport, one blob per write once the consumer has
// finished the one before; everything runs on one thread, so the count is
// the consumer's (decoding, landing each entry, queuing and yielding its
// event, dropping it and giving its credit back) plus the loopback's.
// The first blob warms the consumer up (its receive buffer, event queue,
// coroutine frames and kept entry blocks reach their sizes) and is not
// counted.
#define BOOST_TEST_MODULE receive_alloc_test
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/sender_session.hpp"
#include "test/heap_counter.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

constexpr std::size_t entries_per_blob = 500;
constexpr std::size_t entry_bytes = 64;
constexpr std::size_t blobs = 3;  // the first warms up

/// Each blob's frames, as sender_session writes them for `limits`: entries
/// of `bytes` (uint8 [64], key "e"), inline, then the tail.
std::vector<std::vector<std::byte>> frames_of(const sender_limits& limits,
                                              const std::vector<std::byte>& bytes) {
  sender_session s;
  s.connect(limits);
  std::vector<std::vector<std::byte>> out;
  for (std::size_t k = 0; k < blobs; ++k) {
    sender_blob b;
    layout_builder builder;
    for (std::size_t i = 0; i < entries_per_blob; ++i) {
      auto pe = builder.add(
          "e", value::tensor_bytes(bytes, "uint8", {static_cast<std::int64_t>(bytes.size())}));
      BOOST_REQUIRE(pe.has_value());
      const Entry& e = (*pe)->entry;
      const auto meta = e.meta();
      auto credit = s.plan_entry(b, e, meta);
      BOOST_REQUIRE(credit.has_value());
      BOOST_REQUIRE(s.take_credit(*credit));
      auto room = s.add_entry(b, e, meta, 0, entry_route::automatic);
      BOOST_REQUIRE(room.size() == bytes.size());  // inline
      std::memcpy(room.data(), bytes.data(), bytes.size());
      BOOST_REQUIRE(s.entry_sent(b));
    }
    auto plan = builder.finish(b.tag());
    BOOST_REQUIRE(plan.has_value());
    std::vector<std::byte> tail(tail_size(*plan));
    BOOST_REQUIRE(write_tail(*plan, tail).has_value());
    BOOST_REQUIRE(s.take_credit(tail.size()));
    BOOST_REQUIRE(s.finish(b, tail).has_value());
    std::vector<std::byte> flat;
    for (const auto& p : s.out().pieces()) {
      const auto piece = p.bytes(s.out());
      flat.insert(flat.end(), piece.begin(), piece.end());
    }
    s.out().clear();
    out.push_back(std::move(flat));
  }
  return out;
}

struct run_state {
  std::vector<std::unique_ptr<gate>> sent_next;  // blob k may be written
  std::uint64_t counted_entries = 0;
  std::uint64_t counted_allocations = 0;
  int completed = 0;
  std::string error;
};

asio::awaitable<void> scripted_sender(std::unique_ptr<transport> t, run_state& st) {
  co_await send_frame(*t, {.type = frame_type::hello}, encode_hello(hello{}));
  frame_reader in;
  auto [ec, reply] = co_await in.next(*t);
  auto h = decode_hello(reply.payload);
  if (ec || !h) {
    st.error = "no hello from the consumer";
    co_return;
  }
  const std::vector<std::byte> bytes(entry_bytes, std::byte{0x5a});
  const auto frames = frames_of(sender_limits::from_hello(*h), bytes);
  for (std::size_t k = 0; k < blobs; ++k) {
    co_await st.sent_next[k]->wait();
    const asio::const_buffer buf(frames[k].data(), frames[k].size());
    if (auto wec = co_await t->write(std::span(&buf, 1))) {
      st.error = "write: " + wec.message();
      co_return;
    }
  }
  // Read the consumer's acks until it hangs up.
  for (;;) {
    auto [rec, f] = co_await in.next(*t);
    if (rec) break;
  }
}

asio::awaitable<void> counted_consumer(std::unique_ptr<transport> t, run_state& st,
                                       bool batches) {
  auto [ec, c] = co_await consumer::start(std::move(t));
  if (ec) {
    st.error = "consumer::start: " + ec.message();
    co_return;
  }
  st.sent_next[0]->open();
  std::uint64_t entries = 0, before = 0;
  std::vector<event> batch;
  std::size_t at = 0;  // the next event of `batch` to take
  while (st.completed < static_cast<int>(blobs)) {
    event ev;
    if (!batches) {
      ev = co_await c.next();
    } else {
      if (at == batch.size()) {
        batch.clear();
        at = 0;
        co_await c.next_batch(batch);
      }
      ev = std::move(batch[at++]);  // dropped at the end of this turn, as next()'s
    }
    if (ev.kind == event_kind::entry_ready) {
      ++entries;
    } else if (ev.kind == event_kind::blob_complete) {
      if (++st.completed == 1) {
        // Warmed up: count from here.
        entries = 0;
        before = blobpipe::testing::detail::heap_allocations();
      }
      if (st.completed < static_cast<int>(blobs)) st.sent_next[st.completed]->open();
    } else {
      st.error = "unexpected event: " + ev.reason;
      break;
    }
  }
  st.counted_allocations = blobpipe::testing::detail::heap_allocations() - before;
  st.counted_entries = entries;
  c.close();
}

}  // namespace

// Warm, an entry's block (received_entry, lease and bytes) is one the pool
// kept (consumer_options::recycle_small_entries): what is left is per blob,
// its index, completed_blob and map nodes (about 0.07 per entry here),
// taken one at a time (next()) or a read at a time (next_batch()).
BOOST_AUTO_TEST_CASE(small_entries_cost_the_warm_consumer_no_allocation_of_their_own) {
  BOOST_TEST_REQUIRE(heap_counting());
  for (bool batches : {false, true}) {
    BOOST_TEST_CONTEXT((batches ? "next_batch()" : "next()")) {
      runner r;
      run_state st;
      for (std::size_t k = 0; k < blobs; ++k)
        st.sent_next.push_back(std::make_unique<gate>(r.ex()));
      auto [a, b] = loopback::make_pair(r.ex());
      r.spawn(scripted_sender(std::move(a), st));
      r.spawn(counted_consumer(std::move(b), st, batches));
      BOOST_TEST_REQUIRE(r.run(), "hung");
      BOOST_TEST_REQUIRE(st.error.empty(), st.error);
      BOOST_TEST_REQUIRE(st.counted_entries == (blobs - 1) * entries_per_blob);
      const double per_entry = double(st.counted_allocations) / double(st.counted_entries);
      BOOST_TEST_MESSAGE("consumer allocations per 64-byte entry ("
                         << (batches ? "next_batch" : "next") << "): " << per_entry << " ("
                         << st.counted_allocations << " for " << st.counted_entries
                         << " entries)");
      BOOST_TEST(per_entry <= 0.1, "allocations per entry: " << per_entry);
    }
  }
}
