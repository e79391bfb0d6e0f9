// blobpipe/format/memory_kind.hpp — where a value's bytes live.
//
// A `value` (blobpipe/format/layout.hpp) says whether its `data` is host memory or
// CUDA device memory, or asks the sender to find out. The format layer only
// carries the tag: plan() is the same for every kind (dtype, shape and
// offsets do not depend on where the bytes are), and write()/write_entry()
// refuse device memory (they copy with the CPU). The streaming sender
// (blobpipe/pipeline/producer.hpp) moves device bytes through pinned host buffers,
// or hands them to a transport that takes device memory itself
// (docs/cuda.md).
//
//   auto v = blobpipe::value::tensor_bytes({dev_ptr, n}, "float32", {rows, cols});
//   v.memory = blobpipe::memory_kind::cuda_device;   // or automatic
#pragma once

#include <cstdint>

namespace blobpipe {

enum class memory_kind : std::uint8_t {
  /// Host memory the CPU can read (pageable, pinned or CUDA managed).
  host = 0,
  /// CUDA device memory (cudaMalloc and friends); the CPU must not read it.
  cuda_device = 1,
  /// Ask CUDA (cudaPointerGetAttributes) at emit time. A build without CUDA,
  /// a machine without a device, and a pointer CUDA does not know (or
  /// managed memory) all count as host. Not the default because the query
  /// costs a CUDA runtime call per value (and initialises the runtime).
  automatic = 2,
};

/// "host", "cuda_device" or "automatic".
constexpr const char* memory_kind_name(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::host: return "host";
    case memory_kind::cuda_device: return "cuda_device";
    case memory_kind::automatic: return "automatic";
  }
  return "unknown";
}

}  // namespace blobpipe
