// The push decoder (docs/wire.md "Consumer"): every field of a frame is
// checked against the limits before it is used, in the order the wire
// document lists them, and only then reported.
#include "blobpipe/protocol/decoder.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/layout.hpp"
#include "lib/format/index_rows.hpp"

namespace blobpipe {

// ---- listener defaults ------------------------------------------------------

result<void*> decoder_listener::on_blob_begin(std::uint64_t, const tag_t&) {
  return static_cast<void*>(nullptr);
}
result<std::span<std::byte>> decoder_listener::on_entry_begin(void*, const entry_announcement&) {
  return std::span<std::byte>{};
}
result<void> decoder_listener::on_entry_complete(void*, std::uint64_t) { return {}; }
result<void> decoder_listener::on_blob_complete(void*, std::uint64_t, blob_index,
                                                std::span<const std::byte>) {
  return {};
}
result<void> decoder_listener::on_blob_abort(void*, std::uint64_t, std::string_view) { return {}; }
result<void> decoder_listener::on_ack(std::uint64_t, std::uint64_t) { return {}; }
result<void> decoder_listener::on_blob_group(void*, std::uint64_t, const blob_group&) { return {}; }
result<void> decoder_listener::on_credit_request(std::uint64_t) { return {}; }
result<void> decoder_listener::on_close(std::string_view) { return {}; }

namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

error violation(std::string what) { return make_error(errc::protocol_violation, std::move(what)); }

std::string_view as_text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// The most bytes any msgpack encoding of row `e` takes (every header and
/// integer at its widest), so a tail longer than the rows announced could
/// fill is refused before a byte of it is buffered.
std::uint64_t max_row_bytes(const Entry& e) {
  const std::uint64_t dims = e.shape ? e.shape->size() : 0;
  const std::uint64_t dtype = e.dtype ? e.dtype->size() : 0;
  // array(6) + str key + off + len + str kind + str/nil dtype + array/nil shape
  return 5 + (5 + e.key.size()) + 9 + 9 + (5 + 1) + (5 + dtype) + (5 + 9 * dims);
}

/// Frees a completed entry's row (its key, dtype and shape): an open blob
/// keeps no entry it has finished (decoder::open_blob_bytes). Assigning
/// an empty Entry would not do: a string assigned a short one keeps its
/// buffer. A key in the string's own buffer holds no heap and is only
/// cleared; the dtype and shape are destroyed (each frees what it holds).
void forget_entry(Entry& e) noexcept {
  if (e.key.capacity() > std::string().capacity()) std::string().swap(e.key);
  else e.key.clear();
  e.dtype.reset();
  e.shape.reset();
}

/// The row a checked compact entry_begin announces, at offset `off` (the
/// aligned end of the previous entry): the same Entry Entry::from_meta
/// gives for the msgpack form of that row (a pickle keeps no dtype or
/// shape; 't' and 'n' rows keep their shape, [] when ndim is 0).
void read_compact(const compact_entry_view& cv, std::uint64_t off, Entry& e) {
  e.key.assign(cv.key);
  e.off = off;
  e.len = cv.len;
  e.kind = cv.kind;
  if (cv.kind == KIND_PICKLE) return;  // (decode_compact_entry_begin: code 0, no dims)
  e.dtype.emplace(cv.dtype->name);
  e.shape.emplace(cv.ndim);  // inline up to shape_inline_dims
  for (std::size_t i = 0; i < cv.ndim; ++i) (*e.shape)[i] = cv.dim(i);
}

}  // namespace

decoder::decoder(wire_role from, decoder_limits limits, decoder_listener& listener)
    : from_(from), limits_(limits), listener_(&listener) {}

result<void> decoder::fail(error e) {
  state_ = state::failed;
  failure_ = e;
  return e;
}

std::size_t decoder::next_required_size() const noexcept {
  switch (state_) {
    case state::hello:
    case state::header: return frame_header_size - header_have_;
    case state::payload: return static_cast<std::size_t>(payload_left_);
    case state::closed:
    case state::failed: return 0;
  }
  return 0;
}

bool decoder::owes_bytes() const noexcept {
  return header_have_ != 0 || state_ == state::payload || !blobs_.empty();
}

