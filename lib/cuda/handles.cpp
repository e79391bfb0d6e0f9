#include "lib/cuda/handles.hpp"

namespace blobpipe::cuda {
namespace detail {

device_guard::~device_guard() {
  if (previous_ >= 0) (void)active().set_device(previous_);
}

result<void> device_guard::enter(int device) {
  auto& rt = active();
  auto cur = rt.get_device();
  if (!cur) return cur.err();
  if (*cur == device) return {};
  if (auto r = rt.set_device(device); !r) return r;
  previous_ = *cur;
  return {};
}

}  // namespace detail

// ---- stream ----

stream& stream::operator=(stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) rt_->stream_destroy(s_);
    rt_ = o.rt_;
    s_ = std::exchange(o.s_, nullptr);
    device_ = o.device_;
  }
  return *this;
}

stream::~stream() {
  if (s_ != nullptr) rt_->stream_destroy(s_);
}

result<stream> stream::create(int device) {
  detail::device_guard g;
  if (auto r = g.enter(device); !r) return r.err();
  auto& rt = detail::active();
  auto s = rt.stream_create();
  if (!s) return s.err();
  return stream(&rt, *s, device);
}

result<void> stream::copy_async(void* dst, const void* src, std::size_t n) {
  detail::device_guard g;
  if (auto r = g.enter(device_); !r) return r;
  return rt_->memcpy_async(dst, src, n, s_);
}

result<void> stream::launch_host_func(detail::host_fn fn, void* user) {
  detail::device_guard g;
  if (auto r = g.enter(device_); !r) return r;
  return rt_->launch_host_func(s_, fn, user);
}

result<bool> stream::query() { return rt_->stream_query(s_); }

result<void> stream::synchronize() { return rt_->stream_synchronize(s_); }

// ---- pinned_buffer ----

pinned_buffer& pinned_buffer::operator=(pinned_buffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) rt_->free_host(p_);
    rt_ = o.rt_;
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

pinned_buffer::~pinned_buffer() {
  if (p_ != nullptr) rt_->free_host(p_);
}

result<pinned_buffer> pinned_buffer::allocate(std::size_t nbytes) {
  auto& rt = detail::active();
  auto p = rt.malloc_host(nbytes == 0 ? 1 : nbytes);
  if (!p) return p.err();
  return pinned_buffer(&rt, static_cast<std::byte*>(*p), nbytes);
}

result<void> copy_sync(void* dst, const void* src, std::size_t n) {
  if (n == 0) return {};
  return detail::active().memcpy_sync(dst, src, n);
}

}  // namespace blobpipe::cuda
