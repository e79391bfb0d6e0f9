// test/pickle_test.cpp — the pickle writer (blobpipe/format/pickle.hpp):
// known bytes, the depth and size limits, and Debian's /usr/bin/python3
// reading what it writes: pickle.loads gives the object meant, and the
// bytes equal CPython's pickletools.optimize(pickle.dumps(obj, 2)).
#define BOOST_TEST_MODULE pickle_test
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "blobpipe/format/pickle.hpp"
#include "test/process.hpp"
#include "test/skip.hpp"

namespace {

using blobpipe::pickle;
using pv = blobpipe::pickle_value;

std::string hex(const std::vector<std::byte>& b) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s.push_back(digits[std::to_integer<int>(x) >> 4]);
    s.push_back(digits[std::to_integer<int>(x) & 15]);
  }
  return s;
}

pv nested_lists(std::size_t depth) {
  pv v = pv::list{};
  for (std::size_t i = 1; i < depth; ++i) v = pv::list{std::move(v)};
  return v;
}

// Objects for Python to check, each with the Python expression it must
// load as. Each str, bytes and tuple object occurs once: CPython memoizes
// repeated objects (a BINGET the second time), which this writer does not.
struct python_case {
  const char* name;
  pv value;
  const char* python;
};

std::vector<python_case> python_cases() {
  std::vector<python_case> c;
  c.push_back({"scalars",
               pv::list{nullptr, true, false, 0, 255, 256, 65535, 65536, -1, -2147483648LL,
                        2147483648LL, -5000000000LL, INT64_MAX, INT64_MIN, UINT64_MAX, 0.5, -0.0,
                        1e300, "", "caf\xc3\xa9 \xe2\x98\x83"},
               "[None, True, False, 0, 255, 256, 65535, 65536, -1, -2**31, 2**31, -5000000000, "
               "2**63 - 1, -2**63, 2**64 - 1, 0.5, -0.0, 1e300, '', 'caf\\u00e9 \\u2603']"});
  c.push_back({"bytes",
               pv::bytes{{std::byte{0}, std::byte{0x7f}, std::byte{0x80}, std::byte{0xff},
                          std::byte{'a'}}},
               "b'\\x00\\x7f\\x80\\xffa'"});
  c.push_back({"empty_bytes", pv::bytes{}, "b''"});
  c.push_back({"nested",
               pv::dict{{"idx", 7},
                        {"spans", pv::list{pv::tuple{{1, 2}}, pv::tuple{{3, 4, 5}},
                                           pv::tuple{{6, 7, 8, 9}}, pv::tuple{}}},
                        {"inner", pv::dict{{"k", pv::list{}}, {"t", pv::tuple{{nullptr}}}}},
                        {"e", pv::dict{}},
                        {"one", pv::list{1}}},
               "{'idx': 7, 'spans': [(1, 2), (3, 4, 5), (6, 7, 8, 9), ()], "
               "'inner': {'k': [], 't': (None,)}, 'e': {}, 'one': [1]}"});
  // More items than one batch of 1000: MARK ... APPENDS / SETITEMS twice,
  // the last dict batch a single SETITEM.
  pv::list many;
  for (int i = 0; i < 2500; ++i) many.push_back(i);
  c.push_back({"long_list", std::move(many), "list(range(2500))"});
  // A last batch of one; and a multiple of 1000 (the C pickler then ends
  // with an empty batch).
  for (int n : {1001, 2000}) {
    pv::dict items;
    for (int i = 0; i < n; ++i) items.emplace_back("k" + std::to_string(i), i);
    c.push_back({n == 1001 ? "dict_1001" : "dict_2000", std::move(items),
                 n == 1001 ? "{f'k{i}': i for i in range(1001)}"
                           : "{f'k{i}': i for i in range(2000)}"});
  }
  pv::list thousand;
  for (int i = 0; i < 1001; ++i) thousand.push_back(i);
  c.push_back({"list_1001", std::move(thousand), "list(range(1001))"});
  return c;
}

}  // namespace

