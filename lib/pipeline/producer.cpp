// The sender and its blob writers (docs/wire.md "Sender", "Flow control").
// Each entry is planned with layout_builder and sent at once: entry_begin,
// then data frames pointing at the value's own memory; the tail goes last.
#include "blobpipe/pipeline/producer.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>

#include "lib/pipeline/producer_device.hpp"
#include "lib/pipeline/resend.hpp"
#include "lib/pipeline/sender_state.hpp"

namespace blobpipe {
namespace detail {

sender_state::sender_state(std::shared_ptr<transport> tr, asio::any_io_executor e,
                           sender_options o)
    : t(std::move(tr)), ex(std::move(e)), opt(std::move(o)), credit_cv(ex), reader_cv(ex),
      dog(ex, opt.stall_timeout, {}) {
  dog.owes(true);  // whenever the sender waits on the consumer, it is owed
}

sender_state::~sender_state() = default;

void sender_state::fail(std::error_code ec) noexcept {
  if (!error) error = ec;
  if (t) t->close();
  credit_cv.notify_all();
  reader_cv.notify_all();
  dog.stop();
  if (rs) {
    rs->connected = rs->live = false;
    rs->kept_cv.notify_all();
    rs->retry_timer.cancel();
  }
}

namespace {

/// Ends a stalled connection (sender_options::stall_timeout): a plain
/// sender fails with timed_out, a resend session reconnects.
asio::awaitable<void> watch(std::shared_ptr<sender_state> s) {
  // (No co_await inside a loop or if condition in these files: GCC 12
  // miscompiles some of those coroutines into a trap.)
  for (;;) {
    const bool expired = co_await s->dog.expired();
    if (!expired) break;
    if (s->rs) {
      resend_stalled(s);
      s->dog.progress();
      continue;
    }
    s->timeout_reason = "nothing from the consumer for " +
                        std::to_string(s->opt.stall_timeout.count()) + " ms (stall_timeout)";
    s->message = s->timeout_reason;
    s->fail(make_error_code(errc::timed_out));
    break;
  }
}

void violation(sender_state& s, std::string what) {
  s.message = std::move(what);
  s.fail(make_error_code(errc::protocol_violation));
}

/// Waits until `n` more bytes fit the consumer's window (or nothing is
/// outstanding: an entry larger than the window goes alone), then takes them.
asio::awaitable<std::error_code> acquire_credit(std::shared_ptr<sender_state> s,
                                                std::uint64_t n) {
  bool counted = false;
  while (!s->error) {
    const bool fits = s->in_flight <= s->window_bytes && n <= s->window_bytes - s->in_flight;
    if (n == 0 || s->in_flight == 0 || fits) {
      s->in_flight += n;
      co_return std::error_code{};
    }
    if (!counted) ++s->stats.credit_waits, counted = true;
    s->dog.begin_wait();
    const bool cancelled = co_await s->credit_cv.wait();
    s->dog.end_wait();
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  co_return s->error;
}

/// Sends one frame; a transport failure ends the whole connection.
asio::awaitable<std::error_code> send(sender_state& s, const frame_header& h,
                                      std::span<const std::byte> payload) {
  if (s.error) co_return s.error;
  s.dog.begin_wait();
  auto ec = co_await send_frame(*s.t, h, payload);
  s.dog.end_wait();
  if (ec) s.fail(ec);
  s.dog.progress();
  co_return ec ? s.error : ec;
}

/// Reads acknowledgements (and the consumer's close) until the connection ends.
asio::awaitable<void> read_acks(std::shared_ptr<sender_state> s) {
  for (;;) {
    auto [ec, h] = co_await s->t->receive_header();
    if (ec) {
      // After our `close`, the consumer closing its end is the orderly finish.
      s->fail(s->closing && ec == errc::peer_closed ? make_error_code(errc::closed) : ec);
      break;
    }
    s->dog.progress();
    if (h.type == frame_type::ack && h.length == 0 && h.arg <= s->in_flight) {
      s->in_flight -= h.arg;
      s->credit_cv.notify_all();
      continue;
    }
    if (h.type == frame_type::close && h.length <= max_reason_bytes) {
      std::vector<std::byte> reason(h.length);
      if (h.length != 0) (void)co_await s->t->receive_payload(reason);
      s->fail(make_error_code(s->closing ? errc::closed : errc::peer_closed));
      break;
    }
    violation(*s, std::string("unexpected ") + frame_type_name(h.type) + " frame from consumer");
    break;
  }
  s->reader_done = true;
  s->reader_cv.notify_all();
}

asio::awaitable<std::error_code> ensure_begun(blob_state& b) {
  if (b.begun) co_return std::error_code{};
  frame_header h{.type = frame_type::blob_begin, .length = TAG_SIZE, .blob_id = b.id};
  auto ec = co_await send(*b.sender, h, b.tag);
  if (!ec) b.begun = true;
  co_return ec;
}

asio::awaitable<void> send_abort(std::shared_ptr<sender_state> s, std::uint64_t id,
                                 std::string reason) {
  if (reason.size() > max_reason_bytes) reason.resize(max_reason_bytes);
  frame_header h{.type = frame_type::blob_abort,
                 .length = static_cast<std::uint32_t>(reason.size()),
                 .blob_id = id};
  (void)co_await send(*s, h, std::as_bytes(std::span(reason)));
}

}  // namespace

blob_state::~blob_state() {
  if (kept) {
    kept_dropped(sender, std::move(kept));
    return;
  }
  if (begun && !ended && !sender->error)
    asio::co_spawn(sender->ex, send_abort(sender, id, "blob_writer dropped"), asio::detached);
}

}  // namespace detail

// ---- blob_writer ----

const tag_t& blob_writer::tag() const noexcept { return state_->tag; }
std::uint64_t blob_writer::id() const noexcept {
  return state_->kept ? state_->kept->wire_id : state_->id;
}
std::size_t blob_writer::entry_count() const noexcept { return state_->builder.size(); }
const std::string& blob_writer::last_error() const noexcept { return state_->last_error; }

asio::awaitable<std::error_code> blob_writer::emit(std::string key, value v) {
  auto b = state_;  // this handle may go away while we wait
  if (!b) co_return make_error_code(errc::invalid_argument);
  auto s = b->sender;
  if (auto ec = co_await b->lock.lock()) co_return ec;
  detail::unlock_guard guard(b->lock);
  if (b->ended || b->broken) co_return make_error_code(errc::closed);
  if (s->error) co_return s->error;
  if (key.size() > s->max_key_bytes) co_return make_error_code(errc::invalid_argument);
  // Device memory? Asked before planning: a failure (no device) leaves the
  // blob usable. docs/cuda.md
  b->last_error.clear();
  auto where = detail::locate_value(*s, v);
  if (!where) {
    b->last_error = where.message();
    co_return where.code();
  }
  v.memory = where->kind;
  if (b->kept) co_return co_await detail::kept_emit(b, std::move(key), std::move(v));
  if (auto ec = co_await detail::ensure_begun(*b)) co_return ec;

  auto added = b->builder.add(std::move(key), std::move(v));
  if (!added) co_return added.code();  // nothing sent: the blob stays usable
  const planned_entry& pe = **added;
  const std::uint64_t index = b->builder.size() - 1;
  // From here an early return leaves the consumer without this entry.
  b->broken = true;

  const auto meta = pe.entry.meta();
  if (meta.size() > s->max_meta_bytes) co_return make_error_code(errc::invalid_argument);
  if (auto ec = co_await detail::acquire_credit(s, pe.entry.len)) co_return ec;
  const auto begin = encode_entry_begin(pe.entry.key, meta);
  frame_header h{.type = frame_type::entry_begin,
                 .length = static_cast<std::uint32_t>(begin.size()),
                 .blob_id = b->id,
                 .arg = index};
  if (auto ec = co_await detail::send(*s, h, begin)) co_return ec;

  // Device bytes take their own route to the same data frames.
  if (pe.source.memory == memory_kind::cuda_device) {
    if (auto ec = co_await detail::send_device_bytes(s, *b, pe, where->device)) co_return ec;
    b->broken = false;
    co_return std::error_code{};
  }

  // Zero copy: chunks point into the value's memory. A strided value is
  // the documented exception: gathered once into `gathered`.
  const std::byte* src = pe.source.data;
  std::vector<std::byte> gathered;
  if (!pe.contiguous && pe.entry.len != 0) {
    gathered.resize(pe.entry.len);
    if (auto r = write_entry(pe, gathered); !r) co_return r.code();
    src = gathered.data();
    ++s->stats.gathered_entries;
  }
  const std::uint64_t len = pe.entry.len;
  for (std::uint64_t pos = 0; pos < len;) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(s->chunk_bytes, len - pos));
    frame_header d{.type = frame_type::data, .length = n, .blob_id = b->id,
                   .arg = pe.entry.off + pos};
    if (auto ec = co_await detail::send(*s, d, std::span(src + pos, n))) co_return ec;
    ++s->stats.data_frames_sent;
    pos += n;
  }
  s->stats.bytes_sent += len;
  ++s->stats.entries_sent;
  b->broken = false;
  co_return std::error_code{};
}

