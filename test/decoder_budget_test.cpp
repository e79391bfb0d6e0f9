// The push decoder's budgets (docs/wire.md "Flow control"), driven with
// bytes and no io_context: every byte a consumer holds counts against its
// window, zero-length entries with long keys and tails included, and
// exceeding it is a protocol_violation naming it.
#define BOOST_TEST_MODULE decoder_budget
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "test/heap_counter.hpp"
#include "test/skip.hpp"
#include "test/wire_vectors.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;
using namespace blobpipe::testing::vectors_detail;

namespace {

/// Holds every entry it is given (an application that never drops one):
/// nothing is released, so the decoder's buffered credit only grows.
class holding_listener final : public decoder_listener {
 public:
  std::size_t entries_begun = 0;
  std::size_t blobs_completed = 0;
  result<void> on_hello(const hello&) override { return {}; }
  result<std::span<std::byte>> on_entry_begin(void*, const entry_announcement& a) override {
    ++entries_begun;
    held_.emplace_back(a.entry->len);
    return std::span<std::byte>(held_.back());
  }
  result<void> on_blob_complete(void*, std::uint64_t, blob_index,
                                std::span<const std::byte>) override {
    ++blobs_completed;
    return {};
  }

 private:
  std::vector<std::vector<std::byte>> held_;
};

const hello sender_hello{.role = wire_role::sender};

/// Feeds `o` to a decoder with `window` bytes of window: consume()'s result.
result<void> feed(const outbox& o, std::uint64_t window, holding_listener& l) {
  decoder_limits lim;
  lim.window_bytes = window;
  decoder d(wire_role::sender, lim, l);
  return d.consume(bytes_of(o));
}

}  // namespace

