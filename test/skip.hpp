// test/skip.hpp — a test case that cannot run here says so in its test log,
// in the one line .ci/run counts (docs/reliability.md "Skips"):
//
//   SKIPPED: <target> <case>: <reason>
//
// Bazel 4 has no "skipped" status, and a Boost case that returns early is a
// pass; this line is what tells the two apart. <target> is the Bazel label
// (TEST_TARGET), <case> the Boost case's full name (or what the caller
// names), <reason> one line.
//
//   BOOST_AUTO_TEST_CASE(ipv6_loopback_works) {
//     if (!has_ipv6_loopback()) BLOBPIPE_SKIP("no IPv6 loopback (::1) on this machine");
//     ...
//   }
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

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
    return;                                                                              \
  } while (0)
