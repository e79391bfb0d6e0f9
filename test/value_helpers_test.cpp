// blobpipe::value helpers for a C++ user: scalars of shape [], bool tensors
// from bool spans and std::vector<bool>, bfloat16 and float16 from their
// bit patterns; each written to a blob and read back with the dtype, shape
// and bytes it claims.
#define BOOST_TEST_MODULE value_helpers_test
#include <boost/test/unit_test.hpp>

#include <array>
#include <cstring>
#include <vector>

#include "blobpipe/format.hpp"

using namespace blobpipe;

namespace {

/// Writes `v` as the one entry "x" of a blob and returns the entry's row
/// and bytes as read back.
struct read_back {
  Entry row;
  std::vector<std::byte> bytes;
};

read_back round_trip(value v) {
  auto p = plan({"x"}, {std::move(v)});
  BOOST_TEST_REQUIRE(p.has_value(), p.message());
  std::vector<std::byte> blob(p->nbytes);
  BOOST_TEST_REQUIRE(write(*p, blob).has_value());
  auto idx = read_index(blob);
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  const Entry& e = idx->entries.at(0);
  auto view = decode_entry(blob, e);
  BOOST_TEST_REQUIRE(view.has_value(), view.message());
  return {e, std::vector<std::byte>(view->bytes.begin(), view->bytes.end())};
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_scalar_has_shape_empty_and_one_element) {
  const float reward = 0.75f;
  auto r = round_trip(value::scalar(reward));
  BOOST_TEST(r.row.dtype.value_or("") == "float32");
  BOOST_TEST((r.row.shape == shape_t{}));
  BOOST_TEST_REQUIRE(r.bytes.size() == 4u);
  float back = 0;
  std::memcpy(&back, r.bytes.data(), 4);
  BOOST_TEST(back == 0.75f);
  const std::int64_t step = -3;
  auto s = round_trip(value::scalar(step));
  BOOST_TEST(s.row.dtype.value_or("") == "int64");
  BOOST_TEST(s.bytes.size() == 8u);
}

BOOST_AUTO_TEST_CASE(bools_from_a_span_and_from_a_packed_vector) {
  const std::array<bool, 3> span_bits = {true, false, true};
  auto a = round_trip(value::bools(span_bits, {3}));
  BOOST_TEST(a.row.dtype.value_or("") == "bool");
  BOOST_TEST((a.row.shape == shape_t{3}));
  std::vector<bool> packed = {false, true, true, false, true};
  value v = value::bools(packed);
  packed.assign(5, false);  // the value owns its copy
  auto b = round_trip(std::move(v));
  BOOST_TEST(b.row.dtype.value_or("") == "bool");
  BOOST_TEST((b.row.shape == shape_t{5}));
  const std::vector<std::byte> want = {std::byte{0}, std::byte{1}, std::byte{1}, std::byte{0},
                                       std::byte{1}};
  BOOST_TEST((b.bytes == want));
}

BOOST_AUTO_TEST_CASE(half_precision_from_bit_patterns) {
  // 1.0 is 0x3F80 in bfloat16 and 0x3C00 in float16.
  const std::vector<std::uint16_t> bf = {0x3F80, 0x4000};
  auto a = round_trip(value::bfloat16_bits(bf, {2}));
  BOOST_TEST(a.row.dtype.value_or("") == "bfloat16");
  BOOST_TEST_REQUIRE(a.bytes.size() == 4u);
  std::uint16_t first = 0;
  std::memcpy(&first, a.bytes.data(), 2);
  BOOST_TEST(first == 0x3F80);
  const std::vector<std::uint16_t> h = {0x3C00};
  auto b = round_trip(value::float16_bits(h, {1, 1}));
  BOOST_TEST(b.row.dtype.value_or("") == "float16");
  BOOST_TEST((b.row.shape == shape_t{1, 1}));
}
