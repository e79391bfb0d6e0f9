// Every golden case (../shared/golden, made by the Python reference):
// valid blobs decode to the manifest's rows, digests and values, and
// re-encoding their decoded values gives the golden bytes; invalid blobs
// fail with the manifest's error category, in memory and from a file.
#define BOOST_TEST_MODULE golden
#include <boost/test/unit_test.hpp>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <fstream>
#include <iterator>

#include "blobpipe/format.hpp"
#include "test/golden_dir.hpp"

namespace bp = blobpipe;
using json = nlohmann::json;

namespace {

std::filesystem::path golden_dir() {
  auto g = bp::testing::find_golden_dir();
  BOOST_TEST_REQUIRE(g.dir.has_value(), "golden dir not found; tried " << g.tried);
  return *g.dir;
}

const json& manifest() {
  static const json m = [] {
    std::ifstream in(golden_dir() / "manifest.json");
    return json::parse(in);
  }();
  return m;
}

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> out(raw.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr);
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    s.push_back(digits[md[i] >> 4]);
    s.push_back(digits[md[i] & 0xF]);
  }
  return s;
}

std::string hex(std::span<const std::byte> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (std::byte b : bytes) {
    s.push_back(digits[std::to_integer<unsigned>(b) >> 4]);
    s.push_back(digits[std::to_integer<unsigned>(b) & 0xF]);
  }
  return s;
}

// Flattens the manifest's nested value lists ([[re, im], ...] for complex)
// into doubles, bools as 0/1.
void flatten(const json& v, std::vector<double>& out) {
  if (v.is_array()) {
    for (const auto& x : v) flatten(x, out);
  } else if (v.is_boolean()) {
    out.push_back(v.get<bool>() ? 1.0 : 0.0);
  } else {
    out.push_back(v.get<double>());
  }
}

// Checks one decoded row against its manifest entry: row fields, meta map,
// digest, and (for numeric entries the manifest lists) every value.
void check_entry(const json& want, const bp::Entry& got, std::span<const std::byte> blob) {
  BOOST_TEST_CONTEXT("entry " << want["key"].get<std::string>()) {
    BOOST_TEST(got.key == want["key"].get<std::string>());
    BOOST_TEST(got.off == want["off"].get<std::uint64_t>());
    BOOST_TEST(got.len == want["len"].get<std::uint64_t>());
    BOOST_TEST(std::string(1, got.kind) == want["kind"].get<std::string>());
    if (want["dtype"].is_null()) {
      BOOST_TEST(!got.dtype.has_value());
    } else {
      BOOST_TEST_REQUIRE(got.dtype.has_value());
      BOOST_TEST(*got.dtype == want["dtype"].get<std::string>());
    }
    if (want["shape"].is_null()) {
      BOOST_TEST(!got.shape.has_value());
    } else {
      BOOST_TEST_REQUIRE(got.shape.has_value());
      auto s = want["shape"].get<std::vector<std::int64_t>>();
      BOOST_TEST(*got.shape == s, boost::test_tools::per_element());
    }
    const auto meta = got.meta();
    BOOST_TEST(hex(meta) == want["meta_msgpack_hex"].get<std::string>());
    auto back = bp::Entry::from_meta(got.key, meta);
    BOOST_TEST_REQUIRE(back.has_value(), back.message());
    BOOST_TEST((*back == got));

    auto view = bp::decode_entry(blob, got);
    BOOST_TEST_REQUIRE(view.has_value(), view.message());
    BOOST_TEST(sha256_hex(view->bytes) == want["sha256"].get<std::string>());

    const json& values = want.contains("values") ? want["values"] : json();
    if (got.kind != bp::KIND_PICKLE && values.is_array()) {
      std::vector<double> expect;
      flatten(values, expect);
      for (std::size_t i = 0; i < expect.size(); ++i) {
        auto x = view->as_double(i);
        BOOST_TEST_REQUIRE(x.has_value(), x.message());
        BOOST_TEST(*x == expect[i], "value " << i);
      }
      auto past = view->as_double(expect.size());
      BOOST_TEST(!past.has_value(), "the manifest lists every element");
    }
  }
}

// Re-encodes every entry of `idx` (materialized copies, same keys and tag)
// and returns the blob `write` produces.
std::vector<std::byte> reencode(const bp::blob_index& idx, std::span<const std::byte> blob) {
  std::vector<std::string> keys;
  std::vector<bp::value> values;
  for (const auto& e : idx.entries) {
    auto v = bp::decode_entry(blob, e);
    BOOST_TEST_REQUIRE(v.has_value(), v.message());
    keys.push_back(e.key);
    values.push_back(bp::materialize(*v).as_value());
  }
  auto p = bp::plan(keys, values, idx.foot.tag);
  BOOST_TEST_REQUIRE(p.has_value(), p.message());
  std::vector<std::byte> out(p->nbytes, std::byte{0xAB});  // pads must be written
  auto n = bp::write(*p, out);
  BOOST_TEST_REQUIRE(n.has_value(), n.message());
  BOOST_TEST(*n == p->nbytes);
  return out;
}

