// The sender and its blob writers (docs/wire.md "Sender", "Flow control"):
// loops that plan each entry with layout_builder, ask the sans-IO
// sender_session whether it may go (its checks, its credit), wait for
// credit when it says no, and write what it framed: small entries copied
// inline into their entry_begin, larger ones as data frames pointing at
// the value's own memory; the tail goes last. One writer per connection
// (lib/pipeline/send_queue.hpp) writes whatever is queued.
#include "blobpipe/pipeline/producer.hpp"

#include <algorithm>

#include <asio/error.hpp>
#include <asio/this_coro.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "lib/pipeline/producer_device.hpp"
#include "lib/pipeline/resend.hpp"
#include "lib/pipeline/sender_state.hpp"

namespace blobpipe {
namespace detail {
namespace {

/// Ends a stalled connection (sender_options::stall_timeout): a plain
/// sender fails with timed_out, a resend session reconnects.
asio::awaitable<void> watch(std::shared_ptr<sender_state> s) {
  // (No co_await inside a loop or if condition in these files: GCC 12
  // miscompiles some of those coroutines into a trap.)
  for (;;) {
    const bool expired = co_await s->stall_watch.expired();
    if (!expired) break;
    if (s->resend) {
      resend_stalled(s);
      s->stall_watch.progress();
      continue;
    }
    s->timeout_reason = "nothing from the consumer for " +
                        std::to_string(s->opt.stall_timeout.count()) + " ms (stall_timeout)";
    s->message = s->timeout_reason;
    s->fail(make_error_code(errc::timed_out));
    break;
  }
}

/// The len `v` will be planned with (layout_builder's rule: a pickle's
/// nbytes, else its shape's elements times its dtype's size), so that
/// the consumer's max_entry_bytes can refuse it before it is planned;
/// 0 when `v` is malformed, which planning then reports. `dt` is
/// lookup_dtype(v.kind, v.dtype), which planning is given as well.
std::uint64_t entry_len_of(const value& v, const dtype* dt) {
  if (v.kind == KIND_PICKLE) return v.nbytes;
  if (!dt) return 0;
  std::uint64_t n = dt->itemsize;
  for (const std::int64_t d : v.shape)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return 0;
  return n;
}

/// What emit's steps that never wait decided (plan_emit).
struct emit_plan {
  std::error_code ec;  // refused: nothing framed, the blob stays usable
  const planned_entry* planned = nullptr;
  std::uint64_t credit = 0;
  int device = -1;     // cuda::location::device of a device value
};

/// emit's steps that never wait: the session's checks, where the value
/// lives, its planning (layout_builder), its meta into b.meta and its
/// credit. A plain function, not part of emit's coroutine: their locals
/// would be in emit's frame, which then passes the 1020 bytes up to which
/// Asio recycles a coroutine frame, and every emit would allocate one
/// (docs/performance.md "Per small entry, instructions").
emit_plan plan_emit(blob_state& b, std::string& key, value& v) {
  emit_plan p;
  sender_state& s = *b.sender;
  sender_blob& w = b.wire();
  b.last_error.clear();
  // The value's dtype, looked up once: for the length checked here and for
  // planning below (nothing between them looks a dtype up).
  const dtype* dt = v.kind == KIND_PICKLE ? nullptr : lookup_dtype(v.kind, v.dtype);
  if (auto ok = s.session.check_emit(w, key.size(), entry_len_of(v, dt)); !ok) {
    b.last_error = ok.message();
    if (s.error && ok.code() == s.error && !s.message.empty())
      b.last_error = "the sender ended: " + s.message;
    p.ec = ok.code();
    return p;
  }
  // Device memory? Asked before planning: a failure (no device) leaves the
  // blob usable. docs/cuda.md
  auto where = locate_value(s, v);
  if (!where) {
    b.last_error = where.message();
    p.ec = where.code();
    return p;
  }
  v.memory = where->kind;
  p.device = where->device;
  auto added = b.builder.add(std::move(key), std::move(v), dt);
  if (!added) {
    b.last_error = added.message();
    p.ec = added.code();  // nothing sent: the blob stays usable
    return p;
  }
  p.planned = *added;
  // Encoded into the blob's own buffer (blob calls are serialised by its
  // lock): no allocation per entry once warm. None for an entry going in
  // the compact form (sender_session::needs_meta).
  b.meta.clear();
  if (s.session.needs_meta(w, p.planned->entry)) p.planned->entry.append_meta(b.meta);
  // From here until entry_sent() an early return leaves the consumer
  // without this entry: the session holds the blob broken.
  auto credit = s.session.plan_entry(w, p.planned->entry, b.meta);
  if (!credit) {
    b.last_error = credit.message();
    p.ec = credit.code();
    return p;
  }
  p.credit = *credit;
  return p;
}

/// `ec`, an emit's failure while it waited or sent: last_error() says
/// why (the sender's failure reason, e.g. the consumer's close reason).
std::error_code failed(blob_state& b, std::error_code ec) {
  if (ec && b.last_error.empty())
    b.last_error = b.sender->error ? failure_text(*b.sender) : ec.message();
  return ec;
}

/// abort()'s one path, whatever the retention: the session ends the blob
/// (a plain session frames blob_abort when the consumer heard of it; a
/// resend session keeps the abort and syncs it, or forgets a blob no
/// consumer heard of). The caller holds the blob's lock.
asio::awaitable<std::error_code> end_blob(std::shared_ptr<blob_state> b, std::string reason) {
  auto s = b->sender;
  sender_blob& w = b->wire();
  if (w.ended()) co_return std::error_code{};
  if (b->kept) {
    if (s->error) co_return s->error;
  } else if (w.id() != 0 && s->queue->full()) {
    // Its reason is copied: room first, as for a tail. A failed wait leaves
    // the sender failed, so the session frames nothing below.
    (void)co_await wait_room(s, s->queue);
  }
  const bool tell = s->session.abort(w, reason);
  if (b->kept) {
    s->resend->kept_cv.notify_all();  // forgotten, or an end to deliver
    if (!tell) co_return std::error_code{};  // never on any wire: nobody to tell
    co_return co_await sync_kept(s, b->kept);
  }
  if (tell) {
    s->queue->kick();
    co_return std::error_code{};
  }
  // Not framed: the consumer never heard of it, or the sender ended.
  co_return w.id() != 0 ? s->error : std::error_code{};
}

/// Hands a finished plan's entries, emptied, to the sender's next blob
/// (sender_state::spare_entries) when it goes out of scope, where the plan
/// would have dropped them: the values' owners are released at the same
/// point as before. Storage above spare_entries_bytes is freed instead.
struct spare_entries_back {
  sender_state& s;
  std::vector<planned_entry>& entries;
  ~spare_entries_back() {
    const std::size_t cap = entries.capacity();
    if (cap * sizeof(planned_entry) > spare_entries_bytes || cap <= s.spare_entries.capacity())
      return;
    entries.clear();
    s.spare_entries = std::move(entries);
  }
};

/// Takes the blob's lock: at once when it is free, else in call order.
asio::awaitable<std::error_code> lock_blob(blob_state& b) {
  if (b.lock.try_lock()) co_return std::error_code{};
  co_return co_await b.lock.lock();
}

}  // namespace

blob_state::blob_state(std::shared_ptr<sender_state> s, const blob_options& o)
    : sender(std::move(s)),
      own(o.tag, o.group),
      builder(std::move(sender->spare_entries)),
      lock(sender->ex) {
  if (sender->resend) kept = std::make_shared<kept_blob>(sender->ex, o.tag, o.group);
}

blob_state::~blob_state() {
  if (kept) {
    kept_dropped(sender, std::move(kept));
    return;
  }
  // The session frames blob_abort only for a blob the consumer heard of.
  if (sender->session.abort(own, "blob_writer dropped")) sender->queue->kick();
}

}  // namespace detail

// ---- blob_writer ----

const tag_t& blob_writer::tag() const noexcept { return state_->wire().tag(); }
std::uint64_t blob_writer::id() const noexcept { return state_->wire().id(); }
std::size_t blob_writer::entry_count() const noexcept { return state_->builder.size(); }
const std::string& blob_writer::last_error() const noexcept { return state_->last_error; }

asio::awaitable<std::error_code> blob_writer::emit(std::string key, value v) {
  const std::uint64_t emitted = detail::steady_ns();  // emit -> entry_ready starts here
  auto b = state_;  // this handle may go away while we wait
  if (!b) co_return make_error_code(errc::invalid_argument);
  auto s = b->sender;
  // The blob's lock (lock_blob, inline: a small entry's emit costs no
  // coroutine frame but its own).
  if (!b->lock.try_lock()) {
    if (auto ec = co_await b->lock.lock()) co_return ec;
  }
  detail::unlock_guard guard(b->lock);
  auto q = s->queue;
  // The sender's own bound, whatever window the consumer grants: past
  // max_queued_bytes this waits for the writer before framing (so nothing
  // is planned yet if it fails). Copied entries return at once otherwise.
  if (!b->kept && q->full()) {
    b->last_error.clear();
    if (auto ec = co_await detail::wait_room(s, q)) co_return detail::failed(*b, ec);
  }
  const detail::emit_plan p = detail::plan_emit(*b, key, v);
  if (p.ec) co_return p.ec;
  // The retention policy: a resend session keeps a copy and sends that.
  if (b->kept) {
    const std::error_code kept = co_await detail::retain_entry(b, *p.planned, emitted);
    co_return detail::failed(*b, kept);
  }
  if (!s->session.take_credit(p.credit)) {
    if (auto ec = co_await detail::acquire_credit(s, q, p.credit)) co_return detail::failed(*b, ec);
  }
  // (Not a ?: of two co_awaits: GCC 12 evaluates them wrongly.)
  std::error_code ec;
  if (p.planned->source.memory == memory_kind::cuda_device) {
    ec = co_await detail::send_device_value(s, q, *b, *p.planned, b->meta, p.device, emitted);
  } else if (!detail::begin_entry(*s, *q, b->wire(), *p.planned, b->meta, emitted)) {
    ec = co_await detail::send_entry_bytes(s, q, b->wire(), *p.planned);
  }
  if (ec) co_return detail::failed(*b, ec);
  s->session.entry_sent(b->wire());
  co_return std::error_code{};
}

asio::awaitable<std::error_code> blob_writer::finish() {
  auto b = state_;
  if (!b) co_return make_error_code(errc::invalid_argument);
  auto s = b->sender;
  if (auto ec = co_await detail::lock_blob(*b)) co_return ec;
  detail::unlock_guard guard(b->lock);
  auto& session = s->session;
  sender_blob& w = b->wire();
  if (auto ok = session.check_finish(w); !ok) co_return ok.code();
  auto q = s->queue;
  // A tail is copied: it waits for room as a copied entry does, or blobs
  // ended in a loop would grow the queue without bound. (A resend
  // session's copies are bounded by unacked_bytes instead.)
  if (q->full() && !b->kept) {
    if (auto ec = co_await detail::wait_room(s, q)) co_return ec;
  }
  auto plan = b->builder.finish(w.tag());
  if (!plan) {
    (void)co_await detail::end_blob(b, plan.message());
    co_return plan.code();
  }
  const detail::spare_entries_back spare{*s, plan->entries};
  std::vector<std::byte> tail(tail_size(*plan));
  if (auto r = write_tail(*plan, tail); !r) co_return r.code();
  // The retention policy: a resend session keeps the tail within
  // unacked_bytes; a plain one frames it within the window.
  std::error_code waited;
  if (b->kept) {
    waited = co_await detail::retain(s, b->kept, tail.size());
  } else if (!session.take_credit(tail.size())) {
    waited = co_await detail::acquire_credit(s, q, tail.size());
  }
  if (waited) co_return waited;
  if (auto r = session.finish(w, tail); !r) co_return r.code();
  if (b->kept) co_return co_await detail::sync_kept(s, b->kept);
  q->kick();
  co_return std::error_code{};
}

asio::awaitable<std::error_code> blob_writer::abort(std::string reason) {
  auto b = state_;
  if (!b) co_return make_error_code(errc::invalid_argument);
  auto s = b->sender;
  if (auto ec = co_await detail::lock_blob(*b)) co_return ec;
  detail::unlock_guard guard(b->lock);
  co_return co_await detail::end_blob(b, std::move(reason));
}

// ---- sender ----

namespace {

/// The session's limits (with grants, window_bytes is what was granted
/// so far); all zero for a sender that was never started.
sender_limits limits_of(const std::shared_ptr<detail::sender_state>& s) noexcept {
  if (s) return s->session.limits();
  return sender_limits{.chunk_bytes = 0, .inline_bytes = 0, .window_bytes = 0, .features = 0,
                       .max_key_bytes = 0, .max_meta_bytes = 0, .dedup_window = 0,
                       .max_entry_bytes = 0};
}

}  // namespace

sender& sender::operator=(sender&& o) noexcept {
  if (this != &o) {
    close();
    state_ = std::move(o.state_);
  }
  return *this;
}

sender::~sender() { close(); }

asio::awaitable<std::tuple<std::error_code, sender>> sender::start(std::unique_ptr<transport> t,
                                                                   sender_options opt) {
  using ret = std::tuple<std::error_code, sender>;
  if (!t || opt.chunk_bytes < min_chunk_bytes || opt.inline_bytes > max_inline_bytes)
    co_return ret{make_error_code(errc::invalid_argument), sender{}};
  auto ex = t->get_executor();
  auto s = std::make_shared<detail::sender_state>(ex, std::move(opt));
  std::shared_ptr<transport> link(std::move(t));
  // The queue exists (not yet writing) from here, so a stall during the
  // handshake closes the link through it.
  s->queue = std::make_shared<detail::send_queue>(link, s->opt.max_queued_bytes);
  if (s->stall_watch.enabled()) s->tasks.spawn(detail::watch(s));
  s->stall_watch.begin_wait();
  auto [ec, reader] = co_await detail::handshake(s, link);
  s->stall_watch.end_wait();
  if (!ec && s->error) ec = s->error;  // the watchdog fired meanwhile
  if (ec) {
    const bool timed_out = !s->timeout_reason.empty();
    link->close();
    if (timed_out) ec = make_error_code(errc::timed_out);
    if (s->message.empty() && reader) s->message = reader->message;
    s->fail(ec);
    s->queue->release_link();  // its writer never ran
    co_return ret{ec, sender(std::move(s))};  // failed: failure_reason() says why
  }
  detail::install(s, std::move(reader));
  co_return ret{std::error_code{}, sender(std::move(s))};
}

asio::awaitable<std::tuple<std::error_code, sender>> sender::start(connect_fn connect,
                                                                   sender_options opt) {
  using ret = std::tuple<std::error_code, sender>;
  if (!connect || opt.chunk_bytes < min_chunk_bytes || opt.inline_bytes > max_inline_bytes ||
      opt.resend.unacked_bytes == 0 || opt.resend.max_attempts == 0)
    co_return ret{make_error_code(errc::invalid_argument), sender{}};
  auto ex = co_await asio::this_coro::executor;
  auto s = std::make_shared<detail::sender_state>(ex, std::move(opt), /*resend=*/true);
  s->resend = std::make_unique<detail::resend_state>(ex, std::move(connect));
  if (s->stall_watch.enabled()) s->tasks.spawn(detail::watch(s));
  if (auto ec = co_await detail::resend_start(s)) {
    s->fail(ec);
    co_return ret{ec, sender(std::move(s))};  // failed: failure_reason() says why
  }
  s->resend->live = true;  // nothing kept yet: nothing to re-sync
  co_return ret{std::error_code{}, sender(std::move(s))};
}

blob_writer sender::open_blob(const tag_t& tag) { return open_blob(blob_options{.tag = tag, .group = {}}); }

blob_writer sender::open_blob(const blob_options& opt) {
  // Ids are given when blob_begin is framed, not here.
  return blob_writer(std::make_shared<detail::blob_state>(state_, opt));
}

asio::awaitable<std::error_code> sender::flush() {
  auto s = state_;
  if (!s) co_return make_error_code(errc::closed);
  if (s->error) co_return s->error;
  auto q = s->queue;
  s->stall_watch.begin_wait();
  auto ec = co_await q->wait_written(q->ticket());
  s->stall_watch.end_wait();
  co_return ec ? ec : s->error;
}

asio::awaitable<std::error_code> sender::shutdown() {
  auto s = state_;
  if (!s) co_return make_error_code(errc::closed);
  if (s->resend) co_return co_await detail::resend_shutdown(s);
  if (s->error) {  // failed before (the peer, a limit, a failed start): its tasks still end here
    const std::error_code ec = s->error;
    co_await detail::end_tasks(s);
    co_return ec;
  }
  s->closing = true;
  auto q = s->queue;
  frame_close(q->frames(), {});
  q->kick();
  const std::uint64_t close_ticket = q->ticket();
  s->stall_watch.begin_wait();
  std::error_code written = co_await q->wait_written(close_ticket);
  s->stall_watch.end_wait();
  if (written && written != asio::error::operation_aborted) {
    // The consumer answers `close` by closing its end, and the ack reader
    // may see that (and fail the queue) before the writer has recorded the
    // write that carried `close`: wait for the writer to end, then the
    // transport's outcome of that write decides, not the order of the two.
    co_await q->join_writer();
    if (q->wrote(close_ticket)) written = {};
  }
  if (written) {
    const std::error_code ec = s->error ? s->error : written;
    co_await detail::end_tasks(s);
    co_return ec;
  }
  // The consumer answers our close by closing its end; the ack reader sees
  // that and records `closed`. Anything else is the real outcome.
  while (!s->reader_done) {
    s->stall_watch.begin_wait();
    const bool cancelled = co_await s->reader_cv.wait();
    s->stall_watch.end_wait();
    if (cancelled) {
      s->fail(make_error_code(errc::closed));
      co_return std::error_code(asio::error::operation_aborted);
    }
  }
  const std::error_code late = co_await detail::end_tasks(s);
  if (late) co_return late;
  co_return s->error == errc::closed ? std::error_code{} : s->error;
}

void sender::close() noexcept {
  if (state_) state_->fail(make_error_code(errc::closed));
}

std::error_code sender::error() const noexcept { return state_ ? state_->error : std::error_code{}; }
const std::string& sender::failure_reason() const noexcept {
  static const std::string none;
  return state_ ? state_->message : none;
}
// The negotiated limits and the credit are the session's.
std::uint32_t sender::chunk_bytes() const noexcept { return limits_of(state_).chunk_bytes; }
std::uint32_t sender::inline_bytes() const noexcept { return limits_of(state_).inline_bytes; }
std::uint64_t sender::window_bytes() const noexcept { return limits_of(state_).window_bytes; }
std::uint32_t sender::max_key_bytes() const noexcept { return limits_of(state_).max_key_bytes; }
std::uint32_t sender::max_meta_bytes() const noexcept { return limits_of(state_).max_meta_bytes; }
std::uint64_t sender::features() const noexcept { return limits_of(state_).features; }
std::uint64_t sender::max_entry_bytes() const noexcept { return limits_of(state_).max_entry_bytes; }
std::uint64_t sender::in_flight_bytes() const noexcept {
  return state_ ? state_->session.in_flight() : 0;
}
std::uint64_t sender::unacked_bytes() const noexcept {
  return state_ && state_->resend ? state_->session.kept_bytes() : 0;
}
sender_stats sender::stats() const noexcept { return state_ ? state_->stats() : sender_stats{}; }

}  // namespace blobpipe
