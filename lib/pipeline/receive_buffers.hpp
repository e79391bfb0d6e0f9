// Where received bytes land (internal): a 64-byte aligned buffer per
// entry, a reserved address range per assembled blob, and positional
// file writes for the file sink.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "blobpipe/errors.hpp"

namespace blobpipe::detail {

class buffer_pool;

/// Frees a block, or hands it back to the pool it came from while that
/// pool still exists.
struct aligned_free {
  std::weak_ptr<buffer_pool> pool;  ///< empty: not from a pool
  std::uint64_t size = 0;           ///< the block's size, bytes (pool blocks)
  void operator()(std::byte* p) const noexcept;
};
/// A heap block aligned to ALIGN (64) bytes.
using aligned_bytes = std::unique_ptr<std::byte[], aligned_free>;

/// `n` bytes (at least one), 64-byte aligned; null when allocation fails.
aligned_bytes allocate_aligned(std::uint64_t n) noexcept;

/// Entry buffers released by their holders, kept for later entries
/// (consumer_options::recycle_bytes). The first bytes that land in a fresh
/// block cost a page fault and a zeroed page per 4 KiB, and blocks of
/// several MiB come fresh from the kernel nearly every time (the
/// allocator maps and unmaps them); a kept block costs neither.
///
/// Blocks of at least min_bytes come in size classes, eight per power of
/// two (a block is at most 12.5% larger than asked for), and are reused
/// only within their class. At most `capacity` bytes are kept; the least
/// recently returned blocks go first. Smaller requests are plain
/// allocations, which the C allocator recycles by itself.
/// Thread-safe: a block may come back on any thread.
class buffer_pool : public std::enable_shared_from_this<buffer_pool> {
 public:
  static constexpr std::uint64_t min_bytes = 64 << 10;

  explicit buffer_pool(std::uint64_t capacity) noexcept : capacity_(capacity) {}
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;
  ~buffer_pool();

  /// A block of at least `n` bytes, 64-byte aligned; null when allocation
  /// fails. `reused` says whether it is a kept one.
  aligned_bytes acquire(std::uint64_t n, bool& reused) noexcept;

  /// Bytes kept for reuse now (at most the capacity).
  std::uint64_t kept_bytes() const noexcept;

  /// The size a request for `n` bytes is rounded up to (n itself below
  /// min_bytes).
  static std::uint64_t size_class(std::uint64_t n) noexcept;

 private:
  friend struct aligned_free;
  void give_back(std::byte* p, std::uint64_t size) noexcept;

  struct kept {
    std::uint64_t size;
    std::byte* p;
  };
  mutable std::mutex mu_;
  const std::uint64_t capacity_;
  std::uint64_t kept_bytes_ = 0;
  std::list<kept> order_;  // least recently returned first
  std::multimap<std::uint64_t, std::list<kept>::iterator> by_size_;
};

/// Blocks of one fixed size kept once released, for later ones
/// (consumer_options::recycle_small_entries): a small entry's one heap
/// block (its received_entry, lease and bytes; consumer_sinks.cpp) is
/// reused without operator new or delete. A free list of its own rather
/// than buffer_pool: that one sorts blocks into size classes under a lock
/// and allocates a list node per block it keeps, which would cost what it
/// saves at this size; here every block has the same size and the free
/// list lives in the blocks themselves.
///
/// At most `capacity` blocks are kept; a block returned beyond that is
/// freed. Blocks may come back on any thread (entries are dropped on any
/// thread): they are pushed on a lock-free stack, which the owner takes
/// whole when its own list runs dry (push and take-all only, so no ABA).
/// acquire() is the owner's, one call at a time (the consumer's executor).
class block_pool {
 public:
  /// Blocks of `block_bytes` (at least a pointer's size), aligned for
  /// std::max_align_t (operator new).
  block_pool(std::size_t block_bytes, std::uint64_t capacity) noexcept
      : block_bytes_(block_bytes < sizeof(void*) ? sizeof(void*) : block_bytes),
        capacity_(capacity) {}
  block_pool(const block_pool&) = delete;
  block_pool& operator=(const block_pool&) = delete;
  ~block_pool();

  /// A block of block_bytes(): a kept one (`reused` true) or a new one.
  /// Throws std::bad_alloc. The owner's thread only.
  void* acquire(bool& reused);
  /// Keeps block `p` (from acquire) for reuse, or frees it when capacity
  /// blocks are kept already. Any thread.
  void give_back(void* p) noexcept;

  std::size_t block_bytes() const noexcept { return block_bytes_; }
  /// Blocks kept now (at most the capacity).
  std::uint64_t kept() const noexcept { return kept_.load(std::memory_order_relaxed); }

 private:
  struct free_block {
    free_block* next;
  };
  static void free_all(free_block* b) noexcept;

  const std::size_t block_bytes_;
  const std::uint64_t capacity_;
  free_block* own_ = nullptr;                 // the owner's to take from
  std::atomic<free_block*> returned_{nullptr};  // pushed by any thread
  std::atomic<std::uint64_t> kept_{0};        // in own_ and returned_
};

/// Address space for one blob under assembly. Pages are committed only
/// when bytes land (MAP_NORESERVE), and untouched pages read as zero, so
/// the pads between entries are zero without being written: the blob is
/// byte-identical to write(plan). Entries land at their final offsets, and
/// the mapping never moves, so views into it stay valid.
class reserved_region {
 public:
  /// Errors: too_large (the mapping failed; the message names errno).
  static result<std::shared_ptr<reserved_region>> make(std::uint64_t nbytes);
  reserved_region(std::byte* p, std::size_t n) noexcept : p_(p), n_(n) {}
  reserved_region(const reserved_region&) = delete;
  reserved_region& operator=(const reserved_region&) = delete;
  ~reserved_region();

  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  std::byte* p_;
  std::size_t n_;
};

/// Writes all of `bytes` at `off` of `fd` (pwrite, retried on EINTR and
/// short writes). Errors: io (the message names errno: a full disk, a
/// descriptor not open for writing).
[[nodiscard]] result<void> write_at(int fd, std::uint64_t off, std::span<const std::byte> bytes);

/// Writes `n` (< 64) zero bytes at `off`.
[[nodiscard]] result<void> write_zeros_at(int fd, std::uint64_t off, std::uint64_t n);

}  // namespace blobpipe::detail