void decoder::release(std::uint64_t credit) noexcept {
  buffered_ -= std::min(credit, buffered_);
  if (limits_.features & feature_credit_grants)
    limits_.window_bytes -= std::min(credit, limits_.window_bytes);
}

std::uint64_t decoder::take_returned_credit() noexcept { return std::exchange(returned_, 0); }

decoder::open_blob* decoder::find(std::uint64_t id) noexcept {
  if (last_ && last_->id == id) return last_;
  auto it = blobs_.find(id);
  last_ = it == blobs_.end() ? nullptr : &it->second;
  return last_;
}

void decoder::end_blob(std::map<std::uint64_t, open_blob>::iterator it) noexcept {
  if (last_ == &it->second) last_ = nullptr;
  if (cur_blob_ == &it->second) cur_blob_ = nullptr;
  if (it->second.entry_open) --entries_open_;
  blobs_.erase(it);
}

result<void> decoder::check_window(std::uint64_t n, const char* what) const {
  const std::uint64_t w = limits_.window_bytes;
  const bool fits = buffered_ <= w && n <= w - buffered_;
  // One item larger than the whole window is admitted alone, so no
  // window size deadlocks (docs/wire.md "Flow control"). Not with credit
  // grants: the pool grants such an item its credit instead.
  if (fits || (buffered_ == 0 && !(limits_.features & feature_credit_grants))) return {};
  return violation(std::string(what) + " of " + num(n) + " credit bytes overruns the window (" +
                   num(buffered_) + " of " + num(w) + " bytes buffered)");
}

// ---- bytes in ---------------------------------------------------------------

result<void> decoder::consume(std::span<const std::byte> in) {
  auto r = consume_some(in, ~std::uint64_t{0});
  if (!r) return r.err();
  return {};
}

result<std::size_t> decoder::consume_some(std::span<const std::byte> in, std::uint64_t budget) {
  if (failure_) return *failure_;
  const std::size_t total = in.size();
  // Past a close frame every byte is a violation, budget or not.
  while (!in.empty() && (work_ < budget || state_ == state::closed)) {
    const std::size_t before = in.size();
    auto r = step(in);
    work_ += before - in.size();
    if (!r) return r.err();
  }
  return total - in.size();
}

void decoder::frame_done() noexcept {
  const std::uint64_t size = frame_header_size + std::uint64_t{cur_.length};
  if (size < frame_work_floor_bytes) work_ += frame_work_floor_bytes - size;
}

result<void> decoder::step(std::span<const std::byte>& in) {
  switch (state_) {
    case state::hello:
    case state::header: {
      if (header_have_ == 0 && in.size() >= frame_header_size) {
        auto r = on_header(in.first(frame_header_size));
        in = in.subspan(frame_header_size);
        return r;
      }
      const std::size_t n = std::min(frame_header_size - header_have_, in.size());
      std::memcpy(header_buf_.data() + header_have_, in.data(), n);
      header_have_ += n;
      in = in.subspan(n);
      if (header_have_ < frame_header_size) {
        // A stray client (an HTTP request, a port scanner) is refused on
        // its first bytes, not after it has sent a whole header.
        if (state_ == state::hello) return check_hello_prefix();
        return {};
      }
      header_have_ = 0;
      return on_header(header_buf_);
    }
    case state::payload: {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(payload_left_, in.size()));
      count_admitted(n);
      if (sink_ == sink::assemble && assembly_have_ == 0 && n == payload_left_) {
        // Whole payload present: decoded in place, no copy.
        auto whole = in.first(n);
        in = in.subspan(n);
        payload_left_ = 0;
        return finish_payload(whole);
      }
      std::memcpy(payload_target().data(), in.data(), n);
      in = in.subspan(n);
      return commit(n);
    }
    case state::closed:
      return fail(violation("bytes after the peer's close frame"));
    case state::failed:
      return *failure_;
  }
  return {};
}

