// The sans-IO sender (blobpipe/protocol/sender_session.hpp): blob ids and
// states, window credit, counters, and what a resend session keeps.
// docs/wire.md "Sender", "Flow control", "Delivery".
#include "blobpipe/protocol/sender_session.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/footer.hpp"

namespace blobpipe {
namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

}  // namespace

sender_limits sender_limits::from_hello(const hello& h) {
  sender_limits l{.chunk_bytes = h.max_chunk_bytes,
                  .inline_bytes = h.inline_bytes,
                  .window_bytes = h.window_bytes,
                  .features = h.features,
                  .max_key_bytes = h.max_key_bytes,
                  .max_meta_bytes = h.max_meta_bytes,
                  .dedup_window = h.dedup_window};
  if (auto m = read_max_entry_bytes(h); m && *m) l.max_entry_bytes = **m;
  return l;
}

// ---- the consumer's frames --------------------------------------------------

std::uint64_t sender_session::offer(const hello& mine, outbox& out) {
  offer_ = mine;
  answer_.reset();
  peer_closed_ = false;
  close_reason_.clear();
  frames_ = std::make_unique<decoder>(wire_role::consumer, decoder_limits{}, frames_listener_);
  frame_hello(out, mine);
  return ++attempt_;
}

result<void> sender_session::check_answer(const hello& offer, const hello& answer) {
  if (answer.max_chunk_bytes > offer.max_chunk_bytes)
    return {errc::protocol_violation,
            "hello: chunk " + num(answer.max_chunk_bytes) + " above the proposal"};
  if (answer.inline_bytes > offer.inline_bytes)
    return {errc::protocol_violation,
            "hello: inline_bytes " + num(answer.inline_bytes) + " above the proposal"};
  if (answer.window_bytes == 0 && !(answer.features & feature_credit_grants))
    return {errc::protocol_violation, "hello: zero window"};
  if ((answer.features & ~offer.features) != 0)
    return {errc::protocol_violation, "hello: the consumer accepts features that were not offered"};
  // A resend session needs the consumer to de-duplicate for it.
  if (offer.session != NO_SESSION &&
      (answer.session != offer.session || answer.dedup_window == 0))
    return {errc::protocol_violation, "hello: the consumer keeps no delivery log for this session"};
  if (auto max_entry = read_max_entry_bytes(answer); !max_entry) return max_entry.err();
  return {};
}

result<sender_input> sender_session::consume(std::span<const std::byte> in) {
  input_ = sender_input{};
  if (!frames_) return {errc::protocol_violation, "bytes from the consumer before our hello"};
  if (auto r = frames_->consume(in); !r) return r.err();
  return std::move(input_);
}

result<void> sender_session::check_kept(const sender_limits& l) const {
  for (const auto& b : kept_) {
    if (b->end_ == sender_blob::end_kind::abort) continue;  // its entries are not sent again
    for (std::size_t i = 0; i < b->kept_.size(); ++i) {
      const kept_entry& k = b->kept_[i];
      auto refused = [&](std::string why) -> result<void> {
        return {errc::protocol_violation, "kept blob " + tag_hex(b->tag_) + ", entry " + num(i) +
                                              ": " + why + "; it cannot be sent again there"};
      };
      if (k.entry.key.size() > l.max_key_bytes)
        return refused("its key is " + num(k.entry.key.size()) +
                       " bytes, longer than the consumer's max_key_bytes (" +
                       num(l.max_key_bytes) + " bytes)");
      const bool compact = (l.features & feature_compact_entries) &&
                           compact_code(k.entry, l.max_meta_bytes).has_value();
      if (!compact && k.meta.size() > l.max_meta_bytes)
        return refused("its meta is " + num(k.meta.size()) +
                       " bytes, longer than the consumer's max_meta_bytes (" +
                       num(l.max_meta_bytes) + " bytes)");
      if (k.entry.len > l.max_entry_bytes)
        return refused("it is " + num(k.entry.len) + " bytes, over the consumer's max_entry_bytes " +
                       num(l.max_entry_bytes));
    }
  }
  return {};
}

result<void> sender_session::consumer_frames::on_hello(const hello& h) {
  if (auto ok = check_answer(s_.offer_, h); !ok) return ok;
  if (s_.opt_.resend)
    if (auto ok = s_.check_kept(sender_limits::from_hello(h)); !ok) return ok;
  s_.answer_ = h;
  s_.input_.hello = true;
  return {};
}

