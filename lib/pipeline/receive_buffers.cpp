#include "lib/pipeline/receive_buffers.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/layout.hpp"

namespace blobpipe::detail {

void aligned_free::operator()(std::byte* p) const noexcept {
  if (auto kept_by = pool.lock())
    kept_by->give_back(p, size);
  else
    std::free(p);
}

aligned_bytes allocate_aligned(std::uint64_t n) noexcept {
  const std::uint64_t size = align_up(n == 0 ? 1 : n);  // aligned_alloc wants a multiple
  if (size < n) return aligned_bytes{};
  return aligned_bytes(static_cast<std::byte*>(std::aligned_alloc(ALIGN, size)));
}

std::uint64_t buffer_pool::size_class(std::uint64_t n) noexcept {
  if (n < min_bytes) return n;
  // n in [2^k, 2^(k+1)) rounds up to a multiple of 2^k / 8 (a multiple
  // of ALIGN, as k >= 16).
  const std::uint64_t step = std::bit_floor(n) / 8;
  const std::uint64_t up = (n + step - 1) / step * step;
  return up < n ? n : up;  // (no class above 2^63: n itself)
}

buffer_pool::~buffer_pool() {
  for (const kept& k : order_) std::free(k.p);
}

aligned_bytes buffer_pool::acquire(std::uint64_t n, bool& reused) noexcept {
  reused = false;
  if (n < min_bytes || capacity_ == 0) return allocate_aligned(n);
  const std::uint64_t size = align_up(size_class(n));
  if (size < n) return aligned_bytes{};
  aligned_free owner{weak_from_this(), size};
  {
    std::lock_guard lock(mu_);
    // The most recently returned block of the class: its pages are the
    // likeliest to be in cache.
    if (auto it = by_size_.upper_bound(size);
        it != by_size_.begin() && (--it)->first == size) {
      std::byte* p = it->second->p;
      order_.erase(it->second);
      by_size_.erase(it);
      kept_bytes_ -= size;
      reused = true;
      return aligned_bytes(p, std::move(owner));
    }
  }
  return aligned_bytes(static_cast<std::byte*>(std::aligned_alloc(ALIGN, size)), std::move(owner));
}

void buffer_pool::give_back(std::byte* p, std::uint64_t size) noexcept {
  if (p == nullptr) return;
  // Blocks leaving the pool are freed after the lock is released, so a
  // thread dropping an entry never holds up the consumer's next acquire
  // with a free() (which may unmap megabytes).
  std::list<kept> evicted;
  {
    std::lock_guard lock(mu_);
    if (size <= capacity_) {  // else not kept: freed below
      try {
        order_.push_back({size, p});
        by_size_.emplace(size, std::prev(order_.end()));
        kept_bytes_ += size;
        p = nullptr;
      } catch (...) {  // no memory for the bookkeeping: free the block instead
        if (!order_.empty() && order_.back().p == p) order_.pop_back();
      }
    }
    while (kept_bytes_ > capacity_) {  // the least recently returned go first
      const auto oldest = order_.begin();
      auto [lo, hi] = by_size_.equal_range(oldest->size);
      for (auto it = lo; it != hi; ++it) {
        if (it->second == oldest) {
          by_size_.erase(it);
          break;
        }
      }
      kept_bytes_ -= oldest->size;
      evicted.splice(evicted.end(), order_, oldest);
    }
  }
  std::free(p);
  for (const kept& k : evicted) std::free(k.p);
}

std::uint64_t buffer_pool::kept_bytes() const noexcept {
  std::lock_guard lock(mu_);
  return kept_bytes_;
}

void block_pool::free_all(free_block* b) noexcept {
  while (b != nullptr) {
    free_block* next = b->next;
    ::operator delete(static_cast<void*>(b));
    b = next;
  }
}

block_pool::~block_pool() {
  free_all(own_);
  free_all(returned_.load(std::memory_order_acquire));
}

void* block_pool::acquire(bool& reused) {
  if (own_ == nullptr) own_ = returned_.exchange(nullptr, std::memory_order_acquire);
  if (own_ != nullptr) {
    free_block* b = own_;
    own_ = b->next;
    kept_.fetch_sub(1, std::memory_order_relaxed);
    reused = true;
    b->~free_block();
    return b;
  }
  reused = false;
  return ::operator new(block_bytes_);
}

void block_pool::give_back(void* p) noexcept {
  if (p == nullptr) return;
  // A slot among the kept ones, or the block goes.
  if (kept_.fetch_add(1, std::memory_order_relaxed) >= capacity_) {
    kept_.fetch_sub(1, std::memory_order_relaxed);
    ::operator delete(p);
    return;
  }
  auto* b = ::new (p) free_block{returned_.load(std::memory_order_relaxed)};
  // Release: the owner that takes the stack sees each block's `next`.
  while (!returned_.compare_exchange_weak(b->next, b, std::memory_order_release,
                                          std::memory_order_relaxed)) {
  }
}

result<std::shared_ptr<reserved_region>> reserved_region::make(std::uint64_t nbytes) {
  void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return {errc::too_large, "assembly buffer: mmap of " + std::to_string(nbytes) +
                                 " bytes failed: " + std::strerror(errno)};
  return std::make_shared<reserved_region>(static_cast<std::byte*>(p), nbytes);
}

reserved_region::~reserved_region() { ::munmap(p_, n_); }

result<void> write_at(int fd, std::uint64_t off, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return {errc::io, std::string("file sink: pwrite failed: ") + std::strerror(errno)};
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    off += static_cast<std::uint64_t>(n);
  }
  return {};
}

result<void> write_zeros_at(int fd, std::uint64_t off, std::uint64_t n) {
  static constexpr std::array<std::byte, ALIGN> zeros{};
  return write_at(fd, off, std::span(zeros).first(static_cast<std::size_t>(n)));
}

}  // namespace blobpipe::detail
