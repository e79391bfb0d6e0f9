// test/cuda_cases.hpp — the CUDA test bodies, shared by two drivers:
// test/cuda_test.cpp (Boost.Test, under Bazel) and test/gpu_selfcheck.cpp
// (a plain executable printing PASS/FAIL/SKIP lines, built by CMake on the
// GPU machine, which has no Boost: tools/gpu_check.sh).
//
// Each case runs on one or both backends:
// - real: the build's CUDA runtime. Cases that need a device skip, with
//   the reason (device_count()'s message), when there is none; one case
//   checks the no-device errors and skips when a device is present.
// - emulated: lib/cuda/testing.hpp's emulator (host memory, worker-thread
//   streams), so the staging logic runs on machines without a GPU, and
//   failures can be injected.
//
//   for (const auto& c : blobpipe::cuda_cases::all())
//     for (auto b : c.backends) print(c.name, b, blobpipe::cuda_cases::run(c, b));
#pragma once

#include <string>
#include <vector>

namespace blobpipe::cuda_cases {

enum class backend { real, emulated };

inline const char* backend_name(backend b) { return b == backend::real ? "real" : "emulated"; }

/// Failed expectations of one case run.
class checker {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  }
  std::vector<std::string> failures;
};

#define BLOBPIPE_EXPECT(ck, cond, msg)                                                       \
  (ck).expect(static_cast<bool>(cond), std::string(#cond) + " [" + std::string(msg) + "] at " + \
                                           __FILE__ ":" + std::to_string(__LINE__))

struct test_case {
  const char* name;
  std::vector<backend> backends;
  /// Why the case cannot run on `b` here ("" when it can). Called with
  /// backend `b` selected.
  std::string (*needs)(backend b);
  void (*body)(checker& ck, backend b);
};

/// Every case (test/cuda_cases.cpp).
const std::vector<test_case>& all();

struct outcome {
  enum class status { pass, fail, skip } result = status::pass;
  std::string detail;  ///< skip: why; fail: the failed expectations, one per line
};

/// Why `c` skips on `b` here ("" when it runs): needs() with `b` selected.
std::string why_skip(const test_case& c, backend b);

/// Selects the backend, checks needs(), runs the body (exceptions count as
/// failures), and for the emulator checks that no device memory leaked.
outcome run(const test_case& c, backend b);

}  // namespace blobpipe::cuda_cases