result<void> sender_session::consumer_frames::on_ack(std::uint64_t credit,
                                                     std::uint64_t blob_id) {
  if (s_.connected_attempt_ != s_.attempt_)
    return {errc::protocol_violation, "ack before the handshake ended"};
  auto delivered = s_.on_ack(credit, blob_id);
  if (!delivered) return delivered.err();
  ++s_.input_.acks;
  if (*delivered) s_.input_.delivered.push_back(std::move(*delivered));
  return {};
}

result<void> sender_session::consumer_frames::on_close(std::string_view reason) {
  s_.peer_closed_ = true;
  s_.close_reason_.assign(reason);
  s_.input_.closed = true;
  return {};
}

// ---- connections ------------------------------------------------------------

void sender_session::connect(const sender_limits& limits, outbox* out) {
  connected_attempt_ = attempt_;
  limits_ = limits;
  out_ = out ? out : &own_;
  if (++connection_ > 1) ++counts_.reconnects;
  next_blob_id_ = 1;
  in_flight_ = 0;
  credit_wanted_ = 0;
  on_wire_.clear();
}

// ---- blobs ------------------------------------------------------------------

result<void> sender_session::check_emit(const sender_blob& b, std::size_t key_bytes,
                                        std::uint64_t entry_bytes) const {
  if (b.ended_ || b.broken_) return {errc::closed, "the blob was finished, aborted or broken"};
  if (error_) return blobpipe::error{error_, "the sender ended: " + error_.message()};
  // Tags identify blobs across reconnects.
  if (opt_.resend && b.tag_ == NO_TAG)
    return {errc::invalid_argument, "a resend session's blob needs a tag (not NO_TAG)"};
  if (key_bytes > limits_.max_key_bytes)
    return {errc::invalid_argument, "the key is " + num(key_bytes) +
                                        " bytes, longer than the consumer's max_key_bytes (" +
                                        num(limits_.max_key_bytes) + " bytes)"};
  // Refused here, before a byte is framed: the consumer would refuse it
  // mid-stream and close the connection.
  if (entry_bytes > limits_.max_entry_bytes)
    return {errc::invalid_argument, "the entry is " + num(entry_bytes) +
                                        " bytes, over the consumer's max_entry_bytes " +
                                        num(limits_.max_entry_bytes)};
  if (!opt_.resend && b.group_ && !(limits_.features & feature_blob_groups))
    return {errc::invalid_argument, "the blob names a group; the consumer accepts no blob groups"};
  return {};
}

result<void> sender_session::check_finish(const sender_blob& b) const {
  if (b.group_ && !(limits_.features & feature_blob_groups))
    return {errc::invalid_argument, "the blob names a group; the consumer accepts no blob groups"};
  if (b.ended_ || b.broken_) return {errc::closed, "the blob was finished, aborted or broken"};
  if (error_) return blobpipe::error{error_, "the sender ended: " + error_.message()};
  if (opt_.resend && b.tag_ == NO_TAG)
    return {errc::invalid_argument, "a resend session's blob needs a tag (not NO_TAG)"};
  return {};
}

std::optional<std::uint8_t> sender_session::compact_code_for(const Entry& e) const noexcept {
  if (!(limits_.features & feature_compact_entries)) return std::nullopt;
  return compact_code(e, limits_.max_meta_bytes);
}

std::optional<std::uint8_t> sender_session::form_of(sender_blob& b, const Entry& e) noexcept {
  if (b.form_entry_ == &e && b.form_connection_ == connection_) return b.form_code_;
  b.form_entry_ = &e;
  b.form_connection_ = connection_;
  b.form_code_ = compact_code_for(e);
  return b.form_code_;
}

bool sender_session::needs_meta(sender_blob& b, const Entry& e) noexcept {
  // A resend session may send a kept entry again on a connection without
  // the compact form: it keeps the msgpack meta of every entry.
  return opt_.resend || !form_of(b, e);
}

namespace {

/// Dims the compact form of `e` carries (a pickle's shape is not sent).
std::size_t compact_ndim(const Entry& e) noexcept {
  return e.kind != KIND_PICKLE && e.shape ? e.shape->size() : 0;
}

}  // namespace

