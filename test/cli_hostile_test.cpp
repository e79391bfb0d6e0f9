// test/cli_hostile_test.cpp — `blobpipe verify` and `inspect` on blobs a
// hostile writer could make: bytes between the index and the footer and
// entries that overlap or run out of order are refused by verify (exit 2,
// one line) and reported by inspect --json as findings; a 64 GiB sparse
// file is read in two small reads, not loaded; keys with control characters
// reach no terminal raw; running out of memory is exit 2 with the usual
// line, never an abort.
#define BOOST_TEST_MODULE cli_hostile_test
#include <fcntl.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "blobpipe/format.hpp"
#include "test/cli_fixture.hpp"

namespace {

namespace bp = blobpipe;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace blobpipe::testing;

// Writes a blob to scratch_dir()/name: each entry's range filled with 0x5a,
// `index` (by default the index of `entries`) at `index_off`, then `gap`
// bytes nobody wrote, then the v3 footer. Whatever was not written is a
// hole (sparse file).
std::string write_blob(const std::string& name, const std::vector<bp::Entry>& entries,
                       std::uint32_t index_off, std::uint64_t gap = 0,
                       std::vector<std::byte> index = {}) {
  const std::string path = (scratch_dir() / name).string();
  if (index.empty()) index = bp::encode_index(entries);
  const std::uint64_t footer_at = index_off + index.size() + gap;
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  BOOST_TEST_REQUIRE(fd >= 0);
  BOOST_TEST_REQUIRE(::ftruncate(fd, static_cast<off_t>(footer_at + bp::FOOTER_SIZE)) == 0);
  auto put = [&](std::uint64_t at, const void* p, std::size_t n) {
    BOOST_TEST_REQUIRE(::pwrite(fd, p, n, static_cast<off_t>(at)) == static_cast<ssize_t>(n));
  };
  for (const auto& e : entries) {
    const std::vector<char> fill(e.len, 0x5a);
    if (e.len) put(e.off, fill.data(), fill.size());
  }
  put(index_off, index.data(), index.size());
  bp::footer f;
  f.index_off = index_off;
  f.index_len = static_cast<std::uint32_t>(index.size());
  std::byte foot[bp::FOOTER_SIZE];
  bp::encode_footer(f, foot);
  put(footer_at, foot, sizeof foot);
  ::close(fd);
  return path;
}

bp::Entry u8(std::string key, std::uint64_t off, std::int64_t n) {
  return {std::move(key), off, static_cast<std::uint64_t>(n), 't', std::string("uint8"),
          bp::shape_t{n}};
}

// The kinds of finding `inspect --json` reports for `path` (exit 0).
std::vector<std::string> finding_kinds(const std::string& path) {
  auto r = run_cli({"inspect", path, "--json"});
  check_ok(r);
  std::vector<std::string> kinds;
  if (r.exit_code != 0) return kinds;
  const json report = json::parse(r.out);
  for (const json& f : report.at("findings")) kinds.push_back(f.at("kind").get<std::string>());
  return kinds;
}

}  // namespace

BOOST_AUTO_TEST_CASE(verify_refuses_bytes_between_the_index_and_the_footer) {
  const auto path = write_blob("gap.blob", {u8("a", 0, 8)}, 64, 100);
  check_invalid(run_cli({"verify", path}), "index_out_of_range");
  auto r = run_cli({"inspect", path, "--json"});
  check_ok(r);
  const json findings = json::parse(r.out).at("findings");
  BOOST_TEST_REQUIRE(findings.size() == 1u);
  BOOST_TEST(findings[0].at("kind") == "bytes_after_index");
  BOOST_TEST(findings[0].at("count") == 100);
  BOOST_TEST(findings[0].at("category") == "index_out_of_range");
}

BOOST_AUTO_TEST_CASE(verify_refuses_overlapping_entries) {
  // b starts inside a: in order, but sharing bytes.
  const auto path = write_blob("overlap.blob", {u8("a", 0, 128), u8("b", 64, 64)}, 192);
  check_invalid(run_cli({"verify", path}), "entry_out_of_range");
  BOOST_TEST(finding_kinds(path) == std::vector<std::string>{"entries_overlap"});
}

