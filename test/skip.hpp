// test/skip.hpp — a test case that cannot run here says so in its test log,
// in the one line .ci/run counts (docs/reliability.md "Skips"):
//
//   SKIPPED: <target> <case>: <reason>
//
// Bazel 4 has no "skipped" status, and a Boost case that returns early is a
// pass; this line is what tells the two apart. <target> is the Bazel label
// (TEST_TARGET), <case> the Boost case's full name (or what the caller
// names), <reason> one line. When every case the run selected ended in
// BLOBPIPE_SKIP, the test prints at exit the line by which .ci/run counts
// the target as skipped, not passed:
//
//   ALL SKIPPED: <target>: <n> of <n> cases
//
//   BOOST_AUTO_TEST_CASE(ipv6_loopback_works) {
//     if (!has_ipv6_loopback()) BLOBPIPE_SKIP("no IPv6 loopback (::1) on this machine");
//     ...
//   }
#pragma once

#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <boost/test/framework.hpp>
#include <boost/test/tree/test_case_counter.hpp>
#include <boost/test/tree/traverse.hpp>

namespace blobpipe::testing {

/// The Bazel label of the running test ("//test:cuda_test"), or "?" when
/// run outside `bazel test`.
inline std::string test_target() {
  const char* t = std::getenv("TEST_TARGET");
  return t != nullptr && *t != '\0' ? t : "?";
}

/// Prints the SKIPPED line for `case_name`: `reason` on one line (newlines
/// become "; ").
inline void print_skip(std::string_view case_name, std::string_view reason) {
  std::string one_line;
  for (char c : reason) {
    if (c == '\n') {
      if (!one_line.empty() && one_line.back() != ' ') one_line += "; ";
    } else {
      one_line += c;
    }
  }
  while (!one_line.empty() && (one_line.back() == ' ' || one_line.back() == ';'))
    one_line.pop_back();
  std::cout << "SKIPPED: " << test_target() << " " << case_name << ": " << one_line
            << std::endl;
}

/// The Boost cases that ended in BLOBPIPE_SKIP, and how many the run
/// selected.
struct skipped_cases {
  std::set<std::string> names;
  std::size_t selected = 0;

  static skipped_cases& of_this_run() {
    static skipped_cases s;
    return s;
  }
};

/// At exit: the ALL SKIPPED line when every selected case skipped.
inline void print_whole_skip() {
  const skipped_cases& s = skipped_cases::of_this_run();
  if (s.selected != 0 && s.names.size() >= s.selected)
    std::cout << "ALL SKIPPED: " << test_target() << ": " << s.names.size() << " of "
              << s.selected << " cases" << std::endl;
}

/// Records that Boost case `case_name` skipped, of `selected` cases the
/// run selected; the first call arranges print_whole_skip at exit.
inline void note_skipped_case(std::string case_name, std::size_t selected) {
  skipped_cases& s = skipped_cases::of_this_run();  // constructed before the atexit below
  if (s.selected == 0) std::atexit(print_whole_skip);
  s.selected = selected;
  s.names.insert(std::move(case_name));
}

/// Records that the running Boost case skipped (BLOBPIPE_SKIP; a case
/// that loops over links none of which is offered here), of the cases the
/// run selected (enabled ones: --run_test filters).
inline void note_this_case_skipped() {
  boost::unit_test::test_case_counter selected;
  boost::unit_test::traverse_test_tree(boost::unit_test::framework::master_test_suite(), selected,
                                       false);
  note_skipped_case(boost::unit_test::framework::current_test_case().full_name(),
                    selected.p_count);
}

}  // namespace blobpipe::testing

/// In a Boost.Test case: prints the SKIPPED line for the current case
/// (`reason` is streamed: BLOBPIPE_SKIP("no " << what)) and returns from the
/// test body. Use it before the case has done anything it would check.
#define BLOBPIPE_SKIP(reason)                                                            \
  do {                                                                                   \
    std::ostringstream blobpipe_why_;                                                    \
    blobpipe_why_ << reason;                                                             \
    ::blobpipe::testing::print_skip(                                                     \
        ::boost::unit_test::framework::current_test_case().full_name(),                  \
        blobpipe_why_.str());                                                            \
    ::blobpipe::testing::note_this_case_skipped();                                       \
    return;                                                                              \
  } while (0)
