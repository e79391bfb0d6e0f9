#include "lib/pipeline/device_send.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "lib/cuda/handles.hpp"
#include "lib/pipeline/device_copies.hpp"

namespace blobpipe::detail {
namespace {

/// The bytes a strided value touches: from `lo` (<= 0, bytes from data)
/// for `bytes` bytes.
struct extent {
  std::int64_t lo = 0;
  std::uint64_t bytes = 0;
};

result<extent> strided_extent(const planned_entry& pe) {
  const auto& shape = pe.source.shape;
  const auto& strides = pe.source.strides;
  // Elements, in 128 bits: strides come from the caller and are unchecked.
  __int128 lo = 0, hi = 0;
  for (std::size_t i = 0; i < shape.size() && i < strides.size(); ++i) {
    if (shape[i] == 0) return extent{};
    const __int128 span = static_cast<__int128>(strides[i]) * (shape[i] - 1);
    (span > 0 ? hi : lo) += span;
  }
  const __int128 bytes = (hi - lo + 1) * static_cast<__int128>(pe.itemsize);
  const __int128 lo_bytes = lo * static_cast<__int128>(pe.itemsize);
  if (bytes > static_cast<__int128>(std::numeric_limits<std::int64_t>::max()) ||
      lo_bytes < static_cast<__int128>(std::numeric_limits<std::int64_t>::min()))
    return {errc::invalid_argument, "strided device value spans more than 2^63 bytes"};
  return extent{static_cast<std::int64_t>(lo_bytes), static_cast<std::uint64_t>(bytes)};
}

const std::byte* offset_ptr(const std::byte* p, std::int64_t off) {
  return reinterpret_cast<const std::byte*>(reinterpret_cast<std::uintptr_t>(p) +
                                            static_cast<std::uintptr_t>(off));
}

}  // namespace

result<void> read_device_entry(const planned_entry& pe, std::span<std::byte> out) {
  if (out.size() != pe.entry.len)
    return {errc::buffer_too_small, "read_device_entry: output of " + std::to_string(out.size()) +
                                        " bytes for an entry of " + std::to_string(pe.entry.len)};
  if (pe.entry.len == 0) return {};
  if (pe.contiguous) return cuda::copy_sync(out.data(), pe.source.data, out.size());
  // Strided: the host cannot read device memory element by element, so
  // the whole extent comes over in one copy and is gathered on the host.
  auto ext = strided_extent(pe);
  if (!ext) return ext.err();
  std::vector<std::byte> span_bytes(ext->bytes);
  if (auto r = cuda::copy_sync(span_bytes.data(), offset_ptr(pe.source.data, ext->lo),
                               span_bytes.size());
      !r)
    return r;
  planned_entry host = pe;
  host.source.data = offset_ptr(span_bytes.data(), -ext->lo);
  host.source.memory = memory_kind::host;
  return write_entry(host, out);
}

asio::awaitable<result<void>> send_device_entry(asio::any_io_executor ex,
                                                cuda::staging_pool& pool,
                                                const cuda::staging_options& opt,
                                                bool transport_takes_device,
                                                const planned_entry& pe, int device,
                                                const send_range_fn& send,
                                                device_send_report& report) {
  const std::uint64_t len = pe.entry.len;
  if (len == 0) co_return result<void>{};
  if (!pe.contiguous) {
    std::vector<std::byte> gathered(len);
    if (auto r = read_device_entry(pe, gathered); !r) co_return r;
    report.gathered = true;
    if (auto ec = co_await send(pe.entry.off, gathered, -1)) co_return error{ec, ec.message()};
    co_return result<void>{};
  }

  if (transport_takes_device) {
    report.direct = true;
    if (auto ec = co_await send(pe.entry.off, std::span(pe.source.data, len), device))
      co_return error{ec, ec.message()};
    co_return result<void>{};
  }

  auto lease = pool.acquire(device, opt.pinned_chunk_bytes, opt.pool_depth);
  if (!lease) co_return lease.err();
  copy_queue q(ex, std::move(*lease));
  report.staged = true;
  const std::uint64_t chunk = opt.pinned_chunk_bytes;
  const std::uint64_t depth = opt.pool_depth;
  const std::uint64_t n = (len + chunk - 1) / chunk;
  auto size_of = [&](std::uint64_t k) { return std::min<std::uint64_t>(chunk, len - k * chunk); };
  // Chunk k always uses slot k % depth, and copy number k + 1.
  auto issue = [&](std::uint64_t k) {
    ++report.chunks;
    return q.issue(q.slot(k % depth), pe.source.data + k * chunk, size_of(k));
  };
  for (std::uint64_t k = 0; k < std::min(depth, n); ++k)
    if (auto r = issue(k); !r) co_return r.err();
  for (std::uint64_t k = 0; k < n; ++k) {
    if (auto r = co_await q.wait(k + 1); !r) co_return r;
    // Copies issued and not yet reported done as this chunk goes to the
    // network: the overlap (a serial sender, or copies that ran before
    // the send, show 0 here whatever was queued).
    report.prefetch_high_water =
        std::max(report.prefetch_high_water, q.issued() - q.completed());
    const std::span<const std::byte> bytes(q.slot(k % depth), size_of(k));
    if (auto ec = co_await send(pe.entry.off + k * chunk, bytes, -1))
      co_return error{ec, ec.message()};
    // The slot is free again (the transport is done with it): refill it.
    if (k + depth < n)
      if (auto r = issue(k + depth); !r) co_return r.err();
  }
  co_return result<void>{};
}

}  // namespace blobpipe::detail
