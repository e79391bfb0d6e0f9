// Behaviour of the codec beyond the golden cases: every format errc is
// produced, readers survive truncation and corruption, dtypes parse as
// torch and numpy spell them, and the incremental planner matches plan().
#define BOOST_TEST_MODULE format
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>
#include <utility>

#include <msgpack.hpp>

#include "blobpipe/format.hpp"
#include "test/skip.hpp"

namespace bp = blobpipe;

namespace {

std::vector<std::byte> sample_blob(const bp::tag_t& tag = bp::NO_TAG) {
  static const std::vector<float> x = {0, 1, 2, 3, 4, 5};
  static const std::vector<std::int64_t> ids = {7, 8, 9};
  static const std::string pickled = "\x80\x05K\x07.";
  auto p = bp::plan({"x", "ids", "meta"},
                    {bp::value::tensor(x, {2, 3}), bp::value::tensor(ids),
                     bp::value::pickle(std::as_bytes(std::span(pickled)))},
                    tag);
  std::vector<std::byte> out(p.value().nbytes);
  bp::write(*p, out).value();
  return out;
}

// Patches the u32 at `pos` (little-endian), as a corrupt writer would.
void put_u32(std::vector<std::byte>& b, std::size_t pos, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[pos + i] = std::byte(v >> (8 * i));
}

// A one-row blob around a hand-made index (for rows plan() never writes).
std::vector<std::byte> blob_with_index(std::vector<std::uint8_t> index, std::size_t data = 64) {
  std::vector<std::byte> b(data + index.size() + bp::FOOTER_SIZE);
  std::memcpy(b.data() + data, index.data(), index.size());
  bp::footer f;
  f.index_off = static_cast<std::uint32_t>(data);
  f.index_len = static_cast<std::uint32_t>(index.size());
  bp::encode_footer(f, std::span(b).subspan(data + index.size()));
  return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(footer_tests)

// errors.hpp errc_name: each code's short, stable name is its enumerator's
// spelling (the CLI prints it, the golden manifest's error categories use
// it); a code of another category, or none of ours, is "unknown".
BOOST_AUTO_TEST_CASE(every_code_has_its_short_name) {
  const std::pair<bp::errc, std::string_view> names[] = {
      {bp::errc::too_small, "too_small"},
      {bp::errc::bad_footer, "bad_footer"},
      {bp::errc::index_out_of_range, "index_out_of_range"},
      {bp::errc::malformed_index, "malformed_index"},
      {bp::errc::entry_out_of_range, "entry_out_of_range"},
      {bp::errc::shape_mismatch, "shape_mismatch"},
      {bp::errc::unknown_kind, "unknown_kind"},
      {bp::errc::unknown_dtype, "unknown_dtype"},
      {bp::errc::too_large, "too_large"},
      {bp::errc::buffer_too_small, "buffer_too_small"},
      {bp::errc::invalid_argument, "invalid_argument"},
      {bp::errc::closed, "closed"},
      {bp::errc::peer_closed, "peer_closed"},
      {bp::errc::peer_failed, "peer_failed"},
      {bp::errc::protocol_violation, "protocol_violation"},
      {bp::errc::timed_out, "timed_out"},
      {bp::errc::aborted, "aborted"},
      {bp::errc::cuda_failure, "cuda_failure"},
      {bp::errc::io, "io"},
  };
  // The table covers every code: they are numbered 1 .. io without gaps.
  BOOST_TEST(std::size(names) == static_cast<std::size_t>(bp::errc::io));
  for (const auto& [code, name] : names) {
    const char* got = bp::errc_name(code);
    BOOST_TEST_REQUIRE(got != nullptr, name);
    BOOST_TEST(std::string_view(got) == name);
    BOOST_TEST(std::string_view(bp::errc_name(make_error_code(code))) == name);
  }
  BOOST_TEST(std::string_view(bp::errc_name(std::make_error_code(std::errc::io_error))) ==
             "unknown");
  BOOST_TEST(std::string_view(bp::errc_name(static_cast<bp::errc>(0))) == "unknown");
}

BOOST_AUTO_TEST_CASE(read_footer_rejects_fewer_than_16_bytes_as_too_small) {
  std::vector<std::byte> b(15);
  BOOST_TEST((bp::read_footer(b).code() == bp::errc::too_small));
}

BOOST_AUTO_TEST_CASE(footer_roundtrips_index_range_and_tag) {
  auto tag = bp::make_tag("abc").value();
  auto blob = sample_blob(tag);
  auto f = bp::read_footer(blob);
  BOOST_TEST_REQUIRE(f.has_value());
  BOOST_TEST(f->version == bp::VERSION);
  BOOST_TEST((f->tag == tag));
  BOOST_TEST(bp::tag_hex(tag) == "61626300000000000000000000000000");
  BOOST_TEST(bp::footer_tag(blob).has_value());
  BOOST_TEST(!bp::footer_tag(sample_blob()).has_value(), "NO_TAG reads as no tag");
}

BOOST_AUTO_TEST_CASE(readers_ignore_the_footer_flags_as_the_reference_does) {
  // The reference writes 0 and never reads the field (docs/format.md): a
  // blob whose flags are set is the same blob to every reader.
  auto tag = bp::make_tag("flags").value();
  auto blob = sample_blob(tag);
  const auto want = bp::read_index(blob).value().entries;
  for (std::uint16_t flags : {std::uint16_t{1}, std::uint16_t{0x8000}, std::uint16_t{0xFFFF}}) {
    auto b = blob;
    std::byte* f = b.data() + b.size() - bp::FOOTER_SIZE;
    f[6] = std::byte(flags & 0xFF);
    f[7] = std::byte(flags >> 8);
    auto footer = bp::read_footer(b);
    BOOST_TEST_REQUIRE(footer.has_value());
    BOOST_TEST(footer->flags == flags);
    BOOST_TEST(bp::footer_is_valid(b));
    BOOST_TEST((*bp::footer_tag(b) == tag));
    auto idx = bp::read_index(b);
    BOOST_TEST_REQUIRE(idx.has_value());
    BOOST_TEST((idx->entries == want));
  }
}

BOOST_AUTO_TEST_CASE(make_tag_refuses_more_than_16_bytes) {
  BOOST_TEST((bp::make_tag("0123456789abcdefX").code() == bp::errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(random_tag_is_a_version_4_uuid_and_differs_each_call) {
  auto a = bp::random_tag();
  auto b = bp::random_tag();
  BOOST_TEST((a != b));
  BOOST_TEST(std::to_integer<int>(a[6] >> 4) == 4);
  BOOST_TEST(std::to_integer<int>(a[8] >> 6) == 2);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dtype_tests)

BOOST_AUTO_TEST_CASE(torch_aliases_resolve_to_canonical_names) {
  const std::pair<const char*, const char*> cases[] = {
      {"float", "float32"}, {"double", "float64"}, {"half", "float16"},
      {"long", "int64"},    {"int", "int32"},      {"short", "int16"},
      {"cfloat", "complex64"}, {"cdouble", "complex128"}, {"torch.bfloat16", "bfloat16"}};
  for (auto [alias, name] : cases) {
    auto d = bp::parse_torch_dtype(alias);
    BOOST_TEST_REQUIRE(d.has_value(), alias);
    BOOST_TEST(d->name == name);
  }
  BOOST_TEST(bp::parse_torch_dtype("float8_e5m2fnuz")->itemsize == 1u);
  BOOST_TEST(bp::parse_torch_dtype("uint64")->itemsize == 8u);
}

BOOST_AUTO_TEST_CASE(numpy_dtype_str_gives_order_kind_and_item_size) {
  BOOST_TEST(bp::parse_numpy_dtype("<U3")->itemsize == 12u);
  BOOST_TEST(bp::parse_numpy_dtype("|S4")->itemsize == 4u);
  BOOST_TEST(bp::parse_numpy_dtype("|V8")->itemsize == 8u);
  auto m = bp::parse_numpy_dtype("<M8[ns]");
  BOOST_TEST_REQUIRE(m.has_value());
  BOOST_TEST(m->unit == "ns");
  BOOST_TEST((m->type == bp::scalar_type::datetime));
  auto be = bp::parse_numpy_dtype(">i8");
  BOOST_TEST_REQUIRE(be.has_value());
  BOOST_TEST((be->order == bp::byte_order::big));
  BOOST_TEST(!be->is_native_order());
}

BOOST_AUTO_TEST_CASE(numpy_long_double_dtypes_have_their_item_sizes) {
  // What numpy's longdouble and clongdouble write as dtype.str on x86-64
  // (16, 32) and on 32-bit x86 (12, 24).
  for (auto [s, n] : {std::pair{"<f16", 16u}, {"<f12", 12u}, {">f16", 16u}}) {
    auto d = bp::parse_numpy_dtype(s);
    BOOST_TEST_REQUIRE(d.has_value(), s);
    BOOST_TEST(d->itemsize == n);
    BOOST_TEST((d->type == bp::scalar_type::longdouble));
  }
  for (auto [s, n] : {std::pair{"<c32", 32u}, {"<c24", 24u}}) {
    auto d = bp::parse_numpy_dtype(s);
    BOOST_TEST_REQUIRE(d.has_value(), s);
    BOOST_TEST(d->itemsize == n);
    BOOST_TEST((d->type == bp::scalar_type::clongdouble));
  }
}

BOOST_AUTO_TEST_CASE(unknown_dtypes_fail_with_unknown_dtype) {
  for (const char* s : {"float33", "", "torch.", "Float32"})
    BOOST_TEST((bp::parse_torch_dtype(s).code() == bp::errc::unknown_dtype), s);
  for (const char* s : {"<f3", "|O8", "<i", "f4", "<M8[parsec]", "<f4[s]", "<U99999999999999",
                        "<i4x", "<c12", "<f32"})
    BOOST_TEST((bp::parse_numpy_dtype(s).code() == bp::errc::unknown_dtype), s);
  BOOST_TEST((bp::parse_dtype('p', "float32").code() == bp::errc::unknown_kind));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layout_tests)

BOOST_AUTO_TEST_CASE(entries_are_64_byte_aligned_and_zero_length_entries_do_not_advance) {
  std::vector<float> three(3, 1.0f), none;
  auto p = bp::plan({"a", "e", "b"}, {bp::value::tensor(three), bp::value::tensor(none),
                                      bp::value::tensor(three)});
  BOOST_TEST_REQUIRE(p.has_value());
  BOOST_TEST(p->entries[0].entry.off == 0u);
  BOOST_TEST(p->entries[1].entry.off == 64u);
  BOOST_TEST(p->entries[2].entry.off == 64u);
  BOOST_TEST(p->index_off() == 128u);
}

BOOST_AUTO_TEST_CASE(layout_builder_matches_plan_entry_by_entry) {
  std::vector<double> a(10, 2.0);
  std::vector<std::uint8_t> b(100, 3);
  bp::layout_builder lb;
  auto e0 = lb.add("a", bp::value::tensor(a));
  BOOST_TEST_REQUIRE(e0.has_value());
  BOOST_TEST((*e0)->entry.off == 0u);
  BOOST_TEST(lb.data_end() == 128u);  // 80 bytes, aligned up
  auto e1 = lb.add("b", bp::value::tensor(b));
  BOOST_TEST((*e1)->entry.off == 128u);
  auto built = lb.finish(bp::NO_TAG);
  auto planned = bp::plan({"a", "b"}, {bp::value::tensor(a), bp::value::tensor(b)});
  BOOST_TEST_REQUIRE(built.has_value());
  BOOST_TEST((built->index == planned->index));
  BOOST_TEST(built->nbytes == planned->nbytes);
  BOOST_TEST((lb.add("c", bp::value::tensor(a)).code() == bp::errc::closed));
  BOOST_TEST((lb.finish(bp::NO_TAG).code() == bp::errc::closed));
}

BOOST_AUTO_TEST_CASE(a_refused_add_leaves_the_builder_as_it_was) {
  std::vector<double> a(10, 2.0);
  std::vector<std::uint8_t> b(100, 3);
  const std::byte fake{};
  bp::layout_builder lb;
  BOOST_TEST_REQUIRE(lb.add("a", bp::value::tensor(a)).has_value());
  auto bad_dtype = bp::value::tensor_bytes(std::as_bytes(std::span(a)), "float33", {10});
  auto negative = bp::value::tensor(a, {-1});
  auto odd_kind = bp::value::tensor(a);
  odd_kind.kind = 'q';
  auto null = bp::value::tensor_bytes({}, "float32", {4});
  auto too_large = bp::value::tensor_bytes({&fake, 1}, "uint8", {std::int64_t{5} << 30});
  for (const auto& v : {bad_dtype, negative, odd_kind, null, too_large}) {
    BOOST_TEST(!lb.add("refused", v).has_value());
    BOOST_TEST(lb.size() == 1u);
    BOOST_TEST(lb.data_end() == 128u);
  }
  auto e1 = lb.add("b", bp::value::tensor(b));
  BOOST_TEST_REQUIRE(e1.has_value());
  BOOST_TEST((*e1)->entry.off == 128u);
  auto built = lb.finish(bp::NO_TAG);
  auto planned = bp::plan({"a", "b"}, {bp::value::tensor(a), bp::value::tensor(b)});
  BOOST_TEST_REQUIRE(built.has_value());
  BOOST_TEST_REQUIRE(built->entries.size() == 2u);
  BOOST_TEST(built->entries[1].entry.key == "b");
  BOOST_TEST((built->index == planned->index));
  BOOST_TEST(built->nbytes == planned->nbytes);
}

BOOST_AUTO_TEST_CASE(add_with_the_dtype_looked_up_plans_as_add_does) {
  std::vector<float> x(6, 1.0f);
  bp::layout_builder with, without;
  auto v = bp::value::tensor_bytes(std::as_bytes(std::span(x)), "float", {2, 3});
  auto r1 = with.add("x", bp::value(v), bp::lookup_dtype(v.kind, v.dtype));
  auto r2 = without.add("x", bp::value(v), nullptr);  // null: add looks it up
  BOOST_TEST_REQUIRE(r1.has_value());
  BOOST_TEST_REQUIRE(r2.has_value());
  BOOST_TEST(((*r1)->entry == (*r2)->entry));
  BOOST_TEST((*(*r1)->entry.dtype == "float32"));
  // Refused: the key and value are left to the caller as they were.
  std::string key = "y";
  auto bad = bp::value::tensor_bytes(std::as_bytes(std::span(x)), "float33", {6});
  BOOST_TEST((with.add(std::move(key), std::move(bad), nullptr).code() ==
              bp::errc::unknown_dtype));
  BOOST_TEST(key == "y");
  BOOST_TEST(bad.dtype == "float33");
  BOOST_TEST(bad.shape.size() == 1u);
}

// The index rows are written by the format's own writer; msgpack-cxx's
// packer is the reference for "canonical": the smallest encoding of each
// value, str keys. Every boundary of every form a row field can take.
BOOST_AUTO_TEST_CASE(index_rows_are_canonical_msgpack_at_every_size_boundary) {
  auto packed = [](const std::vector<bp::Entry>& rows) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_array(static_cast<std::uint32_t>(rows.size()));
    for (const auto& e : rows) {
      pk.pack_array(6);
      pk.pack_str(static_cast<std::uint32_t>(e.key.size()));
      pk.pack_str_body(e.key.data(), static_cast<std::uint32_t>(e.key.size()));
      pk.pack(e.off);
      pk.pack(e.len);
      pk.pack_str(1);
      pk.pack_str_body(&e.kind, 1);
      if (e.dtype) {
        pk.pack_str(static_cast<std::uint32_t>(e.dtype->size()));
        pk.pack_str_body(e.dtype->data(), static_cast<std::uint32_t>(e.dtype->size()));
      } else {
        pk.pack_nil();
      }
      if (e.shape) {
        pk.pack_array(static_cast<std::uint32_t>(e.shape->size()));
        for (std::int64_t d : *e.shape) pk.pack(d);
      } else {
        pk.pack_nil();
      }
    }
    const auto* b = reinterpret_cast<const std::byte*>(buf.data());
    return std::vector<std::byte>(b, b + buf.size());
  };
  const std::uint64_t u32 = std::uint64_t{1} << 32;
  const std::vector<std::uint64_t> uints = {0, 127, 128, 255, 256, 65535, 65536, u32 - 1, u32,
                                            ~std::uint64_t{0}};
  const std::int64_t i31 = std::int64_t{1} << 31;
  const std::vector<std::int64_t> ints = {0,      1,      127,        128,     255,
                                          256,    65535,  65536,      i31,     -1,
                                          -32,    -33,    -128,       -129,    -32768,
                                          -32769, -i31,   -i31 - 1,   INT64_MIN, INT64_MAX};
  std::vector<bp::Entry> rows;
  for (std::size_t i = 0; i < uints.size(); ++i) {
    bp::Entry e;
    e.key = "k";
    e.off = uints[i];
    e.len = uints[uints.size() - 1 - i];
    e.dtype = "uint8";
    e.shape = bp::shape_t{ints[i], ints[ints.size() - 1 - i]};
    rows.push_back(e);
  }
  for (std::size_t n : {0, 1, 31, 32, 255, 256, 65535, 65536}) {
    bp::Entry e;
    e.key = std::string(n, 'k');
    e.kind = bp::KIND_NDARRAY;
    e.dtype = std::string(n, 'd');
    e.shape = bp::shape_t(n % 20, 3);  // 0, 1, 11, 12, 15, 16, 15, 16 dims
    rows.push_back(e);
  }
  bp::Entry pickle;
  pickle.kind = bp::KIND_PICKLE;  // nil dtype and shape
  rows.push_back(pickle);
  BOOST_TEST((bp::encode_index(rows) == packed(rows)));
  for (const auto& e : rows) {
    std::vector<std::byte> out = {std::byte{0x42}};
    bp::append_index_row(e, out);
    auto whole = packed({e});
    whole.erase(whole.begin());  // its array header
    whole.insert(whole.begin(), std::byte{0x42});
    BOOST_TEST((out == whole));
  }
  // Array headers: fixarray, array16 and array32 of rows.
  for (std::size_t n : {15, 16, 65535, 65536}) {
    std::vector<bp::Entry> many(n, pickle);
    BOOST_TEST((bp::encode_index(many) == packed(many)), n << " rows");
  }
}

BOOST_AUTO_TEST_CASE(plan_refuses_a_blob_the_v3_footer_cannot_address) {
  // plan() reads no bytes, so a 5 GiB description needs no memory.
  const std::byte fake{};
  auto big = bp::value::tensor_bytes({&fake, 1}, "uint8", {std::int64_t{5} << 30});
  BOOST_TEST((bp::plan({"big"}, {big}).code() == bp::errc::too_large));
}

// An entry may end at 4 GiB exactly, but then the index would begin there,
// past what the footer's u32 index_off holds: finish refuses the blob.
BOOST_AUTO_TEST_CASE(finish_refuses_an_index_that_would_begin_at_4_gib) {
  const std::byte fake{};
  bp::layout_builder lb;
  auto big = bp::value::tensor_bytes({&fake, 1}, "uint8", {std::int64_t{1} << 32});
  BOOST_TEST_REQUIRE(lb.add("big", big).has_value());
  auto p = lb.finish(bp::NO_TAG);
  BOOST_TEST_REQUIRE(!p.has_value());
  BOOST_TEST((p.code() == bp::errc::too_large), p.message());
  BOOST_TEST(p.message().find("index_off 4294967296") != std::string::npos, p.message());
  BOOST_TEST(p.message().find("does not fit the v3 footer") != std::string::npos, p.message());
}

BOOST_AUTO_TEST_CASE(plan_refuses_bad_arguments) {
  std::vector<float> x(4);
  std::vector<std::string> keys = {"a", "b"};
  std::vector<bp::value> one = {bp::value::tensor(x)};
  BOOST_TEST((bp::plan(keys, one).code() == bp::errc::invalid_argument));
  auto neg = bp::value::tensor(x, {-1});
  BOOST_TEST((bp::plan({"a"}, {neg}).code() == bp::errc::invalid_argument));
  auto strided = bp::value::tensor(x, {2, 2});
  strided.strides = {1};
  BOOST_TEST((bp::plan({"a"}, {strided}).code() == bp::errc::invalid_argument));
  auto null = bp::value::tensor_bytes({}, "float32", {4});
  BOOST_TEST((bp::plan({"a"}, {null}).code() == bp::errc::invalid_argument));
  auto odd = bp::value::tensor(x);
  odd.kind = 'q';
  BOOST_TEST((bp::plan({"a"}, {odd}).code() == bp::errc::unknown_kind));
  auto bad = bp::value::tensor_bytes(std::as_bytes(std::span(x)), "float33", {4});
  BOOST_TEST((bp::plan({"a"}, {bad}).code() == bp::errc::unknown_dtype));
}

BOOST_AUTO_TEST_CASE(write_refuses_a_buffer_shorter_than_the_plan) {
  std::vector<float> x(4);
  auto p = bp::plan({"x"}, {bp::value::tensor(x)});
  std::vector<std::byte> small(p->nbytes - 1);
  BOOST_TEST((bp::write(*p, small).code() == bp::errc::buffer_too_small));
  std::vector<std::byte> tail(bp::tail_size(*p) - 1);
  BOOST_TEST((bp::write_tail(*p, tail).code() == bp::errc::buffer_too_small));
}

BOOST_AUTO_TEST_CASE(write_entry_needs_exactly_the_entrys_bytes) {
  std::vector<float> x(4);
  auto p = bp::plan({"x"}, {bp::value::tensor(x)});
  BOOST_TEST_REQUIRE(p.has_value(), p.message());
  std::vector<std::byte> out(p->entries[0].entry.len + 1);
  BOOST_TEST((bp::write_entry(p->entries[0], std::span(out).first(out.size() - 2)).code() ==
              bp::errc::buffer_too_small));
  BOOST_TEST((bp::write_entry(p->entries[0], out).code() == bp::errc::buffer_too_small));
  BOOST_TEST(bp::write_entry(p->entries[0], std::span(out).first(out.size() - 1)).has_value());
}

// The CPU cannot read device memory: write() and write_entry() refuse a
// value declared cuda_device before touching its bytes (host memory here,
// so a copy would not crash, which is what the check is for elsewhere).
BOOST_AUTO_TEST_CASE(write_refuses_a_value_declared_in_device_memory) {
  std::vector<float> x = {1, 2, 3, 4};
  auto v = bp::value::tensor(x);
  v.memory = bp::memory_kind::cuda_device;
  auto p = bp::plan({"x"}, {v});
  BOOST_TEST_REQUIRE(p.has_value(), p.message());
  std::vector<std::byte> out(p->nbytes);
  BOOST_TEST((bp::write(*p, out).code() == bp::errc::invalid_argument));
  BOOST_TEST((bp::write_entry(p->entries[0], std::span(out).first(p->entries[0].entry.len))
                  .code() == bp::errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(write_tail_is_exactly_the_end_of_write) {
  auto tag = bp::random_tag();
  std::vector<std::int32_t> x = {1, 2, 3};
  auto p = bp::plan({"x"}, {bp::value::tensor(x)}, tag);
  std::vector<std::byte> whole(p->nbytes), tail(bp::tail_size(*p));
  bp::write(*p, whole).value();
  BOOST_TEST(bp::write_tail(*p, tail).value() == tail.size());
  BOOST_TEST(std::equal(tail.begin(), tail.end(), whole.end() - tail.size()));
  BOOST_TEST(bp::footer_is_valid(tail));
  BOOST_TEST((*bp::footer_tag(tail) == tag));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(index_tests)

BOOST_AUTO_TEST_CASE(decoded_views_are_zero_copy_and_typed) {
  auto blob = sample_blob();
  auto idx = bp::read_index(blob);
  BOOST_TEST_REQUIRE(idx.has_value());
  auto v = bp::decode_entry(blob, idx->entries[0]);
  BOOST_TEST_REQUIRE(v.has_value());
  BOOST_TEST(v->bytes.data() == blob.data());
  BOOST_TEST(v->numel() == 6u);
  BOOST_TEST(v->at<float>(5) == 5.0f);
  auto ids = bp::decode_entry(blob, idx->entries[1]);
  BOOST_TEST(ids->at<std::int64_t>(2) == 9);
  auto m = bp::materialize(*ids);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(m.bytes().data()) % bp::ALIGN == 0u);
  BOOST_TEST(std::equal(m.bytes().begin(), m.bytes().end(), ids->bytes.begin()));
}

BOOST_AUTO_TEST_CASE(big_endian_elements_read_in_native_order) {
  const std::uint8_t be[] = {0, 0, 0, 0, 0, 0, 1, 2};  // >i8 258
  bp::Entry e{"x", 0, 8, 'n', std::string(">i8"), bp::shape_t{1}};
  auto v = bp::view_entry(e, std::as_bytes(std::span(be)));
  BOOST_TEST_REQUIRE(v.has_value());
  BOOST_TEST(v->at<std::int64_t>(0) == 258);
  BOOST_TEST(*v->as_double(0) == 258.0);
}

BOOST_AUTO_TEST_CASE(float8_values_decode) {
  // 1.0, -2.0 and a NaN in each format: exponent bias 7 (e4m3fn), 15
  // (e5m2), 8 (e4m3fnuz), 16 (e5m2fnuz); the fnuz forms' one NaN is 0x80,
  // negative zero elsewhere.
  const struct {
    const char* dtype;
    std::array<std::uint8_t, 3> bytes;
  } cases[] = {
      {"float8_e4m3fn", {0x38, 0xC0, 0x7F}},
      {"float8_e5m2", {0x3C, 0xC0, 0x7F}},
      {"float8_e4m3fnuz", {0x40, 0xC8, 0x80}},
      {"float8_e5m2fnuz", {0x40, 0xC4, 0x80}},
  };
  for (const auto& c : cases) {
    bp::Entry e{"f", 0, 3, 't', std::string(c.dtype), bp::shape_t{3}};
    auto v = bp::view_entry(e, std::as_bytes(std::span(c.bytes)));
    BOOST_TEST_REQUIRE(v.has_value(), c.dtype);
    BOOST_TEST(*v->as_double(0) == 1.0, c.dtype);
    BOOST_TEST(*v->as_double(1) == -2.0, c.dtype);
    BOOST_TEST(std::isnan(*v->as_double(2)), c.dtype);
  }
}

BOOST_AUTO_TEST_CASE(index_past_the_footer_is_index_out_of_range) {
  auto blob = sample_blob();
  const std::size_t foot = blob.size() - bp::FOOTER_SIZE;
  auto b = blob;
  put_u32(b, foot + 12, 0xFFFFFFF0u);  // index_len near 4 GiB
  BOOST_TEST((bp::read_index(b).code() == bp::errc::index_out_of_range));
  b = blob;
  put_u32(b, foot + 8, 0xFFFFFFFFu);  // index_off + index_len overflows u32
  BOOST_TEST((bp::read_index(b).code() == bp::errc::index_out_of_range));
}

BOOST_AUTO_TEST_CASE(malformed_rows_are_malformed_index) {
  // [["x", 0, 4, "t", "float32", [-1]]]: negative dim
  BOOST_TEST((bp::read_index(blob_with_index({0x91, 0x96, 0xa1, 'x', 0, 4, 0xa1, 't', 0xa7, 'f',
                                              'l', 'o', 'a', 't', '3', '2', 0x91, 0xff}))
                  .code() == bp::errc::malformed_index));
  // a row that is a str, not an array
  BOOST_TEST((bp::read_index(blob_with_index({0x91, 0xa1, 'x'})).code() ==
              bp::errc::malformed_index));
  // trailing bytes after the index array
  BOOST_TEST((bp::read_index(blob_with_index({0x90, 0x90})).code() ==
              bp::errc::malformed_index));
  // nesting deeper than rows allow: [[[[]]]]
  BOOST_TEST((bp::read_index(blob_with_index({0x91, 0x91, 0x91, 0x90})).code() ==
              bp::errc::malformed_index));
}

// docs/format.md "Validation order": the whole index is checked as msgpack
// before any row, then rows one at a time.
BOOST_AUTO_TEST_CASE(index_errors_come_in_the_documented_order) {
  // Row 0 names an unknown dtype; the index is then cut short: the
  // truncation (step 4) is reported, not the dtype (step 8).
  const std::vector<std::uint8_t> row0 = {0x96, 0xa1, 'x', 0, 4, 0xa1, 't', 0xa3, 'f', '1', '6',
                                          0x91, 1};
  std::vector<std::uint8_t> cut = {0x92};
  cut.insert(cut.end(), row0.begin(), row0.end());
  cut.insert(cut.end(), {0x96, 0xa1});  // row 1: a str header and nothing more
  BOOST_TEST((bp::read_index(blob_with_index(cut)).code() == bp::errc::malformed_index));
  // Whole, with row 1 not an array: row 0's dtype comes first.
  std::vector<std::uint8_t> whole = {0x92};
  whole.insert(whole.end(), row0.begin(), row0.end());
  whole.push_back(0x05);
  BOOST_TEST((bp::read_index(blob_with_index(whole)).code() == bp::errc::unknown_dtype));
}

BOOST_AUTO_TEST_CASE(pickle_rows_keep_no_dtype_or_shape_in_any_reader) {
  // [["p", 0, 3, "p", "float32", [3]]]: the reference ignores both fields.
  auto b = blob_with_index({0x91, 0x96, 0xa1, 'p', 0, 3, 0xa1, 'p', 0xa7, 'f', 'l', 'o', 'a', 't',
                            '3', '2', 0x91, 3});
  auto idx = bp::read_index(b);
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  const bp::Entry want{"p", 0, 3, 'p', std::nullopt, std::nullopt};
  BOOST_TEST((idx->entries[0] == want));
  auto v = bp::decode_entry(b, idx->entries[0]);
  BOOST_TEST_REQUIRE(v.has_value(), v.message());
  BOOST_TEST(v->numel() == 3u);
  // The meta map: {"o": 0, "n": 3, "k": "p", "d": "float32", "s": [3]}.
  const std::uint8_t m[] = {0x85, 0xa1, 'o', 0, 0xa1, 'n', 3, 0xa1, 'k', 0xa1, 'p', 0xa1, 'd',
                            0xa7, 'f', 'l', 'o', 'a', 't', '3', '2', 0xa1, 's', 0x91, 3};
  auto e = bp::Entry::from_meta("p", std::as_bytes(std::span(m)));
  BOOST_TEST_REQUIRE(e.has_value(), e.message());
  BOOST_TEST((*e == want));
  // The fields keep their types: a dtype that is an int is still refused.
  BOOST_TEST((bp::read_index(blob_with_index({0x91, 0x96, 0xa1, 'p', 0, 3, 0xa1, 'p', 5, 0xc0}))
                  .code() == bp::errc::malformed_index));
  // An Entry built by hand with them views as the same pickle.
  const bp::Entry by_hand{"p", 0, 3, 'p', std::string("float32"), bp::shape_t{3}};
  BOOST_TEST(bp::validate_entry(by_hand, 64).has_value());
}

BOOST_AUTO_TEST_CASE(shape_product_overflow_is_refused_whatever_the_itemsize) {
  // |V0 elements are 0 bytes, so len 0 matches any shape; the element
  // count 3 x (2^62-1)^2 still overflows.
  constexpr std::int64_t big = (std::int64_t{1} << 62) - 1;
  const bp::Entry e{"v", 0, 0, 'n', std::string("|V0"), bp::shape_t{3, big, big}};
  BOOST_TEST((bp::validate_entry(e, 64).code() == bp::errc::shape_mismatch));
  BOOST_TEST(bp::validate_entry(e, 64).message().find("overflows 64 bits") != std::string::npos,
             bp::validate_entry(e, 64).message());
  // Through the index, as a hostile file would carry it.
  auto b = blob_with_index(
      {0x91, 0x96, 0xa1, 'v', 0, 0, 0xa1, 'n', 0xa3, '|', 'V', '0', 0x93, 3, 0xcf, 0x3f, 0xff,
       0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xcf, 0x3f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  BOOST_TEST((bp::read_index(b).code() == bp::errc::shape_mismatch));
  // plan() will not write it either.
  std::byte none[1];
  BOOST_TEST((bp::plan({"v"}, {bp::value::ndarray_bytes({none, 0}, "|V0", {3, big, big})})
                  .code() == bp::errc::invalid_argument));
  // The running product, as numpy and torch take it: a leading 0 is 0.
  const bp::Entry zero{"z", 0, 0, 'n', std::string("|V0"), bp::shape_t{0, big, big}};
  BOOST_TEST(bp::validate_entry(zero, 64).has_value());
  // A view built by hand cannot wrap numel(): it saturates.
  bp::entry_view v;
  v.shape = {3, big, big};
  BOOST_TEST(v.numel() == UINT64_MAX);
}

BOOST_AUTO_TEST_CASE(unaligned_entry_offset_is_entry_out_of_range) {
  // [["x", 8, 4, "t", "float32", [1]]]
  auto b = blob_with_index({0x91, 0x96, 0xa1, 'x', 8, 4, 0xa1, 't', 0xa7, 'f', 'l', 'o', 'a', 't',
                            '3', '2', 0x91, 1});
  BOOST_TEST((bp::read_index(b).code() == bp::errc::entry_out_of_range));
}

BOOST_AUTO_TEST_CASE(tensor_row_with_nil_dtype_means_float32) {
  // [["x", 0, 8, "t", nil, [2]]]
  auto b = blob_with_index({0x91, 0x96, 0xa1, 'x', 0, 8, 0xa1, 't', 0xc0, 0x91, 2});
  auto idx = bp::read_index(b);
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  auto v = bp::decode_entry(b, idx->entries[0]);
  BOOST_TEST_REQUIRE(v.has_value());
  BOOST_TEST(v->type.name == "float32");
}

BOOST_AUTO_TEST_CASE(every_truncation_of_a_blob_fails_cleanly) {
  auto blob = sample_blob();
  for (std::size_t n = 0; n < blob.size(); ++n) {
    auto r = bp::read_index(std::span(blob).first(n));
    BOOST_TEST(!r.has_value(), "prefix of " << n << " bytes");
  }
}

BOOST_AUTO_TEST_CASE(every_single_byte_corruption_is_read_or_refused_never_crashes) {
  auto blob = sample_blob(bp::make_tag("t").value());
  std::size_t refused = 0;
  for (std::size_t i = 0; i < blob.size(); ++i) {
    for (std::uint8_t flip : {0x01, 0x80, 0xFF}) {
      auto b = blob;
      b[i] ^= std::byte{flip};
      auto r = bp::read_index(b);
      if (!r) {
        ++refused;
        BOOST_TEST((r.code().category() == bp::category()));
        continue;
      }
      for (const auto& e : r->entries) BOOST_TEST(bp::decode_entry(b, e).has_value());
    }
  }
  BOOST_TEST(refused > 0u);
}

BOOST_AUTO_TEST_CASE(read_index_file_reads_a_blob_at_an_offset) {
  auto blob = sample_blob();
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                           "/format_test_offset.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "prefix!";
    out.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  }
  auto idx = bp::read_index_file(path, 7, blob.size());
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  BOOST_TEST(idx->entries.size() == 3u);
  BOOST_TEST((bp::read_index_file(path, 7, blob.size() + 1).code() == bp::errc::too_small));
  BOOST_TEST((bp::read_index_file(path + ".missing").code() == bp::errc::io));
}

// The footer is at the end, so only a regular file will do. A FIFO with no
// writer must be refused at once, not waited on (the timeout turns such a
// hang into a failure); a pipe holding a whole blob and a directory are
// refused as io too, not reported as format errors.
BOOST_AUTO_TEST_CASE(read_index_file_refuses_what_is_not_a_regular_file,
                     *boost::unit_test::timeout(30)) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string fifo = dir + "/format_test_no_writer.fifo";
  ::unlink(fifo.c_str());
  BOOST_TEST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto r = bp::read_index_file(fifo);
  BOOST_TEST((r.code() == bp::errc::io), r.message());
  BOOST_TEST(r.message().find("not a regular file") != std::string::npos, r.message());
  ::unlink(fifo.c_str());

  auto blob = sample_blob();
  int fds[2];
  BOOST_TEST_REQUIRE(::pipe(fds) == 0);
  BOOST_TEST_REQUIRE(::write(fds[1], blob.data(), blob.size()) ==
                     static_cast<ssize_t>(blob.size()));
  ::close(fds[1]);
  auto p = bp::read_index_file("/dev/fd/" + std::to_string(fds[0]));
  BOOST_TEST((p.code() == bp::errc::io), p.message());
  // The same pipe as an open FILE: it cannot seek, which is io as well.
  std::FILE* f = ::fdopen(fds[0], "rb");
  BOOST_TEST_REQUIRE(f != nullptr);
  auto q = bp::read_index_file(f, 0, 0);
  BOOST_TEST((q.code() == bp::errc::io), q.message());
  std::fclose(f);

  auto d = bp::read_index_file(dir);
  BOOST_TEST((d.code() == bp::errc::io), d.message());
}

namespace {

// A FILE over `data` (fopencookie) whose seeks after the first `seeks_ok`
// and reads after the first `reads_ok` fail with EIO, as a file on a
// failing disk or a network stream does; so does a read that begins in
// [hole_begin, hole_end), and one that begins before stops there.
struct failing_file {
  std::vector<std::byte> data;
  int seeks_ok = 1 << 30;
  int reads_ok = 1 << 30;
  off64_t hole_begin = 0, hole_end = 0;
  off64_t pos = 0;

  static ssize_t read(void* c, char* buf, std::size_t n) {
    auto& f = *static_cast<failing_file*>(c);
    if (f.reads_ok-- <= 0 || (f.pos >= f.hole_begin && f.pos < f.hole_end)) {
      errno = EIO;
      return -1;
    }
    const off64_t size = static_cast<off64_t>(f.data.size());
    auto have = static_cast<std::size_t>(std::max<off64_t>(0, size - f.pos));
    if (f.pos < f.hole_begin)
      have = std::min(have, static_cast<std::size_t>(f.hole_begin - f.pos));
    const std::size_t m = std::min(n, have);
    if (m != 0) std::memcpy(buf, f.data.data() + f.pos, m);
    f.pos += static_cast<off64_t>(m);
    return static_cast<ssize_t>(m);
  }
  static int seek(void* c, off64_t* off, int whence) {
    auto& f = *static_cast<failing_file*>(c);
    if (f.seeks_ok-- <= 0) {
      errno = EIO;
      return -1;
    }
    const off64_t base = whence == SEEK_SET   ? 0
                         : whence == SEEK_CUR ? f.pos
                                              : static_cast<off64_t>(f.data.size());
    f.pos = base + *off;
    *off = f.pos;
    return 0;
  }
  bp::result<bp::blob_index> read_index() {
    cookie_io_functions_t io{&failing_file::read, nullptr, &failing_file::seek, nullptr};
    std::FILE* f = ::fopencookie(this, "r", io);
    BOOST_TEST_REQUIRE(f != nullptr);
    auto r = bp::read_index_file(f, 0, 0);
    std::fclose(f);
    return r;
  }
};

}  // namespace

// read_index_file(FILE*) on a file whose seek or read fails: io, naming the
// call that failed and the system's reason, never a format error.
BOOST_AUTO_TEST_CASE(read_index_file_of_a_failing_file_is_io_naming_the_failed_call) {
  const auto blob = sample_blob();
  {
    failing_file ok{blob};
    auto r = ok.read_index();
    BOOST_TEST_REQUIRE(r.has_value(), r.message());
    BOOST_TEST(r->entries.size() == 3u);
  }
  // glibc's stdio: seek 1 is fseeko(SEEK_END), seek 2 ftello, seek 3 the
  // footer's fseeko(SEEK_SET).
  const std::pair<int, const char*> seeks[] = {
      {0, "cannot seek: "}, {1, "cannot tell file size: "}, {2, "cannot seek: "}};
  for (auto [n, what] : seeks) {
    failing_file f{blob};
    f.seeks_ok = n;
    auto r = f.read_index();
    BOOST_TEST_CONTEXT(n << " seeks work") {
      BOOST_TEST_REQUIRE(!r.has_value());
      BOOST_TEST((r.code() == bp::errc::io), r.message());
      BOOST_TEST(r.message().starts_with(what), r.message());
    }
  }
  // A read that fails, not a file that ends: the footer's or the index's
  // read, whichever glibc issues the failing read(2) for.
  bool short_read = false;
  for (int n = 0; n <= 4; ++n) {
    failing_file f{blob};
    f.reads_ok = n;
    auto r = f.read_index();
    if (r) continue;
    BOOST_TEST_CONTEXT(n << " reads work") {
      BOOST_TEST((r.code() == bp::errc::io), r.message());
      BOOST_TEST(r.message().find("ended early") == std::string::npos, r.message());
      short_read |= r.message().starts_with("short read: ");
    }
  }
  BOOST_TEST(short_read, "no failing read was reported as one");
}

// An index over first_index_read_bytes (1 MiB) is read in pieces, and the
// first is checked to begin an array of rows before the next is allocated:
// one whose msgpack value ends inside that piece (an empty array, then
// bytes) is refused there. The bytes after the first piece cannot be read
// here, so the refusal must come before any read of them.
BOOST_AUTO_TEST_CASE(read_index_file_refuses_a_large_index_that_ends_early_after_its_first_piece) {
  constexpr std::size_t piece = std::size_t{1} << 20;  // first_index_read_bytes
  constexpr std::size_t data = 64;
  // The footer at 2 MiB, a block boundary, so stdio's reads of it start
  // past the unreadable bytes.
  std::vector<std::uint8_t> index((std::size_t{2} << 20) - data);
  index[0] = 0x90;  // an empty array: the whole msgpack value
  failing_file f{blob_with_index(index, data)};
  f.hole_begin = static_cast<off64_t>(data + piece);
  f.hole_end = static_cast<off64_t>(data + index.size());
  auto r = f.read_index();
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST((r.code() == bp::errc::malformed_index), r.message());
  BOOST_TEST(r.message().find("index: " + std::to_string(index.size() - 1) +
                              " trailing bytes after the msgpack object") != std::string::npos,
             r.message());
}

BOOST_AUTO_TEST_CASE(read_index_file_refuses_a_large_index_whose_first_piece_is_no_table) {
  std::vector<std::uint8_t> index((std::size_t{1} << 20) + 1);
  index[0] = 0x80;  // an empty map, not an array of rows
  const auto blob = blob_with_index(index);
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
      "/format_test_no_table.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  }
  auto r = bp::read_index_file(path);
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST((r.code() == bp::errc::malformed_index), r.message());
  BOOST_TEST(r.message().find("index: not an array of rows") != std::string::npos, r.message());
  ::unlink(path.c_str());
}

BOOST_AUTO_TEST_CASE(read_index_file_refuses_a_null_file) {
  BOOST_TEST((bp::read_index_file(static_cast<std::FILE*>(nullptr), 0, 0).code() ==
              bp::errc::invalid_argument));
}

// A sysfs attribute is a regular file whose size (4096) says nothing of the
// few bytes it holds: the footer's read comes back short, which is io.
BOOST_AUTO_TEST_CASE(read_index_file_of_a_file_shorter_than_its_size_is_io) {
  const char* path = "/sys/devices/system/cpu/online";
  if (::access(path, R_OK) != 0) BLOBPIPE_SKIP("no sysfs here: " << path << " is not readable");
  auto r = bp::read_index_file(path);
  BOOST_TEST((r.code() == bp::errc::io), r.message());
  BOOST_TEST(r.message().find("ended early") != std::string::npos, r.message());
}

// docs/format.md "Validation order", the row checks no plan() output can
// fail: each hostile row is refused with its own code.
BOOST_AUTO_TEST_CASE(rows_that_break_a_field_rule_get_its_code) {
  // [["x", 0, 4, 5, nil, nil]]: the kind is an int, not a str.
  BOOST_TEST((bp::read_index(blob_with_index({0x91, 0x96, 0xa1, 'x', 0, 4, 5, 0xc0, 0xc0}))
                  .code() == bp::errc::malformed_index));
  // [["x", 0, 4, "n", nil, [1]]]: an ndarray row must name its dtype (the
  // message says so, not that some dtype is unknown).
  auto no_dtype = bp::read_index(blob_with_index({0x91, 0x96, 0xa1, 'x', 0, 4, 0xa1, 'n', 0xc0,
                                                  0x91, 1}));
  BOOST_TEST((no_dtype.code() == bp::errc::unknown_dtype));
  BOOST_TEST(no_dtype.message().find("has no dtype") != std::string::npos, no_dtype.message());
  // [["x", 0, 0, "t", nil, [1 x 65]]]: more than 64 dims.
  std::vector<std::uint8_t> deep = {0x91, 0x96, 0xa1, 'x', 0, 0, 0xa1, 't', 0xc0, 0xdc, 0, 65};
  deep.insert(deep.end(), 65, 1);
  BOOST_TEST((bp::read_index(blob_with_index(deep)).code() == bp::errc::malformed_index));
  deep[11] = 64;  // 64 dims of 1 is a 4-byte float32 entry, at the limit
  deep.pop_back();
  deep[5] = 4;
  BOOST_TEST(bp::read_index(blob_with_index(deep)).has_value());
}

// A row with a nil shape is read as 1-d, which needs a whole number of
// elements (the reference's frombuffer refuses a partial one).
BOOST_AUTO_TEST_CASE(a_row_without_shape_needs_whole_elements) {
  // [["x", 0, 8, "t", "float32", nil]]: two float32 elements.
  auto b = blob_with_index({0x91, 0x96, 0xa1, 'x', 0, 8, 0xa1, 't', 0xa7, 'f', 'l', 'o', 'a', 't',
                            '3', '2', 0xc0});
  auto idx = bp::read_index(b);
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  auto v = bp::decode_entry(b, idx->entries[0]);
  BOOST_TEST_REQUIRE(v.has_value(), v.message());
  BOOST_TEST((v->shape == bp::shape_t{2}));
  // The same row with 6 bytes: one and a half elements.
  b = blob_with_index({0x91, 0x96, 0xa1, 'x', 0, 6, 0xa1, 't', 0xa7, 'f', 'l', 'o', 'a', 't', '3',
                       '2', 0xc0});
  BOOST_TEST((bp::read_index(b).code() == bp::errc::shape_mismatch));
}

BOOST_AUTO_TEST_CASE(entries_the_bytes_do_not_hold_are_entry_out_of_range) {
  auto blob = sample_blob();
  auto idx = bp::read_index(blob);
  BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
  const bp::Entry& x = idx->entries[0];  // 24 bytes at 0
  // decode_entry: the blob ends inside the entry.
  BOOST_TEST((bp::decode_entry(std::span(blob).first(x.len - 1), x).code() ==
              bp::errc::entry_out_of_range));
  // view_entry: the bytes given are not exactly the entry's.
  BOOST_TEST((bp::view_entry(x, std::span(blob).first(x.len + 1)).code() ==
              bp::errc::entry_out_of_range));
  BOOST_TEST(bp::view_entry(x, std::span(blob).first(x.len)).has_value());
}

BOOST_AUTO_TEST_CASE(view_entry_validates_the_row_it_views) {
  // 8 bytes, exactly the entry's, but a dtype no reader knows.
  const bp::Entry e{"x", 0, 8, 't', std::string("float33"), bp::shape_t{2}};
  std::byte bytes[8] = {};
  BOOST_TEST((bp::view_entry(e, bytes).code() == bp::errc::unknown_dtype));
}

BOOST_AUTO_TEST_CASE(validate_entry_refuses_a_kind_built_by_hand) {
  // No dtype either: the kind is what is wrong, and is reported first.
  const bp::Entry e{"k", 0, 4, 'x', std::nullopt, std::nullopt};
  BOOST_TEST((bp::validate_entry(e, 64).code() == bp::errc::unknown_kind));
  const bp::Entry typed{"k", 0, 4, 'x', std::string("float32"), bp::shape_t{1}};
  BOOST_TEST((bp::validate_entry(typed, 64).code() == bp::errc::unknown_kind));
}

BOOST_AUTO_TEST_CASE(as_double_refuses_a_dtype_with_no_numeric_value) {
  // A numpy str dtype: its elements are not numbers.
  const bp::Entry e{"s", 0, 8, 'n', std::string("<U2"), bp::shape_t{1}};
  std::byte bytes[8] = {};
  auto v = bp::view_entry(e, bytes);
  BOOST_TEST_REQUIRE(v.has_value(), v.message());
  BOOST_TEST((v->as_double(0).code() == bp::errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(read_index_file_refuses_an_offset_past_the_end) {
  auto blob = sample_blob();
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
      "/format_test_past_end.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
  }
  auto r = bp::read_index_file(path, blob.size() + 1);
  BOOST_TEST((r.code() == bp::errc::too_small), r.message());
  BOOST_TEST(r.message().find("past the end") != std::string::npos, r.message());
  // At the very end, the blob is empty: too small for a footer.
  BOOST_TEST((bp::read_index_file(path, blob.size()).code() == bp::errc::too_small));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(quote_tests)

BOOST_AUTO_TEST_CASE(quote_escapes_what_a_terminal_would_act_on) {
  BOOST_TEST(bp::quote("x@reward") == "'x@reward'");
  BOOST_TEST(bp::quote("a\x1b[2Jb\x07") == "'a\\x1b[2Jb\\x07'");
  BOOST_TEST(bp::quote("l1\nl2\t\r") == "'l1\\nl2\\t\\r'");
  BOOST_TEST(bp::quote("it's a \\") == "'it\\'s a \\\\'");
  BOOST_TEST(bp::quote(std::string("nul\0del\x7f", 8)) == "'nul\\x00del\\x7f'");
  BOOST_TEST(bp::quote("caf\xc3\xa9") == "'caf\xc3\xa9'");          // UTF-8 stays
  BOOST_TEST(bp::quote("\xc2\x9b" "31m") == "'\\u009b31m'");          // C1 CSI
  BOOST_TEST(bp::quote("\xe2\x80\xae" "evil") == "'\\u202eevil'");   // right-to-left override
  BOOST_TEST(bp::quote("\xff\xc3") == "'\\xff\\xc3'");              // not UTF-8
  BOOST_TEST(bp::quote(std::string(100, 'k')) == "'" + std::string(64, 'k') + "'...");
  BOOST_TEST(bp::quote("ab\xc3\xa9", 3) == "'ab'...");  // never half a character
}

BOOST_AUTO_TEST_CASE(escape_is_quote_without_the_quotes) {
  BOOST_TEST(bp::escape("gone\n OK: every sample arrived") == "gone\\n OK: every sample arrived");
  // Quotes and backslashes matter only inside quote()'s quotes: a reason
  // that quotes a key (the library's own errors) is not escaped twice.
  BOOST_TEST(bp::escape("a\x1b[2Jb it's") == "a\\x1b[2Jb it's");
  BOOST_TEST(bp::escape("entry 'a\\'b' too long") == "entry 'a\\'b' too long");
  BOOST_TEST(bp::quote("it's") == "'it\\'s'");
  BOOST_TEST(bp::escape("\xc2\x9b" "31m") == "\\u009b31m");
  BOOST_TEST(bp::escape(std::string(100, 'k')) == std::string(100, 'k'));  // no limit by default
  BOOST_TEST(bp::escape("abcd", 2) == "ab...");
}

BOOST_AUTO_TEST_CASE(errors_escape_keys_with_control_characters) {
  const std::string key = "\x1b]0;owned\x07\x1b[2J";
  bp::Entry e{key, 0, 8, 't', std::string("float32"), bp::shape_t{3}};
  auto r = bp::validate_entry(e, 64);
  BOOST_TEST_REQUIRE(!r.has_value());
  for (char c : r.message())
    BOOST_TEST((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f), "raw control in: " << r.message());
  BOOST_TEST(r.message().find(bp::quote(key)) != std::string::npos, r.message());
  // A dtype name from the bytes goes through the same function.
  auto d = bp::parse_dtype('t', "\x1b[31mred");
  BOOST_TEST(d.message().find('\x1b') == std::string::npos, d.message());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(entry_tests)

BOOST_AUTO_TEST_CASE(from_meta_rejects_maps_that_are_not_entry_meta) {
  const std::uint8_t not_map[] = {0x90};
  BOOST_TEST((bp::Entry::from_meta("k", std::as_bytes(std::span(not_map))).code() ==
              bp::errc::malformed_index));
  bp::Entry e{"k", 64, 4, 'q', std::nullopt, std::nullopt};
  BOOST_TEST((bp::Entry::from_meta("k", e.meta()).code() == bp::errc::unknown_kind));
  bp::Entry p{"k", 0, 5, 'p', std::nullopt, std::nullopt};
  auto back = bp::Entry::from_meta("k", p.meta());
  BOOST_TEST_REQUIRE(back.has_value());
  BOOST_TEST((*back == p));
}

BOOST_AUTO_TEST_CASE(from_meta_requires_s_to_be_an_array) {
  // From fuzz/entry_meta_fuzz: {"o":0,"n":12,"k":"t","d":"float32","s":nil}
  // is refused; parsed with no shape, meta() would write "s": [] (a 0-d tensor).
  const std::uint8_t m[] = {0x85, 0xa1, 'o', 0x00, 0xa1, 'n', 0x0c, 0xa1, 'k', 0xa1, 't',
                            0xa1, 'd', 0xa7, 'f', 'l', 'o', 'a', 't', '3', '2', 0xa1, 's', 0xc0};
  BOOST_TEST((bp::Entry::from_meta("k", std::as_bytes(std::span(m))).code() ==
              bp::errc::malformed_index));
}

BOOST_AUTO_TEST_CASE(from_meta_checks_kind_before_the_dtype_type) {
  // {"o": 0, "n": 0, "k": "q", "d": 5, "s": []}: the kind is reported, as
  // it always was, though the dtype is not a str either.
  const std::uint8_t m[] = {0x85, 0xa1, 'o', 0, 0xa1, 'n', 0, 0xa1, 'k', 0xa1, 'q',
                            0xa1, 'd', 5, 0xa1, 's', 0x90};
  BOOST_TEST((bp::Entry::from_meta("k", std::as_bytes(std::span(m))).code() ==
              bp::errc::unknown_kind));
  // The same with a byte after the map: not msgpack of one map, malformed.
  std::vector<std::uint8_t> trailing(std::begin(m), std::end(m));
  trailing.push_back(0xc0);
  BOOST_TEST((bp::Entry::from_meta("k", std::as_bytes(std::span(trailing))).code() ==
              bp::errc::malformed_index));
}

BOOST_AUTO_TEST_CASE(shape_overflow_is_shape_mismatch) {
  bp::Entry e{"k", 0, 8, 't', std::string("float64"),
              bp::shape_t{std::int64_t{1} << 62, std::int64_t{1} << 62}};
  BOOST_TEST((bp::validate_entry(e, 64).code() == bp::errc::shape_mismatch));
}

BOOST_AUTO_TEST_SUITE_END()
