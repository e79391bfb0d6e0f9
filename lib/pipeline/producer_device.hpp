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

/// Sends the bytes of entry `pe` from device memory on `device`, after its
/// entry_begin: staged through a pinned ring, given to a transport that
/// takes device memory, or gathered (strided). Counts sender_stats
/// (bytes_sent and entries_sent too).
/// On a CUDA failure the blob is aborted (blob_abort with the CUDA message;
/// b.ended) and b.last_error says why; the connection stays up.
/// Errors: cuda_failure, invalid_argument (strided extent overflows), the
/// connection's errors.
asio::awaitable<std::error_code> send_device_bytes(std::shared_ptr<sender_state> s,
                                                   blob_state& b, const planned_entry& pe,
                                                   int device);

}  // namespace blobpipe::detail
