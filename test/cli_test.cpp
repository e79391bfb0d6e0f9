// test/cli_test.cpp — runs the built `blobpipe` CLI over every golden case.
//
// Valid cases: `inspect --json --digest` must reproduce the manifest's
// footer fields and entry rows (with SHA-256 of each entry's bytes), and
// `verify` must exit 0. Invalid cases: both commands exit 2 with exactly one
// stderr line `blobpipe: <expected_error>: ...`. Also covers the usage and
// I/O exit codes that `blobpipe --help` documents, including the refusal of
// pipes and FIFOs (the footer is at the end, so FILE must be seekable).
#define BOOST_TEST_MODULE cli_test
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "blobpipe/version.hpp"
#include "test/cli_fixture.hpp"
#include "test/golden_dir.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace blobpipe::testing;

// The golden dir and manifest, loaded once. A missing golden dir fails
// every test that needs it (never a silent pass).
struct golden {
  fs::path dir;
  json manifest;

  static const golden& get() {
    static const golden g = [] {
      golden g;
      auto found = blobpipe::testing::find_golden_dir();
      BOOST_TEST_REQUIRE(found.dir.has_value(),
                         "golden dir not found (set BLOBPIPE_GOLDEN_DIR); tried " << found.tried);
      g.dir = *found.dir;
      std::ifstream in(g.dir / "manifest.json");
      g.manifest = json::parse(in);
      BOOST_TEST_REQUIRE(g.manifest["cases"].size() > 0u);
      return g;
    }();
    return g;
  }
  std::string file(const json& c) const { return (dir / c.at("file").get<std::string>()).string(); }
};

const char* const entry_fields[] = {"key", "off", "len", "kind", "dtype", "shape", "sha256"};

void check_entry(const json& got, const json& want, std::size_t i) {
  BOOST_TEST_CONTEXT("entry " << i << " (" << want.at("key").dump() << ")") {
    BOOST_TEST(got.size() == std::size(entry_fields), "fields: " << got.dump());
    for (const char* f : entry_fields) {
      BOOST_TEST(got.value(f, json("<missing>")) == want.at(f),
                 f << ": got " << got.value(f, json("<missing>")).dump() << ", want "
                   << want.at(f).dump());
    }
  }
}

// Compares `inspect --json --digest` output with a manifest case (or one
// blob of the shard case, which carries only nbytes and entries).
void check_inspect_json(const json& got, const json& want) {
  for (const char* f : {"footer_version", "tag_hex", "index_off", "index_len"}) {
    if (want.contains(f)) BOOST_TEST(got.at(f) == want.at(f), f << ": got " << got.at(f));
  }
  BOOST_TEST(got.at("nbytes") == want.at("nbytes"));
  const json& entries = got.at("entries");
  if (want.contains("entry_count")) {
    BOOST_TEST(entries.size() == want.at("entry_count").get<std::size_t>());
  }
  if (want.contains("entries")) {
    BOOST_TEST_REQUIRE(entries.size() == want.at("entries").size());
    for (std::size_t i = 0; i < entries.size(); ++i) check_entry(entries[i], want["entries"][i], i);
  }
  if (want.contains("entries_head")) {
    const json& head = want.at("entries_head");
    BOOST_TEST_REQUIRE(entries.size() >= head.size());
    for (std::size_t i = 0; i < head.size(); ++i) check_entry(entries[i], head[i], i);
  }
  if (want.contains("entries_tail")) {
    const json& tail = want.at("entries_tail");
    BOOST_TEST_REQUIRE(entries.size() >= tail.size());
    const std::size_t base = entries.size() - tail.size();
    for (std::size_t i = 0; i < tail.size(); ++i) check_entry(entries[base + i], tail[i], base + i);
  }
}

bool is_shard(const json& c) { return c.value("kind", "") == "shard"; }

