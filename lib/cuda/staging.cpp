#include "lib/cuda/staging.hpp"

#include <algorithm>

namespace blobpipe::cuda {

namespace detail {
struct pool_state {
  explicit pool_state(std::size_t max) : max_idle(max) {}
  const std::size_t max_idle;
  mutable std::mutex m;
  std::vector<std::unique_ptr<staging_ring>> idle;
  std::size_t created = 0;
};
}  // namespace detail

// ---- staging_ring ----

result<std::unique_ptr<staging_ring>> staging_ring::create(int device, std::size_t slot_bytes,
                                                           std::size_t depth) {
  if (slot_bytes == 0 || depth == 0)
    return {errc::invalid_argument, "staging ring: slot size and depth must be positive"};
  auto s = stream::create(device);
  if (!s) return s.err();
  std::vector<pinned_buffer> slots;
  slots.reserve(depth);
  for (std::size_t i = 0; i < depth; ++i) {
    auto b = pinned_buffer::allocate(slot_bytes);
    if (!b) return b.err();
    slots.push_back(std::move(*b));
  }
  return std::make_unique<staging_ring>(private_tag{}, device, slot_bytes, std::move(*s),
                                        std::move(slots));
}

staging_ring::~staging_ring() {
  if (stream_) (void)stream_.synchronize();
}

// ---- ring_lease ----

void ring_lease::give_back() noexcept {
  if (!ring_) return;
  // Only an idle, healthy ring goes back: a failed stream stays failed.
  const bool healthy = ring_->get_stream().synchronize().has_value();
  if (pool_ && healthy) {
    try {
      std::lock_guard l(pool_->m);
      if (pool_->idle.size() < pool_->max_idle) pool_->idle.push_back(std::move(ring_));
    } catch (...) {  // bad_alloc growing the list: the ring is simply freed
    }
  }
  ring_.reset();
  pool_.reset();
}

ring_lease& ring_lease::operator=(ring_lease&& o) noexcept {
  if (this != &o) {
    give_back();
    pool_ = std::move(o.pool_);
    ring_ = std::move(o.ring_);
  }
  return *this;
}

ring_lease::~ring_lease() { give_back(); }

// ---- staging_pool ----

staging_pool::staging_pool(std::size_t max_idle)
    : s_(std::make_shared<detail::pool_state>(max_idle)) {}

staging_pool& staging_pool::process_default() {
  // Never destroyed, on purpose: at exit the CUDA runtime may be torn down
  // before a static pool would be (its teardown is registered when it
  // initialises, after the pool exists), and freeing pinned memory then
  // fails or worse. The OS takes the memory back at exit anyway.
  static staging_pool* const pool = std::make_unique<staging_pool>().release();
  return *pool;
}

result<ring_lease> staging_pool::acquire(int device, std::size_t slot_bytes, std::size_t depth) {
  {
    std::lock_guard l(s_->m);
    const detail::runtime* rt = &detail::active();
    auto it = std::find_if(s_->idle.begin(), s_->idle.end(), [&](const auto& r) {
      return r->runtime() == rt && r->device() == device && r->slot_bytes() == slot_bytes &&
             r->depth() == depth;
    });
    if (it != s_->idle.end()) {
      auto r = std::move(*it);
      s_->idle.erase(it);
      return ring_lease(s_, std::move(r));
    }
  }
  auto r = staging_ring::create(device, slot_bytes, depth);
  if (!r) return r.err();
  std::lock_guard l(s_->m);
  ++s_->created;
  return ring_lease(s_, std::move(*r));
}

std::size_t staging_pool::idle_rings() const {
  std::lock_guard l(s_->m);
  return s_->idle.size();
}

std::size_t staging_pool::rings_created() const {
  std::lock_guard l(s_->m);
  return s_->created;
}

}  // namespace blobpipe::cuda
