// Memory bounds of the parsers, measured with a counting allocator
// (heap_counter.hpp), not RSS: the index parser stays within the bound
// parse_index documents (23 x index bytes + 4 KiB) for every shape of
// index, including indexes of one-byte rows built to amplify, and
// Entry::from_meta allocates nothing beyond the Entry's own strings and a
// shape's dims past the inline ones. Counting works in the sanitizer
// builds too (their malloc hooks), so these tests run in every phase of
// .ci/run.
#define BOOST_TEST_MODULE parse_memory
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "blobpipe/format.hpp"
#include "test/heap_counter.hpp"

namespace bp = blobpipe;
using blobpipe::testing::measure_heap;

namespace {

constexpr std::size_t stated_factor = 23;      // parse_index's documented bound
constexpr std::size_t stated_constant = 4096;  // bytes

std::size_t bound(std::size_t index_bytes) { return stated_factor * index_bytes + stated_constant; }

// msgpack array32 header for `n` elements, then `body`.
std::vector<std::byte> array32(std::uint32_t n, const std::vector<std::uint8_t>& body) {
  std::vector<std::byte> b = {std::byte{0xdd}, std::byte(n >> 24), std::byte(n >> 16),
                              std::byte(n >> 8), std::byte(n)};
  for (auto x : body) b.push_back(std::byte{x});
  return b;
}

// `count` copies of `row`, behind an array32 header of `count`.
std::vector<std::byte> repeated_rows(const std::vector<std::uint8_t>& row, std::size_t count) {
  std::vector<std::uint8_t> body;
  body.reserve(row.size() * count);
  for (std::size_t i = 0; i < count; ++i) body.insert(body.end(), row.begin(), row.end());
  return array32(static_cast<std::uint32_t>(count), body);
}

// An index built to amplify: one array of one-byte fixints, every size
// check against the bytes present passes.
std::vector<std::byte> fixint_index(std::size_t bytes) {
  return array32(static_cast<std::uint32_t>(bytes - 5), std::vector<std::uint8_t>(bytes - 5, 0));
}

void check_parse_within_bound(const std::vector<std::byte>& index, std::uint64_t data_end,
                              bool expect_ok) {
  bp::result<std::vector<bp::Entry>> r(bp::errc::invalid_argument, "not run");
  auto use = measure_heap([&] { r = bp::parse_index(index, data_end); });
  BOOST_TEST(r.has_value() == expect_ok, r.message());
  BOOST_TEST(use.peak_bytes <= bound(index.size()),
             "peak " << use.peak_bytes << " bytes for an index of " << index.size()
                     << " bytes; stated bound " << bound(index.size()));
  BOOST_TEST_MESSAGE("index of " << index.size() << " bytes: peak heap " << use.peak_bytes
                                 << " bytes (" << double(use.peak_bytes) / index.size()
                                 << " x)");
}

}  // namespace

BOOST_AUTO_TEST_CASE(heap_counter_counts_in_this_build) {
  BOOST_TEST_REQUIRE(bp::testing::heap_counting());
  auto use = measure_heap([] { std::vector<char> v(1 << 20); v[5] = 1; });
  BOOST_TEST(use.peak_bytes >= std::size_t{1} << 20);
  BOOST_TEST(use.allocations >= 1u);
}

BOOST_AUTO_TEST_CASE(index_of_ten_megabytes_of_fixints_stays_within_the_stated_bound) {
  const auto index = fixint_index(10'000'000);
  check_parse_within_bound(index, 0, false);
  // The header's count is not a reservation: almost nothing is allocated.
  auto use = measure_heap([&] { (void)bp::parse_index(index, 0); });
  BOOST_TEST(use.peak_bytes <= stated_constant);
}

BOOST_AUTO_TEST_CASE(row_count_the_bytes_cannot_hold_fails_cleanly) {
  // 2^32 - 1 rows declared, three bytes present.
  const auto index = array32(0xFFFFFFFFu, {0x90, 0x90, 0x90});
  bp::result<std::vector<bp::Entry>> r(bp::errc::invalid_argument, "not run");
  auto use = measure_heap([&] { r = bp::parse_index(index, 0); });
  BOOST_TEST((r.code() == bp::errc::malformed_index));
  BOOST_TEST(use.peak_bytes <= stated_constant);
}

