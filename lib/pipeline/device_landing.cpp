#include "lib/pipeline/device_landing.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "lib/cuda/staging.hpp"

namespace blobpipe::detail {

result<void> device_lander::check(const consumer_options& opt) {
  const auto& l = opt.landing;
  if (!l.enabled) return {};
  if (opt.assemble != assemble_mode::none)
    return {errc::invalid_argument, "consumer_options::landing needs assemble_mode::none"};
  if (l.pool_depth == 0)
    return {errc::invalid_argument, "consumer_options::landing: pool_depth must be >= 1"};
  auto n = cuda::device_count();
  if (!n) return n.err();
  if (l.device < 0 || l.device >= *n)
    return {errc::invalid_argument, "consumer_options::landing: CUDA device " +
                                        std::to_string(l.device) + " of " + std::to_string(*n)};
  return {};
}

device_lander::device_lander(asio::any_io_executor ex, const cuda::landing_options& opt,
                             std::uint32_t chunk_bytes)
    : ex_(std::move(ex)),
      opt_(opt),
      chunk_bytes_(chunk_bytes),
      slot_copy_(opt.pool_depth, 0),
      slot_keep_(opt.pool_depth) {}

device_lander::~device_lander() { q_.reset(); }  // waits for the stream, then frees

bool device_lander::selects(const Entry& e) const {
  if (opt_.select) return opt_.select(e);
  return e.kind != KIND_PICKLE;
}

result<std::shared_ptr<cuda::device_buffer>> device_lander::allocate(std::uint64_t len) {
  auto b = cuda::device_buffer::allocate(len, opt_.device);
  if (!b) return b.err();
  return std::make_shared<cuda::device_buffer>(std::move(*b));
}

void device_lander::drop_ring() noexcept {
  q_.reset();  // a failed stream runs nothing more; this returns at once
  std::fill(slot_copy_.begin(), slot_copy_.end(), 0);
  for (auto& k : slot_keep_) k.reset();
  next_ = 0;
}

asio::awaitable<result<void>> device_lander::upload(std::span<const std::byte> host,
                                                    std::shared_ptr<const void> keep,
                                                    std::byte* dest) {
  const std::size_t depth = slot_copy_.size();
  for (std::size_t pos = 0; pos < host.size();) {
    if (!q_) {
      auto lease = cuda::staging_pool::process_default().acquire(opt_.device, chunk_bytes_, depth);
      if (!lease) co_return lease.err();
      q_ = std::make_unique<copy_queue>(ex_, std::move(*lease));
    }
    const std::size_t i = next_ % depth;
    if (slot_copy_[i] != 0) {
      auto free = co_await q_->wait(slot_copy_[i]);
      if (!free) {
        drop_ring();
        co_return free;
      }
    }
    const std::size_t n = std::min<std::size_t>(chunk_bytes_, host.size() - pos);
    std::memcpy(q_->slot(i), host.data() + pos, n);
    auto copy = q_->issue(dest + pos, q_->slot(i), n);
    if (!copy) {
      drop_ring();
      co_return copy.err();
    }
    slot_copy_[i] = *copy;
    slot_keep_[i] = keep;
    ++next_;
    ++chunks_;
    pos += n;
  }
  if (!q_) co_return result<void>{};
  auto done = co_await q_->wait(q_->issued());
  if (!done) drop_ring();
  co_return done;
}

}  // namespace blobpipe::detail
