// Resend sessions (docs/wire.md "Delivery", docs/reliability.md): kept
// blobs, delivery acknowledgements, reconnecting, re-syncing.
#include "lib/pipeline/resend.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <utility>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/pipeline/device_send.hpp"

namespace blobpipe::detail {
namespace {

constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

session_id random_session() {
  const tag_t t = random_tag();  // uuid4 bytes: random enough, never all zero
  session_id s;
  std::copy(t.begin(), t.end(), s.begin());
  return s;
}

asio::awaitable<void> reconnect(std::shared_ptr<sender_state> s);

}  // namespace

void connection_lost(const std::shared_ptr<sender_state>& s, std::uint64_t connection,
                     std::error_code ec, std::string why) {
  auto& rs = *s->resend;
  if (s->error || s->session.connection() != connection || !rs.connected) return;
  rs.connected = rs.live = false;
  rs.last_error = ec;
  rs.last_reason = why.empty() ? ec.message() : std::move(why);
  // Only delivery counts as the connection working: a consumer that
  // completes the handshake and then closes, or goes silent, or refuses
  // the same blob each time, delivers nothing. A connection with nothing
  // to deliver (no blob kept: a worker between steps, whose consumer drops
  // idle connections) is no failure; the next attempt still backs off.
  if (std::exchange(rs.delivered_here, false)) {
    rs.failures = 0;
    rs.retries = 0;
  } else {
    ++rs.retries;
    if (s->session.kept_blobs() != 0) ++rs.failures;
  }
  s->queue->fail(ec);
  s->credit_cv.notify_all();
  s->reader_cv.notify_all();
  rs.kept_cv.notify_all();
  s->tasks.spawn(reconnect(s));
}

/// What a connection attempt waits on, for its deadline to end: the
/// connect function's coroutine (cancelled: connect_fn should honour it),
/// then the link (closed: the handshake's read or write fails).
struct attempt_wait {
  asio::cancellation_signal connecting;
  std::shared_ptr<transport> link;
  void end() {
    if (link) link->close();
    else connecting.emit(asio::cancellation_type::all);
  }
};

void resend_failed(sender_state& s) noexcept {
  auto& rs = *s.resend;
  rs.connected = rs.live = false;
  rs.kept_cv.notify_all();
  rs.retry_wait.notify_all();
  if (auto a = rs.attempt.lock()) a->end();
}

namespace {

/// Whether connection number `c` is still the sender's and healthy.
bool current(const sender_state& s, std::uint64_t c) {
  return !s.error && s.session.connection() == c && s.resend->connected;
}

/// Sends what the current connection has not seen of `kb`, as the session
/// says step by step. With `resyncing`, runs before the connection is live
/// (the reconnector); otherwise only when it is (producers), so resent
/// blobs begin before new ones. Entries go through the one chunk loop.
asio::awaitable<void> sync(std::shared_ptr<sender_state> s, std::shared_ptr<kept_blob> kb,
                           bool resyncing) {
  auto& rs = *s->resend;
  auto usable = [&] {
    return !s->error && rs.connected && (rs.live || resyncing) && !kb->delivered();
  };
  if (!usable()) co_return;
  const std::error_code locked = co_await kb->send_lock.lock();
  if (locked) co_return;  // closed
  unlock_guard guard(kb->send_lock);
  if (!usable()) co_return;
  auto& ss = s->session;
  const std::uint64_t conn = ss.connection();
  auto q = s->queue;
  ss.begin_sync(*kb);  // a delivery meanwhile leaves the bytes to us until we are done
  struct done_sending {
    sender_session& ss;
    kept_blob& kb;
    ~done_sending() { ss.end_sync(kb); }
  } done{ss, *kb};
  for (;;) {
    const sync_step step = ss.next_step(*kb);  // frames blob_begin on a new connection
    q->kick();
    if (step == sync_step::none) break;
    if (step == sync_step::abort) {
      ss.send_kept_end(*kb, step);
      q->kick();
      break;
    }
    const std::uint64_t credit =
        step == sync_step::entry ? ss.kept_credit(*kb) : ss.tail_bytes(*kb);
    if (!ss.take_credit(credit)) {
      const std::error_code ec = co_await acquire_credit(s, q, credit);
      if (ec) co_return;
    }
    if (step == sync_step::tail) {
      ss.send_kept_end(*kb, step);
      q->kick();
      break;
    }
    const kept_entry& e = kb->kept()[kb->entries()];  // deque: stable while others are added
    auto room = ss.send_kept_entry(*kb);
    q->kick();
    if (!room.empty()) {
      std::memcpy(room.data(), e.bytes.data(), e.bytes.size());
    } else if (!e.bytes.empty()) {
      const std::error_code sent = co_await send_chunks(s, q, *kb, e.bytes);
      if (sent) co_return;
    }
    if (!current(*s, conn)) co_return;
    ss.entry_sent(*kb);
  }
  if (q->full()) (void)co_await wait_room(s, q);
}

/// sync() for a producer: its entry is kept already, so a cancellation of
/// the producer must not leave the entry half sent on a live connection.
/// A producer that can be cancelled (its coroutine has a connected slot)
/// runs sync as a task of its own that the cancellation does not reach (an
/// empty slot); its own cancellation state is not touched, so a producer
/// cancelled meanwhile is still cancelled once the entry is sent, its next
/// co_await throwing operation_aborted. One cancelled before this point
/// threw at the co_await of this function already (one that turned
/// throw_if_cancelled off sends the entry all the same).
asio::awaitable<void> sync_shielded(std::shared_ptr<sender_state> s,
                                    std::shared_ptr<kept_blob> kb) {
  const auto cs = co_await asio::this_coro::cancellation_state;
  if (!cs.slot().is_connected()) {  // nothing can cancel this producer
    co_await sync(std::move(s), std::move(kb), false);
    co_return;
  }
  co_await asio::co_spawn(co_await asio::this_coro::executor,
                          sync(std::move(s), std::move(kb), false),
                          asio::bind_cancellation_slot(asio::cancellation_slot(),
                                                       asio::use_awaitable));
}

/// Re-sends every kept blob on connection number `conn`, oldest first,
/// then makes it live. Blobs kept meanwhile are picked up by the next pass.
asio::awaitable<void> resync(std::shared_ptr<sender_state> s, std::uint64_t conn) {
  auto& rs = *s->resend;
  for (;;) {
    if (!current(*s, conn)) co_return;
    auto todo = s->session.to_resync();
    if (todo.empty()) break;
    for (auto& kb : todo) {
      co_await sync(s, std::static_pointer_cast<kept_blob>(kb), true);
      if (!current(*s, conn)) co_return;
    }
  }
  rs.live = true;
  rs.kept_cv.notify_all();
}

struct attempt_result {
  std::error_code ec;
  std::string reason;                  // why it failed, where known
  std::shared_ptr<ack_reader> reader;  // set on success: handshake done
};

/// `r` of an attempt bounded by `bound`: timed_out with the limit's
/// reason once it expired (whatever else failed then), its link closed.
attempt_result bounded(attempt_result r, const deadline& bound, attempt_wait& wait) {
  if (!bound.expired()) return r;
  if (wait.link) wait.link->close();
  r.reader.reset();
  r.ec = make_error_code(errc::timed_out);
  r.reason = bound.reason("no connection and handshake with the consumer", "stall_timeout");
  return r;
}

/// One connection attempt, connect and handshake, bounded as a whole by
/// stall_timeout when one is set (the handshake by handshake_timeout
/// too): past it the attempt ends with timed_out.
asio::awaitable<attempt_result> attempt(std::shared_ptr<sender_state> s) {
  auto wait = std::make_shared<attempt_wait>();
  s->resend->attempt = wait;
  const deadline bound(s->ex, s->opt.stall_timeout, [w = std::weak_ptr<attempt_wait>(wait)] {
    if (auto a = w.lock()) a->end();
  });
  attempt_result r;
  // The connect runs with a slot of its own (the deadline cancels it);
  // the caller's cancellation (a cancelled sender::start, Ctrl-C in
  // Python's connect()) is forwarded to it while it runs.
  asio::cancellation_slot caller = (co_await asio::this_coro::cancellation_state).slot();
  if (caller.is_connected())
    caller.assign([w = std::weak_ptr<attempt_wait>(wait)](asio::cancellation_type type) {
      if (auto a = w.lock()) a->connecting.emit(type);
    });
  auto [thrown, connected] = co_await asio::co_spawn(
      s->ex, s->resend->connect(),
      asio::bind_cancellation_slot(wait->connecting.slot(), use_tuple));
  if (caller.is_connected()) caller.clear();
  // Ended by its deadline or by the sender's end, a connect that threw
  // (operation_aborted) is a failed attempt, not the caller's exception.
  if (thrown && !bound.expired() && !s->error) std::rethrow_exception(thrown);
  auto& [ec, t] = connected;
  r.ec = ec;
  if (!r.ec && !t) r.ec = make_error_code(errc::peer_failed);
  if (t) wait->link = std::shared_ptr<transport>(std::move(t));  // closed if it expired
  if (s->error) wait->end();  // the sender ended meanwhile: no handshake
  if (r.ec || bound.expired()) co_return bounded(std::move(r), bound, *wait);
  auto [hec, reader] = co_await handshake(s, wait->link);
  r.ec = hec;
  if (r.ec) {
    reader->link->close();
    r.reason = reader->message;
    co_return bounded(std::move(r), bound, *wait);
  }
  r.reader = std::move(reader);
  co_return bounded(std::move(r), bound, *wait);
}

/// install() for a resend session: the consumer's window of remembered
/// tags bounds the blobs kept, and the blobs of the old connection are
/// begun afresh here.
void resend_install(const std::shared_ptr<sender_state>& s, std::shared_ptr<ack_reader> reader) {
  auto& rs = *s->resend;
  rs.connected = true;
  rs.live = false;
  install(s, std::move(reader));
  rs.kept_cv.notify_all();
}

/// Ends the session: max_attempts attempts in a row delivered nothing.
std::error_code give_up(sender_state& s) {
  auto& rs = *s.resend;
  // Before the first handshake nothing could be delivered: say that no
  // consumer was reached, with the hint the plain connect gives unless one
  // answered and refused (a bad hello: the reason says what).
  const bool never_connected = s.session.connection() == 0;
  const bool refused = rs.last_error == errc::protocol_violation;
  if (s.message.empty())
    s.message = (never_connected ? "no handshake with the consumer on "
                                 : "no blob delivered on ") +
                std::to_string(rs.failures) + " connection attempts in a row (max_attempts " +
                std::to_string(s.opt.resend.max_attempts) + "); the last: " + rs.last_reason +
                (never_connected && !refused ? "; is the consumer listening and accepting?" : "");
  s.fail(rs.last_error);
  return s.error;
}

/// The wait before retry number `retries` (1: the first): retry_delay,
/// doubling with each retry, never above max_retry_delay
/// (producer.hpp resend_options).
std::chrono::milliseconds backoff_delay(const resend_options& o, std::uint32_t retries) {
  auto delay = o.retry_delay;
  for (std::uint32_t i = 1; i < retries && delay < o.max_retry_delay; ++i) delay *= 2;
  return std::min(delay, o.max_retry_delay);
}

/// Connects until it works or max_attempts attempts in a row delivered
/// nothing (failed, or connections that ended with no delivery ack).
asio::awaitable<std::error_code> connect_loop(std::shared_ptr<sender_state> s) {
  auto& rs = *s->resend;
  while (!s->error) {
    if (rs.failures >= s->opt.resend.max_attempts) co_return give_up(*s);
    if (rs.retries > 0) {
      (void)co_await rs.retry_wait.wait_for(backoff_delay(s->opt.resend, rs.retries));
      if (s->error) break;
    }
    auto r = co_await attempt(s);
    if (s->error) {
      if (r.reader) r.reader->link->close();
      break;
    }
    if (!r.ec) {
      resend_install(s, std::move(r.reader));
      co_return std::error_code{};
    }
    rs.last_error = r.ec;
    rs.last_reason = r.reason.empty() ? r.ec.message() : std::move(r.reason);
    ++rs.failures;
    ++rs.retries;
  }
  co_return s->error;
}

asio::awaitable<void> reconnect(std::shared_ptr<sender_state> s) {
  const std::error_code ec = co_await connect_loop(s);
  if (ec) co_return;
  co_await resync(s, s->session.connection());
}

/// Waits for kept_cv; true when the waiting coroutine was cancelled.
asio::awaitable<bool> wait_kept(std::shared_ptr<sender_state> s) {
  s->stall_watch.begin_wait();
  const bool cancelled = co_await s->resend->kept_cv.wait();
  s->stall_watch.end_wait();
  co_return cancelled;
}

}  // namespace

asio::awaitable<std::error_code> retain(std::shared_ptr<sender_state> s,
                                        std::shared_ptr<kept_blob> kb, std::uint64_t n) {
  auto& ss = s->session;
  for (;;) {
    if (s->error) co_return s->error;
    if (ss.list(kb)) break;
    const bool cancelled = co_await wait_kept(s);
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  bool counted = false;
  while (!s->error) {
    if (ss.admit(*kb, n)) co_return std::error_code{};
    if (!counted) ss.note_budget_wait(), counted = true;
    const bool cancelled = co_await wait_kept(s);
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  co_return s->error;
}

asio::awaitable<std::error_code> sync_kept(std::shared_ptr<sender_state> s,
                                           std::shared_ptr<kept_blob> kb) {
  co_await sync_shielded(s, std::move(kb));
  co_return s->error;
}

void resend_acked(sender_state& s, const std::shared_ptr<sender_blob>& delivered) {
  auto& rs = *s.resend;
  if (!delivered) return;
  // The connection delivers: when it ends, the count starts over
  // (connection_lost).
  rs.delivered_here = true;
  rs.kept_cv.notify_all();
}

asio::awaitable<std::error_code> retain_entry(std::shared_ptr<blob_state> b,
                                              const planned_entry& planned,
                                              std::uint64_t emitted_ns) {
  auto s = b->sender;
  auto kb = b->kept;
  auto& ss = s->session;
  kept_entry e;
  e.emitted_ns = emitted_ns;
  e.meta = b->meta;
  const std::uint64_t n = planned.entry.len + planned.entry.key.size() + e.meta.size();
  if (auto ec = co_await retain(s, kb, n)) co_return ec;
  e.bytes.resize(planned.entry.len);
  // The one copy a resend session makes: host values gathered, device
  // values copied to the host (docs/cuda.md), both into the kept bytes.
  auto copied = planned.source.memory == memory_kind::cuda_device
                    ? read_device_entry(planned, e.bytes)
                    : write_entry(planned, e.bytes);
  if (!copied) {
    ss.refund(*kb, n);
    b->last_error = copied.message();
    co_return copied.code();
  }
  if (planned.source.memory == memory_kind::cuda_device) {
    ++s->io.device_entries;
  } else if (!planned.contiguous) {
    ++s->io.gathered_entries;
  }
  e.entry = planned.entry;
  ss.keep_entry(*kb, std::move(e));
  co_return co_await sync_kept(s, kb);
}

void kept_dropped(const std::shared_ptr<sender_state>& s, std::shared_ptr<kept_blob> kb) {
  if (s->error) return;
  const bool tell = s->session.abort(*kb, "blob_writer dropped");
  s->resend->kept_cv.notify_all();
  if (tell) s->tasks.spawn(sync(s, std::move(kb), false));
}

void resend_stalled(const std::shared_ptr<sender_state>& s) {
  connection_lost(s, s->session.connection(), make_error_code(errc::timed_out),
                  "nothing from the consumer for " + std::to_string(s->opt.stall_timeout.count()) +
                      " ms (stall_timeout)");
}

asio::awaitable<std::error_code> resend_start(std::shared_ptr<sender_state> s) {
  s->resend->session = random_session();
  co_return co_await connect_loop(s);
}

asio::awaitable<std::error_code> resend_shutdown(std::shared_ptr<sender_state> s) {
  auto& rs = *s->resend;
  // Every ended blob delivered first; open ones are abandoned.
  for (;;) {
    if (s->error) {
      const std::error_code ec = s->error;
      co_await end_tasks(s);
      co_return ec;
    }
    const bool pending = s->session.ended_pending();
    if (!pending && !rs.connected) {  // all delivered, no connection to close
      // A connection attempt in flight ends here (or the wait is bounded).
      const std::error_code late = co_await end_tasks(s);
      co_return late;
    }
    if (!pending && rs.live) break;
    const bool cancelled = co_await wait_kept(s);
    if (cancelled) {
      s->fail(make_error_code(errc::closed));
      co_return std::error_code(asio::error::operation_aborted);
    }
  }
  s->closing = true;
  const std::uint64_t conn = s->session.connection();
  auto q = s->queue;
  frame_close(q->frames(), {});
  q->kick();
  const std::error_code close_ec = co_await q->wait_written(q->ticket());
  if (!close_ec) {
    // The consumer answers our close by closing its end.
    while (!s->error && s->session.connection() == conn && !s->reader_done) {
      s->stall_watch.begin_wait();
      const bool cancelled = co_await s->reader_cv.wait();
      s->stall_watch.end_wait();
      if (cancelled) {
        s->fail(make_error_code(errc::closed));
        co_return std::error_code(asio::error::operation_aborted);
      }
    }
  }
  // Everything ended was delivered: whatever the close did, we are done.
  const bool violated = s->error == errc::protocol_violation;
  const std::error_code late = co_await end_tasks(s);
  if (violated) co_return make_error_code(errc::protocol_violation);
  co_return late;
}

}  // namespace blobpipe::detail

namespace blobpipe {

std::chrono::milliseconds resend_give_up_bound(const sender_options& o) {
  using std::chrono::milliseconds;
  milliseconds attempt = o.handshake_timeout;
  if (o.stall_timeout.count() > 0 && (attempt.count() <= 0 || o.stall_timeout < attempt))
    attempt = o.stall_timeout;  // attempt() bounds the whole attempt with it
  if (attempt.count() <= 0) return milliseconds{0};
  const std::uint32_t attempts = std::max<std::uint32_t>(o.resend.max_attempts, 1);
  milliseconds total = attempt * attempts;
  // The waits before attempts 2 .. attempts, as connect_loop waits them.
  for (std::uint32_t retries = 1; retries < attempts; ++retries)
    total += detail::backoff_delay(o.resend, retries);
  return total;
}

}  // namespace blobpipe
