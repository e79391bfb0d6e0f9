#include "lib/pipeline/producer_device.hpp"

#include <algorithm>
#include <string>

#include "blobpipe/protocol/framer.hpp"
#include "lib/cuda/staging.hpp"
#include "lib/pipeline/device_send.hpp"

namespace blobpipe::detail {

result<cuda::location> locate_value(const sender_state& s, const value& v) {
  auto where = cuda::locate(v.data, v.memory);
  if (!where || where->kind != memory_kind::cuda_device) return where;
  const auto& st = s.opt.staging;
  if (st.pinned_chunk_bytes < min_chunk_bytes || st.pool_depth == 0)
    return {errc::invalid_argument,
            "sender_options::staging: pinned_chunk_bytes must be >= 64 and pool_depth >= 1"};
  return where;
}

asio::awaitable<std::error_code> send_device_value(std::shared_ptr<sender_state> s,
                                                   std::shared_ptr<send_queue> q, blob_state& b,
                                                   const planned_entry& pe,
                                                   std::span<const std::byte> meta, int device,
                                                   std::uint64_t emitted_ns) {
  if (q->error()) co_return q->error();  // (its transport may be released)
  sender_blob& w = b.wire();
  // Device bytes are never copied inline: they go in data frames.
  (void)s->session.add_entry(w, pe.entry, meta, emitted_ns, entry_route::chunks);
  q->kick();
  // The device bytes reach the one chunk loop, host or device memory, in
  // order (the session keeps the entry's offset).
  send_range_fn send = [s, q, &w](std::uint64_t, std::span<const std::byte> bytes,
                                  int dev) -> asio::awaitable<std::error_code> {
    co_return co_await send_chunks(s, q, w, bytes, dev);
  };
  device_send_report rep;
  auto r = co_await send_device_entry(s->ex, cuda::staging_pool::process_default(),
                                      s->opt.staging, q->link().accepts_device_memory(), pe,
                                      device, send, rep);
  ++s->io.device_entries;
  s->io.device_chunks += rep.chunks;
  if (rep.direct) ++s->io.device_direct_entries;
  if (rep.gathered) ++s->io.gathered_entries;
  s->io.device_prefetch_high_water =
      std::max(s->io.device_prefetch_high_water, rep.prefetch_high_water);
  if (r) co_return std::error_code{};
  if (s->error || q->error()) co_return s->error ? s->error : q->error();  // not CUDA
  // The consumer has part of this entry: the blob cannot go on, but the
  // connection can. Tell the consumer why.
  b.last_error = r.message();
  if (s->session.abort(w, "entry " + quote(pe.entry.key) + ": " + r.message())) q->kick();
  co_return r.code();
}

}  // namespace blobpipe::detail