result<std::uint64_t> sender_session::plan_entry(sender_blob& b, const Entry& e,
                                                 std::span<const std::byte> meta) {
  // From here until entry_sent() the blob lacks an entry it has planned.
  b.broken_ = true;
  const bool compact = form_of(b, e).has_value();
  if (!compact && meta.size() > limits_.max_meta_bytes)
    return {errc::invalid_argument,
            "the entry's meta (its index row) is " + num(meta.size()) +
                " bytes, longer than the consumer's max_meta_bytes (" +
                num(limits_.max_meta_bytes) + " bytes)"};
  // Key and meta are bounded by the limits above (the compact meta by
  // compact_dims_fit); only len can be huge.
  const std::uint64_t rest = compact ? compact_entry_credit(0, e.key.size(), compact_ndim(e))
                                     : entry_credit(0, e.key.size(), meta.size());
  if (e.len > std::numeric_limits<std::uint64_t>::max() - rest)
    return {errc::too_large, "entry of " + num(e.len) + " bytes: its credit overflows 64 bits"};
  return e.len + rest;
}

void sender_session::begin(sender_blob& b) {
  // Ids are given here, so they rise in the order blobs begin on the wire.
  b.connection_ = connection_;
  b.id_ = next_blob_id_++;
  b.next_index_ = 0;
  b.entry_left_ = 0;
  b.entry_off_ = 0;
  b.end_framed_ = false;
  if (opt_.resend) {
    if (b.attempts_++ > 0) ++counts_.blobs_resent;
    on_wire_[b.id_] = &b;
  }
  frame_blob_begin(*out_, b.id_, b.tag_,
                   limits_.features & feature_blob_groups ? b.group_ : std::nullopt);
}

std::span<std::byte> sender_session::add_entry(sender_blob& b, const Entry& e,
                                               std::span<const std::byte> meta,
                                               std::uint64_t emitted_ns, entry_route route) {
  if (b.connection_ != connection_) begin(b);
  const std::uint64_t index = b.next_index_++;
  if (!opt_.resend) {  // a resend session counted it when it kept it
    counts_.bytes_sent += e.len;
    ++counts_.entries_sent;
    if (counts_.first_entry_ns == 0) counts_.first_entry_ns = emitted_ns;
  }
  std::optional<std::uint64_t> stamp;
  if (limits_.features & feature_entry_timestamps) stamp = emitted_ns;
  const bool inline_bytes =
      route == entry_route::automatic && e.len != 0 && e.len <= limits_.inline_bytes;
  const auto code = form_of(b, e);
  b.form_entry_ = nullptr;  // taken: the next entry is looked up afresh
  if (code) {
    if (inline_bytes) return frame_entry_begin_compact_inline(*out_, b.id_, index, e, *code, stamp);
    frame_entry_begin_compact(*out_, b.id_, index, e, *code, stamp);
  } else if (inline_bytes) {
    return frame_entry_begin_inline(*out_, b.id_, index, e, meta, stamp);
  } else {
    frame_entry_begin(*out_, b.id_, index, e, meta, stamp);
  }
  b.entry_left_ = e.len;
  b.entry_off_ = e.off;
  return {};
}

std::size_t sender_session::add_chunk(sender_blob& b, std::span<const std::byte> bytes,
                                      bool bulk, int device) {
  const std::size_t n =
      static_cast<std::size_t>(std::min<std::uint64_t>({limits_.chunk_bytes, bytes.size(), b.entry_left_}));
  if (n == 0 || b.connection_ != connection_) return 0;
  frame_data(*out_, b.id_, b.entry_off_, bytes.first(n), limits_.chunk_bytes, /*copy=*/false,
             bulk, device);
  ++counts_.data_frames_sent;
  b.entry_off_ += n;
  b.entry_left_ -= n;
  return n;
}

bool sender_session::entry_sent(sender_blob& b) noexcept {
  if (b.entry_left_ != 0) return false;
  b.broken_ = false;
  return true;
}

result<void> sender_session::finish(sender_blob& b, std::span<const std::byte> tail) {
  // (A resend session's producer frames nothing: a sync may be framing a
  // kept entry of the blob meanwhile.)
  if (b.ended_ || b.broken_ || (!opt_.resend && b.entry_left_ != 0))
    return {errc::closed, "the blob was finished, aborted or broken"};
  if (error_) return blobpipe::error{error_, "the sender ended: " + error_.message()};
  b.ended_ = true;
  counts_.bytes_sent += tail.size();
  ++counts_.blobs_sent;
  if (opt_.resend) {
    // Kept until delivered: next_step() says when to frame it.
    b.tail_.assign(tail.begin(), tail.end());
    b.end_ = sender_blob::end_kind::tail;
    return {};
  }
  if (b.connection_ != connection_) begin(b);
  frame_tail(*out_, b.id_, tail);
  b.end_framed_ = true;
  return {};
}

