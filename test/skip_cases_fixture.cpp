// A Boost module for skip_test: case `always_skips` skips; case
// `skips_when_told` skips when BLOBPIPE_SKIP_BOTH is set, else runs one
// check. So a plain run skips 1 of 2 cases, a run with the variable set
// skips both, and --run_test=always_skips selects 1 and skips it.
#define BOOST_TEST_MODULE skip_cases_fixture
#include <boost/test/unit_test.hpp>
#include <cstdlib>

#include "test/skip.hpp"

BOOST_AUTO_TEST_CASE(always_skips) { BLOBPIPE_SKIP("this case always skips"); }

BOOST_AUTO_TEST_CASE(skips_when_told) {
  if (std::getenv("BLOBPIPE_SKIP_BOTH") != nullptr) BLOBPIPE_SKIP("told to skip");
  BOOST_TEST(std::getenv("BLOBPIPE_SKIP_BOTH") == nullptr);
}
