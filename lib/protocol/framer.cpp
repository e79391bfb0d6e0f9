// The framer (docs/wire.md "Sender"): blob-writer calls become frames in an
// outbox, headers and small payloads copied, large payloads referenced.
#include "blobpipe/protocol/framer.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "blobpipe/format/dtype.hpp"

namespace blobpipe {

outbox::outbox(outbox&& o) noexcept
    : bytes_(std::move(o.bytes_)),
      capacity_(std::exchange(o.capacity_, 0)),
      used_(std::exchange(o.used_, 0)),
      pieces_(std::move(o.pieces_)),
      size_(std::exchange(o.size_, 0)) {
  o.pieces_.clear();
}

outbox& outbox::operator=(outbox&& o) noexcept {
  if (this != &o) {
    bytes_ = std::move(o.bytes_);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    pieces_ = std::move(o.pieces_);
    o.pieces_.clear();
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

std::span<std::byte> outbox::append(std::size_t n) {
  const std::size_t at = used_;
  if (capacity_ - at < n) {
    // Doubling, as a vector grows; only the queued bytes are copied.
    const std::size_t cap = std::max(at + n, 2 * capacity_);
    auto grown = std::make_unique_for_overwrite<std::byte[]>(cap);
    if (at != 0) std::memcpy(grown.get(), bytes_.get(), at);
    bytes_ = std::move(grown);
    capacity_ = cap;
  }
  used_ = at + n;
  if (!pieces_.empty() && !pieces_.back().external) {
    pieces_.back().size += n;  // extends the run of owned bytes
  } else {
    pieces_.push_back(piece{nullptr, at, n, false, -1});
  }
  size_ += n;
  return std::span(bytes_.get() + at, n);
}

void outbox::append_external(std::span<const std::byte> payload, bool bulk, int device) {
  if (payload.empty()) return;
  pieces_.push_back(piece{payload.data(), 0, payload.size(), bulk, device});
  size_ += payload.size();
}

void outbox::clear() noexcept {
  used_ = 0;
  pieces_.clear();
  size_ = 0;
}

namespace {

/// Appends a header for a payload of `length` bytes and returns the
/// payload's room (`copied` bytes of it, 0 when the payload is external).
std::span<std::byte> header(outbox& out, frame_header h, std::size_t copied) {
  auto room = out.append(frame_header_size + copied);
  encode_frame_header(h, room);
  return room.subspan(frame_header_size);
}

void copy(std::span<std::byte> to, std::span<const std::byte> from) {
  if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
}

std::string_view cut_reason(std::string_view reason) {
  return reason.substr(0, std::min<std::size_t>(reason.size(), max_reason_bytes));
}

}  // namespace

void frame_hello(outbox& out, const hello& h) {
  const auto payload = encode_hello(h);
  copy(header(out, {.type = frame_type::hello, .length = static_cast<std::uint32_t>(payload.size())},
              payload.size()),
       payload);
}

void frame_blob_begin(outbox& out, std::uint64_t blob_id, const tag_t& tag,
                      const std::optional<blob_group>& group) {
  const std::size_t n = TAG_SIZE + (group ? blob_group_bytes : 0);
  auto room = header(out, {.type = frame_type::blob_begin,
                           .flags = group ? frame_flag_group : std::uint8_t{0},
                           .length = static_cast<std::uint32_t>(n), .blob_id = blob_id},
                     n);
  copy(room, tag);
  if (group) encode_blob_group(*group, room.subspan(TAG_SIZE));
}

namespace {

/// An entry_begin header (either form) and its timestamp when `sent_ns`;
/// returns the payload's room after the timestamp: `form_bytes` of the
/// form's prefix, then `extra` bytes.
std::span<std::byte> entry_begin_header(outbox& out, std::uint64_t blob_id, std::uint64_t index,
                                        std::optional<std::uint64_t> sent_ns, std::uint8_t flags,
                                        std::size_t form_bytes, std::size_t extra) {
  const std::size_t stamp = sent_ns ? timestamp_bytes : 0;
  if (sent_ns) flags |= frame_flag_timestamp;
  auto room = header(out, {.type = frame_type::entry_begin, .flags = flags,
                           .length = static_cast<std::uint32_t>(stamp + form_bytes + extra),
                           .blob_id = blob_id, .arg = index},
                     stamp + form_bytes + extra);
  if (sent_ns) encode_timestamp(*sent_ns, room);
  return room.subspan(stamp);
}

/// An entry_begin header and its payload up to the inline bytes (the
/// timestamp, then key_len | meta_len | key | meta); returns the room after
/// them (`extra` bytes).
std::span<std::byte> entry_begin_frame(outbox& out, std::uint64_t blob_id, std::uint64_t index,
                                       const Entry& e, std::span<const std::byte> meta,
                                       std::optional<std::uint64_t> sent_ns, std::uint8_t flags,
                                       std::size_t extra) {
  const std::size_t prefix = entry_begin_prefix_bytes(e.key.size(), meta.size());
  auto room = entry_begin_header(out, blob_id, index, sent_ns, flags, prefix, extra);
  encode_entry_begin_prefix(e.key, meta, room);
  return room.subspan(prefix);
}

}  // namespace

void frame_entry_begin(outbox& out, std::uint64_t blob_id, std::uint64_t index, const Entry& e,
                       std::span<const std::byte> meta, std::optional<std::uint64_t> sent_ns) {
  entry_begin_frame(out, blob_id, index, e, meta, sent_ns, 0, 0);
}

std::span<std::byte> frame_entry_begin_inline(outbox& out, std::uint64_t blob_id,
                                              std::uint64_t index, const Entry& e,
                                              std::span<const std::byte> meta,
                                              std::optional<std::uint64_t> sent_ns) {
  return entry_begin_frame(out, blob_id, index, e, meta, sent_ns, frame_flag_inline, e.len);
}

std::optional<std::uint8_t> compact_code(const Entry& e, std::uint32_t max_meta_bytes) noexcept {
  // A pickle's dtype and shape are not part of its row (Entry::from_meta
  // drops them): code 0, no dims.
  if (e.kind == KIND_PICKLE) {
    if (!compact_dims_fit(0, max_meta_bytes)) return std::nullopt;
    return std::uint8_t{0};
  }
  const std::uint8_t code = e.dtype ? compact_dtype_code(e.kind, *e.dtype) : 0;
  if (code == 0 || !compact_dims_fit(e.shape ? e.shape->size() : 0, max_meta_bytes))
    return std::nullopt;
  return code;
}

namespace {

/// A compact entry_begin header and payload up to the inline bytes (the
/// timestamp, then the compact prefix); returns the room after them
/// (`extra` bytes).
std::span<std::byte> compact_entry_begin_frame(outbox& out, std::uint64_t blob_id,
                                               std::uint64_t index, const Entry& e,
                                               std::uint8_t code,
                                               std::optional<std::uint64_t> sent_ns,
                                               std::uint8_t flags, std::size_t extra) {
  const bool pickle = e.kind == KIND_PICKLE;
  std::span<const std::int64_t> dims;
  if (!pickle && e.shape) dims = *e.shape;
  const std::size_t prefix = compact_entry_begin_prefix_bytes(e.key.size(), dims.size());
  auto room = entry_begin_header(out, blob_id, index, sent_ns,
                                 static_cast<std::uint8_t>(flags | frame_flag_compact),
                                 prefix, extra);
  encode_compact_entry_begin_prefix(e.key, e.kind, code, e.len, dims, room);
  return room.subspan(prefix);
}

}  // namespace

void frame_entry_begin_compact(outbox& out, std::uint64_t blob_id, std::uint64_t index,
                               const Entry& e, std::uint8_t code,
                               std::optional<std::uint64_t> sent_ns) {
  compact_entry_begin_frame(out, blob_id, index, e, code, sent_ns, 0, 0);
}

std::span<std::byte> frame_entry_begin_compact_inline(outbox& out, std::uint64_t blob_id,
                                                      std::uint64_t index, const Entry& e,
                                                      std::uint8_t code,
                                                      std::optional<std::uint64_t> sent_ns) {
  return compact_entry_begin_frame(out, blob_id, index, e, code, sent_ns, frame_flag_inline,
                                   e.len);
}

void frame_data(outbox& out, std::uint64_t blob_id, std::uint64_t off,
                std::span<const std::byte> bytes, std::uint32_t chunk_bytes, bool copy_payload,
                bool bulk, int device) {
  for (std::size_t pos = 0; pos < bytes.size();) {
    const auto n = static_cast<std::uint32_t>(
        std::min<std::size_t>(chunk_bytes, bytes.size() - pos));
    const frame_header h{.type = frame_type::data, .length = n, .blob_id = blob_id,
                         .arg = off + pos};
    const auto chunk = bytes.subspan(pos, n);
    if (copy_payload) {
      copy(header(out, h, n), chunk);
    } else {
      header(out, h, 0);
      out.append_external(chunk, bulk, device);
    }
    pos += n;
  }
}

void frame_tail(outbox& out, std::uint64_t blob_id, std::span<const std::byte> tail) {
  copy(header(out, {.type = frame_type::tail, .length = static_cast<std::uint32_t>(tail.size()),
                    .blob_id = blob_id},
              tail.size()),
       tail);
}

void frame_blob_abort(outbox& out, std::uint64_t blob_id, std::string_view reason) {
  const auto r = std::as_bytes(std::span(cut_reason(reason)));
  copy(header(out, {.type = frame_type::blob_abort, .length = static_cast<std::uint32_t>(r.size()),
                    .blob_id = blob_id},
              r.size()),
       r);
}

void frame_ack(outbox& out, std::uint64_t credit, std::uint64_t blob_id) {
  header(out, {.type = frame_type::ack, .blob_id = blob_id, .arg = credit}, 0);
}

void frame_credit_request(outbox& out, std::uint64_t credit) {
  header(out, {.type = frame_type::ack, .flags = frame_flag_credit_request, .arg = credit}, 0);
}

void frame_close(outbox& out, std::string_view reason) {
  const auto r = std::as_bytes(std::span(cut_reason(reason)));
  copy(header(out, {.type = frame_type::close, .length = static_cast<std::uint32_t>(r.size())},
              r.size()),
       r);
}

}  // namespace blobpipe
