// Staging rings and their pool (internal): the pinned host buffers that
// device bytes pass through on their way to or from a transport.
//
// A ring is `depth` pinned buffers ("slots") of `slot_bytes` each and one
// stream that runs the copies into or out of them. The pipeline
// (lib/pipeline/device_copies.hpp) cycles through the slots: while slot k
// is on the network, the copies for slots k+1 ... run on the stream.
// cudaHostAlloc is slow (it maps and locks pages), so rings are kept in a
// pool and lent out per entry.
//
//   cuda::staging_pool pool;
//   auto ring = pool.acquire(device, 1 << 20, 4).value();
//   ring->get_stream().copy_async(ring->slot(0), dev_ptr, n).value();
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "blobpipe/errors.hpp"
#include "lib/cuda/handles.hpp"

namespace blobpipe::cuda {

class staging_ring {
  struct private_tag {
    explicit private_tag() = default;
  };

 public:
  /// `depth` (>= 1) slots of `slot_bytes` (>= 1) pinned bytes and a stream
  /// on `device`. Errors: cuda_failure, invalid_argument (zero sizes).
  [[nodiscard]] static result<std::unique_ptr<staging_ring>> create(int device,
                                                                    std::size_t slot_bytes,
                                                                    std::size_t depth);
  /// Use create(); public only so make_unique can reach it (the tag is private).
  staging_ring(private_tag, int device, std::size_t slot_bytes, stream s,
               std::vector<pinned_buffer> slots)
      : device_(device), slot_bytes_(slot_bytes), stream_(std::move(s)), slots_(std::move(slots)) {}
  staging_ring(const staging_ring&) = delete;
  staging_ring& operator=(const staging_ring&) = delete;
  /// Waits for the stream first: a slot may still be the target of a copy.
  ~staging_ring();

  int device() const noexcept { return device_; }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  std::size_t depth() const noexcept { return slots_.size(); }
  std::byte* slot(std::size_t i) const noexcept { return slots_[i].data(); }
  stream& get_stream() noexcept { return stream_; }
  /// The runtime its stream and slots came from (tests switch runtimes).
  const detail::runtime* runtime() const noexcept { return stream_.runtime(); }

 private:
  int device_;
  std::size_t slot_bytes_;
  // Acquisition order: the stream, then the slots it fills. The destructor
  // synchronises before either goes.
  stream stream_;
  std::vector<pinned_buffer> slots_;
};

namespace detail {
struct pool_state;
}

/// A ring borrowed from a staging_pool. Dropping it returns the ring once
/// its stream is idle (cudaStreamSynchronize), or destroys it when the
/// stream failed. Move-only.
class ring_lease {
 public:
  ring_lease() = default;
  ring_lease(ring_lease&&) noexcept = default;
  ring_lease& operator=(ring_lease&& o) noexcept;
  ring_lease(const ring_lease&) = delete;
  ring_lease& operator=(const ring_lease&) = delete;
  ~ring_lease();

  staging_ring& operator*() const noexcept { return *ring_; }
  staging_ring* operator->() const noexcept { return ring_.get(); }
  explicit operator bool() const noexcept { return ring_ != nullptr; }

 private:
  friend class staging_pool;
  ring_lease(std::shared_ptr<detail::pool_state> pool, std::unique_ptr<staging_ring> r)
      : pool_(std::move(pool)), ring_(std::move(r)) {}
  void give_back() noexcept;
  std::shared_ptr<detail::pool_state> pool_;
  std::unique_ptr<staging_ring> ring_;
};

/// Rings kept for reuse, matched by device, slot size and depth. A pool
/// lends as many rings as are asked for at once (one per entry being
/// staged) and keeps up to `max_idle` of them for reuse; more are freed as
/// they come back. Thread-safe.
class staging_pool {
 public:
  static constexpr std::size_t default_max_idle = 16;
  explicit staging_pool(std::size_t max_idle = default_max_idle);
  /// The pool every sender and consumer of this process shares.
  static staging_pool& process_default();
  /// A ring from the pool, or a new one. Errors: those of staging_ring::create.
  [[nodiscard]] result<ring_lease> acquire(int device, std::size_t slot_bytes, std::size_t depth);
  std::size_t idle_rings() const;
  std::size_t rings_created() const;

 private:
  std::shared_ptr<detail::pool_state> s_;
};

}  // namespace blobpipe::cuda