// Expected bytes: CPython 3 pickletools.optimize(pickle.dumps(d, protocol=2))
// for the same dict (optimize only drops unused memo PUTs).
BOOST_AUTO_TEST_CASE(pickle_dict_matches_cpython_protocol_2) {
  auto b = pickle(pv::dict{
      {"idx", 7},
      {"source", "riddles"},
      {"prompt_tokens", 300},
      {"response_tokens", 70000},
      {"big", -5000000000LL},
      {"neg", -3},
      {"finished", true},
      {"truncated", false},
      {"parent", nullptr},
      {"temp", 0.7},
      {"text", "caf\xc3\xa9"},
  });
  BOOST_TEST_REQUIRE(b.has_value(), b.message());
  BOOST_TEST(hex(*b) ==
             "80027d2858030000006964784b075806000000736f757263655807000000726964646c6573580d"
             "00000070726f6d70745f746f6b656e734d2c01580f000000726573706f6e73655f746f6b656e73"
             "4a7011010058030000006269678a05000efad5fe58030000006e65674afdffffff580800000066"
             "696e69736865648858090000007472756e6361746564895806000000706172656e744e58040000"
             "0074656d70473fe66666666666665804000000746578745805000000636166c3a9752e");
}

BOOST_AUTO_TEST_CASE(pickle_dict_of_one_item_uses_setitem) {
  BOOST_TEST(hex(pickle(pv::dict{{"a", 1}}).value()) == "80027d5801000000614b01732e");
  BOOST_TEST(hex(pickle(pv::dict{}).value()) == "80027d2e");
  BOOST_TEST(hex(pickle(pv{}).value()) == "80024e2e");  // None
}

BOOST_AUTO_TEST_CASE(pickle_refuses_nesting_deeper_than_max_pickle_depth) {
  BOOST_TEST(pickle(nested_lists(blobpipe::max_pickle_depth)).has_value());
  auto deep = pickle(nested_lists(blobpipe::max_pickle_depth + 1));
  BOOST_TEST_REQUIRE(!deep.has_value());
  BOOST_TEST(deep.code() == blobpipe::errc::invalid_argument);
  BOOST_TEST(deep.message().find("max_pickle_depth") != std::string::npos, deep.message());
}

BOOST_AUTO_TEST_CASE(python3_pickle_loads_what_pickle_writes) {
  const std::filesystem::path python = "/usr/bin/python3";
  if (!std::filesystem::exists(python))
    BLOBPIPE_SKIP("no /usr/bin/python3 (Debian's python3) to load the pickles");
  const auto dir = blobpipe::testing::scratch_dir() / "pickle_cases";
  std::filesystem::create_directories(dir);
  const auto cases = python_cases();
  for (const auto& c : cases) {
    auto b = pickle(c.value);
    BOOST_TEST_REQUIRE(b.has_value(), c.name << ": " << b.message());
    std::ofstream(dir / (std::string(c.name) + ".pkl"), std::ios::binary)
        .write(reinterpret_cast<const char*>(b->data()), static_cast<std::streamsize>(b->size()));
    std::ofstream(dir / (std::string(c.name) + ".py")) << c.python;
  }
  // For each case: loads gives the object meant, and the bytes are
  // CPython's own for it (which also pins each type: True is not 1).
  const char* script = R"(
import pathlib, pickle, pickletools, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.pkl")):
    data = p.read_bytes()
    want = eval(p.with_suffix(".py").read_text())
    got = pickle.loads(data)
    if got != want:
        print("FAIL", p.stem, "loads as", repr(got)[:300])
        continue
    ref = pickletools.optimize(pickle.dumps(want, 2))
    if ref != data:
        print("FAIL", p.stem, "bytes differ from CPython's:", ref.hex()[:300], data.hex()[:300])
        continue
    print("ok", p.stem)
)";
  auto r = blobpipe::testing::run_process(python, {"-c", script, dir.string()});
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(r.out.find("FAIL") == std::string::npos, r.out);
  for (const auto& c : cases)
    BOOST_TEST(r.out.find("ok " + std::string(c.name) + "\n") != std::string::npos,
               c.name << ":\n" << r.out << r.err);
}
