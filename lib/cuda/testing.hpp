// The CUDA emulator and its switch (test-only: //lib/cuda:emulator, which
// production targets cannot depend on; tests and benchmarks only).
//
// The emulated runtime (lib/cuda/testing/emulated_runtime.cpp) stands in
// for CUDA on a machine with no GPU, keeping the rules code can get wrong:
// - one "device" whose memory the host cannot read or write: a device
//   pointer is an address range with no access, so host code that touches
//   one faults here, as it would on a GPU, instead of working by accident;
// - streams are worker threads running their work in order, and host
//   functions are called from those threads as CUDA calls them;
// - the legacy default stream: streams made by cudaStreamCreate wait for
//   the work queued on it before theirs, and it waits for theirs
//   (cudaMemcpy, a kernel launched without a stream);
// - copies can be held and released one by one, so a test can see how
//   many are in flight at a given moment without any timing.
// The pipeline's staging paths then run unchanged (copies complete on
// another thread and post back to the io_context), so their logic is
// tested by the CPU-only build; only the real copy engine is left to the
// GPU check (tools/gpu_check.sh).
//
//   blobpipe::cuda::testing::emulated_scope emu;   // until end of scope
//   auto buf = blobpipe::cuda::device_buffer::allocate(1024).value();
#pragma once

#include <cstddef>
#include <functional>
#include <span>

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

/// Emulator only: from now on (true), every stream copy (memcpy_async)
/// waits before it runs until the test lets it through with
/// release_copies; false lets every copy run again. REQUIRES: the hold
/// ends before anything waits for the held copies outside the test's
/// control (a stream's destructor, cudaMemcpy).
void hold_copies(bool on) noexcept;
/// Lets `n` more held copies run, in the order they reach the gate.
void release_copies(std::size_t n) noexcept;
/// Stream copies issued (memcpy_async returned) and not finished.
std::size_t copies_in_flight() noexcept;
/// Emulator only: how many times pinned host memory was freed while a
/// queued stream copy still read or wrote it (a use after free: CUDA does
/// not promise the copy has finished).
std::size_t pinned_frees_under_copies() noexcept;

/// Emulator only: `kernel` runs as a kernel launched on the legacy default
/// stream would: on that stream's thread, after the work queued before it
/// there and on every blocking stream; blocking streams' later work waits
/// for it. It may block (a test holds it until it decides).
void launch_on_default_stream(std::function<void()> kernel);
/// The bytes behind device memory [device_ptr, +n), for an emulated kernel
/// to read or write: the device's view, never for the code under test.
/// Empty when the range runs past its allocation.
std::span<std::byte> kernel_view(const void* device_ptr, std::size_t n);

/// Blocking streams whose next piece of work is waiting for work queued
/// before it on the legacy default stream.
std::size_t streams_waiting_for_default_stream() noexcept;

/// Selects the emulator for one scope, then the build's runtime again.
class emulated_scope {
 public:
  emulated_scope() { use_emulated_runtime(true); }
  emulated_scope(const emulated_scope&) = delete;
  emulated_scope& operator=(const emulated_scope&) = delete;
  ~emulated_scope() {
    hold_copies(false);
    fail_copy_after(-1);
    use_emulated_runtime(false);
  }
};

}  // namespace blobpipe::cuda::testing