bool is_shard(const json& c) { return c.value("kind", "") == "shard"; }

/// Cases of the manifest that are valid single blobs, or invalid ones.
std::size_t count_cases(bool valid) {
  std::size_t n = 0;
  for (const auto& c : manifest()["cases"]) n += c["valid"].get<bool>() == valid && !is_shard(c);
  return n;
}

void check_valid_blob(const json& c, std::span<const std::byte> blob,
                      const bp::blob_index& idx) {
  BOOST_TEST(idx.nbytes == c["nbytes"].get<std::uint64_t>());
  BOOST_TEST(idx.foot.version == c["footer_version"].get<int>());
  BOOST_TEST(bp::tag_hex(idx.foot.tag) == c["tag_hex"].get<std::string>());
  BOOST_TEST(idx.foot.index_off == c["index_off"].get<std::uint32_t>());
  BOOST_TEST(bp::footer_is_valid(blob));
  // The index bytes themselves, as the reference wrote them (every v3 case
  // lists their digest; v2_footer, the same index as single_f32, does not).
  BOOST_TEST((c.contains("index_sha256") || idx.foot.version == bp::VERSION_V2));
  if (c.contains("index_sha256")) {
    BOOST_TEST_REQUIRE(std::uint64_t{idx.foot.index_off} + idx.foot.index_len <= blob.size());
    BOOST_TEST(sha256_hex(blob.subspan(idx.foot.index_off, idx.foot.index_len)) ==
               c["index_sha256"].get<std::string>());
  }
  if (c.contains("entries")) {
    BOOST_TEST_REQUIRE(idx.entries.size() == c["entries"].size());
    for (std::size_t i = 0; i < idx.entries.size(); ++i)
      check_entry(c["entries"][i], idx.entries[i], blob);
  } else {  // many_entries lists a head and a tail of its rows
    BOOST_TEST_REQUIRE(idx.entries.size() == c["entry_count"].get<std::size_t>());
    const auto& head = c["entries_head"];
    const auto& tail = c["entries_tail"];
    for (std::size_t i = 0; i < head.size(); ++i) check_entry(head[i], idx.entries[i], blob);
    for (std::size_t i = 0; i < tail.size(); ++i)
      check_entry(tail[i], idx.entries[idx.entries.size() - tail.size() + i], blob);
  }
}

}  // namespace

// The golden set is whole: the reference's generator writes 12 valid single
// blobs, 15 invalid ones and one shard file. A manifest cut short (or a
// golden dir from another generator) would let every case below pass on
// fewer cases.
BOOST_AUTO_TEST_CASE(manifest_lists_every_golden_case) {
  BOOST_TEST(count_cases(true) == 12u);
  BOOST_TEST(count_cases(false) == 15u);
  std::size_t shards = 0;
  for (const auto& c : manifest()["cases"]) shards += is_shard(c);
  BOOST_TEST(shards == 1u);
}

BOOST_AUTO_TEST_CASE(every_valid_golden_blob_decodes_and_reencodes_byte_identical) {
  std::size_t checked = 0;
  for (const auto& c : manifest()["cases"]) {
    if (!c["valid"].get<bool>() || is_shard(c)) continue;
    BOOST_TEST_CONTEXT("case " << c["name"].get<std::string>()) {
      const auto path = golden_dir() / c["file"].get<std::string>();
      const auto blob = read_file(path);
      BOOST_TEST_REQUIRE(blob.size() == c["nbytes"].get<std::size_t>());
      auto idx = bp::read_index(blob);
      BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
      BOOST_TEST(idx->foot.index_len == c["index_len"].get<std::uint32_t>());
      check_valid_blob(c, blob, *idx);
      if (c.contains("blob_sha256"))
        BOOST_TEST(sha256_hex(blob) == c["blob_sha256"].get<std::string>());

      // From a file: footer and index only, same answer.
      auto from_file = bp::read_index_file(path.string());
      BOOST_TEST_REQUIRE(from_file.has_value(), from_file.message());
      BOOST_TEST((from_file->entries == idx->entries));

      if (idx->foot.version == bp::VERSION) {
        auto again = reencode(*idx, blob);
        BOOST_TEST((again == blob), "re-encoded blob differs from the golden bytes");
      } else {
        // A v2 blob has no tag and we write only v3: its entries and index
        // must re-encode to the same data region and index bytes.
        auto again = reencode(*idx, blob);
        auto re_idx = bp::read_index(again);
        BOOST_TEST_REQUIRE(re_idx.has_value());
        BOOST_TEST((re_idx->entries == idx->entries));
        BOOST_TEST(std::equal(blob.begin(), blob.begin() + idx->foot.index_off + idx->foot.index_len,
                              again.begin()));
      }
      ++checked;
    }
  }
  BOOST_TEST(checked == count_cases(true));
}

