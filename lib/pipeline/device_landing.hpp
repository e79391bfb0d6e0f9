// Landing received entries in CUDA device memory (internal; the
// consumer's half of docs/cuda.md, consumer_options::landing).
//
// One pinned ring per connection, `pool_depth` slots of one data frame
// each. Frame k is read into slot k % depth and its host-to-device copy
// (cudaMemcpyAsync) queued at once; the read of frame k+1 then overlaps
// that copy. A slot is reused only after its previous copy is done. When an
// entry's last frame is in, drain() waits for the copies queued so far
// (the stream runs them in order), and the entry is yielded with a device
// view. The ring is shared by every blob of the connection: frames arrive
// one at a time, whichever blob they belong to.
//
// A transport that accepts device memory gets the device destination
// instead (receive_payload_device), with no ring.
//
// Failures: a CUDA error is reported for the entry at hand (its blob is
// aborted by the caller); the ring is replaced, and entries that had
// copies queued on the failed ring fail at drain() too (generation check).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/cuda.hpp"
#include "blobpipe/transport/transport.hpp"
#include "lib/pipeline/device_copies.hpp"

namespace blobpipe::detail {

class device_lander {
 public:
  /// Checks consumer_options::landing before the handshake.
  /// Errors: invalid_argument (assemble mode not none, pool_depth 0, no
  /// such device), cuda_failure (no device: built without CUDA, no driver).
  [[nodiscard]] static result<void> check(const consumer_options& opt);

  /// REQUIRES: check(opt) passed. `chunk_bytes`: the negotiated frame size.
  device_lander(asio::any_io_executor ex, const cuda::landing_options& opt,
                std::uint32_t chunk_bytes, bool transport_takes_device);
  device_lander(const device_lander&) = delete;
  device_lander& operator=(const device_lander&) = delete;
  ~device_lander();

  int device() const noexcept { return opt_.device; }
  bool selects(const Entry& e) const;

  /// The device buffer for an entry of `len` bytes (cudaMalloc).
  /// Errors: cuda_failure.
  [[nodiscard]] result<std::shared_ptr<cuda::device_buffer>> allocate(std::uint64_t len);

  /// Ring generation: drain(gen) fails for an entry begun on a ring that
  /// failed since.
  std::uint64_t generation() const noexcept { return generation_; }

  /// Reads one data frame's payload (`n` bytes) into a pinned slot and
  /// queues its copy to `dest` (device memory inside `*keep`, which stays
  /// alive until the copy is done, even if the entry is dropped first).
  /// Errors: cuda_failure (the payload was still read: the frame stream
  /// stays in step; the entry's blob must be aborted); any other code is
  /// the transport's, the payload is not read, and the stream is over.
  asio::awaitable<result<void>> receive(transport& t, std::shared_ptr<const void> keep,
                                        std::byte* dest, std::uint32_t n);

  /// Waits until every copy queued so far is done.
  /// Errors: cuda_failure (a copy failed, or the ring of generation `gen`
  /// was replaced after a failure).
  asio::awaitable<result<void>> drain(std::uint64_t gen);

  std::uint64_t chunks() const noexcept { return chunks_; }

 private:
  void drop_ring() noexcept;

  asio::any_io_executor ex_;
  cuda::landing_options opt_;
  std::uint32_t chunk_bytes_;
  bool direct_;
  std::uint64_t generation_ = 0;
  std::uint64_t next_ = 0;    // frames queued on this ring: slot next_ % depth is next
  std::uint64_t chunks_ = 0;  // copies queued, all rings
  std::vector<std::byte> spill_;  // a payload read while the ring is unusable
  // Per slot: the number of its last copy (0: none) and that copy's
  // destination keep-alive. Declared before q_, so q_'s destructor (which
  // waits for the stream) runs before the destinations may be freed.
  std::vector<std::uint64_t> slot_copy_;
  std::vector<std::shared_ptr<const void>> slot_keep_;
  std::unique_ptr<copy_queue> q_;
};

}  // namespace blobpipe::detail
