// blobpipe/cuda.hpp on top of the runtime interface (lib/cuda/runtime.hpp).
#include "blobpipe/cuda.hpp"

#include <utility>

#include "lib/cuda/runtime.hpp"

namespace blobpipe::cuda {

result<int> device_count() { return detail::active().device_count(); }

bool device_available() noexcept {
  try {
    return device_count().has_value();
  } catch (...) {  // std::bad_alloc building a message: no device worth using
    return false;
  }
}

result<std::string> describe_device(int device) { return detail::active().device_name(device); }

std::string version_string() { return detail::active().version(); }

result<location> locate(const void* p, memory_kind declared) {
  using type = detail::pointer_info::type;
  auto& rt = detail::active();
  switch (declared) {
    case memory_kind::host:
      return location{};
    case memory_kind::automatic: {
      if (p == nullptr) return location{};
      // No CUDA, no device or no driver: whatever `p` is, the CPU reads it.
      auto a = rt.pointer_attributes(p);
      if (!a || a->kind != type::device) return location{};
      return location{memory_kind::cuda_device, a->device};
    }
    case memory_kind::cuda_device: {
      auto n = rt.device_count();
      if (!n) return n.err();
      if (p == nullptr) {  // an empty value: no bytes to copy
        auto d = rt.get_device();
        if (!d) return d.err();
        return location{memory_kind::cuda_device, *d};
      }
      auto a = rt.pointer_attributes(p);
      if (!a) return a.err();
      if (a->kind != type::device && a->kind != type::managed)
        return {errc::invalid_argument,
                "value declared cuda_device, but cudaPointerGetAttributes reports host memory"};
      return location{memory_kind::cuda_device, a->device};
    }
  }
  return {errc::invalid_argument, "unknown memory_kind"};
}

// ---- device_buffer ----

void device_buffer::release() noexcept {
  if (p_ == nullptr) return;
  detail::device_guard g;
  (void)g.enter(device_);  // cudaFree frees on any device; this only keeps it tidy
  rt_->free_device(p_);
  p_ = nullptr;
  n_ = 0;
}

device_buffer::device_buffer(device_buffer&& o) noexcept
    : rt_(o.rt_),
      p_(std::exchange(o.p_, nullptr)),
      n_(std::exchange(o.n_, 0)),
      device_(o.device_) {}

device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    release();
    rt_ = o.rt_;
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
    device_ = o.device_;
  }
  return *this;
}

device_buffer::~device_buffer() { release(); }

result<device_buffer> device_buffer::allocate(std::uint64_t nbytes, int device) {
  auto& rt = detail::active();
  auto n = rt.device_count();
  if (!n) return n.err();
  if (device < 0 || device >= *n)
    return {errc::invalid_argument,
            "CUDA device " + std::to_string(device) + " of " + std::to_string(*n)};
  if (nbytes == 0) return device_buffer(&rt, nullptr, 0, device);
  detail::device_guard g;
  if (auto r = g.enter(device); !r) return r.err();
  auto p = rt.malloc_device(nbytes);
  if (!p) return p.err();
  return device_buffer(&rt, static_cast<std::byte*>(*p), nbytes, device);
}

namespace {
bool fits(std::uint64_t offset, std::uint64_t n, std::uint64_t size) {
  return offset <= size && n <= size - offset;
}
}  // namespace

result<void> device_buffer::copy_from_host(std::span<const std::byte> src, std::uint64_t offset) {
  if (!fits(offset, src.size(), n_))
    return {errc::invalid_argument, "copy_from_host: range past the buffer's end"};
  if (src.empty()) return {};
  return rt_->memcpy_sync(p_ + offset, src.data(), src.size());
}

result<void> device_buffer::copy_to_host(std::span<std::byte> dst, std::uint64_t offset) const {
  if (!fits(offset, dst.size(), n_))
    return {errc::invalid_argument, "copy_to_host: range past the buffer's end"};
  if (dst.empty()) return {};
  return rt_->memcpy_sync(dst.data(), p_ + offset, dst.size());
}

}  // namespace blobpipe::cuda