std::span<std::byte> decoder::payload_target() {
  const auto left = static_cast<std::size_t>(payload_left_);
  if (sink_ == sink::assemble) {
    if (assembly_.size() < assembly_have_ + left) assembly_.resize(assembly_have_ + left);
    return std::span(assembly_.data() + assembly_have_, left);
  }
  if (cur_blob_ && cur_blob_->dest) return std::span(cur_blob_->dest + cur_blob_->received, left);
  if (scratch_.size() < left) scratch_.resize(left);  // a data frame: <= the chunk size
  return std::span(scratch_.data(), left);
}

result<void> decoder::commit_payload(std::size_t n) {
  if (failure_) return *failure_;
  work_ += n;
  count_admitted(n);
  return commit(n);
}

void decoder::count_admitted(std::size_t n) noexcept {
  if (state_ == state::payload && (sink_ == sink::entry || cur_.type == frame_type::tail))
    admitted_bytes_ += std::min<std::uint64_t>(n, payload_left_);
}

result<void> decoder::commit(std::size_t n) {
  if (failure_) return *failure_;
  if (state_ != state::payload || n > payload_left_)
    return fail(make_error(errc::invalid_argument, "commit_payload: no payload of that size"));
  payload_left_ -= n;
  if (sink_ == sink::entry) return advance_entry(n);
  assembly_have_ += n;
  if (payload_left_ != 0) return {};
  const std::size_t have = std::exchange(assembly_have_, 0);
  auto r = finish_payload(std::span<const std::byte>(assembly_.data(), have));
  // A large tail: give it back (not `= {}`, which keeps the capacity).
  if (assembly_.capacity() > (1u << 20)) assembly_ = std::vector<std::byte>();
  return r;
}

result<void> decoder::advance_entry(std::size_t n) {
  open_blob& b = *cur_blob_;  // data frames point at their blob until it ends
  b.received += n;
  if (payload_left_ != 0) return {};
  frame_done();
  state_ = state::header;
  if (b.received != b.current.len) return {};
  b.entry_open = false;
  --entries_open_;
  b.dest = nullptr;
  forget_entry(b.current);
  if (auto r = listener_->on_entry_complete(b.user, b.id); !r) return fail(r.err());
  return {};
}

// ---- frames -----------------------------------------------------------------

result<void> decoder::on_header(std::span<const std::byte> bytes) {
  auto h = decode_frame_header(bytes, limits_.max_frame_bytes);
  if (!h) return fail(h.err());
  cur_ = *h;
  if (state_ == state::hello && cur_.type != frame_type::hello)
    return fail(violation(std::string("first frame is ") + frame_type_name(cur_.type) +
                          ", expected hello"));
  if (auto r = check_header(cur_); !r) return fail(r.err());
  return {};
}

result<void> decoder::check_hello_prefix() {
  // The hello's header begins type 1, flags 0, reserved 0 (docs/wire.md).
  static constexpr std::array<std::byte, 4> prefix{
      std::byte{static_cast<std::uint8_t>(frame_type::hello)}, std::byte{0}, std::byte{0},
      std::byte{0}};
  const std::size_t n = std::min(header_have_, prefix.size());
  if (std::memcmp(header_buf_.data(), prefix.data(), n) == 0) return {};
  return fail(violation(
      "the first bytes are not a blobpipe hello: " +
      quote(std::string_view(reinterpret_cast<const char*>(header_buf_.data()), n))));
}

result<void> decoder::start_payload(sink k) {
  sink_ = k;
  payload_left_ = cur_.length;
  if (payload_left_ == 0) return finish_payload({});
  state_ = state::payload;
  return {};
}

