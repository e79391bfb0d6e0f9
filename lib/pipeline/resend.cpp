// Resend sessions (docs/wire.md "Delivery", docs/reliability.md): kept
// blobs, delivery acknowledgements, reconnecting, re-syncing.
#include "lib/pipeline/resend.hpp"

#include <algorithm>
#include <array>
#include <random>
#include <variant>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>

#include "blobpipe/protocol/framer.hpp"
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
                     std::error_code ec) {
  auto& rs = *s->resend;
  if (s->error || s->connection != connection || !rs.connected) return;
  rs.connected = rs.live = false;
  rs.last_error = ec;
  s->queue->fail(ec);
  s->credit_cv.notify_all();
  s->reader_cv.notify_all();
  rs.kept_cv.notify_all();
  asio::co_spawn(s->ex, reconnect(s), asio::detached);
}

void resend_failed(sender_state& s) noexcept {
  auto& rs = *s.resend;
  rs.connected = rs.live = false;
  rs.kept_cv.notify_all();
  rs.retry_timer.cancel();
}

namespace {

/// Whether connection number `c` is still the sender's and healthy.
bool current(const sender_state& s, std::uint64_t c) {
  return !s.error && s.connection == c && s.resend->connected;
}

/// Sends what the current connection has not seen of `kb`. With
/// `resyncing`, runs before the connection is live (the reconnector);
/// otherwise only when it is (producers), so resent blobs begin before new
/// ones. Entries go through the one entry path (send_entry).
asio::awaitable<void> sync(std::shared_ptr<sender_state> s, std::shared_ptr<kept_blob> kb,
                           bool resyncing) {
  auto& rs = *s->resend;
  auto usable = [&] {
    return !s->error && rs.connected && (rs.live || resyncing) && !kb->delivered;
  };
  if (!usable()) co_return;
  const std::error_code locked = co_await kb->send_lock.lock();
  if (locked) co_return;  // closed
  unlock_guard guard(kb->send_lock);
  if (!usable()) co_return;
  const std::uint64_t conn = s->connection;
  auto q = s->queue;
  if (kb->connection != conn) {
    kb->connection = conn;
    kb->wire_id = s->next_blob_id++;
    kb->begun = kb->end_sent = false;
    kb->entries_sent = 0;
    if (kb->attempts++ > 0) ++s->stats.blobs_resent;
    rs.on_wire[kb->wire_id] = kb;
  }
  const std::uint64_t id = kb->wire_id;
  kb->sending = true;  // forget() leaves the bytes to us until we are done
  struct done_sending {
    kept_blob* kb;
    ~done_sending() {
      kb->sending = false;
      if (kb->delivered) kb->release();
    }
  } done{kb.get()};
  if (!kb->begun) {
    frame_blob_begin(q->frames(), id, kb->tag,
                     s->features & feature_blob_groups ? kb->group : std::nullopt);
    q->kick();
    kb->begun = true;
  }
  // Delivered while we send (the consumer had it already): stop, and end
  // the blob on this connection so it does not stay open there.
  while (kb->end != kept_blob::end_kind::abort && !kb->delivered &&
         kb->entries_sent < kb->entries.size()) {
    const std::size_t i = kb->entries_sent;
    const kept_entry& e = kb->entries[i];  // deque: stable while others are added
    const std::uint64_t credit =
        entry_credit(e.planned.entry.len, e.planned.entry.key.size(), e.meta.size());
    if (!take_credit(*s, credit)) {
      const std::error_code ec = co_await acquire_credit(s, q, credit);
      if (ec) co_return;
    }
    const std::error_code sent =
        co_await send_entry(s, q, id, i, e.planned, e.meta, e.emitted_ns);
    if (sent || !current(*s, conn)) co_return;
    ++kb->entries_sent;
  }
  if (kb->end_sent) co_return;
  if (kb->end == kept_blob::end_kind::tail && !kb->delivered) {
    if (!take_credit(*s, kb->tail.size())) {
      const std::error_code ec = co_await acquire_credit(s, q, kb->tail.size());
      if (ec) co_return;
    }
    frame_tail(q->frames(), id, kb->tail);
    q->kick();
    kb->end_sent = true;
  } else if (kb->end == kept_blob::end_kind::abort || kb->delivered) {
    frame_abort(*q, id, kb->delivered ? std::string_view("delivered already") : kb->abort_reason);
    kb->end_sent = true;
  }
  if (q->full()) (void)co_await q->room();
}

/// sync() for a producer: its entry is kept already, so a cancellation of
/// the producer must not leave the entry half sent on a live connection.
asio::awaitable<void> sync_shielded(std::shared_ptr<sender_state> s,
                                    std::shared_ptr<kept_blob> kb) {
  co_await asio::this_coro::reset_cancellation_state(asio::disable_cancellation());
  co_await sync(s, std::move(kb), false);
  co_await asio::this_coro::reset_cancellation_state();
}

/// Re-sends every kept blob on connection number `conn`, oldest first,
/// then makes it live. Blobs kept meanwhile are picked up by the next pass.
asio::awaitable<void> resync(std::shared_ptr<sender_state> s, std::uint64_t conn) {
  auto& rs = *s->resend;
  for (;;) {
    if (!current(*s, conn)) co_return;
    std::vector<std::shared_ptr<kept_blob>> todo;
    for (auto& kb : rs.kept)
      if (!kb->delivered && !kb->synced(conn)) todo.push_back(kb);
    if (todo.empty()) break;
    for (auto& kb : todo) {
      co_await sync(s, kb, true);
      if (!current(*s, conn)) co_return;
    }
  }
  rs.live = true;
  rs.kept_cv.notify_all();
}

/// Lets a blob go: delivered, or never sent anywhere.
void forget(resend_state& rs, const std::shared_ptr<kept_blob>& kb) {
  auto it = std::find(rs.kept.begin(), rs.kept.end(), kb);
  if (it != rs.kept.end()) rs.kept.erase(it);
  rs.kept_bytes -= kb->bytes;
  kb->bytes = 0;
  if (!kb->sending) kb->release();  // else sync() releases them when it is done
  rs.kept_cv.notify_all();
}

struct attempt_result {
  std::error_code ec;
  std::shared_ptr<ack_reader> reader;  // set on success: handshake done
};

asio::awaitable<attempt_result> attempt(std::shared_ptr<sender_state> s) {
  attempt_result r;
  auto [ec, t] = co_await s->resend->connect();
  r.ec = ec;
  if (!r.ec && !t) r.ec = make_error_code(errc::peer_failed);
  if (r.ec) co_return r;
  auto [hec, reader] = co_await handshake(std::shared_ptr<transport>(std::move(t)), s->opt,
                                          s->resend->session);
  r.ec = hec;
  if (r.ec) {
    reader->link->close();
    co_return r;
  }
  r.reader = std::move(reader);
  co_return r;
}

/// attempt(), raced with stall_timeout when one is set.
asio::awaitable<attempt_result> bounded_attempt(std::shared_ptr<sender_state> s) {
  using namespace asio::experimental::awaitable_operators;
  if (s->opt.stall_timeout.count() <= 0) co_return co_await attempt(s);
  asio::steady_timer timer(s->ex);
  timer.expires_after(s->opt.stall_timeout);
  auto won = co_await (attempt(s) || timer.async_wait(use_tuple));
  if (won.index() == 0) co_return std::move(std::get<0>(won));
  attempt_result r;
  r.ec = make_error_code(errc::timed_out);
  co_return r;
}

/// install() for a resend session: the consumer's window of remembered
/// tags bounds the blobs kept, and the blobs of the old connection are
/// begun afresh here.
void resend_install(const std::shared_ptr<sender_state>& s, std::shared_ptr<ack_reader> reader) {
  auto& rs = *s->resend;
  rs.max_kept_blobs = reader->peer->dedup_window;
  rs.on_wire.clear();
  rs.connected = true;
  rs.live = false;
  install(s, std::move(reader));
  rs.kept_cv.notify_all();
}

/// Connects until it works or max_attempts consecutive attempts failed.
asio::awaitable<std::error_code> connect_loop(std::shared_ptr<sender_state> s) {
  auto& rs = *s->resend;
  while (!s->error) {
    if (rs.failures > 0) {  // back off: retry_delay, doubling, capped
      auto delay = s->opt.resend.retry_delay;
      for (std::uint32_t i = 1; i < rs.failures && delay < s->opt.resend.max_retry_delay; ++i)
        delay *= 2;
      rs.retry_timer.expires_after(std::min(delay, s->opt.resend.max_retry_delay));
      co_await rs.retry_timer.async_wait(use_tuple);
      if (s->error) break;
    }
    auto r = co_await bounded_attempt(s);
    if (s->error) {
      if (r.reader) r.reader->link->close();
      break;
    }
    if (!r.ec) {
      resend_install(s, std::move(r.reader));
      co_return std::error_code{};
    }
    rs.last_error = r.ec;
    if (++rs.failures >= s->opt.resend.max_attempts) {
      s->fail(r.ec);
      co_return r.ec;
    }
  }
  co_return s->error;
}

asio::awaitable<void> reconnect(std::shared_ptr<sender_state> s) {
  const std::error_code ec = co_await connect_loop(s);
  if (ec) co_return;
  ++s->stats.reconnects;
  co_await resync(s, s->connection);
}

/// Waits for kept_cv; true when the waiting coroutine was cancelled.
asio::awaitable<bool> wait_kept(std::shared_ptr<sender_state> s) {
  s->stall_watch.begin_wait();
  const bool cancelled = co_await s->resend->kept_cv.wait();
  s->stall_watch.end_wait();
  co_return cancelled;
}

/// Admits `n` more kept bytes for `kb` (listing it first, within the
/// consumer's de-duplication window).
asio::awaitable<std::error_code> admit(std::shared_ptr<sender_state> s,
                                       std::shared_ptr<kept_blob> kb, std::uint64_t n) {
  auto& rs = *s->resend;
  while (!kb->listed) {
    if (s->error) co_return s->error;
    if (rs.kept.empty() || rs.kept.size() < rs.max_kept_blobs) {
      kb->listed = true;
      rs.kept.push_back(kb);
      break;
    }
    const bool cancelled = co_await wait_kept(s);
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  bool counted = false;
  while (!s->error) {
    // The oldest blob always proceeds: its delivery frees the rest.
    if (rs.kept.front() == kb || rs.kept_bytes + n <= s->opt.resend.unacked_bytes) {
      rs.kept_bytes += n;
      kb->bytes += n;
      co_return std::error_code{};
    }
    if (!counted) ++s->stats.budget_waits, counted = true;
    const bool cancelled = co_await wait_kept(s);
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  co_return s->error;
}

}  // namespace

result<void> resend_acked(sender_state& s, std::uint64_t blob_id) {
  auto& rs = *s.resend;
  rs.failures = 0;  // the connection works: later retries start over
  if (blob_id == 0) return {};
  auto it = rs.on_wire.find(blob_id);
  if (it == rs.on_wire.end())
    return {errc::protocol_violation,
            "ack for blob " + std::to_string(blob_id) + ", not awaiting delivery"};
  auto kb = std::move(it->second);
  rs.on_wire.erase(it);
  kb->delivered = true;
  ++s.stats.blobs_delivered;
  forget(rs, kb);
  return {};
}

asio::awaitable<std::error_code> kept_emit(std::shared_ptr<blob_state> b, std::string key,
                                           value v) {
  auto s = b->sender;
  auto kb = b->kept;
  if (b->ended || b->broken) co_return make_error_code(errc::closed);
  if (s->error) co_return s->error;
  // Tags identify blobs across reconnects.
  if (kb->tag == NO_TAG || key.size() > s->max_key_bytes)
    co_return make_error_code(errc::invalid_argument);
  auto added = b->builder.add(std::move(key), std::move(v));
  if (!added) co_return added.code();  // nothing kept: the blob stays usable
  const planned_entry& planned = **added;
  b->broken = true;  // planned but not kept: only abort() is left
  kept_entry e;
  e.emitted_ns = steady_ns();
  e.meta = planned.entry.meta();
  if (e.meta.size() > s->max_meta_bytes) {
    b->last_error = meta_too_long(e.meta.size(), s->max_meta_bytes);
    co_return make_error_code(errc::invalid_argument);
  }
  const std::uint64_t n = planned.entry.len + planned.entry.key.size() + e.meta.size();
  if (auto ec = co_await admit(s, kb, n)) co_return ec;
  e.bytes.resize(planned.entry.len);
  // The one copy a resend session makes: host values gathered, device
  // values copied to the host (docs/cuda.md), both into the kept bytes.
  auto copied = planned.source.memory == memory_kind::cuda_device
                    ? read_device_entry(planned, e.bytes)
                    : write_entry(planned, e.bytes);
  if (!copied) {
    s->resend->kept_bytes -= n;
    kb->bytes -= n;
    b->last_error = copied.message();
    co_return copied.code();
  }
  if (planned.source.memory == memory_kind::cuda_device) {
    ++s->stats.device_entries;
  } else if (!planned.contiguous) {
    ++s->stats.gathered_entries;
  }
  s->stats.bytes_sent += planned.entry.len;
  ++s->stats.entries_sent;
  if (s->stats.first_entry_ns == 0) s->stats.first_entry_ns = e.emitted_ns;
  e.planned.entry = planned.entry;
  e.planned.itemsize = planned.itemsize;
  e.planned.source.data = e.bytes.data();
  kb->entries.push_back(std::move(e));
  b->broken = false;
  co_await sync_shielded(s, kb);
  co_return s->error;
}

asio::awaitable<std::error_code> kept_finish(std::shared_ptr<blob_state> b) {
  auto s = b->sender;
  auto kb = b->kept;
  if (b->ended || b->broken) co_return make_error_code(errc::closed);
  if (s->error) co_return s->error;
  if (kb->tag == NO_TAG) co_return make_error_code(errc::invalid_argument);
  auto plan = b->builder.finish(kb->tag);
  if (!plan) {
    co_await kept_abort(b, plan.message());
    co_return plan.code();
  }
  std::vector<std::byte> tail(tail_size(*plan));
  if (auto r = write_tail(*plan, tail); !r) co_return r.code();
  if (auto ec = co_await admit(s, kb, tail.size())) co_return ec;
  s->stats.bytes_sent += tail.size();
  kb->tail = std::move(tail);
  kb->end = kept_blob::end_kind::tail;
  b->ended = true;
  ++s->stats.blobs_sent;
  co_await sync_shielded(s, kb);
  co_return s->error;
}

asio::awaitable<std::error_code> kept_abort(std::shared_ptr<blob_state> b, std::string reason) {
  auto s = b->sender;
  auto kb = b->kept;
  if (b->ended) co_return std::error_code{};
  b->ended = true;
  if (!kb->listed || kb->end != kept_blob::end_kind::open) co_return std::error_code{};
  if (s->error) co_return s->error;
  if (reason.size() > max_reason_bytes) reason.resize(max_reason_bytes);
  kb->abort_reason = std::move(reason);
  kb->end = kept_blob::end_kind::abort;
  ++s->stats.blobs_aborted;
  if (kb->attempts == 0) {  // never on any wire: nobody to tell
    forget(*s->resend, kb);
    co_return std::error_code{};
  }
  co_await sync_shielded(s, kb);
  co_return s->error;
}

void kept_dropped(const std::shared_ptr<sender_state>& s, std::shared_ptr<kept_blob> kb) {
  if (!kb->listed || kb->end != kept_blob::end_kind::open || s->error) return;
  kb->abort_reason = "blob_writer dropped";
  kb->end = kept_blob::end_kind::abort;
  ++s->stats.blobs_aborted;
  if (kb->attempts == 0) return forget(*s->resend, kb);
  asio::co_spawn(s->ex, sync(s, std::move(kb), false), asio::detached);
}

void resend_stalled(const std::shared_ptr<sender_state>& s) {
  connection_lost(s, s->connection, make_error_code(errc::timed_out));
}

asio::awaitable<std::error_code> resend_start(std::shared_ptr<sender_state> s) {
  s->resend->session = random_session();
  co_return co_await connect_loop(s);
}

asio::awaitable<std::error_code> resend_shutdown(std::shared_ptr<sender_state> s) {
  auto& rs = *s->resend;
  // Every ended blob delivered first; open ones are abandoned.
  for (;;) {
    if (s->error) co_return s->error;
    const bool pending = std::any_of(rs.kept.begin(), rs.kept.end(), [](auto& kb) {
      return kb->end != kept_blob::end_kind::open;
    });
    if (!pending && !rs.connected) {  // all delivered, no connection to close
      s->fail(make_error_code(errc::closed));
      co_return std::error_code{};
    }
    if (!pending && rs.live) break;
    const bool cancelled = co_await wait_kept(s);
    if (cancelled) {
      s->fail(make_error_code(errc::closed));
      co_return std::error_code(asio::error::operation_aborted);
    }
  }
  s->closing = true;
  const std::uint64_t conn = s->connection;
  auto q = s->queue;
  frame_close(q->frames(), {});
  q->kick();
  const std::error_code close_ec = co_await q->wait_written(q->ticket());
  if (!close_ec) {
    // The consumer answers our close by closing its end.
    while (!s->error && s->connection == conn && !s->reader_done) {
      s->stall_watch.begin_wait();
      const bool cancelled = co_await s->reader_cv.wait();
      s->stall_watch.end_wait();
      if (cancelled) break;
    }
  }
  // Everything ended was delivered: whatever the close did, we are done.
  const bool violated = s->error == errc::protocol_violation;
  s->fail(make_error_code(errc::closed));
  co_return violated ? make_error_code(errc::protocol_violation) : std::error_code{};
}

}  // namespace blobpipe::detail

namespace blobpipe {

std::chrono::milliseconds resend_give_up_bound(const sender_options& o) {
  using std::chrono::milliseconds;
  milliseconds attempt = o.handshake_timeout;
  if (o.stall_timeout.count() > 0 && (attempt.count() <= 0 || o.stall_timeout < attempt))
    attempt = o.stall_timeout;  // bounded_attempt races the whole attempt with it
  if (attempt.count() <= 0) return milliseconds{0};
  const std::uint32_t attempts = std::max<std::uint32_t>(o.resend.max_attempts, 1);
  milliseconds total = attempt * attempts;
  // The waits before attempts 2 .. attempts, as connect_loop computes them.
  for (std::uint32_t failures = 1; failures < attempts; ++failures) {
    auto delay = o.resend.retry_delay;
    for (std::uint32_t i = 1; i < failures && delay < o.resend.max_retry_delay; ++i) delay *= 2;
    total += std::min(delay, o.resend.max_retry_delay);
  }
  return total;
}

}  // namespace blobpipe