BOOST_AUTO_TEST_CASE(zero_length_entries_with_long_keys_fill_the_window) {
  // Each zero-length entry costs its key, its meta and
  // entry_overhead_bytes: a 1 MiB window refuses the 17th of ~61 KiB.
  // Without that cost, 4,000 zero-length entries with 64 KiB keys would
  // hold 260 MB in a consumer whose window is 64 MiB.
  constexpr std::uint64_t window = 1 << 20;
  outbox o;
  frame_hello(o, sender_hello);
  frame_blob_begin(o, 1, tag_of("keys"));
  const std::string key(60'000, 'k');
  layout_builder b;
  std::uint64_t credit = 0;
  for (std::uint64_t i = 0; i < 100; ++i) {
    const planned_entry& pe =
        *b.add(key + std::to_string(i), value::ndarray_bytes({}, "|u1", {0})).value();
    const auto meta = pe.entry.meta();
    frame_entry_begin(o, 1, i, pe.entry, meta);
    if (i == 0) credit = entry_credit(0, pe.entry.key.size(), meta.size());
  }
  holding_listener l;
  auto r = feed(o, window, l);
  BOOST_TEST_REQUIRE(!r);
  BOOST_TEST((r.code() == errc::protocol_violation));
  BOOST_TEST(r.message().find("overruns the window") != std::string::npos, r.message());
  // Admitted while they fit, and not one more.
  BOOST_TEST(l.entries_begun == window / credit);
}

BOOST_AUTO_TEST_CASE(tail_past_what_the_window_has_left_is_refused_before_it_is_parsed) {
  // The tail's bytes are buffered too: with an entry held, a tail one byte
  // more than the window has left is refused at its header, and the same
  // stream fits a window one byte larger.
  const std::vector<float> x(768, 1.0f);  // 3 KiB
  const tag_t tag = tag_of("tail");
  layout_builder b;
  const planned_entry& pe = *b.add("x", value::tensor(x)).value();
  const auto meta = pe.entry.meta();
  const std::uint64_t credit = entry_credit(pe.entry.len, pe.entry.key.size(), meta.size());
  outbox o;
  frame_hello(o, sender_hello);
  frame_blob_begin(o, 1, tag);
  frame_entry_begin(o, 1, 0, pe.entry, meta);
  frame_data(o, 1, 0, std::as_bytes(std::span(x)), default_chunk_bytes, true);
  auto plan = b.finish(tag).value();
  std::vector<std::byte> t(tail_size(plan));
  (void)write_tail(plan, t);
  frame_tail(o, 1, t);

  holding_listener tight;
  auto r = feed(o, credit + t.size() - 1, tight);
  BOOST_TEST_REQUIRE(!r);
  BOOST_TEST((r.code() == errc::protocol_violation));
  BOOST_TEST(r.message().find("tail of " + std::to_string(t.size()) +
                              " credit bytes overruns the window") != std::string::npos,
             r.message());
  BOOST_TEST(tight.entries_begun == 1u);
  BOOST_TEST(tight.blobs_completed == 0u);

  holding_listener enough;
  BOOST_TEST(feed(o, credit + t.size(), enough).has_value());
  BOOST_TEST(enough.blobs_completed == 1u);
}

BOOST_AUTO_TEST_CASE(tail_with_more_rows_than_entries_announced_is_refused) {
  // A tail may not describe entries the consumer never saw begin: its row
  // count is bounded by them before its rows are parsed.
  outbox o;
  frame_hello(o, sender_hello);
  const tag_t tag = tag_of("rows");
  frame_blob_begin(o, 1, tag);
  const std::vector<float> x(4, 1.0f);
  layout_builder sent, described;
  entry(o, sent, 1, "x", value::tensor(x), 64, default_chunk_bytes);
  for (const char* k : {"x", "y", "z"}) (void)described.add(k, value::tensor(x)).value();
  tail(o, described, 1, tag);
  holding_listener l;
  auto r = feed(o, 64 << 20, l);
  BOOST_TEST_REQUIRE(!r);
  BOOST_TEST((r.code() == errc::protocol_violation));
  BOOST_TEST(l.blobs_completed == 0u);
}

namespace {

/// Releases each entry's credit once it completes (an application that
/// drops every entry at once), and keeps nothing itself.
class releasing_listener final : public decoder_listener {
 public:
  decoder* dec = nullptr;
  std::uint64_t credit = 0;  // of the entry announced last
  result<void> on_hello(const hello&) override { return {}; }
  result<std::span<std::byte>> on_entry_begin(void*, const entry_announcement& a) override {
    credit = a.credit;
    return std::span<std::byte>{};  // bytes dropped
  }
  result<void> on_entry_complete(void*, std::uint64_t) override {
    dec->release(credit);
    return {};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(an_open_blob_holds_a_constant_whatever_its_entries_announced) {
  // An open blob whose entries completed holds at most
  // decoder::open_blob_bytes. An open blob that kept its last entry, key
  // included, and the capacity its pending index rows had grown to would
  // let 4,000 open blobs with 64 KiB keys hold 526 MB beside a 64 MiB
  // window.
  if (!blobpipe::testing::detail::heap_counting()) BLOBPIPE_SKIP("this build cannot count the heap");
  constexpr std::uint64_t blobs = 400;
  const std::string key(60'000, 'k');
  const std::vector<std::byte> payload(64, std::byte{7});
  outbox o;
  frame_hello(o, sender_hello);
  for (std::uint64_t id = 1; id <= blobs; ++id) {
    frame_blob_begin(o, id, tag_of(("open" + std::to_string(id)).c_str()));
    layout_builder b;
    // One entry with a long key sent in a data frame (its row kept while
    // it is open), one empty entry with a long key (complete at once).
    const planned_entry& pe =
        *b.add(key + "a", value::ndarray_bytes(payload, "|u1", {64})).value();
    frame_entry_begin(o, id, 0, pe.entry, pe.entry.meta());
    frame_data(o, id, pe.entry.off, payload, 1 << 20, /*copy=*/true);
    const planned_entry& empty = *b.add(key + "b", value::ndarray_bytes({}, "|u1", {0})).value();
    frame_entry_begin(o, id, 1, empty.entry, empty.entry.meta());
  }
  const auto stream = bytes_of(o);
  releasing_listener l;
  decoder_limits lim;
  lim.window_bytes = 1 << 20;  // one entry at a time: each is released at once
  decoder d(wire_role::sender, lim, l);
  l.dec = &d;
  const std::int64_t before = blobpipe::testing::detail::heap_live();
  auto r = d.consume(stream);
  BOOST_TEST_REQUIRE(bool(r), r.message());
  BOOST_TEST(d.open_blobs() == blobs);
  BOOST_TEST(d.buffered_bytes() == 0u);
  // The decoder's own frame assembly buffer (one key-sized frame) is not
  // per blob: allowed once.
  const std::int64_t held = blobpipe::testing::detail::heap_live() - before - std::int64_t{256 << 10};
  BOOST_TEST_MESSAGE((blobpipe::testing::detail::heap_live() - before) / std::int64_t{blobs}
                     << " bytes of heap per open blob");
  BOOST_TEST(held <= std::int64_t{blobs * decoder::open_blob_bytes});
}

BOOST_AUTO_TEST_CASE(a_tail_whose_known_rows_cannot_be_allocated_is_refused_not_thrown) {
  // A canonical tail is read with read_known_rows (docs/wire.md "Consumer"):
  // its rows failing to allocate end decoding with an error naming it, as
  // parse_index's do; std::bad_alloc never escapes consume().
  if (!blobpipe::testing::heap_limits())
    BLOBPIPE_SKIP("the sanitizer's allocator cannot be made to fail");
  outbox o;
  frame_hello(o, sender_hello);
  const tag_t tag = tag_of("rows");
  frame_blob_begin(o, 1, tag);
  layout_builder b;
  const std::vector<std::byte> payload(8, std::byte{3});
  for (int i = 0; i < 2000; ++i) entry(o, b, 1, "k", value::ndarray_bytes(payload, "|u1", {8}), 64, 1 << 20);
  const auto prefix = bytes_of(o);
  outbox t;
  tail(t, b, 1, tag);
  const auto tail_bytes = bytes_of(t);
  releasing_listener l;
  decoder d(wire_role::sender, {}, l);
  l.dec = &d;
  auto r = d.consume(prefix);
  BOOST_TEST_REQUIRE(bool(r), r.message());
  // 2,000 rows take far more than 16 KiB; the refusal's own words fit.
  blobpipe::testing::with_heap_limit(16 << 10, [&] { r = d.consume(tail_bytes); });
  BOOST_TEST_REQUIRE(!r);
  BOOST_TEST(r.message().find("out of memory for the known rows of an index") != std::string::npos,
             r.message());
}