result<void> decoder::check_header(const frame_header& h) {
  const bool from_sender = from_ == wire_role::sender;
  const auto unexpected = [&] {
    return violation(std::string("unexpected ") + frame_type_name(h.type) + " frame from " +
                     (from_sender ? "sender" : "consumer"));
  };
  switch (h.type) {
    case frame_type::hello:
      if (state_ != state::hello) return violation("hello after the handshake");
      if (h.length < hello_size || h.length > max_hello_bytes)
        return violation("hello: " + num(h.length) + " bytes, expected 64 to 4096");
      return start_payload(sink::assemble);
    case frame_type::blob_begin: {
      if (!from_sender) return unexpected();
      const bool grouped = (h.flags & frame_flag_group) != 0;
      if (grouped && !(limits_.features & feature_blob_groups))
        return violation("blob_begin: a group, but the blob-groups feature was not negotiated");
      const std::size_t expect = TAG_SIZE + (grouped ? blob_group_bytes : 0);
      if (h.length != expect)
        return violation("blob_begin: payload of " + num(h.length) + " bytes, expected " +
                         num(expect));
      if (h.blob_id <= last_blob_id_)
        return violation("blob_begin: blob id " + num(h.blob_id) + " not above " +
                         num(last_blob_id_));
      if (blobs_.size() >= limits_.max_open_blobs)
        return violation("blob_begin: more than max_open_blobs (" + num(limits_.max_open_blobs) +
                         ") blobs open");
      return start_payload(sink::assemble);
    }
    case frame_type::entry_begin: {
      if (!from_sender) return unexpected();
      open_blob* b = find(h.blob_id);
      if (!b) return violation("entry_begin for unknown blob " + num(h.blob_id));
      if (b->entry_open)
        return violation("entry_begin before entry " + num(b->entries - 1) + " of blob " +
                         num(b->id) + " was complete");
      if (h.arg != b->entries)
        return violation("entry_begin: entry index " + num(h.arg) + ", expected " +
                         num(b->entries));
      if (b->entries >= limits_.max_entries_per_blob)
        return violation("entry_begin: more than max_entries_per_blob entries");
      const bool inline_bytes = (h.flags & frame_flag_inline) != 0;
      const bool stamped = (h.flags & frame_flag_timestamp) != 0;
      if (stamped && !(limits_.features & feature_entry_timestamps))
        return violation("entry_begin: a timestamp, but the entry-timestamps feature was not "
                         "negotiated");
      const bool compact = (h.flags & frame_flag_compact) != 0;
      if (compact && !(limits_.features & feature_compact_entries))
        return violation("entry_begin: the compact form, but the compact-entries feature was "
                         "not negotiated");
      const std::uint64_t stamp = stamped ? timestamp_bytes : 0;
      // The msgpack form: key_len, meta_len and at least one meta byte;
      // the compact form: its fixed bytes (key_len counted in them).
      const std::uint64_t min_len = stamp + (compact ? compact_fixed_bytes : 9);
      const std::uint64_t max_len = stamp + (compact ? 4ull : 8ull) + limits_.max_key_bytes +
                                    limits_.max_meta_bytes +
                                    (inline_bytes ? limits_.inline_bytes : 0);
      if (h.length < min_len || h.length > max_len)
        return violation("entry_begin: payload of " + num(h.length) + " bytes not in [" +
                         num(min_len) + ", " + num(max_len) + "]");
      return start_payload(sink::assemble);
    }
    case frame_type::data: {
      if (!from_sender) return unexpected();
      open_blob* b = find(h.blob_id);
      if (!b) return violation("data for unknown blob " + num(h.blob_id));
      if (!b->entry_open) return violation("data for blob " + num(b->id) + " with no entry open");
      if (h.length == 0 || h.length > limits_.max_chunk_bytes)
        return violation("data: chunk of " + num(h.length) + " bytes not in [1, " +
                         num(limits_.max_chunk_bytes) + "]");
      const Entry& e = b->current;
      const std::uint64_t expect = e.off + b->received;
      if (h.arg != expect)
        return violation("data: offset " + num(h.arg) + " for entry " + quote(e.key) + " [" +
                         num(e.off) + ", " + num(e.off + e.len) + "), expected " + num(expect));
      if (h.length > e.len - b->received)
        return violation("data: chunk runs past the end of entry " + quote(e.key) +
                         " (offset " + num(h.arg) + " + " + num(h.length) + " > " +
                         num(e.off + e.len) + ")");
      cur_blob_ = b;
      return start_payload(sink::entry);
    }
    case frame_type::tail: {
      if (!from_sender) return unexpected();
      open_blob* b = find(h.blob_id);
      if (!b) return violation("tail for unknown blob " + num(h.blob_id));
      if (b->entry_open)
        return violation("tail before entry " + quote(b->current.key) + " was complete");
      if (h.length < FOOTER_SIZE + 1 || h.length > limits_.max_tail_bytes)
        return violation("tail: " + num(h.length) + " bytes not in [33, " +
                         num(limits_.max_tail_bytes) + "]");
      // Bounded by the rows announced before a byte of it is buffered.
      if (h.length > FOOTER_SIZE + b->max_index_bytes)
        return violation("tail: " + num(h.length) + " bytes, more than an index of the " +
                         num(b->entries) + " entries announced can take (" +
                         num(FOOTER_SIZE + b->max_index_bytes) + ")");
      if (h.length > limits_.max_blob_bytes || b->data_end > limits_.max_blob_bytes - h.length)
        return violation("tail: blob would exceed max_blob_bytes");
      if (auto r = check_window(h.length, "tail"); !r) return r;
      buffered_ += h.length;
      return start_payload(sink::assemble);
    }
    case frame_type::blob_abort:
      if (!from_sender) return unexpected();
      if (!find(h.blob_id)) return violation("blob_abort for unknown blob " + num(h.blob_id));
      if (h.length > max_reason_bytes) return violation("blob_abort: reason too long");
      return start_payload(sink::assemble);
    case frame_type::ack:
      if (from_sender) {
        // A credit request is the one ack a sender sends.
        if (!(h.flags & frame_flag_credit_request)) return unexpected();
        if (!(limits_.features & feature_credit_grants))
          return violation("credit request, but the credit-grants feature was not negotiated");
        if (h.length != 0 || h.blob_id != 0)
          return violation("credit request with a payload or a blob id");
        return start_payload(sink::assemble);
      }
      if (h.flags != 0) return violation("ack: a credit request from the consumer");
      if (h.length != 0) return violation("ack with a payload");
      return start_payload(sink::assemble);
    case frame_type::close:
      if (h.length > max_reason_bytes) return violation("close: reason too long");
      return start_payload(sink::assemble);
  }
  return unexpected();
}