bool sender_session::abort(sender_blob& b, std::string_view reason) {
  if (b.ended_) return false;
  b.ended_ = true;
  if (opt_.resend) return keep_abort(b, reason);
  b.entry_left_ = 0;
  // A blob not begun here: the consumer never heard of it.
  if (b.connection_ != connection_ || b.end_framed_ || error_) return false;
  frame_blob_abort(*out_, b.id_, reason);
  b.end_framed_ = true;
  ++counts_.blobs_aborted;
  return true;
}

// ---- credit -----------------------------------------------------------------

bool sender_session::take_credit(std::uint64_t n) noexcept {
  const std::uint64_t window = limits_.window_bytes;
  const bool fits = in_flight_ <= window && n <= window - in_flight_;
  // With credit grants nothing goes beyond the credit granted: the pool
  // grants an oversized item its credit instead.
  if (n != 0 && !fits && (in_flight_ != 0 || (limits_.features & feature_credit_grants)))
    return false;
  in_flight_ += n;
  return true;
}

void sender_session::ask_credit(std::uint64_t n) {
  ++counts_.credit_waits;
  if (!(limits_.features & feature_credit_grants) || error_) return;
  credit_wanted_ += std::min(n, std::numeric_limits<std::uint64_t>::max() - credit_wanted_);
  frame_credit_request(*out_, credit_wanted_);
  ++counts_.credit_requests;
}

void sender_session::withdraw_credit(std::uint64_t n, std::uint64_t connection) noexcept {
  // A replaced connection started the sum over.
  if (connection == connection_ && (limits_.features & feature_credit_grants))
    credit_wanted_ -= std::min(n, credit_wanted_);
}

result<std::shared_ptr<sender_blob>> sender_session::on_ack(std::uint64_t credit,
                                                            std::uint64_t blob_id) {
  if (limits_.features & feature_credit_grants) {
    // A grant: what we hold comes back first, the rest widens the window
    // (docs/wire_features.md "Credit grants"); saturating, as the
    // decoder's grant() does, so a hostile pool cannot wrap it.
    const std::uint64_t back = std::min(credit, in_flight_);
    in_flight_ -= back;
    const std::uint64_t more = credit - back;
    limits_.window_bytes +=
        std::min(more, std::numeric_limits<std::uint64_t>::max() - limits_.window_bytes);
  } else if (credit > in_flight_) {
    return {errc::protocol_violation, "ack returns " + num(credit) + " credit bytes, " +
                                          num(in_flight_) + " in flight"};
  } else {
    in_flight_ -= credit;
  }
  if (blob_id == 0) return std::shared_ptr<sender_blob>{};
  if (!opt_.resend)
    return {errc::protocol_violation,
            "ack delivers blob " + num(blob_id) + " to a sender without a resend session"};
  auto it = on_wire_.find(blob_id);
  if (it == on_wire_.end())
    return {errc::protocol_violation, "ack for blob " + num(blob_id) + ", not awaiting delivery"};
  sender_blob* raw = it->second;
  on_wire_.erase(it);
  auto listed = std::find_if(kept_.begin(), kept_.end(), [&](auto& k) { return k.get() == raw; });
  std::shared_ptr<sender_blob> b = listed != kept_.end() ? *listed : nullptr;
  raw->delivered_ = true;
  ++counts_.blobs_delivered;
  if (b) forget(b);
  return b;
}

// ---- resend sessions --------------------------------------------------------

bool sender_session::list(const std::shared_ptr<sender_blob>& b) {
  if (b->listed_) return true;
  if (!kept_.empty() && kept_.size() >= limits_.dedup_window) return false;
  b->listed_ = true;
  kept_.push_back(b);
  return true;
}

bool sender_session::admit(sender_blob& b, std::uint64_t n) noexcept {
  // The oldest blob always proceeds: its delivery frees the rest.
  const bool oldest = !kept_.empty() && kept_.front().get() == &b;
  if (!oldest && (kept_bytes_ > opt_.unacked_bytes || n > opt_.unacked_bytes - kept_bytes_))
    return false;
  kept_bytes_ += n;
  b.kept_bytes_ += n;
  return true;
}

void sender_session::refund(sender_blob& b, std::uint64_t n) noexcept {
  n = std::min(n, b.kept_bytes_);
  b.kept_bytes_ -= n;
  kept_bytes_ -= std::min(n, kept_bytes_);
}