// `inspect --digest` refuses overlapping index rows, as verify does, so
// what it reads stays within the blob: otherwise a sparse file whose rows
// overlap makes it read the same bytes once per row (hours for many rows
// over a large hole). Without --digest they are listed.
BOOST_AUTO_TEST_CASE(inspect_digest_refuses_overlapping_entries) {
  const auto path = write_blob(
      "digest_overlap.blob", {u8("a", 0, 4096), u8("b", 0, 4096), u8("c", 64, 4032)}, 4096);
  const auto r = run_cli({"inspect", path, "--digest"});
  check_invalid(r, "entry_out_of_range");
  BOOST_TEST(r.err.find("--digest: entries_overlap") != std::string::npos, r.err);
  BOOST_TEST(r.out.empty(), "a half report: " << r.out);
  BOOST_TEST(finding_kinds(path) == std::vector<std::string>{"entries_overlap"});
  // Zero-length entries sharing an offset do not overlap: digested.
  const auto zero = write_blob("digest_zero.blob", {u8("e", 0, 0), u8("a", 0, 8)}, 64);
  check_ok(run_cli({"inspect", zero, "--digest"}));
}

BOOST_AUTO_TEST_CASE(verify_refuses_entries_out_of_order) {
  const auto path = write_blob("order.blob", {u8("a", 64, 64), u8("b", 0, 64)}, 128);
  check_invalid(run_cli({"verify", path}), "entry_out_of_range");
  BOOST_TEST(finding_kinds(path) == std::vector<std::string>{"entries_out_of_order"});
}

BOOST_AUTO_TEST_CASE(verify_accepts_zero_length_entries_sharing_an_offset) {
  // The reference's own layout: a zero-length entry does not advance.
  const auto path = write_blob("zero.blob", {u8("e", 0, 0), u8("a", 0, 8)}, 64);
  check_ok(run_cli({"verify", path}));
  BOOST_TEST(finding_kinds(path).empty());
}

// 64 GiB, all of it a hole but the index (one byte, an empty array) and
// the footer: verify reads those two and stops, rather than reading the
// whole blob into memory and aborting. The timeout turns a regression into
// a failure instead of a very long test.
BOOST_AUTO_TEST_CASE(sparse_64_gib_file_with_an_empty_index_is_refused_at_once,
                     *boost::unit_test::timeout(60)) {
  const std::uint64_t size = std::uint64_t{64} << 30;
  const auto path = write_blob("sparse64g.blob", {}, 0, size - 1 - bp::FOOTER_SIZE);
  BOOST_TEST_REQUIRE(fs::file_size(path) == size);
  check_invalid(run_cli({"verify", path}), "index_out_of_range");
  BOOST_TEST(finding_kinds(path) == std::vector<std::string>{"bytes_after_index"});
  fs::remove(path);
}

// A footer claiming a 4 GiB index that the file does not hold: all of it
// a hole (zeros), or an array header for 4 billion rows and then a hole.
// The CLI reads the index in pieces and refuses the first piece that
// cannot begin an array of rows (malformed_index), rather than allocating
// and reading all 4 GiB first (4.2 GB RSS). Under a 64 MiB heap limit a
// whole-index read fails as too_large instead.
BOOST_AUTO_TEST_CASE(sparse_file_claiming_a_4_gib_index_is_refused_from_its_first_piece,
                     *boost::unit_test::timeout(120)) {
  const std::uint32_t index_len = 0xffff'ff00;
  auto write_sparse = [&](const std::string& name, std::vector<std::uint8_t> head) {
    const std::string path = (scratch_dir() / name).string();
    const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    BOOST_TEST_REQUIRE(fd >= 0);
    BOOST_TEST_REQUIRE(::ftruncate(fd, off_t{index_len} + off_t{bp::FOOTER_SIZE}) == 0);
    if (!head.empty())
      BOOST_TEST_REQUIRE(::pwrite(fd, head.data(), head.size(), 0) ==
                         static_cast<ssize_t>(head.size()));
    bp::footer f;
    f.index_off = 0;
    f.index_len = index_len;
    std::byte foot[bp::FOOTER_SIZE];
    bp::encode_footer(f, foot);
    BOOST_TEST_REQUIRE(::pwrite(fd, foot, sizeof foot, off_t{index_len}) ==
                       static_cast<ssize_t>(sizeof foot));
    ::close(fd);
    return path;
  };
  std::vector<std::string> env;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  env = {"LD_PRELOAD=" + (runfiles_root() / "test" / "heap_limit_preload.so").string(),
         "BLOBPIPE_TEST_HEAP_LIMIT=67108864"};
#endif
  const std::vector<std::string> paths = {
      write_sparse("sparse_index_zeros.blob", {}),
      write_sparse("sparse_index_rows.blob", {0xdd, 0xf0, 0x00, 0x00, 0x00})};
  for (const auto& path : paths) {
    for (const char* cmd : {"verify", "inspect"})
      check_invalid(run_process(cli_path(), {cmd, path}, std::nullopt, env), "malformed_index");
    fs::remove(path);
  }
}

