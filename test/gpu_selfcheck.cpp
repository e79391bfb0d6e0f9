// gpu_selfcheck — the CUDA cases (test/cuda_cases.hpp) without Boost, for
// the GPU machine (tools/gpu_check.sh builds it with CMake). One line per
// case and backend:
//   PASS real/device_values_arrive_byte_identical
//   SKIP real/device_buffer_round_trip: no device: no CUDA device: ...
//   FAIL emulated/...: the failed expectations
// Exit status: 1 when any case failed; 0 otherwise (skips included), unless
// --require-device is given, which turns a real-backend skip for want of a
// device into a failure (the GPU machine must have one).
//   gpu_selfcheck [--require-device] [--real-only] [--filter SUBSTRING]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "blobpipe/cuda.hpp"
#include "test/cuda_cases.hpp"

using namespace blobpipe::cuda_cases;

int main(int argc, char** argv) {
  bool require_device = false, real_only = false;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--require-device")) require_device = true;
    else if (!std::strcmp(argv[i], "--real-only")) real_only = true;
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    else {
      std::fprintf(stderr, "usage: gpu_selfcheck [--require-device] [--real-only] [--filter S]\n");
      return 2;
    }
  }
  std::printf("CUDA: %s (built %s CUDA)\n", blobpipe::cuda::version_string().c_str(),
              blobpipe::cuda::built_with_cuda() ? "with" : "without");
  if (auto n = blobpipe::cuda::device_count()) {
    for (int d = 0; d < *n; ++d)
      std::printf("device %d: %s\n", d, blobpipe::cuda::describe_device(d).value().c_str());
  } else {
    std::printf("device: none (%s)\n", n.message().c_str());
  }
  int pass = 0, fail = 0, skip = 0;
  for (const test_case& c : all()) {
    if (!filter.empty() && std::string(c.name).find(filter) == std::string::npos) continue;
    for (backend b : c.backends) {
      if (real_only && b != backend::real) continue;
      auto o = run(c, b);
      const std::string id = std::string(backend_name(b)) + "/" + c.name;
      const bool device_skip = o.result == outcome::status::skip && b == backend::real &&
                               o.detail.rfind("no device", 0) == 0;
      if (o.result == outcome::status::skip && require_device && device_skip) {
        o.result = outcome::status::fail;
        o.detail = "--require-device: " + o.detail;
      }
      switch (o.result) {
        case outcome::status::pass: ++pass; std::printf("PASS %s\n", id.c_str()); break;
        case outcome::status::skip: ++skip; std::printf("SKIP %s: %s\n", id.c_str(), o.detail.c_str()); break;
        case outcome::status::fail: ++fail; std::printf("FAIL %s: %s\n", id.c_str(), o.detail.c_str()); break;
      }
      std::fflush(stdout);
    }
  }
  std::printf("%d passed, %d failed, %d skipped\n", pass, fail, skip);
  return fail == 0 ? 0 : 1;
}