BOOST_AUTO_TEST_CASE(smallest_valid_rows_stay_within_the_stated_bound) {
  // ["", 0, 0, "p", nil, nil]: 8 bytes, the smallest row that parses.
  check_parse_within_bound(repeated_rows({0x96, 0xa0, 0, 0, 0xa1, 'p', 0xc0, 0xc0}, 125'000), 0,
                           true);
  // ["", 0, 0, "t", nil, [0]]: the smallest row with a shape (inline now).
  check_parse_within_bound(repeated_rows({0x96, 0xa0, 0, 0, 0xa1, 't', 0xc0, 0x91, 0}, 110'000),
                           0, true);
  // A 16-byte key: the smallest that leaves the string's inline buffer.
  std::vector<std::uint8_t> row = {0x96, 0xb0};
  row.insert(row.end(), 16, 'k');
  row.insert(row.end(), {0, 0, 0xa1, 'p', 0xc0, 0xc0});
  check_parse_within_bound(repeated_rows(row, 40'000), 0, true);
}

BOOST_AUTO_TEST_CASE(rows_reserved_then_refused_stay_within_the_stated_bound) {
  // [0, 0, 0, 0, 0, 0]: 7 bytes, an array of six the scan counts as a row;
  // the first fails (its key is not a str) after the reserve.
  check_parse_within_bound(repeated_rows({0x96, 0, 0, 0, 0, 0, 0}, 140'000), 0, false);
}

BOOST_AUTO_TEST_CASE(read_index_file_of_a_fixint_index_stays_within_the_index_plus_the_bound) {
  const auto index = fixint_index(1'000'000);
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
      "/parse_memory_fixints.blob";
  std::vector<std::byte> blob(index.size() + bp::FOOTER_SIZE);
  std::copy(index.begin(), index.end(), blob.begin());
  bp::footer f;
  f.index_len = static_cast<std::uint32_t>(index.size());
  bp::encode_footer(f, std::span(blob).subspan(index.size()));
  {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    BOOST_TEST_REQUIRE(out != nullptr);
    BOOST_TEST_REQUIRE(std::fwrite(blob.data(), 1, blob.size(), out) == blob.size());
    std::fclose(out);
  }
  bp::result<bp::blob_index> r(bp::errc::invalid_argument, "not run");
  // read_index_file holds the index (1x) while parse_index runs.
  auto use = measure_heap([&] { r = bp::read_index_file(path); });
  BOOST_TEST((r.code() == bp::errc::malformed_index));
  BOOST_TEST(use.peak_bytes <= index.size() + bound(index.size()) + 8192,  // + stdio buffer
             "peak " << use.peak_bytes);
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(max_rows_refuses_an_index_with_more_rows) {
  std::vector<bp::Entry> rows;
  for (int i = 0; i < 5; ++i) rows.push_back({"k", 0, 0, 'p', std::nullopt, std::nullopt});
  const auto index = bp::encode_index(rows);
  BOOST_TEST(bp::parse_index(index, 0).has_value());
  BOOST_TEST(bp::parse_index(index, 0, 5).has_value());
  BOOST_TEST((bp::parse_index(index, 0, 4).code() == bp::errc::malformed_index));
  // Checked before the scan: a header of 2^32 - 1 rows over nothing.
  BOOST_TEST((bp::parse_index(array32(0xFFFFFFFFu, {}), 0, 4).code() ==
              bp::errc::malformed_index));
}

BOOST_AUTO_TEST_CASE(from_meta_allocates_nothing_for_short_keys_and_shapes) {
  const bp::Entry tensor{"0@reward", 0, 64, 't', std::string("float32"), bp::shape_t{16}};
  const auto meta = tensor.meta();
  std::string key = tensor.key;  // short: held inline, as most keys are
  bp::result<bp::Entry> r(bp::errc::invalid_argument, "not run");
  auto use = measure_heap([&] { r = bp::Entry::from_meta(key, meta); });
  BOOST_TEST_REQUIRE(r.has_value(), r.message());
  BOOST_TEST((*r == tensor));
  // The shape's dims are inline (shape_t, up to shape_inline_dims): the
  // receive path's meta parse allocates nothing for a small entry.
  BOOST_TEST(use.allocations == 0u);

  // Four dims (an image batch, NCHW) are inline too.
  const bp::Entry nchw{"0@obs", 0, 64, 't', std::string("float32"), bp::shape_t{2, 2, 2, 2}};
  const auto nmeta = nchw.meta();
  use = measure_heap([&] { r = bp::Entry::from_meta("0@obs", nmeta); });
  BOOST_TEST_REQUIRE(r.has_value(), r.message());
  BOOST_TEST((*r == nchw));
  BOOST_TEST(use.allocations == 0u);

  // Past the inline dims, one heap block for the dims: nothing else.
  const bp::Entry wide{"0@frames", 0, 64 * 8, 'n', std::string("<i8"),
                       bp::shape_t{2, 2, 2, 2, 2, 2}};
  static_assert(bp::shape_inline_dims < 6);
  const auto wmeta = wide.meta();
  use = measure_heap([&] { r = bp::Entry::from_meta("0@frames", wmeta); });
  BOOST_TEST_REQUIRE(r.has_value(), r.message());
  BOOST_TEST((*r == wide));
  BOOST_TEST(use.allocations == 1u);

  const bp::Entry pickle{"0@meta", 0, 5, 'p', std::nullopt, std::nullopt};
  const auto pmeta = pickle.meta();
  use = measure_heap([&] { r = bp::Entry::from_meta("0@meta", pmeta); });
  BOOST_TEST_REQUIRE(r.has_value(), r.message());
  BOOST_TEST(use.allocations == 0u);
}

// std::bad_alloc never escapes the parsers: an index whose entries cannot
// be allocated is too_large, a value like any other error.
BOOST_AUTO_TEST_CASE(allocation_failure_in_the_parsers_is_too_large) {
  if (!bp::testing::heap_limits()) {
    std::cout << "SKIPPED: //test:parse_memory_test allocation_failure_in_the_parsers_is_too_large: "
                 "the sanitizer's allocator cannot be made to fail\n";
    return;
  }
  const auto index = repeated_rows({0x96, 0xa0, 0, 0, 0xa1, 'p', 0xc0, 0xc0}, 125'000);
  bp::result<std::vector<bp::Entry>> r(bp::errc::invalid_argument, "not run");
  bp::testing::with_heap_limit(1 << 20, [&] { r = bp::parse_index(index, 0); });
  BOOST_TEST((r.code() == bp::errc::too_large), r.message());

  const bp::Entry tensor{"a key longer than the inline buffer", 0, 64, 't',
                         std::string("a dtype name longer than inline"), bp::shape_t{16}};
  const auto meta = tensor.meta();
  bp::result<bp::Entry> e(bp::errc::invalid_argument, "not run");
  bp::testing::with_heap_limit(0, [&] { e = bp::Entry::from_meta("k", meta); });
  BOOST_TEST((e.code() == bp::errc::too_large), e.message());
}
