// The wire protocol's test vectors (docs/wire.md "Test vectors"): every
// file in test/wire_vectors/ decodes, in one piece and byte by byte, to
// exactly what vectors.txt says, and the framer still produces every
// file byte for byte.
#define BOOST_TEST_MODULE wire_vectors
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "test/wire_vectors.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

std::string dir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "blobpipe") + "/test/wire_vectors/";
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto* b = reinterpret_cast<const std::byte*>(c.data());
  return {b, b + c.size()};
}

/// vectors.txt: file name -> expected lines.
std::map<std::string, std::vector<std::string>> expectations() {
  std::ifstream f(dir() + "vectors.txt");
  std::map<std::string, std::vector<std::string>> out;
  std::string line, current;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("== ", 0) == 0) {
      current = line.substr(3);
      out[current];
    } else {
      out[current].push_back(line);
    }
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_vector_decodes_to_what_vectors_txt_says_in_any_chunking) {
  const auto want = expectations();
  const auto built = build_vectors();
  BOOST_TEST_REQUIRE(want.size() == built.size());
  for (const auto& [name, lines] : want) {
    BOOST_TEST_CONTEXT(name) {
      const auto bytes = read_file(dir() + name);
      BOOST_TEST_REQUIRE(!bytes.empty());
      BOOST_TEST((decode_vector(bytes) == lines));
      BOOST_TEST((decode_vector(bytes, 1) == lines));
      BOOST_TEST((decode_vector(bytes, 7) == lines));
    }
  }
}

BOOST_AUTO_TEST_CASE(the_framer_still_writes_every_vector_byte_for_byte) {
  for (const auto& v : build_vectors()) {
    BOOST_TEST_CONTEXT(v.name) {
      const auto bytes = read_file(dir() + v.name);
      BOOST_TEST((bytes == v.bytes), "the framer's bytes changed: regenerate with "
                                     "test/wire_vectors_gen and review the difference");
    }
  }
}

BOOST_AUTO_TEST_CASE(valid_vectors_complete_and_invalid_ones_fail_as_documented) {
  const auto want = expectations();
  BOOST_TEST(want.at("one_blob.bin").back() == "close reason='done'");
  BOOST_TEST(want.at("interleaved_abort.bin").size() > 5u);
  BOOST_TEST(want.at("compact_blob.bin").back() == "close reason='done'");
  for (const char* bad : {"v2_hello.bin", "tail_mismatch.bin", "data_past_entry.bin",
                          "inline_short.bin", "stray_client.bin", "compact_not_negotiated.bin",
                          "compact_reserved_code.bin"})
    BOOST_TEST(want.at(bad).back() == "error protocol_violation", bad);
}
