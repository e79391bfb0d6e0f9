#include "lib/pipeline/producer_device.hpp"

#include <algorithm>
#include <array>
#include <string>

#include <asio/buffer.hpp>

#include "blobpipe/protocol/wire.hpp"
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

asio::awaitable<std::error_code> send_device_bytes(std::shared_ptr<sender_state> s,
                                                   blob_state& b, const planned_entry& pe,
                                                   int device) {
  const std::uint64_t id = b.id;
  // Data frames as in the host path, cut at the negotiated chunk; a
  // transport failure ends the connection.
  send_range_fn send = [s, id](std::uint64_t off, std::span<const std::byte> bytes,
                               int dev) -> asio::awaitable<std::error_code> {
    for (std::uint64_t pos = 0; pos < bytes.size();) {
      if (s->error) co_return s->error;
      const auto n = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(s->chunk_bytes, bytes.size() - pos));
      frame_header d{.type = frame_type::data, .length = n, .blob_id = id, .arg = off + pos};
      const std::array<asio::const_buffer, 1> buf{asio::const_buffer(bytes.data() + pos, n)};
      const std::span<const asio::const_buffer> payload(buf);
      auto ec = dev >= 0 ? co_await s->t->send_device(d, payload, dev)
                         : co_await s->t->send(d, payload);
      if (ec) {
        s->fail(ec);
        co_return s->error;
      }
      ++s->stats.data_frames_sent;
      pos += n;
    }
    co_return std::error_code{};
  };

  device_send_report rep;
  auto r = co_await send_device_entry(s->ex, cuda::staging_pool::process_default(),
                                      s->opt.staging, s->t->accepts_device_memory(), pe, device,
                                      send, rep);
  ++s->stats.device_entries;
  s->stats.device_chunks += rep.chunks;
  if (rep.direct) ++s->stats.device_direct_entries;
  if (rep.gathered) ++s->stats.gathered_entries;
  s->stats.device_prefetch_high_water =
      std::max(s->stats.device_prefetch_high_water, rep.prefetch_high_water);
  if (r) {
    s->stats.bytes_sent += pe.entry.len;
    ++s->stats.entries_sent;
    co_return std::error_code{};
  }
  if (s->error) co_return s->error;  // the connection failed, not CUDA
  // The consumer has part of this entry: the blob cannot go on, but the
  // connection can. Tell the consumer why.
  b.last_error = r.message();
  b.ended = true;
  std::string reason = "entry " + quote(pe.entry.key) + ": " + r.message();
  if (reason.size() > max_reason_bytes) reason.resize(max_reason_bytes);
  frame_header h{.type = frame_type::blob_abort,
                 .length = static_cast<std::uint32_t>(reason.size()),
                 .blob_id = id};
  if (auto ec = co_await send_frame(*s->t, h, std::as_bytes(std::span(reason)))) s->fail(ec);
  co_return r.code();
}

}  // namespace blobpipe::detail