/// Cases of the manifest that are valid single blobs, or invalid ones
/// (golden_test checks that the manifest lists all of them).
std::size_t count_cases(const json& manifest, bool valid) {
  std::size_t n = 0;
  for (const json& c : manifest["cases"]) n += c.at("valid").get<bool>() == valid && !is_shard(c);
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(golden_dir_is_found) {
  const golden& g = golden::get();
  BOOST_TEST_MESSAGE("golden dir: " << g.dir << ", CLI: " << cli_path());
  BOOST_TEST(fs::is_regular_file(g.dir / "manifest.json"));
  BOOST_TEST(fs::is_regular_file(cli_path()), "CLI not found at " << cli_path());
}

BOOST_AUTO_TEST_CASE(inspect_json_digest_matches_manifest_for_valid_blobs) {
  const golden& g = golden::get();
  std::size_t checked = 0;
  for (const json& c : g.manifest["cases"]) {
    if (!c.at("valid").get<bool>() || is_shard(c)) continue;
    BOOST_TEST_CONTEXT("case " << c.at("name").get<std::string>()) {
      auto r = run_cli({"inspect", g.file(c), "--json", "--digest"});
      check_ok(r);
      if (r.exit_code != 0) continue;
      check_inspect_json(json::parse(r.out), c);
      ++checked;
    }
  }
  BOOST_TEST(checked == count_cases(g.manifest, true));
}

BOOST_AUTO_TEST_CASE(inspect_with_offset_and_nbytes_reads_each_shard_blob) {
  const golden& g = golden::get();
  std::size_t blobs = 0;
  for (const json& c : g.manifest["cases"]) {
    if (!is_shard(c)) continue;
    for (const json& b : c.at("blobs")) {
      BOOST_TEST_CONTEXT("shard blob at " << b.at("off")) {
        auto r = run_cli({"inspect", g.file(c), "--offset", b.at("off").dump(), "--nbytes",
                          b.at("nbytes").dump(), "--json", "--digest"});
        check_ok(r);
        if (r.exit_code == 0) check_inspect_json(json::parse(r.out), b);
        auto v = run_cli({"verify", g.file(c), "--offset=" + b.at("off").dump(),
                          "--nbytes=" + b.at("nbytes").dump()});
        check_ok(v);
        ++blobs;
      }
    }
  }
  BOOST_TEST(blobs == 3u);
}

BOOST_AUTO_TEST_CASE(inspect_json_without_digest_has_no_sha256) {
  const golden& g = golden::get();
  auto r = run_cli({"inspect", (g.dir / "pickles.blob").string(), "--json"});
  check_ok(r);
  json j = json::parse(r.out);
  BOOST_TEST_REQUIRE(j.at("entries").size() > 0u);
  for (const json& e : j["entries"]) {
    BOOST_TEST(!e.contains("sha256"));
    BOOST_TEST(e.at("dtype").is_null());  // pickles have nil dtype and shape
    BOOST_TEST(e.at("shape").is_null());
  }
}

BOOST_AUTO_TEST_CASE(inspect_text_prints_footer_and_one_row_per_entry) {
  const golden& g = golden::get();
  for (const json& c : g.manifest["cases"]) {
    if (!c.at("valid").get<bool>() || is_shard(c)) continue;
    BOOST_TEST_CONTEXT("case " << c.at("name").get<std::string>()) {
      auto r = run_cli({"inspect", g.file(c), "--digest"});
      check_ok(r);
      const std::size_t n = c.contains("entry_count") ? c["entry_count"].get<std::size_t>()
                                                      : c.at("entries").size();
      // Six footer lines, then a header row and one row per entry.
      BOOST_TEST(count_lines(r.out) == 6 + (n ? n + 1 : 0));
      BOOST_TEST(r.out.find(c.at("tag_hex").get<std::string>()) != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(verify_exits_zero_with_one_line_for_valid_blobs) {
  const golden& g = golden::get();
  for (const json& c : g.manifest["cases"]) {
    if (!c.at("valid").get<bool>() || is_shard(c)) continue;
    BOOST_TEST_CONTEXT("case " << c.at("name").get<std::string>()) {
      auto r = run_cli({"verify", g.file(c)});
      check_ok(r);
      BOOST_TEST(count_lines(r.out) == 1u, "stdout: " << r.out);
    }
  }
}

BOOST_AUTO_TEST_CASE(invalid_blobs_exit_2_with_their_category) {
  const golden& g = golden::get();
  std::size_t checked = 0;
  for (const json& c : g.manifest["cases"]) {
    if (c.at("valid").get<bool>()) continue;
    const std::string category = c.at("expected_error").get<std::string>();
    BOOST_TEST_CONTEXT("case " << c.at("name").get<std::string>()) {
      check_invalid(run_cli({"inspect", g.file(c)}), category);
      check_invalid(run_cli({"inspect", g.file(c), "--json", "--digest"}), category);
      check_invalid(run_cli({"verify", g.file(c)}), category);
      ++checked;
    }
  }
  BOOST_TEST(checked == count_cases(g.manifest, false));
}

BOOST_AUTO_TEST_CASE(range_past_end_of_file_is_too_small) {
  const golden& g = golden::get();
  // single_f32.blob is 115 bytes.
  check_invalid(run_cli({"inspect", (g.dir / "single_f32.blob").string(), "--nbytes", "116"}),
                "too_small");
}

BOOST_AUTO_TEST_CASE(missing_file_exits_3_and_names_it) {
  auto r = run_cli({"inspect", "/nonexistent/blobpipe/no.blob"});
  BOOST_TEST(r.exit_code == 3);
  BOOST_TEST(count_lines(r.err) == 1u);
  BOOST_TEST(r.err.rfind("blobpipe: io: ", 0) == 0u, "stderr: " << r.err);
  BOOST_TEST(r.err.find("/nonexistent/blobpipe/no.blob") != std::string::npos);
  auto d = run_cli({"verify", scratch_dir().string()});
  BOOST_TEST(d.exit_code == 3, "a directory is an I/O error; stderr: " << d.err);
}

// The footer is at the blob's end, so FILE must be a regular (seekable)
// file. Opening a FIFO that has no writer must not wait for one: the
// timeout turns the hang this guards against into a failure.
BOOST_AUTO_TEST_CASE(fifo_without_writer_exits_3_at_once, *boost::unit_test::timeout(30)) {
  const fs::path fifo = scratch_dir() / "cli_test_no_writer.fifo";
  fs::remove(fifo);
  BOOST_TEST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0, "mkfifo: " << std::strerror(errno));
  for (const char* cmd : {"inspect", "verify"}) {
    BOOST_TEST_CONTEXT(cmd) { check_io(run_cli({cmd, fifo.string()}), "not a regular file"); }
  }
  fs::remove(fifo);
}

// `blobpipe verify <(cat x.blob)`: a pipe holding a whole valid blob is
// still refused as I/O, not reported as a format error (too_small).
BOOST_AUTO_TEST_CASE(pipe_exits_3_not_a_format_error, *boost::unit_test::timeout(30)) {
  const golden& g = golden::get();
  std::ifstream in(g.dir / "single_f32.blob", std::ios::binary);
  const std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST_REQUIRE(blob.size() == 115u);  // fits the pipe's buffer: no reader needed
  for (const char* cmd : {"inspect", "verify"}) {
    BOOST_TEST_CONTEXT(cmd) {
      int fds[2];
      BOOST_TEST_REQUIRE(::pipe(fds) == 0);
      BOOST_TEST_REQUIRE(::write(fds[1], blob.data(), blob.size()) ==
                         static_cast<ssize_t>(blob.size()));
      ::close(fds[1]);
      // The child inherits the read end, as a shell's process substitution
      // passes it.
      auto r = run_cli({cmd, "/dev/fd/" + std::to_string(fds[0])});
      ::close(fds[0]);
      check_io(r, "a pipe or FIFO");
    }
  }
}

BOOST_AUTO_TEST_CASE(usage_errors_exit_1) {
  const golden& g = golden::get();
  const std::string f = (g.dir / "single_f32.blob").string();
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate", f},
      {"inspect"},
      {"verify"},
      {"inspect", f, "--bogus"},
      {"inspect", f, "--offset"},
      {"inspect", f, "--offset", "12x"},
      {"inspect", f, "--nbytes", "-1"},
      {"inspect", f, "--offset=abc"},
      {"inspect", f, "--nbytes", "99999999999999999999999"},
      {"verify", f, "--json"},
      {"inspect", f, f},
  };
  for (const auto& args : bad) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    BOOST_TEST_CONTEXT("args: " << joined) {
      auto r = run_cli(args);
      BOOST_TEST(r.exit_code == 1, "stderr: " << r.err);
      BOOST_TEST(r.err.find("usage:") != std::string::npos, "stderr: " << r.err);
      BOOST_TEST(r.out.empty());
    }
  }
}

// A number too large for 64 bits is a decimal integer all the same: the
// message says it is out of range, and a malformed one is still "not".
BOOST_AUTO_TEST_CASE(usage_error_says_out_of_range_for_a_too_large_number) {
  for (const char* flag : {"--offset", "--nbytes"}) {
    BOOST_TEST_CONTEXT(flag) {
      auto r = run_cli({"verify", "f.blob", flag, "18446744073709551616"});
      BOOST_TEST(r.exit_code == 1, "stderr: " << r.err);
      BOOST_TEST(r.err.rfind(std::string("blobpipe: ") + flag +
                                 ": '18446744073709551616' is out of range",
                             0) == 0u,
                 "stderr: " << r.err);
      auto max = run_cli({"verify", "/nonexistent/f.blob", flag, "18446744073709551615"});
      BOOST_TEST(max.exit_code == 3, "2^64 - 1 is in range; stderr: " << max.err);
      auto typo = run_cli({"verify", "f.blob", flag, "18446744073709551616x"});
      BOOST_TEST(typo.err.find("is not an unsigned decimal integer") != std::string::npos,
                 "stderr: " << typo.err);
    }
  }
}

// `bazel run //tools:blobpipe -- verify ../shared/golden/x.blob` runs in the
// runfiles tree; Bazel names the user's directory in BUILD_WORKING_DIRECTORY
// and a relative FILE is relative to it. Reports name FILE as typed.
BOOST_AUTO_TEST_CASE(relative_file_is_relative_to_build_working_directory) {
  const golden& g = golden::get();
  const std::string bwd = "BUILD_WORKING_DIRECTORY=" + g.dir.string();
  auto v = run_process(cli_path(), {"verify", "single_f32.blob"}, std::nullopt, {bwd});
  check_ok(v);
  BOOST_TEST(v.out.rfind("single_f32.blob: ok: 1 entries", 0) == 0u, "stdout: " << v.out);
  auto i = run_process(cli_path(), {"inspect", "--json", "single_f32.blob"}, std::nullopt, {bwd});
  check_ok(i);
  // From a subdirectory, with ../ as a user types it.
  const fs::path sub = scratch_dir() / "cli_test_bwd";
  fs::create_directories(sub);
  fs::copy_file(g.dir / "single_f32.blob", scratch_dir() / "cli_test_bwd.blob",
                fs::copy_options::overwrite_existing);
  check_ok(run_process(cli_path(), {"verify", "../cli_test_bwd.blob"}, std::nullopt,
                       {"BUILD_WORKING_DIRECTORY=" + sub.string()}));
  // An absolute FILE stays as it is.
  check_ok(run_process(cli_path(), {"verify", (g.dir / "single_f32.blob").string()}, std::nullopt,
                       {"BUILD_WORKING_DIRECTORY=/nonexistent"}));
  // A missing one names the directory it was looked for in.
  auto missing = run_process(cli_path(), {"verify", "no.blob"}, std::nullopt, {bwd});
  check_io(missing, (g.dir / "no.blob").string());
}

// Output that cannot be written (a full disk; /dev/full) is an I/O error,
// not a success: exit 3 with one line `blobpipe: io: ...`, for --help too.
BOOST_AUTO_TEST_CASE(stdout_write_error_exits_3) {
  const golden& g = golden::get();
  const std::string f = (g.dir / "single_f32.blob").string();
  auto help = run_process(cli_path(), {"--help"}, "/dev/full");
  check_io(help, "write error: No space left on device");
  // The reports say the same, with the reason: a short one fails when it
  // is flushed, inspect of many_entries (megabytes) while it is printed.
  const std::string many = (g.dir / "many_entries.blob").string();
  const std::vector<std::vector<std::string>> reports = {
      {"inspect", f}, {"verify", f}, {"inspect", many}, {"inspect", many, "--json"}};
  for (const auto& args : reports) {
    BOOST_TEST_CONTEXT(args[0] << " " << args[1] << (args.size() > 2 ? " --json" : "")) {
      auto r = run_process(cli_path(), args, "/dev/full");
      check_io(r, "write error: No space left on device");
      BOOST_TEST(r.err == help.err, "stderr: " << r.err);
    }
  }
}

BOOST_AUTO_TEST_CASE(help_exits_0_and_documents_exit_codes) {
  for (const char* flag : {"--help", "-h"}) {
    auto r = run_cli({flag});
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.out.find("usage:") != std::string::npos);
    BOOST_TEST(r.out.find("exit status") != std::string::npos);
  }
  BOOST_TEST(run_cli({"inspect", "x.blob", "--help"}).exit_code == 0);
}

// --version prints the library's version (version.bzl; //test:version_test
// compares it with the other copies), anywhere on the line; --help wins.
BOOST_AUTO_TEST_CASE(version_prints_the_library_version_and_exits_0) {
  const std::string want = std::string("blobpipe ") + blobpipe::version() + "\n";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--version"}, {"inspect", "x.blob", "--version"}}) {
    auto r = run_cli(args);
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.out == want);
    BOOST_TEST(r.err.empty());
  }
  auto both = run_cli({"--version", "--help"});
  BOOST_TEST(both.exit_code == 0);
  BOOST_TEST(both.out.find("usage:") == 0u);
  // After `--`, it is a FILE name.
  BOOST_TEST(run_cli({"inspect", "--", "--version"}).out.find("blobpipe 0") == std::string::npos);
}
