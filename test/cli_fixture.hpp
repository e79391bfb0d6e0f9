// test/cli_fixture.hpp — running the built `blobpipe` CLI and checking its
// exit status and its one stderr line (cli_test, cli_hostile_test).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "test/golden_dir.hpp"
#include "test/process.hpp"

namespace blobpipe::testing {

/// $BLOBPIPE_CLI, else //tools:blobpipe in the runfiles.
inline std::filesystem::path cli_path() {
  if (const char* p = std::getenv("BLOBPIPE_CLI"); p && *p) return p;
  return runfiles_root() / "tools" / "blobpipe";
}

/// Runs the CLI with `args` to its end (output through temporary files, as
/// inspect of many_entries prints megabytes).
inline run_result run_cli(const std::vector<std::string>& args) {
  return run_process(cli_path(), args);
}

inline std::size_t count_lines(const std::string& s) {
  std::size_t n = 0;
  for (char ch : s) n += ch == '\n';
  return n;
}

/// Exit 0 and nothing on stderr.
inline void check_ok(const run_result& r) {
  BOOST_TEST(r.exit_code == 0, "exit " << r.exit_code << ", stderr: " << r.err);
  BOOST_TEST(r.err.empty(), "stderr: " << r.err);
}

/// Exit 2 and exactly one line on stderr: `blobpipe: CATEGORY: message`.
inline void check_invalid(const run_result& r, const std::string& category) {
  BOOST_TEST(r.exit_code == 2, "exit " << r.exit_code << ", stderr: " << r.err);
  BOOST_TEST(count_lines(r.err) == 1u, "stderr: " << r.err);
  const std::string prefix = "blobpipe: " + category + ": ";
  BOOST_TEST(r.err.rfind(prefix, 0) == 0u, "stderr: " << r.err << "want prefix: " << prefix);
}

/// Exit 3 with exactly one stderr line `blobpipe: io: ...` containing `what`.
inline void check_io(const run_result& r, const std::string& what) {
  BOOST_TEST(r.exit_code == 3, "exit " << r.exit_code << ", stderr: " << r.err);
  BOOST_TEST(count_lines(r.err) == 1u, "stderr: " << r.err);
  BOOST_TEST(r.err.rfind("blobpipe: io: ", 0) == 0u, "stderr: " << r.err);
  BOOST_TEST(r.err.find(what) != std::string::npos, "stderr: " << r.err << "want: " << what);
  BOOST_TEST(r.out.empty(), "stdout: " << r.out);
}

}  // namespace blobpipe::testing