result<void> decoder::finish_payload(std::span<const std::byte> p) {
  frame_done();
  state_ = state::header;
  result<void> r;
  switch (cur_.type) {
    case frame_type::hello: r = on_hello_frame(p); break;
    case frame_type::blob_begin: r = on_blob_begin(p); break;
    case frame_type::entry_begin: r = on_entry_begin(p); break;
    case frame_type::tail: r = on_tail(p); break;
    case frame_type::blob_abort: r = on_blob_abort(p); break;
    case frame_type::ack:
      r = from_ == wire_role::sender ? listener_->on_credit_request(cur_.arg)
                                     : listener_->on_ack(cur_.arg, cur_.blob_id);
      break;
    case frame_type::close: r = on_close(p); break;
    case frame_type::data: break;  // entry bytes: advance_entry
  }
  if (!r) return fail(r.err());
  return {};
}

result<void> decoder::on_hello_frame(std::span<const std::byte> p) {
  auto h = decode_hello(p);
  if (!h) return h.err();
  if (h->role != from_)
    return violation(std::string("hello: role ") +
                     (h->role == wire_role::sender ? "sender" : "consumer") + ", expected " +
                     (from_ == wire_role::sender ? "sender" : "consumer"));
  return listener_->on_hello(*h);
}

result<void> decoder::on_blob_begin(std::span<const std::byte> p) {
  tag_t tag;
  std::memcpy(tag.data(), p.data(), TAG_SIZE);
  std::optional<blob_group> group;
  if (cur_.flags & frame_flag_group) {
    auto g = decode_blob_group(p.subspan(TAG_SIZE));
    if (!g) return g.err();
    group = *g;
  }
  last_blob_id_ = cur_.blob_id;
  auto user = listener_->on_blob_begin(cur_.blob_id, tag);
  if (!user) return user.err();
  open_blob& b = blobs_[cur_.blob_id];
  b.id = cur_.blob_id;
  b.tag = tag;
  b.user = *user;
  last_ = &b;
  if (group) return listener_->on_blob_group(b.user, b.id, *group);
  return {};
}

