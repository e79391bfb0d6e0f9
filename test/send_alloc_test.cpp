// Heap allocations of the sender per small entry (docs/performance.md
// "Planning per entry"), counted with the counting allocator
// (heap_counter.hpp), not timed. A sender emits blobs of 64-byte entries
// over the in-process loopback transport to a consumer on the same thread,
// which reads each blob whole only after it is finished: an emit that need
// not wait (the window and the sender's queue hold a whole blob) never
// suspends, so the consumer does not run during a blob's emits and the
// count is the sender's alone. Blobs after the first plan into the storage
// the one before left (sender_state::spare_entries): their emits allocate
// nothing, where a blob growing its own storage would allocate about
// log2(entries) times.
#define BOOST_TEST_MODULE send_alloc_test
#include <boost/test/unit_test.hpp>

#include <vector>

#include "test/heap_counter.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

constexpr std::size_t entries_per_blob = 1000;
constexpr std::size_t blobs = 5;  // the first two warm up

// One entry's value, as a user builds one: the dtype and shape fit in place.
value entry_value(const std::vector<std::byte>& bytes) {
  return value::tensor_bytes(bytes, "uint8", {static_cast<std::int64_t>(bytes.size())});
}

struct run_state {
  std::vector<std::uint64_t> emit_allocations;  // per blob, its emits only
  std::string error;
};

asio::awaitable<void> send_and_drain(run_state& st) {
  auto ep = co_await connect(link_kind::loopback);
  const std::vector<std::byte> bytes(64, std::byte{0x5a});
  for (std::size_t k = 0; k < blobs; ++k) {
    auto blob = ep.s.open_blob();
    const std::uint64_t before = blobpipe::testing::detail::heap_allocations();
    for (std::size_t i = 0; i < entries_per_blob; ++i) {
      std::string key = "e";
      value v = entry_value(bytes);
      auto ec = co_await blob.emit(std::move(key), std::move(v));
      if (ec) {
        st.error = "emit: " + blob.last_error();
        co_return;
      }
    }
    st.emit_allocations.push_back(blobpipe::testing::detail::heap_allocations() - before);
    if (auto ec = co_await blob.finish()) {
      st.error = "finish: " + ec.message();
      co_return;
    }
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::blob_complete) break;
      if (ev.kind != event_kind::entry_ready) {
        st.error = "unexpected event: " + ev.reason;
        co_return;
      }
    }
  }
  ep.c.close();
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_blob_as_large_as_the_last_costs_the_sender_no_allocation_per_entry) {
  BOOST_TEST_REQUIRE(heap_counting());
  runner r;
  run_state st;
  r.spawn(send_and_drain(st));
  BOOST_TEST_REQUIRE(r.run(), "hung");
  BOOST_TEST_REQUIRE(st.error.empty(), st.error);
  BOOST_TEST_REQUIRE(st.emit_allocations.size() == blobs);
  for (std::size_t k = 0; k < blobs; ++k)
    BOOST_TEST_MESSAGE("blob " << k << ": " << st.emit_allocations[k] << " allocations in "
                               << entries_per_blob << " emits");
  // Warm blobs: none for their entries' storage (growing it would take 11
  // more for 1,000 entries: 15 a blob here), only the few of the blob's own
  // state (its meta buffer among them: 4 a blob here), none per entry.
  for (std::size_t k = 2; k < blobs; ++k)
    BOOST_TEST(st.emit_allocations[k] <= 6u, "blob " << k << ": " << st.emit_allocations[k]);
}
