// blobpipe/cuda.hpp — CUDA device memory: detection, device buffers, and
// the staging options of the streaming pipeline.
//
// CUDA is optional twice over. At build time, `--config=cuda` links the CUDA
// runtime; without it this header is unchanged and every call that needs a
// device fails with errc::cuda_failure "built without CUDA". At run time,
// without a device (or driver) the same calls fail with cuda_failure and a
// message that starts "no CUDA device:" and names CUDA's reason.
//
//   if (!blobpipe::cuda::device_available()) { /* host only */ }
//   auto buf = blobpipe::cuda::device_buffer::allocate(n).value();   // cudaMalloc
//   auto v = blobpipe::value::tensor_bytes({buf.data(), n}, "float32", {n / 4});
//   v.memory = blobpipe::memory_kind::cuda_device;
//   co_await blob.emit("x", v);   // staged device -> pinned host -> transport
//
// How device bytes travel (docs/cuda.md): the sender copies a device
// value chunk by chunk (cudaMemcpyAsync on its own stream) into a ring of
// `pool_depth` pinned host buffers of `pinned_chunk_bytes` each
// (cudaHostAlloc), and sends chunk k while the copies of chunks k+1 ... are
// running. The consumer, with consumer_options::landing, receives each data
// frame into a pinned buffer and copies it to the entry's device buffer
// while the next frame is read; the entry is yielded once every copy
// finished. A transport that moves device memory itself
// (transport::accepts_device_memory(), e.g. UCX built with CUDA) gets the
// device pointers instead, with no staging.
//
// Threading: these calls may be made from any thread. Device buffers are
// plain handles: the caller orders their use with its own streams.
// Source: CUDA runtime API (cudaGetDeviceCount, cudaPointerGetAttributes,
// cudaMalloc, cudaMemcpy, cudaHostAlloc, cudaMemcpyAsync, cudaLaunchHostFunc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/format/memory_kind.hpp"

namespace blobpipe::cuda {

namespace detail {
class runtime;
}

inline constexpr std::uint32_t default_pinned_chunk_bytes = 1u << 20;  ///< 1 MiB
inline constexpr std::uint32_t default_pool_depth = 4;                 ///< buffers per ring

/// How device bytes are staged through pinned host memory.
struct staging_options {
  /// Bytes per pinned buffer, i.e. per cudaMemcpyAsync on the sender (a
  /// staged chunk goes out as data frames of at most the negotiated chunk).
  /// The consumer's buffers are one data frame each (its negotiated
  /// chunk_bytes), so it ignores this. At least 64.
  std::uint32_t pinned_chunk_bytes = default_pinned_chunk_bytes;
  /// Pinned buffers per ring: copies running ahead of the network, plus the
  /// one being sent. 2 or more overlap copy and send; 1 alternates them.
  /// At least 1.
  std::uint32_t pool_depth = default_pool_depth;
};

/// Receiving entries straight into device memory (consumer_options::landing).
/// Each selected entry gets a device buffer (cudaMalloc, freed when the
/// received_entry is released); its data frames are read into a ring of
/// `pool_depth` pinned buffers of one frame each (the negotiated
/// chunk_bytes) and copied to the device (cudaMemcpyAsync) while the next
/// frame is read. Requires assemble_mode::none.
struct landing_options {
  bool enabled = false;
  int device = 0;  ///< CUDA ordinal the entries land on
  /// Pinned buffers in the ring, at least 1; 2 or more overlap the copy of
  /// frame k with the read of frame k+1.
  std::uint32_t pool_depth = default_pool_depth;
  /// Which entries land on the device. Empty: every tensor and ndarray
  /// entry ('t', 'n'); pickles ('p') stay on the host, where they are read.
  std::function<bool(const Entry&)> select;
};

/// True when this build links the CUDA runtime (`--config=cuda`).
bool built_with_cuda() noexcept;

/// Number of CUDA devices (cudaGetDeviceCount); 0 never returns as a value.
/// Errors: cuda_failure ("built without CUDA", or "no CUDA device: " and
/// CUDA's reason, e.g. no driver loaded).
[[nodiscard]] result<int> device_count();

/// device_count() succeeded (at least one device). Never throws.
bool device_available() noexcept;

/// "NVIDIA H200, 139.8 GiB, sm_90" (cudaGetDeviceProperties).
/// Errors: cuda_failure, invalid_argument (no such device).
[[nodiscard]] result<std::string> describe_device(int device);

/// The runtime and driver versions, "CUDA runtime 13.0, driver 13.0", or
/// "built without CUDA" (cudaRuntimeGetVersion, cudaDriverGetVersion).
std::string version_string();

/// Where a value's bytes are, as the sender decides it.
struct location {
  memory_kind kind = memory_kind::host;  ///< host or cuda_device, never automatic
  int device = -1;                       ///< CUDA ordinal for cuda_device
};

/// Resolves a value's declared memory kind for pointer `p`:
/// - host: host, with no CUDA call;
/// - automatic: cudaPointerGetAttributes; device memory is cuda_device,
///   anything else is host, and so is any failure of the query (no CUDA in
///   the build, no device, no driver) and a null `p`;
/// - cuda_device: needs a device; `p` must be device (or managed) memory.
/// Errors (cuda_device only): cuda_failure ("built without CUDA", "no CUDA
/// device: ...", or the failing call), invalid_argument (CUDA reports `p` as
/// host memory).
[[nodiscard]] result<location> locate(const void* p, memory_kind declared);

/// Device memory from cudaMalloc, freed (cudaFree) by the destructor.
/// Move-only; an empty buffer (size 0, null data) owns nothing.
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(device_buffer&& o) noexcept;
  device_buffer& operator=(device_buffer&& o) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer();

