// Test hooks for lib/cuda (internal; tests and benchmarks only).
//
// The emulated runtime (lib/cuda/runtime.hpp) stands in for CUDA on a
// machine with no GPU: one "device" whose memory is tracked host memory,
// streams that are worker threads running their work in order, and host
// functions called from those threads as CUDA calls them. The pipeline's
// staging paths then run unchanged (copies complete on another thread and
// post back to the io_context), so their logic is tested by the CPU-only
// build; only the real copy engine is left to the GPU check
// (tools/gpu_check.sh).
//
//   blobpipe::cuda::testing::emulated_scope emu;   // until end of scope
//   auto buf = blobpipe::cuda::device_buffer::allocate(1024).value();
#pragma once

#include <cstddef>

namespace blobpipe::cuda::testing {

/// Routes every blobpipe CUDA call to the emulator (true) or back to the
/// runtime of the build (false). REQUIRES: no CUDA work in flight (switch
/// between tests, not during one).
void use_emulated_runtime(bool on) noexcept;
bool using_emulated_runtime() noexcept;

/// Emulator only: the copy (memcpy_async) after the next `n` fails as an
/// illegal address would: its stream reports the error from then on and
/// runs no more work, host functions included (as cudaLaunchHostFunc's are
/// not called after an error). One-shot; n < 0 disarms.
void fail_copy_after(long n) noexcept;

/// Emulator only: device allocations alive now (leak checks).
std::size_t live_device_allocations() noexcept;

/// Selects the emulator for one scope, then the build's runtime again.
class emulated_scope {
 public:
  emulated_scope() { use_emulated_runtime(true); }
  emulated_scope(const emulated_scope&) = delete;
  emulated_scope& operator=(const emulated_scope&) = delete;
  ~emulated_scope() {
    fail_copy_after(-1);
    use_emulated_runtime(false);
  }
};

}  // namespace blobpipe::cuda::testing
