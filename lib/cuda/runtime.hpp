// The CUDA runtime calls blobpipe makes, behind one interface (internal).
//
// Three implementations:
// - runtime_cuda.cpp, `--config=cuda`: the CUDA runtime itself; every call
//   goes through one checker (BLOBPIPE_CUDA_CHECK) that turns a cudaError_t
//   into cuda_failure with the call's name and CUDA's error string;
// - runtime_cuda.cpp, default build: every call fails "built without CUDA";
// - testing/emulated_runtime.cpp, test-only (//lib/cuda:emulator): a test
//   double that keeps CUDA's rules (streams, the legacy default stream,
//   device memory the host cannot touch). It lets a machine with no GPU
//   run the staging logic (slot reuse, completions arriving from another
//   thread, failures) through the same code paths; see lib/cuda/testing.hpp.
//
// Streams are opaque `void*` (cudaStream_t) so nothing outside lib/cuda
// sees a CUDA type, and `#if BLOBPIPE_WITH_CUDA` stays in this folder.
#pragma once

#include <cstddef>
#include <string>

#include "blobpipe/errors.hpp"

namespace blobpipe::cuda::detail {

/// cudaPointerGetAttributes' answer.
struct pointer_info {
  enum class type { unregistered, host, device, managed } kind = type::unregistered;
  int device = -1;
};

/// A host function run on a stream once the work before it is done
/// (cudaLaunchHostFunc). It must not call CUDA.
using host_fn = void (*)(void* user);

class runtime {
 public:
  virtual ~runtime() = default;

  virtual const char* name() const noexcept = 0;  ///< "cuda", "none", "emulated"
  virtual std::string version() const = 0;
  virtual result<int> device_count() = 0;                    // > 0 or an error
  virtual result<std::string> device_name(int device) = 0;
  virtual result<int> get_device() = 0;
  virtual result<void> set_device(int device) = 0;
  virtual result<pointer_info> pointer_attributes(const void* p) = 0;
  virtual result<void*> malloc_device(std::size_t n) = 0;   // current device
  virtual void free_device(void* p) noexcept = 0;
  virtual result<void*> malloc_host(std::size_t n) = 0;     // pinned, portable
  virtual void free_host(void* p) noexcept = 0;
  /// A stream of the current device that also waits for the legacy default
  /// stream (cudaStreamCreate), so work the caller queued there first (a
  /// torch kernel on the default stream, a cudaMemcpy) comes before ours.
  virtual result<void*> stream_create() = 0;
  virtual void stream_destroy(void* s) noexcept = 0;
  virtual result<void> memcpy_async(void* dst, const void* src, std::size_t n, void* s) = 0;
  virtual result<void> launch_host_func(void* s, host_fn fn, void* user) = 0;
  virtual result<bool> stream_query(void* s) = 0;  ///< true when all its work is done
  virtual result<void> stream_synchronize(void* s) = 0;
  /// cudaMemcpy (cudaMemcpyDefault), then cudaDeviceSynchronize.
  virtual result<void> memcpy_sync(void* dst, const void* src, std::size_t n) = 0;
  virtual result<void> device_synchronize() = 0;
};

/// The runtime every blobpipe CUDA call uses: cuda_runtime() unless a test
/// selected the emulator (lib/cuda/testing.hpp, the only caller of
/// set_active; production code has no other runtime to select).
runtime& active() noexcept;
runtime& cuda_runtime() noexcept;
void set_active(runtime& r) noexcept;

/// Makes `device` current for one scope and restores the previous one
/// (cudaGetDevice, cudaSetDevice): the caller's thread keeps its device.
class device_guard {
 public:
  device_guard() = default;
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard();
  /// Errors: those of set_device.
  [[nodiscard]] result<void> enter(int device);

 private:
  int previous_ = -1;
};

}  // namespace blobpipe::cuda::detail
