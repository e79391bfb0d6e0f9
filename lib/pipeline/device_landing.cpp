#include "lib/pipeline/device_landing.hpp"

#include <algorithm>
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
                             std::uint32_t chunk_bytes, bool transport_takes_device)
    : ex_(std::move(ex)),
      opt_(opt),
      chunk_bytes_(chunk_bytes),
      direct_(transport_takes_device),
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
  ++generation_;
}

asio::awaitable<result<void>> device_lander::receive(transport& t,
                                                     std::shared_ptr<const void> keep,
                                                     std::byte* dest, std::uint32_t n) {
  if (direct_) {
    if (auto ec = co_await t.receive_payload_device(std::span(dest, n), opt_.device))
      co_return error{ec, t.last_error()};
    co_return result<void>{};
  }
  // Get a free slot. A CUDA failure here still reads the payload (into
  // spill_), so the frame stream stays in step.
  result<void> cuda_ok;
  const std::size_t depth = slot_copy_.size();
  const std::size_t i = next_ % depth;
  if (!q_) {
    auto lease = cuda::staging_pool::process_default().acquire(opt_.device, chunk_bytes_, depth);
    if (lease) q_ = std::make_unique<copy_queue>(ex_, std::move(*lease));
    else cuda_ok = lease.err();
  }
  if (cuda_ok && slot_copy_[i] != 0) cuda_ok = co_await q_->wait(slot_copy_[i]);
  std::span<std::byte> into;
  if (cuda_ok) {
    into = std::span(q_->slot(i), n);
  } else {
    spill_.resize(n);
    into = spill_;
  }
  if (auto ec = co_await t.receive_payload(into)) co_return error{ec, t.last_error()};
  if (!cuda_ok) {
    drop_ring();
    co_return cuda_ok;
  }
  auto copy = q_->issue(dest, q_->slot(i), n);
  if (!copy) {
    drop_ring();
    co_return copy.err();
  }
  slot_copy_[i] = *copy;
  slot_keep_[i] = std::move(keep);
  ++next_;
  ++chunks_;
  co_return result<void>{};
}

asio::awaitable<result<void>> device_lander::drain(std::uint64_t gen) {
  if (gen != generation_)
    co_return result<void>(errc::cuda_failure,
                           "an earlier CUDA failure lost copies of this entry");
  if (direct_ || !q_) co_return result<void>{};
  auto r = co_await q_->wait(q_->issued());
  if (!r) drop_ring();
  co_return r;
}

}  // namespace blobpipe::detail