asio::awaitable<std::error_code> blob_writer::finish() {
  auto b = state_;
  if (!b) co_return make_error_code(errc::invalid_argument);
  auto s = b->sender;
  if (auto ec = co_await b->lock.lock()) co_return ec;
  detail::unlock_guard guard(b->lock);
  if (b->kept) co_return co_await detail::kept_finish(b);
  if (b->ended || b->broken) co_return make_error_code(errc::closed);
  if (s->error) co_return s->error;
  if (auto ec = co_await detail::ensure_begun(*b)) co_return ec;

  auto plan = b->builder.finish(b->tag);
  if (!plan) {
    b->ended = true;
    co_await detail::send_abort(s, b->id, plan.message());
    co_return plan.code();
  }
  std::vector<std::byte> tail(tail_size(*plan));
  if (auto r = write_tail(*plan, tail); !r) co_return r.code();
  if (auto ec = co_await detail::acquire_credit(s, tail.size())) co_return ec;
  frame_header h{.type = frame_type::tail,
                 .length = static_cast<std::uint32_t>(tail.size()),
                 .blob_id = b->id};
  b->ended = true;
  if (auto ec = co_await detail::send(*s, h, tail)) co_return ec;
  s->stats.bytes_sent += tail.size();
  co_return std::error_code{};
}

