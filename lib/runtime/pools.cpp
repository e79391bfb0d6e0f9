#include "lib/runtime/pools.hpp"

#include <bit>
#include <new>

namespace blobpipe::detail {
namespace {

std::uint64_t align_to_pool(std::uint64_t n) noexcept {
  return (n + pool_align - 1) / pool_align * pool_align;
}

}  // namespace

void aligned_free::operator()(std::byte* p) const noexcept {
  if (auto kept_by = pool.lock())
    kept_by->give_back(p, size);
  else
    std::free(p);
}

aligned_bytes allocate_aligned(std::uint64_t n) noexcept {
  const std::uint64_t size = align_to_pool(n == 0 ? 1 : n);  // aligned_alloc wants a multiple
  if (size < n) return aligned_bytes{};
  return aligned_bytes(static_cast<std::byte*>(std::aligned_alloc(pool_align, size)));
}

std::uint64_t buffer_pool::size_class(std::uint64_t n) noexcept {
  if (n < min_bytes) return n;
  // n in [2^k, 2^(k+1)) rounds up to a multiple of 2^k / 8 (a multiple
  // of pool_align, as k >= 16).
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
  const std::uint64_t size = align_to_pool(size_class(n));
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
  return aligned_bytes(static_cast<std::byte*>(std::aligned_alloc(pool_align, size)), std::move(owner));
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

}  // namespace blobpipe::detail
