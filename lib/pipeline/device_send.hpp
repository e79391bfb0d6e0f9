// Sending an entry whose bytes are in CUDA device memory (internal; the
// sender's half of docs/cuda.md).
//
// Three ways, picked in this order:
// - strided value: one synchronous copy of the span of memory it touches
//   to the host, gathered there with write_entry (like a strided host
//   value), then sent as host bytes;
// - the transport accepts device memory (transport::accepts_device_memory):
//   the device pointer goes to it frame by frame, no staging;
// - otherwise staging: the entry is cut into chunks of pinned_chunk_bytes;
//   chunk k is copied device-to-host (cudaMemcpyAsync) into slot k % depth
//   of a pinned ring, and sent (as data frames) once its copy is done. The
//   copies of chunks k+1 ... k+depth-1 are queued before chunk k is sent, so
//   the copy engine works while the network does; the copy of chunk
//   k+depth reuses slot k % depth and is queued as soon as chunk k is sent.
//
// The plan is the host plan: offsets, dtype and shape do not depend on
// where the bytes are. Only the bytes' route differs.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <system_error>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/cuda.hpp"
#include "blobpipe/format/layout.hpp"
#include "lib/cuda/staging.hpp"

namespace blobpipe::detail {

/// Sends `bytes` as the data frames of blob offsets [off, off + size):
/// host memory when `device` < 0, else device memory of that ordinal (only
/// for a transport that accepts it). Errors: the connection's.
using send_range_fn = std::function<asio::awaitable<std::error_code>(
    std::uint64_t off, std::span<const std::byte> bytes, int device)>;

/// What the device path did, for sender_stats.
struct device_send_report {
  bool staged = false;       ///< went through the pinned ring
  bool direct = false;       ///< handed to the transport as device memory
  bool gathered = false;     ///< strided: copied to the host and gathered
  std::uint64_t chunks = 0;  ///< device-to-host copies queued
  std::uint64_t prefetch_high_water = 0;  ///< most copies not yet done as a chunk was sent
};

/// Copies the e.len bytes of `pe` (device memory, contiguous or strided)
/// into host memory `out`, synchronously (resend sessions keep them).
/// Errors: cuda_failure, buffer_too_small (out is not e.len bytes),
/// invalid_argument (a strided extent that overflows).
[[nodiscard]] result<void> read_device_entry(const planned_entry& pe, std::span<std::byte> out);

/// Sends the bytes of `pe` (device memory on `device`; entry_begin already
/// sent) through `send`.
/// Errors: cuda_failure (a copy or a CUDA call failed; bytes of the entry
/// may be on the wire already), errors of `send` (the connection failed),
/// invalid_argument (a strided value whose extent overflows).
asio::awaitable<result<void>> send_device_entry(asio::any_io_executor ex,
                                                cuda::staging_pool& pool,
                                                const cuda::staging_options& opt,
                                                bool transport_takes_device,
                                                const planned_entry& pe, int device,
                                                const send_range_fn& send,
                                                device_send_report& report);

}  // namespace blobpipe::detail