result<void> decoder::on_entry_begin(std::span<const std::byte> p) {
  open_blob& b = *find(cur_.blob_id);  // checked with the header
  const bool has_inline = (cur_.flags & frame_flag_inline) != 0;
  std::optional<std::uint64_t> sent_ns;
  if (cur_.flags & frame_flag_timestamp) {  // its size was checked with the header
    sent_ns = decode_timestamp(p);
    p = p.subspan(timestamp_bytes);
  }
  // Either form gives the row, the inline bytes and the key and meta
  // bytes the entry's credit counts. The row is read straight into the
  // blob's current entry, empty here (the header check found no entry
  // open, and a finished one is forgotten): checked there, it needs no
  // move. A refused row stays there, with the decoder failed.
  Entry* const e = &b.current;
  std::span<const std::byte> inline_bytes;
  std::uint64_t key_bytes = 0;
  std::uint64_t meta_bytes = 0;
  const dtype* known = nullptr;  // a compact row's dtype, from its code
  if (cur_.flags & frame_flag_compact) {  // its feature was checked with the header
    auto cv = decode_compact_entry_begin(p, has_inline, limits_.max_key_bytes,
                                         limits_.max_meta_bytes);
    if (!cv) return cv.err();
    read_compact(*cv, b.data_end, *e);
    if (cv->dtype) known = &format_dtype_of(*cv->dtype);
    inline_bytes = cv->inline_bytes;
    key_bytes = cv->key.size();
    meta_bytes = compact_meta_bytes(cv->ndim);
  } else {
    auto eb = decode_entry_begin(p, has_inline, limits_.max_key_bytes, limits_.max_meta_bytes);
    if (!eb) return eb.err();
    auto row = Entry::from_meta(std::string(eb->key), eb->meta);
    if (!row) return violation("entry_begin meta: " + row.message());
    *e = std::move(*row);
    inline_bytes = eb->inline_bytes;
    key_bytes = eb->key.size();
    meta_bytes = eb->meta.size();
  }
  auto type = detail::validate_row(*e, limits_.max_blob_bytes, known);
  if (!type) return violation("entry " + quote(e->key) + ": " + type.message());
  if (e->off != b.data_end)
    return violation("entry " + quote(e->key) + ": offset " + num(e->off) + ", expected " +
                     num(b.data_end));
  if (e->len > limits_.max_entry_bytes)
    return violation("entry " + quote(e->key) + ": " + num(e->len) +
                     " bytes exceed max_entry_bytes " + num(limits_.max_entry_bytes));
  if (has_inline && inline_bytes.size() != e->len)
    return violation("entry " + quote(e->key) + ": " + num(inline_bytes.size()) +
                     " inline bytes for an entry of " + num(e->len));
  // The header's length bound leaves the unused key and meta room free, so
  // an inline entry could pass it above the negotiated threshold; and an
  // empty entry has no bytes to carry inline (the sender never sets it).
  if (has_inline && e->len > limits_.inline_bytes)
    return violation("entry " + quote(e->key) + ": " + num(e->len) +
                     " inline bytes exceed the negotiated inline_bytes " +
                     num(limits_.inline_bytes));
  if (has_inline && e->len == 0)
    return violation("entry " + quote(e->key) + ": the inline flag on an entry of 0 bytes");
  // compact_entry_credit for a compact entry (meta_bytes are its compact
  // meta bytes), the sender's figure either way.
  const std::uint64_t credit = entry_credit(e->len, key_bytes, meta_bytes);
  if (auto r = check_window(credit, "entry"); !r) return r;
  buffered_ += credit;
  // The row goes into the blob's keyed digest now, in canonical form, and
  // nothing of it stays with the blob (open_blob_bytes). row_ is the
  // decoder's one scratch buffer, at most one row (max_key_bytes plus
  // max_meta_bytes bound it): grown to the widest row's bound and written
  // in place, not zeroed for each row.
  const std::size_t row_bound = detail::index_row_bound(*e);
  if (row_.size() < row_bound) row_.resize(row_bound);
  b.rows.update(std::span<const std::byte>(row_).first(detail::write_index_row(*e, row_)));
  b.max_index_bytes += max_row_bytes(*e);
  b.data_end = align_up(e->off + e->len);
  const std::uint64_t len = b.current.len;
  const bool whole = has_inline || len == 0;  // complete once announced
  entry_announcement a{b.id, b.entries++, &b.current, credit, sent_ns};
  // A numpy dtype looked up by name lives in this thread's cache only.
  if (known || e->kind == KIND_TENSOR) a.type = *type;
  // A complete entry's row is not needed here after the call: the
  // listener may take it instead of copying it.
  if (whole) a.take = &b.current;
  auto dest = listener_->on_entry_begin(b.user, a);
  if (!dest) return dest.err();
  if (!dest->empty() && dest->size() != len)
    return make_error(errc::invalid_argument,
                      "on_entry_begin: destination of " + num(dest->size()) + " bytes for " +
                          num(len));
  if (whole) {
    admitted_bytes_ += len;
    if (len != 0 && !dest->empty()) std::memcpy(dest->data(), inline_bytes.data(), len);
    forget_entry(b.current);
    return listener_->on_entry_complete(b.user, b.id);
  }
  b.entry_open = true;
  ++entries_open_;
  b.received = 0;
  b.dest = dest->empty() ? nullptr : dest->data();
  return {};
}