  /// `nbytes` on `device` (cudaSetDevice, cudaMalloc; the calling thread's
  /// current device is restored). nbytes 0 gives an empty buffer.
  /// Errors: cuda_failure (no device, out of memory: the message names the
  /// call and CUDA's error string), invalid_argument (no such device).
  [[nodiscard]] static result<device_buffer> allocate(std::uint64_t nbytes, int device = 0);

  std::byte* data() const noexcept { return p_; }
  std::uint64_t size() const noexcept { return n_; }
  int device() const noexcept { return device_; }

  /// Copies `src` to bytes [offset, offset + src.size()) and returns once
  /// they are in place (cudaMemcpy, cudaDeviceSynchronize). For setup,
  /// tests and benchmarks. Errors: invalid_argument (range past the end),
  /// cuda_failure.
  [[nodiscard]] result<void> copy_from_host(std::span<const std::byte> src,
                                            std::uint64_t offset = 0);
  /// Copies bytes [offset, offset + dst.size()) into `dst` (cudaMemcpy).
  /// Errors: invalid_argument (range past the end), cuda_failure.
  [[nodiscard]] result<void> copy_to_host(std::span<std::byte> dst,
                                          std::uint64_t offset = 0) const;

 private:
  device_buffer(detail::runtime* rt, std::byte* p, std::uint64_t n, int device) noexcept
      : rt_(rt), p_(p), n_(n), device_(device) {}
  void release() noexcept;
  detail::runtime* rt_ = nullptr;  // the runtime that allocated it
  std::byte* p_ = nullptr;
  std::uint64_t n_ = 0;
  int device_ = -1;
};

/// A received entry that landed in device memory (consumer_options::landing).
/// The bytes are complete when the entry is yielded: every host-to-device
/// copy has finished, so any stream may read them.
struct device_view {
  const Entry* entry = nullptr;  ///< the row (offsets from blob start)
  std::byte* data = nullptr;     ///< device pointer; null when nbytes == 0
  std::uint64_t nbytes = 0;      ///< == entry->len
  int device = -1;               ///< CUDA ordinal
  dtype type;                    ///< parsed dtype ('p': uint8 placeholder)
  shape_t shape;                 ///< elements
};

}  // namespace blobpipe::cuda
