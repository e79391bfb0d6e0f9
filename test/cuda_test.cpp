// The CUDA cases (test/cuda_cases.hpp) as Boost.Test cases, suites "real"
// and "emulated". A case that cannot run here (no device on the real
// backend) is skipped through a precondition whose message says why, and
// prints the SKIPPED line .ci/run counts (test/skip.hpp), e.g.
//   SKIPPED: //test:cuda_test real/device_buffer_round_trip: no device: ...
// With --config=cuda on a GPU machine the real suite runs on the device.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <iostream>

#include "blobpipe/cuda.hpp"
#include "test/cuda_cases.hpp"
#include "test/skip.hpp"

namespace bt = boost::unit_test;
using namespace blobpipe::cuda_cases;

namespace {

void run_one(const test_case& c, backend b) {
  const auto o = run(c, b);
  if (o.result == outcome::status::fail) BOOST_ERROR(o.detail);
  else if (o.result == outcome::status::skip)
    blobpipe::testing::print_skip(std::string(backend_name(b)) + "/" + c.name, o.detail);
  else BOOST_TEST(true);  // one assertion, so Boost does not warn about none
}

bool init() {
  auto& master = bt::framework::master_test_suite();
  master.p_name.value = "cuda";
  std::cout << "CUDA: " << blobpipe::cuda::version_string() << "\n";
  for (backend b : {backend::real, backend::emulated}) {
    auto* suite = BOOST_TEST_SUITE(backend_name(b));
    for (const test_case& c : all()) {
      if (std::find(c.backends.begin(), c.backends.end(), b) == c.backends.end()) continue;
      auto* tc = bt::make_test_case([&c, b] { run_one(c, b); }, c.name, __FILE__, __LINE__);
      tc->add_precondition([&c, b](bt::test_unit_id) -> boost::test_tools::assertion_result {
        const auto why = why_skip(c, b);
        if (why.empty()) return true;
        blobpipe::testing::print_skip(std::string(backend_name(b)) + "/" + c.name, why);
        boost::test_tools::assertion_result r(false);
        r.message() << why;
        return r;
      });
      suite->add(tc);
    }
    master.add(suite);
  }
  return true;
}

}  // namespace

int main(int argc, char* argv[]) { return bt::unit_test_main(&init, argc, argv); }
