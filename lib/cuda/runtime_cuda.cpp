// The CUDA runtime behind lib/cuda/runtime.hpp: the real one with
// `--config=cuda` (BLOBPIPE_WITH_CUDA=1), else one whose every call fails
// "built without CUDA". The only file that includes cuda_runtime.h.
#include "lib/cuda/runtime.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#ifndef BLOBPIPE_WITH_CUDA
#define BLOBPIPE_WITH_CUDA 0
#endif
#if BLOBPIPE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace blobpipe::cuda::detail {
namespace {

#if BLOBPIPE_WITH_CUDA

/// Errors that mean "there is no usable device here", not "a call broke".
bool means_no_device(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
         e == cudaErrorDevicesUnavailable || e == cudaErrorSystemDriverMismatch ||
         e == cudaErrorCompatNotSupportedOnDevice;
}

/// The one checker: success, or cuda_failure naming the call (the text of
/// `expr` up to its '(') and CUDA's error string and name.
result<void> check(cudaError_t e, const char* expr) {
  if (e == cudaSuccess) return {};
  // Clears a non-sticky error so the next call on this thread starts clean
  // (a sticky one, e.g. an illegal address, stays: every later call fails).
  (void)cudaGetLastError();
  std::string msg = means_no_device(e) ? "no CUDA device: " : "";
  msg.append(expr, std::strcspn(expr, "("));
  msg += ": ";
  msg += cudaGetErrorString(e);
  msg += " (";
  msg += cudaGetErrorName(e);
  msg += ")";
  return {errc::cuda_failure, std::move(msg)};
}

#define BLOBPIPE_CUDA_CHECK(call)                                       \
  do {                                                                  \
    if (auto blobpipe_r_ = check((call), #call); !blobpipe_r_)          \
      return blobpipe_r_.err();                                         \
  } while (0)

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

class cuda_runtime_impl final : public runtime {
 public:
  const char* name() const noexcept override { return "cuda"; }

  std::string version() const override {
    int rt = 0, drv = 0;
    (void)check(cudaRuntimeGetVersion(&rt), "cudaRuntimeGetVersion");
    (void)check(cudaDriverGetVersion(&drv), "cudaDriverGetVersion");
    return "CUDA runtime " + version_text(rt) + ", " +
           (drv == 0 ? std::string("no CUDA driver") : "driver " + version_text(drv));
  }

  result<int> device_count() override {
    int n = 0;
    BLOBPIPE_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n <= 0) return {errc::cuda_failure, "no CUDA device: cudaGetDeviceCount found none"};
    return n;
  }

  result<std::string> device_name(int device) override {
    auto n = device_count();
    if (!n) return n.err();
    if (device < 0 || device >= *n)
      return {errc::invalid_argument, "CUDA device " + std::to_string(device) + " of " +
                                          std::to_string(*n)};
    cudaDeviceProp p{};
    BLOBPIPE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", double(p.totalGlobalMem) / double(1ull << 30));
    return std::string(p.name) + ", " + mem + ", sm_" + std::to_string(p.major) +
           std::to_string(p.minor);
  }

  result<int> get_device() override {
    int d = -1;
    BLOBPIPE_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }

  result<void> set_device(int device) override {
    BLOBPIPE_CUDA_CHECK(cudaSetDevice(device));
    return {};
  }

  result<pointer_info> pointer_attributes(const void* p) override {
    cudaPointerAttributes a{};
    BLOBPIPE_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
    pointer_info out;
    out.device = a.device;
    switch (a.type) {
      case cudaMemoryTypeHost: out.kind = pointer_info::type::host; break;
      case cudaMemoryTypeDevice: out.kind = pointer_info::type::device; break;
      case cudaMemoryTypeManaged: out.kind = pointer_info::type::managed; break;
      default: out.kind = pointer_info::type::unregistered; break;
    }
    return out;
  }

  result<void*> malloc_device(std::size_t n) override {
    void* p = nullptr;
    BLOBPIPE_CUDA_CHECK(cudaMalloc(&p, n));
    return p;
  }
  void free_device(void* p) noexcept override { (void)check(cudaFree(p), "cudaFree"); }

  result<void*> malloc_host(std::size_t n) override {
    void* p = nullptr;
    BLOBPIPE_CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocPortable));
    return p;
  }
  void free_host(void* p) noexcept override { (void)check(cudaFreeHost(p), "cudaFreeHost"); }

