// Landing received entries in CUDA device memory (internal; the
// consumer's half of docs/cuda.md, consumer_options::landing).
//
// An entry selected for the device is received like any other, into a
// host buffer from the consumer's pool, by the push decoder. Once its last
// byte is in, upload() copies it to its device buffer through one pinned
// ring per connection (`pool_depth` slots of `chunk_bytes` each): chunk k
// is copied into slot k % depth and its host-to-device copy
// (cudaMemcpyAsync) queued at once, a slot being reused only after its
// previous copy is done; then upload() waits for the copies (the stream
// runs them in order) and the entry is yielded with a device view. The
// network goes on receiving the next entries meanwhile.
//
// Failures: a CUDA error is reported for the entry at hand (its blob is
// aborted by the caller) and the ring is replaced.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/cuda.hpp"
#include <span>
#include "lib/pipeline/device_copies.hpp"

namespace blobpipe::detail {

class device_lander {
 public:
  /// Checks consumer_options::landing before the handshake.
  /// Errors: invalid_argument (assemble mode not none, pool_depth 0, no
  /// such device), cuda_failure (no device: built without CUDA, no driver).
  [[nodiscard]] static result<void> check(const consumer_options& opt);

  /// REQUIRES: check(opt) passed. `chunk_bytes`: the size of a ring slot.
  device_lander(asio::any_io_executor ex, const cuda::landing_options& opt,
                std::uint32_t chunk_bytes);
  device_lander(const device_lander&) = delete;
  device_lander& operator=(const device_lander&) = delete;
  ~device_lander();

  int device() const noexcept { return opt_.device; }
  bool selects(const Entry& e) const;

  /// The device buffer for an entry of `len` bytes (cudaMalloc).
  /// Errors: cuda_failure.
  [[nodiscard]] result<std::shared_ptr<cuda::device_buffer>> allocate(std::uint64_t len);

  /// Copies `host` to `dest` (device memory inside `*keep`, which stays
  /// alive until the copies are done, even if the entry is dropped first)
  /// and waits until every copy is done.
  /// Errors: cuda_failure (the ring is replaced).
  asio::awaitable<result<void>> upload(std::span<const std::byte> host,
                                       std::shared_ptr<const void> keep, std::byte* dest);

  std::uint64_t chunks() const noexcept { return chunks_; }

 private:
  void drop_ring() noexcept;

  asio::any_io_executor ex_;
  cuda::landing_options opt_;
  std::uint32_t chunk_bytes_;
  std::uint64_t next_ = 0;    // copies queued on this ring: slot next_ % depth is next
  std::uint64_t chunks_ = 0;  // copies queued, all rings
  // Per slot: the number of its last copy (0: none) and that copy's
  // destination keep-alive. Declared before q_, so q_'s destructor (which
  // waits for the stream) runs before the destinations may be freed.
  std::vector<std::uint64_t> slot_copy_;
  std::vector<std::shared_ptr<const void>> slot_keep_;
  std::unique_ptr<copy_queue> q_;
};

}  // namespace blobpipe::detail
