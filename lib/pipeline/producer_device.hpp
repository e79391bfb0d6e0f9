// The sender's device-memory steps (internal), called from
// blob_writer::emit: where a value lives, and how a device entry's bytes
// go out (lib/pipeline/device_send.hpp). docs/cuda.md "Producer".
#pragma once

#include <memory>
#include <system_error>

#include <asio/awaitable.hpp>

#include "blobpipe/cuda.hpp"
#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/sender_state.hpp"

namespace blobpipe::detail {

/// Where `v`'s bytes are (cuda::locate on v.data, v.memory), and for device
/// memory a check of the sender's staging options. Runs before the entry is
/// planned, so a failure leaves the blob usable.
/// Errors: cuda_failure (declared cuda_device with no device, no driver, or
/// built without CUDA), invalid_argument (staging options out of range;
/// CUDA reports declared device memory as host memory).
[[nodiscard]] result<cuda::location> locate_value(const sender_state& s, const value& v);

/// Sends entry `pe` of blob `b` whose bytes are in device memory on
/// `device`, through the same session call as a host entry
/// (sender_session::add_entry, stamped with `emitted_ns` like host
/// entries, always in data frames) and the one chunk loop (send_chunks):
/// staged through a pinned ring, given to a transport that takes device
/// memory, or gathered (strided). Counts the device statistics.
/// On a CUDA failure the blob is aborted (blob_abort with the CUDA
/// message) and b.last_error says why; the connection stays up.
/// Errors: cuda_failure, invalid_argument (strided extent overflows), the
/// connection's errors.
asio::awaitable<std::error_code> send_device_value(std::shared_ptr<sender_state> s,
                                                   std::shared_ptr<send_queue> q, blob_state& b,
                                                   const planned_entry& pe,
                                                   std::span<const std::byte> meta, int device,
                                                   std::uint64_t emitted_ns);

}  // namespace blobpipe::detail