BOOST_AUTO_TEST_CASE(v2_footer_blob_decodes_like_single_f32) {
  const auto v2 = read_file(golden_dir() / "v2_footer.blob");
  const auto v3 = read_file(golden_dir() / "single_f32.blob");
  auto a = bp::read_index(v2);
  auto b = bp::read_index(v3);
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST_REQUIRE(b.has_value());
  BOOST_TEST(a->foot.version == 2);
  BOOST_TEST((a->entries == b->entries));
  BOOST_TEST(!bp::footer_tag(v2).has_value());
  BOOST_TEST(bp::footer_tag(v3).has_value());
}

BOOST_AUTO_TEST_CASE(shard_blobs_read_at_their_offsets_and_reencode) {
  const json* shard = nullptr;
  for (const auto& c : manifest()["cases"])
    if (is_shard(c)) shard = &c;
  BOOST_TEST_REQUIRE(shard != nullptr);
  const auto path = golden_dir() / (*shard)["file"].get<std::string>();
  const auto file = read_file(path);
  for (const auto& b : (*shard)["blobs"]) {
    const auto off = b["off"].get<std::uint64_t>();
    const auto n = b["nbytes"].get<std::uint64_t>();
    BOOST_TEST_CONTEXT("shard blob at " << off) {
      auto idx = bp::read_index_file(path.string(), off, n);
      BOOST_TEST_REQUIRE(idx.has_value(), idx.message());
      const auto blob = std::span<const std::byte>(file).subspan(off, n);
      BOOST_TEST_REQUIRE(idx->entries.size() == b["entries"].size());
      for (std::size_t i = 0; i < idx->entries.size(); ++i)
        check_entry(b["entries"][i], idx->entries[i], blob);
      auto again = reencode(*idx, blob);
      BOOST_TEST(std::equal(again.begin(), again.end(), blob.begin(), blob.end()));
    }
  }
}

BOOST_AUTO_TEST_CASE(every_invalid_golden_blob_fails_with_its_category) {
  std::size_t checked = 0;
  for (const auto& c : manifest()["cases"]) {
    if (c["valid"].get<bool>()) continue;
    BOOST_TEST_CONTEXT("case " << c["name"].get<std::string>()) {
      const auto path = golden_dir() / c["file"].get<std::string>();
      const auto want = c["expected_error"].get<std::string>();
      auto idx = bp::read_index(read_file(path));
      BOOST_TEST_REQUIRE(!idx.has_value());
      BOOST_TEST(bp::errc_name(idx.code()) == want, idx.message());
      BOOST_TEST(idx.message().find('\n') == std::string::npos);
      auto from_file = bp::read_index_file(path.string());
      BOOST_TEST_REQUIRE(!from_file.has_value());
      BOOST_TEST(bp::errc_name(from_file.code()) == want, from_file.message());
      ++checked;
    }
  }
  BOOST_TEST(checked == count_cases(false));
}

BOOST_AUTO_TEST_CASE(strided_inputs_are_written_contiguous_in_logical_order) {
  // noncontig.blob: t_T = arange(12, float32).reshape(3, 4).T (shape [4, 3],
  // strides [1, 4]) and np_slice = arange(10, int32)[::2] (strides [2]).
  const auto golden = read_file(golden_dir() / "noncontig.blob");
  std::vector<float> base(12);
  for (int i = 0; i < 12; ++i) base[i] = static_cast<float>(i);
  std::vector<std::int32_t> base2(10);
  for (int i = 0; i < 10; ++i) base2[i] = i;
  bp::value t = bp::value::tensor(base, {4, 3});
  t.strides = {1, 4};
  bp::value n = bp::value::ndarray_bytes(std::as_bytes(std::span(base2)), "<i4", {5});
  n.strides = {2};
  auto p = bp::plan({"t_T", "np_slice"}, {t, n});
  BOOST_TEST_REQUIRE(p.has_value(), p.message());
  BOOST_TEST(!p->entries[0].contiguous);
  BOOST_TEST(!p->entries[1].contiguous);
  std::vector<std::byte> out(p->nbytes);
  BOOST_TEST_REQUIRE(bp::write(*p, out).has_value());
  BOOST_TEST((out == golden));
}