result<void> decoder::on_tail(std::span<const std::byte> tail) {
  auto it = blobs_.find(cur_.blob_id);
  open_blob& b = it->second;
  // The tail was counted when admitted; checked, it is the listener's.
  release(tail.size());
  returned_ += tail.size();
  auto f = read_footer(tail);
  if (!f) return violation("tail: " + f.message());
  if (f->version != VERSION)
    return violation("tail: footer version " + num(f->version) + ", expected 3");
  if (f->index_off != b.data_end)
    return violation("tail: index_off " + num(f->index_off) + " but entries end at " +
                     num(b.data_end));
  if (std::uint64_t{f->index_len} + FOOTER_SIZE != tail.size())
    return violation("tail: index_len " + num(f->index_len) + " does not fill the " +
                     num(tail.size()) + "-byte tail");
  if (f->tag != b.tag) return violation("tail: footer tag differs from blob_begin's");
  const auto index = tail.first(f->index_len);
  // The rows were not kept: the index must digest, row by row in
  // canonical form, to what the entries announced did. Its length was
  // bounded by the rows announced when the tail was admitted.
  const auto announced = b.rows.finish();
  // Canonical encoders (the reference's, ours) write an array header of
  // the rows announced, then exactly those rows. When the bytes after the
  // header digest to the rows announced, they are the rows checked at
  // entry_begin: read once, without a second scan or check
  // (read_known_rows, which also holds the header to that count). Any
  // other index is parsed in full (declaring more rows than were
  // announced is refused before a row is read), checked, and re-encoded
  // row by row for the digest.
  const std::size_t header = b.entries < 16 ? 1 : b.entries < 65536 ? 3 : 5;
  row_digest as_sent(row_digest::process_key());
  as_sent.update(index.subspan(std::min(header, index.size())));
  const bool as_announced = as_sent.finish() == announced;
  auto rows = as_announced ? detail::read_known_rows(index, b.entries)
                           : parse_index(index, b.data_end, b.entries);
  if (!rows) return violation("tail: " + rows.message());
  if (rows->size() != b.entries)
    return violation("tail: index has " + num(rows->size()) + " rows, " + num(b.entries) +
                     " entries were sent");
  if (!as_announced) {
    row_digest seen(row_digest::process_key());
    for (const Entry& row : *rows) {
      row_.clear();
      append_index_row(row, row_);
      seen.update(row_);
    }
    if (seen.finish() != announced)
      return violation("tail: index rows disagree with the entries sent");
  }
  blob_index out;
  out.foot = *f;
  out.entries = std::move(*rows);
  out.nbytes = b.data_end + tail.size();
  void* user = b.user;
  const std::uint64_t id = b.id;
  end_blob(it);
  return listener_->on_blob_complete(user, id, std::move(out), tail);
}

result<void> decoder::on_blob_abort(std::span<const std::byte> reason) {
  auto it = blobs_.find(cur_.blob_id);
  void* user = it->second.user;
  const std::uint64_t id = it->second.id;
  end_blob(it);
  return listener_->on_blob_abort(user, id, as_text(reason));
}

result<void> decoder::on_close(std::span<const std::byte> reason) {
  state_ = state::closed;
  return listener_->on_close(as_text(reason));
}

}  // namespace blobpipe
