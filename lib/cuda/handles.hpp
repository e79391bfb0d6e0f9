// RAII handles for CUDA streams and pinned host buffers (internal; the
// public device_buffer is in blobpipe/cuda.hpp). Move-only; each releases
// its handle in its destructor, which never throws.
#pragma once

#include <cstddef>
#include <utility>

#include "blobpipe/errors.hpp"
#include "lib/cuda/runtime.hpp"

namespace blobpipe::cuda {

/// A stream of one device (cudaStreamCreate; cudaStreamDestroy when
/// dropped, which lets queued work finish). Operations make the stream's
/// device current for the call and restore the caller's.
class stream {
 public:
  stream() = default;
  stream(stream&& o) noexcept
      : rt_(o.rt_), s_(std::exchange(o.s_, nullptr)), device_(o.device_) {}
  stream& operator=(stream&& o) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream();

  /// Errors: cuda_failure.
  [[nodiscard]] static result<stream> create(int device);

  int device() const noexcept { return device_; }
  const detail::runtime* runtime() const noexcept { return rt_; }
  explicit operator bool() const noexcept { return s_ != nullptr; }

  /// cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, this).
  [[nodiscard]] result<void> copy_async(void* dst, const void* src, std::size_t n);
  /// cudaLaunchHostFunc: `fn(user)` runs on a CUDA thread after the work
  /// queued before it; it is not called if the stream has failed.
  [[nodiscard]] result<void> launch_host_func(detail::host_fn fn, void* user);
  /// cudaStreamQuery: true when all queued work is done.
  /// Errors: cuda_failure (the stream's work failed).
  [[nodiscard]] result<bool> query();
  /// cudaStreamSynchronize. Errors: cuda_failure.
  [[nodiscard]] result<void> synchronize();

 private:
  stream(detail::runtime* rt, void* s, int device) noexcept : rt_(rt), s_(s), device_(device) {}
  detail::runtime* rt_ = nullptr;  // the runtime that made it (tests may switch)
  void* s_ = nullptr;              // cudaStream_t
  int device_ = -1;
};

/// Page-locked host memory (cudaHostAlloc with cudaHostAllocPortable:
/// usable with every device; cudaFreeHost when dropped). The DMA engine
/// reads and writes it directly, which is what lets a copy run
/// asynchronously beside the CPU.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(pinned_buffer&& o) noexcept
      : rt_(o.rt_), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer();

  /// Errors: cuda_failure (no device, out of pinned memory).
  [[nodiscard]] static result<pinned_buffer> allocate(std::size_t nbytes);

  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  pinned_buffer(detail::runtime* rt, std::byte* p, std::size_t n) noexcept
      : rt_(rt), p_(p), n_(n) {}
  detail::runtime* rt_ = nullptr;
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Copies `n` bytes between any two of host and device memory and returns
/// once they are in place (cudaMemcpy with cudaMemcpyDefault, then
/// cudaDeviceSynchronize). Blocks the calling thread. Errors: cuda_failure.
[[nodiscard]] result<void> copy_sync(void* dst, const void* src, std::size_t n);

}  // namespace blobpipe::cuda