asio::awaitable<std::error_code> blob_writer::abort(std::string reason) {
  auto b = state_;
  if (!b) co_return make_error_code(errc::invalid_argument);
  auto s = b->sender;
  if (auto ec = co_await b->lock.lock()) co_return ec;
  detail::unlock_guard guard(b->lock);
  if (b->kept) co_return co_await detail::kept_abort(b, std::move(reason));
  if (b->ended) co_return std::error_code{};
  b->ended = true;
  if (!b->begun) co_return std::error_code{};  // the consumer never heard of it
  if (s->error) co_return s->error;
  co_await detail::send_abort(s, b->id, std::move(reason));
  co_return s->error;
}

// ---- sender ----

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
  if (!t || opt.chunk_bytes < min_chunk_bytes)
    co_return ret{make_error_code(errc::invalid_argument), sender{}};
  auto ex = t->get_executor();
  auto s = std::make_shared<detail::sender_state>(std::move(t), ex, std::move(opt));
  if (s->dog.enabled()) asio::co_spawn(s->ex, detail::watch(s), asio::detached);
  s->dog.begin_wait();
  auto [ec, peer] = co_await detail::handshake(*s->t, s->opt.chunk_bytes, NO_SESSION);
  s->dog.end_wait();
  if (ec) {
    const bool timed_out = !s->timeout_reason.empty();
    s->fail(ec);
    co_return ret{timed_out ? make_error_code(errc::timed_out) : ec, sender{}};
  }
  s->chunk_bytes = peer.max_chunk_bytes;
  s->window_bytes = peer.window_bytes;
  s->max_key_bytes = peer.max_key_bytes;
  s->max_meta_bytes = peer.max_meta_bytes;
  asio::co_spawn(s->ex, detail::read_acks(s), asio::detached);
  co_return ret{std::error_code{}, sender(std::move(s))};
}