  result<void*> stream_create() override {
    cudaStream_t s = nullptr;
    BLOBPIPE_CUDA_CHECK(cudaStreamCreate(&s));
    return static_cast<void*>(s);
  }
  void stream_destroy(void* s) noexcept override {
    (void)check(cudaStreamDestroy(as_stream(s)), "cudaStreamDestroy");
  }

  result<void> memcpy_async(void* dst, const void* src, std::size_t n, void* s) override {
    BLOBPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, as_stream(s)));
    return {};
  }

  result<void> launch_host_func(void* s, host_fn fn, void* user) override {
    BLOBPIPE_CUDA_CHECK(cudaLaunchHostFunc(as_stream(s), fn, user));
    return {};
  }

  result<bool> stream_query(void* s) override {
    const cudaError_t e = cudaStreamQuery(as_stream(s));
    if (e == cudaErrorNotReady) return false;  // not an error: work is still queued
    if (auto r = check(e, "cudaStreamQuery"); !r) return r.err();
    return true;
  }

  result<void> stream_synchronize(void* s) override {
    BLOBPIPE_CUDA_CHECK(cudaStreamSynchronize(as_stream(s)));
    return {};
  }

  result<void> memcpy_sync(void* dst, const void* src, std::size_t n) override {
    BLOBPIPE_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
    BLOBPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    return {};
  }

  result<void> device_synchronize() override {
    BLOBPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    return {};
  }
};

#else  // !BLOBPIPE_WITH_CUDA

error no_cuda() {
  return make_error(errc::cuda_failure, "built without CUDA (rebuild with --config=cuda)");
}

class cuda_runtime_impl final : public runtime {
 public:
  const char* name() const noexcept override { return "none"; }
  std::string version() const override { return "built without CUDA"; }
  result<int> device_count() override { return no_cuda(); }
  result<std::string> device_name(int) override { return no_cuda(); }
  result<int> get_device() override { return no_cuda(); }
  result<void> set_device(int) override { return no_cuda(); }
  result<pointer_info> pointer_attributes(const void*) override { return no_cuda(); }
  result<void*> malloc_device(std::size_t) override { return no_cuda(); }
  void free_device(void*) noexcept override {}
  result<void*> malloc_host(std::size_t) override { return no_cuda(); }
  void free_host(void*) noexcept override {}
  result<void*> stream_create() override { return no_cuda(); }
  void stream_destroy(void*) noexcept override {}
  result<void> memcpy_async(void*, const void*, std::size_t, void*) override { return no_cuda(); }
  result<void> launch_host_func(void*, host_fn, void*) override { return no_cuda(); }
  result<bool> stream_query(void*) override { return no_cuda(); }
  result<void> stream_synchronize(void*) override { return no_cuda(); }
  result<void> memcpy_sync(void*, const void*, std::size_t) override { return no_cuda(); }
  result<void> device_synchronize() override { return no_cuda(); }
};

#endif  // BLOBPIPE_WITH_CUDA

std::atomic<runtime*>& active_slot() noexcept {
  static std::atomic<runtime*> slot{&cuda_runtime()};
  return slot;
}

}  // namespace

runtime& cuda_runtime() noexcept {
  static cuda_runtime_impl r;
  return r;
}

runtime& active() noexcept { return *active_slot().load(std::memory_order_acquire); }

void set_active(runtime& r) noexcept { active_slot().store(&r, std::memory_order_release); }

}  // namespace blobpipe::cuda::detail

namespace blobpipe::cuda {

bool built_with_cuda() noexcept { return BLOBPIPE_WITH_CUDA != 0; }

}  // namespace blobpipe::cuda
