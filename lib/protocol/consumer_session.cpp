// The sans-IO receiving half (blobpipe/protocol/consumer_session.hpp): the
// decoder's listener, which decides what the protocol decides (the hello's
// answer, credit, duplicates, acks, the close frame) and asks its own
// listener only where bytes go.
#include "blobpipe/protocol/consumer_session.hpp"

#include <algorithm>
#include <utility>

#include "lib/runtime/progress_clocks.hpp"

namespace blobpipe {
namespace {

result<void> violation(std::string what) { return {errc::protocol_violation, std::move(what)}; }

session_blob& blob_of(void* blob) { return *static_cast<session_blob*>(blob); }

}  // namespace

consumer_session::consumer_session(consumer_session_options opt,
                                   consumer_session_listener& listener)
    : opt_(std::move(opt)),
      listener_(listener),
      frames_(wire_role::sender, opt_.limits, *this),
      clocks_(std::make_unique<detail::progress_clocks>(opt_.stall_timeout, opt_.idle_timeout,
                                                        opt_.held_timeout)) {}

consumer_session::~consumer_session() = default;

// ---- input ------------------------------------------------------------------------

result<void> consumer_session::consume(std::span<const std::byte> in, time_point now) {
  now_ = now;
  auto r = frames_.consume(in);
  collect_returned_credit();
  return r;
}

result<std::size_t> consumer_session::consume_some(std::span<const std::byte> in,
                                                   std::uint64_t budget, time_point now) {
  now_ = now;
  auto r = frames_.consume_some(in, budget);
  collect_returned_credit();
  return r;
}

result<void> consumer_session::commit_payload(std::size_t n, time_point now) {
  now_ = now;
  auto r = frames_.commit_payload(n);
  collect_returned_credit();
  return r;
}

// ---- the handshake ----------------------------------------------------------------

result<void> consumer_session::on_hello(const hello& h) {
  if (peer_) return violation("a second hello");
  // Checked before the hello is accepted, so the handshake fails. A shared
  // budget (a fan-in server) bounds only senders that take their credit
  // from it: one offering no credit grants would get a window of its own,
  // outside the budget (docs/cluster.md).
  if (opt_.pooled && !(h.features & feature_credit_grants))
    return violation(
        "hello: the sender does not offer credit grants (feature_credit_grants), which a "
        "consumer sharing a receive budget (a fan-in server) requires");
  peer_ = h;
  // Negotiated: the smaller chunk and copy threshold, and the features both
  // accept (decode_hello checked the rest).
  auto l = frames_.limits();
  l.max_chunk_bytes = std::min(h.max_chunk_bytes, opt_.limits.max_chunk_bytes);
  l.inline_bytes = std::min(h.inline_bytes, opt_.limits.inline_bytes);
  std::uint64_t accept = opt_.accept_features &
                         (feature_entry_timestamps | feature_blob_groups | feature_compact_entries);
  if (opt_.pooled) accept |= feature_credit_grants;
  l.features = h.features & accept & known_features;
  // With grants, the window is the pool's: each grant raises it (grant()),
  // each release lowers it (decoder::release) and goes to the pool.
  l.window_bytes = (l.features & feature_credit_grants) ? listener_.pool_join()
                                                         : opt_.limits.window_bytes;
  frames_.set_limits(l);
  answer_ = hello{.role = wire_role::consumer,
                  .max_chunk_bytes = l.max_chunk_bytes,
                  .max_key_bytes = l.max_key_bytes,
                  .window_bytes = l.window_bytes,
                  .max_meta_bytes = l.max_meta_bytes,
                  .dedup_window = opt_.dedup_window,
                  .session = h.session,
                  .features = l.features,
                  .inline_bytes = l.inline_bytes,
                  .extensions = {max_entry_bytes_extension(l.max_entry_bytes)}};
  frame_hello(out_, answer_);
  return {};
}

// ---- blobs ------------------------------------------------------------------------

result<void*> consumer_session::on_blob_begin(std::uint64_t blob_id, const tag_t& tag) {
  // Resent after a lost acknowledgement: delivered already. Its frames are
  // still checked and read, then dropped; the sender may let it go.
  const bool duplicate = session() != NO_SESSION && opt_.delivered &&
                         opt_.delivered->contains(session(), tag);
  auto b = listener_.blob_begin(blob_id, tag, duplicate);
  if (!b) return b.err();
  session_blob& s = **b;
  s.id = blob_id;
  s.tag = tag;
  s.duplicate = duplicate;
  if (duplicate) {
    s.discard = true;
    ++counts_.duplicates_dropped;
    acknowledge(blob_id);
  }
  return static_cast<void*>(&s);
}

result<std::span<std::byte>> consumer_session::on_entry_begin(void* blob,
                                                              const entry_announcement& a) {
  return listener_.entry_begin(blob_of(blob), a);
}

result<void> consumer_session::on_entry_complete(void* blob, std::uint64_t) {
  session_blob& b = blob_of(blob);
  auto r = listener_.entry_complete(b);
  if (r && !b.discard) ++counts_.items_completed;
  return r;
}

result<void> consumer_session::on_blob_complete(void* blob, std::uint64_t,
                                                blob_index index,
                                                std::span<const std::byte> tail) {
  // A pool must see the tail's credit released before the next frame.
  if (frames_.limits().features & feature_credit_grants) collect_returned_credit();
  session_blob& b = blob_of(blob);
  if (b.discard) {
    if (!b.duplicate) delivered(b);  // reported aborted already: final
    listener_.blob_end(b);
    return {};
  }
  if (session() != NO_SESSION && opt_.delivered && opt_.delivered->contains(session(), b.tag)) {
    // Another connection of the session delivered this tag while this
    // attempt was in flight (the sender resent it after losing that
    // connection). This attempt's entries were yielded: void them.
    listener_.blob_abort(b, make_error_code(errc::aborted),
                         "delivered on another connection of the session", true);
    ++counts_.duplicates_dropped;
    acknowledge(b.id);
    listener_.blob_end(b);
    return {};
  }
  auto done = listener_.blob_complete(b, std::move(index), tail);
  if (!done) return done.err();
  if (*done) {
    ++counts_.items_completed;
    delivered(b);
  }
  listener_.blob_end(b);
  return {};
}

result<void> consumer_session::on_blob_abort(void* blob, std::uint64_t,
                                             std::string_view reason) {
  session_blob& b = blob_of(blob);
  listener_.blob_abort(b, make_error_code(errc::aborted), std::string(reason), false);
  if (!b.duplicate) delivered(b);  // the producer's abort is final
  listener_.blob_end(b);
  return {};
}

result<void> consumer_session::on_blob_group(void* blob, std::uint64_t, const blob_group& g) {
  listener_.blob_in_group(blob_of(blob), g);  // feature_blob_groups (docs/wire_features.md)
  return {};
}

result<void> consumer_session::on_close(std::string_view reason) {
  listener_.closed(reason);
  return {};
}

// ---- credit -----------------------------------------------------------------------

bool consumer_session::unused_credit_covers(std::uint64_t wanted) const noexcept {
  const std::uint64_t window = frames_.limits().window_bytes;
  const std::uint64_t used = frames_.buffered_bytes();
  return used <= window && wanted <= window - used;
}

bool consumer_session::sender_has_credit() const noexcept {
  return frames_.buffered_bytes() < frames_.limits().window_bytes && credit_wanted_ == 0 &&
         held_in_window_ == 0;
}

result<void> consumer_session::on_credit_request(std::uint64_t n) {
  ++counts_.credit_requests;
  // What the sender waits for (its waiting items' total): until granted,
  // a silence is not its fault. A request its unused credit covers is met
  // at once: it waits for nothing, so it cannot keep the stall clock (and
  // idle reclaim) off by asking for what it holds.
  credit_wanted_ = unused_credit_covers(n) ? 0 : n;
  watch(now_);
  if (!(frames_.limits().features & feature_credit_grants)) return {};
  publish();
  listener_.pool_request(n);
  return {};
}

void consumer_session::grant(std::uint64_t n, time_point now) noexcept {
  frames_.grant(n);
  credit_wanted_ -= std::min(n, credit_wanted_);
  // The pool grants a request's deficit: the request is met once the
  // unused credit covers it, and the stall clock may run again.
  if (unused_credit_covers(credit_wanted_)) credit_wanted_ = 0;
  watch(now);
  return_credit(n);
}

void consumer_session::release_yielded(std::uint64_t n, time_point now) noexcept {
  held_in_window_ -= std::min(n, held_in_window_);
  release(n);
  watch(now);
}

void consumer_session::release(std::uint64_t n) noexcept {
  frames_.release(n);
  if (frames_.limits().features & feature_credit_grants) {
    // The pool decides who gets it.
    publish();
    if (n != 0) listener_.pool_released(n);
    return;
  }
  if (n != 0) return_credit(n);
}

void consumer_session::collect_returned_credit() noexcept {
  const std::uint64_t n = frames_.take_returned_credit();
  counts_.buffered_high_water = std::max(counts_.buffered_high_water, frames_.buffered_bytes());
  if (frames_.limits().features & feature_credit_grants) {
    publish();  // for the pool's other threads
    if (n != 0) listener_.pool_released(n);
    return;
  }
  if (n != 0) return_credit(n);
}

// ---- the held allowance -----------------------------------------------------------

bool consumer_session::hold(std::uint64_t n, time_point now) noexcept {
  // With the default allowance and no pool, one entry larger than the
  // allowance moves alone, into an empty one (as the window admits one
  // larger entry alone): the loop that keeps the previous event while it
  // waits goes on whatever an entry's size.
  const std::uint64_t room = opt_.held_bytes - std::min(held_credit_, opt_.held_bytes);
  if (n > room && (held_credit_ != 0 || !opt_.one_larger_alone)) return false;
  held_credit_ += n;
  counts_.held_high_water = std::max(counts_.held_high_water, held_credit_);
  release_yielded(n, now);
  return true;
}

void consumer_session::release_held(std::uint64_t n, time_point now) noexcept {
  held_credit_ -= std::min(n, held_credit_);
  watch(now);
}

// ---- acks and the close frame -----------------------------------------------------

void consumer_session::return_credit(std::uint64_t n) noexcept {
  if (acks_stopped_) return;
  ack_credit_ += n;
  if (!std::exchange(acks_announced_, true)) listener_.acks_due();
}

void consumer_session::acknowledge(std::uint64_t blob_id) {
  delivered_ids_.push_back(blob_id);
  if (!std::exchange(acks_announced_, true)) listener_.acks_due();
}

void consumer_session::delivered(const session_blob& b) {
  if (session() == NO_SESSION || acks_stopped_ || !opt_.delivered) return;
  opt_.delivered->record(session(), b.tag);
  acknowledge(b.id);
}

void consumer_session::frame_acks() {
  acks_announced_ = false;
  if (!acks_due()) return;
  std::uint64_t credit = std::exchange(ack_credit_, 0);
  do {
    std::uint64_t id = 0;
    if (!delivered_ids_.empty()) {
      id = delivered_ids_.front();
      delivered_ids_.pop_front();
    }
    frame_ack(out_, std::exchange(credit, 0), id);
    ++counts_.acks_sent;
  } while (!delivered_ids_.empty());
}

bool consumer_session::refuse(std::string reason) {
  if (refusal_) return false;
  refusal_ = std::move(reason);
  acks_stopped_ = true;
  listener_.acks_due();
  return true;
}

void consumer_session::frame_close() {
  blobpipe::frame_close(out_, refusal_ ? std::string_view(*refusal_) : std::string_view());
}

// ---- clocks -----------------------------------------------------------------------

void consumer_session::watch(time_point now) noexcept {
  if (!clocks_running()) return;  // wait_begins() looks when the next wait begins
  // The sender is to blame for a silence while its hello is due, a frame
  // of it is half sent, a fetch is outstanding, or a blob is open and it
  // holds credit it could send on: not while it waits for credit the
  // application holds (docs/reliability.md "Held entries").
  const bool has_credit = sender_has_credit();
  // An entry begun and not complete is owed whatever else the sender
  // waits for: its credit was taken whole when it was announced.
  clocks_->owes(!peer_ || frames_.in_frame() || fetches_ || frames_.entries_open() != 0 ||
                    (frames_.open_blobs() != 0 && has_credit),
                now);
  clocks_->held(held_in_window_ != 0 && (!opt_.waits_reported || app_waiting_), now);
}

bool consumer_session::clocks_set() const noexcept {
  return clocks_->enabled() && !clocks_->stopped();
}

bool consumer_session::clocks_running() const noexcept {
  return clocks_->waiting() && clocks_set();
}

void consumer_session::wait_begins(time_point now, bool fetches) noexcept {
  fetches_ = fetches;
  clocks_->begin_wait(now);
  watch(now);
}

void consumer_session::wait_ends(time_point now) noexcept {
  // Progress is an entry or blob completed, or progress_bytes more bytes
  // of admitted entries and tails: neither a trickle nor a stream of
  // control frames (blob_begin + blob_abort pairs) keeps a connection that
  // owes bytes or holds credit others wait for.
  clocks_->progress(frames_.admitted_bytes(), counts_.items_completed, now);
  clocks_->end_wait(now);
}

void consumer_session::application_waits(time_point now) noexcept {
  if (!opt_.waits_reported) return;
  app_waiting_ = true;
  watch(now);
}

std::optional<consumer_session::time_point> consumer_session::next_deadline(
    time_point now) const noexcept {
  if (!clocks_->enabled() || clocks_->stopped()) return std::nullopt;
  return now + clocks_->tick();
}

void consumer_session::stop_clocks() noexcept { clocks_->stop(); }

std::optional<clock_expiry> consumer_session::on_time(time_point now) {
  // Credit others wait for and this sender does not use ends it after
  // stall_timeout (credit_pool::pressed).
  const bool pressed = clocks_->pressure_counts() &&
                       (frames_.limits().features & feature_credit_grants) &&
                       listener_.pool_pressed();
  const auto tripped = clocks_->check(now, pressed);
  if (!tripped) return std::nullopt;
  using kind = detail::progress_clocks::limit_kind;
  const auto n = [](std::uint64_t v) { return std::to_string(v); };
  const std::string ms = n(static_cast<std::uint64_t>(clocks_->limit().count()));
  clock_expiry e;
  if (*tripped == kind::held) {
    // The application's doing, not the sender's: say what it holds.
    e.which = clock_expiry::limit::held;
    e.reason = "the application holds received entries of " +
               n(held_credit_ + held_in_window_) + " credit bytes (" + n(held_credit_) +
               " in the held_bytes allowance of " + n(opt_.held_bytes) + ", " +
               n(held_in_window_) + " of the window of " + n(window_bytes()) +
               ") and waited " + ms +
               " ms for an entry the sender may have no credit to send (held_timeout): "
               "drop received entries and values sooner, or raise held_bytes or window_bytes";
  } else if (*tripped == kind::pressed) {
    e.which = clock_expiry::limit::pressed;
    e.reason = "the sender held " +
               n(window_bytes() - std::min(buffered_bytes(), window_bytes())) +
               " bytes of unused credit that other connections wait for and sent nothing for " +
               ms + " ms (stall_timeout)";
  } else if (*tripped == kind::stall) {
    e.which = clock_expiry::limit::stall;
    e.reason = "no progress from the sender for " + ms +
               " ms while it owed bytes (stall_timeout: no entry or blob ended and fewer than " +
               n(detail::progress_clocks::progress_bytes) + " bytes arrived)";
  } else {
    e.which = clock_expiry::limit::idle;
    e.reason = "no bytes from the sender for " + ms + " ms (idle_timeout)";
  }
  return e;
}

}  // namespace blobpipe