BOOST_AUTO_TEST_CASE(keys_with_control_characters_are_escaped_in_cli_output) {
  const std::string key = "\x1b]0;owned\x07\x1b[2J\xc2\x9b" "1m";
  const auto path = write_blob("ctl.blob", {u8(key, 0, 8)}, 64);
  auto is_plain = [](const std::string& s) {
    for (unsigned char c : s)
      if ((c < 0x20 && c != '\n') || c >= 0x7f) return false;
    return true;
  };
  auto text = run_cli({"inspect", path});
  check_ok(text);
  BOOST_TEST(is_plain(text.out), text.out);
  auto j = run_cli({"inspect", path, "--json"});
  check_ok(j);
  BOOST_TEST(is_plain(j.out), j.out);
  BOOST_TEST(json::parse(j.out).at("entries").at(0).at("key") == key);  // the exact key
  // An error line that names the key.
  const auto bad = write_blob("ctl_overlap.blob", {u8(key, 0, 128), u8(key, 64, 64)}, 192);
  auto v = run_cli({"verify", bad});
  check_invalid(v, "entry_out_of_range");
  BOOST_TEST(is_plain(v.err), v.err);
}

// Out of memory, two ways: under an address-space limit (ulimit -v) the
// parser cannot allocate the entries of a 4M-row index (too_large from
// parse_index); with the heap limited by the preloaded counter
// (heap_limit_preload.so) the CLI's own 1 MiB read buffer for --digest
// fails (main's catch). Either way exit 2 and one line `blobpipe:
// too_large: ...`, never SIGABRT. The sanitizers reserve terabytes of
// address space and own malloc, so neither can run there.
BOOST_AUTO_TEST_CASE(running_out_of_memory_exits_2_with_one_line) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  std::cout << "SKIPPED: //test:cli_hostile_test running_out_of_memory_exits_2_with_one_line: "
               "memory limits cannot run under the sanitizers\n";
#else
  // 4M rows ["", 0, 0, "p", nil, nil] of 8 bytes: 32 MB of index, 512 MB
  // of entries.
  const std::uint32_t n = 4'000'000;
  std::vector<std::byte> index = {std::byte{0xdd}, std::byte(n >> 24), std::byte(n >> 16),
                                  std::byte(n >> 8), std::byte(n)};
  const std::uint8_t row[] = {0x96, 0xa0, 0, 0, 0xa1, 'p', 0xc0, 0xc0};
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint8_t b : row) index.push_back(std::byte{b});
  const auto rows = write_blob("oom_rows.blob", {}, 0, 0, std::move(index));
  std::vector<std::string> sh = {"-c", "ulimit -v 393216 && exec \"$0\" \"$@\"",  // 384 MiB
                                 cli_path().string(), "inspect", rows};
  check_invalid(run_process("/bin/sh", sh), "too_large");
  fs::remove(rows);

  const auto big = write_blob("oom_digest.blob", {u8("x", 0, 3 << 20)}, 3 << 20);
  const std::vector<std::string> limit = {
      "LD_PRELOAD=" + (runfiles_root() / "test" / "heap_limit_preload.so").string(),
      "BLOBPIPE_TEST_HEAP_LIMIT=524288"};
  check_ok(run_process(cli_path(), {"inspect", big}, std::nullopt, limit));  // fits
  check_invalid(run_process(cli_path(), {"inspect", big, "--digest"}, std::nullopt, limit),
                "too_large");
#endif
}
