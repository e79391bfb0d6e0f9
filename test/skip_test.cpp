// test/skip.hpp's lines (docs/reliability.md "Skips"): every BLOBPIPE_SKIP
// prints its SKIPPED line, and a run whose selected cases all skipped
// prints the ALL SKIPPED line by which .ci/run counts the target as
// skipped rather than passed; a run in which any case ran does not.
#define BOOST_TEST_MODULE skip
#include <boost/test/unit_test.hpp>
#include <string>

#include "test/golden_dir.hpp"
#include "test/process.hpp"

using namespace blobpipe::testing;

namespace {

constexpr const char* target = "//test:skip_cases_fixture";

run_result run_fixture(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
  env.push_back(std::string("TEST_TARGET=") + target);
  auto r = run_process(runfiles_root() / "test" / "skip_cases_fixture", args, std::nullopt, env);
  BOOST_TEST_INFO("stdout: " << r.out << "\nstderr: " << r.err);
  BOOST_TEST(r.exit_code == 0);
  return r;
}

bool has(const std::string& out, const std::string& line) {
  return out.find(line) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_run_in_which_a_case_ran_is_not_all_skipped) {
  const auto r = run_fixture({});
  const auto line = std::string("SKIPPED: ") + target + " always_skips: this case always skips\n";
  BOOST_TEST(has(r.out, line), r.out);
  BOOST_TEST(!has(r.out, "ALL SKIPPED"), r.out);
}

BOOST_AUTO_TEST_CASE(a_run_whose_cases_all_skipped_says_so_at_exit) {
  const auto r = run_fixture({}, {"BLOBPIPE_SKIP_BOTH=1"});
  BOOST_TEST(has(r.out, "skips_when_told: told to skip"), r.out);
  BOOST_TEST(has(r.out, std::string("ALL SKIPPED: ") + target + ": 2 of 2 cases\n"), r.out);
}

BOOST_AUTO_TEST_CASE(all_skipped_counts_the_cases_the_run_selected) {
  const auto r = run_fixture({"--run_test=always_skips"});
  BOOST_TEST(has(r.out, std::string("ALL SKIPPED: ") + target + ": 1 of 1 cases\n"), r.out);
}