asio::awaitable<std::tuple<std::error_code, sender>> sender::start(connect_fn connect,
                                                                   sender_options opt) {
  using ret = std::tuple<std::error_code, sender>;
  if (!connect || opt.chunk_bytes < min_chunk_bytes || opt.resend.unacked_bytes == 0 ||
      opt.resend.max_attempts == 0)
    co_return ret{make_error_code(errc::invalid_argument), sender{}};
  auto ex = co_await asio::this_coro::executor;
  auto s = std::make_shared<detail::sender_state>(nullptr, ex, std::move(opt));
  s->rs = std::make_unique<detail::resend_state>(ex, std::move(connect));
  if (s->dog.enabled()) asio::co_spawn(s->ex, detail::watch(s), asio::detached);
  if (auto ec = co_await detail::resend_start(s)) {
    s->fail(ec);
    co_return ret{ec, sender{}};
  }
  s->rs->live = true;  // nothing kept yet: nothing to re-sync
  co_return ret{std::error_code{}, sender(std::move(s))};
}

blob_writer sender::open_blob(const tag_t& tag) {
  if (state_->rs) {  // wire ids are given per connection, when the blob is sent
    auto b = std::make_shared<detail::blob_state>(state_, 0, tag);
    b->kept = std::make_shared<detail::kept_blob>(state_->ex, tag);
    return blob_writer(std::move(b));
  }
  return blob_writer(std::make_shared<detail::blob_state>(state_, state_->next_blob_id++, tag));
}

asio::awaitable<std::error_code> sender::shutdown() {
  auto s = state_;
  if (!s) co_return make_error_code(errc::closed);
  if (s->rs) co_return co_await detail::resend_shutdown(s);
  if (s->error) co_return s->error;
  s->closing = true;
  const frame_header close_frame{.type = frame_type::close};
  if (auto ec = co_await detail::send(*s, close_frame, {})) co_return ec;
  // The consumer answers our close by closing its end; the ack reader sees
  // that and records `closed`. Anything else is the real outcome.
  while (!s->reader_done) {
    s->dog.begin_wait();
    const bool cancelled = co_await s->reader_cv.wait();
    s->dog.end_wait();
    if (cancelled) {
      s->fail(make_error_code(errc::closed));
      co_return std::error_code(asio::error::operation_aborted);
    }
  }
  s->t->close();
  co_return s->error == errc::closed ? std::error_code{} : s->error;
}

void sender::close() noexcept {
  if (state_) state_->fail(make_error_code(errc::closed));
}

std::error_code sender::error() const noexcept { return state_ ? state_->error : std::error_code{}; }
std::uint32_t sender::chunk_bytes() const noexcept { return state_ ? state_->chunk_bytes : 0; }
std::uint64_t sender::window_bytes() const noexcept { return state_ ? state_->window_bytes : 0; }
std::uint64_t sender::in_flight_bytes() const noexcept { return state_ ? state_->in_flight : 0; }
std::uint64_t sender::unacked_bytes() const noexcept {
  return state_ && state_->rs ? state_->rs->kept_bytes : 0;
}
sender_stats sender::stats() const noexcept { return state_ ? state_->stats : sender_stats{}; }

}  // namespace blobpipe