void sender_session::keep_entry(sender_blob& b, kept_entry e) {
  counts_.bytes_sent += e.entry.len;
  ++counts_.entries_sent;
  if (counts_.first_entry_ns == 0) counts_.first_entry_ns = e.emitted_ns;
  b.kept_.push_back(std::move(e));
  b.form_entry_ = nullptr;  // a kept entry is framed later, looked up then
  b.broken_ = false;
}

bool sender_session::keep_abort(sender_blob& b, std::string_view reason) {
  // (A blob being framed by a sync keeps its entry_left_: the sync ends it.)
  if (!b.listed_ || b.end_ != sender_blob::end_kind::open) return false;
  b.abort_reason_.assign(reason.substr(0, std::min<std::size_t>(reason.size(), max_reason_bytes)));
  b.end_ = sender_blob::end_kind::abort;
  ++counts_.blobs_aborted;
  if (b.attempts_ != 0) return true;
  // Never on any wire: nobody to tell.
  auto it = std::find_if(kept_.begin(), kept_.end(), [&](auto& k) { return k.get() == &b; });
  if (it != kept_.end()) forget(std::shared_ptr<sender_blob>(*it));
  return false;
}

sync_step sender_session::next_step(sender_blob& b) {
  if (error_) return sync_step::none;
  if (b.connection_ != connection_) {
    if (b.delivered_) return sync_step::none;
    begin(b);
  }
  // Delivered while we send (the consumer had it already): stop, and end
  // the blob on this connection so it does not stay open there.
  if (b.end_ != sender_blob::end_kind::abort && !b.delivered_ && b.next_index_ < b.kept_.size())
    return sync_step::entry;
  if (b.end_framed_) return sync_step::none;
  if (b.end_ == sender_blob::end_kind::tail && !b.delivered_) return sync_step::tail;
  if (b.end_ == sender_blob::end_kind::abort || b.delivered_) return sync_step::abort;
  return sync_step::none;
}

std::uint64_t sender_session::kept_credit(const sender_blob& b) const noexcept {
  const kept_entry& k = b.kept_[b.next_index_];
  // The form this connection sends it in (send_kept_entry).
  if (compact_code_for(k.entry))
    return compact_entry_credit(k.entry.len, k.entry.key.size(), compact_ndim(k.entry));
  return entry_credit(k.entry.len, k.entry.key.size(), k.meta.size());
}

std::span<std::byte> sender_session::send_kept_entry(sender_blob& b) {
  const kept_entry& k = b.kept_[b.next_index_];
  return add_entry(b, k.entry, k.meta, k.emitted_ns, entry_route::automatic);
}

void sender_session::send_kept_end(sender_blob& b, sync_step step) {
  if (b.connection_ != connection_) begin(b);
  if (step == sync_step::tail) {
    frame_tail(*out_, b.id_, b.tail_);
  } else {
    frame_blob_abort(*out_, b.id_,
                     b.delivered_ ? std::string_view("delivered already") : b.abort_reason_);
  }
  b.end_framed_ = true;
}

bool sender_session::synced(const sender_blob& b) const noexcept {
  return b.connection_ == connection_ &&
         (b.end_ == sender_blob::end_kind::abort || b.next_index_ == b.kept_.size()) &&
         (b.end_ == sender_blob::end_kind::open || b.end_framed_);
}

std::vector<std::shared_ptr<sender_blob>> sender_session::to_resync() const {
  std::vector<std::shared_ptr<sender_blob>> todo;
  for (const auto& b : kept_)
    if (!synced(*b)) todo.push_back(b);  // (delivered blobs are no longer kept)
  return todo;
}

void sender_session::release(sender_blob& b) noexcept {
  b.kept_.clear();
  b.kept_.shrink_to_fit();
  b.tail_ = {};
}

void sender_session::end_sync(sender_blob& b) noexcept {
  b.sending_ = false;
  if (b.delivered_) release(b);
}

void sender_session::forget(const std::shared_ptr<sender_blob>& b) {
  auto it = std::find(kept_.begin(), kept_.end(), b);
  if (it != kept_.end()) kept_.erase(it);
  kept_bytes_ -= std::min(b->kept_bytes_, kept_bytes_);
  b->kept_bytes_ = 0;
  if (!b->sending_) release(*b);  // else end_sync() frees them
}

bool sender_session::ended_pending() const noexcept {
  return std::any_of(kept_.begin(), kept_.end(),
                     [](const auto& b) { return b->end_ != sender_blob::end_kind::open; });
}

}  // namespace blobpipe
