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

/// The connection `gen` failed (or stalled): close it and start over on a
/// new one. Everything kept goes out again there.
void connection_lost(const std::shared_ptr<sender_state>& s, std::uint64_t gen,
                     std::error_code ec) {
  auto& rs = *s->rs;
  if (s->error || s->gen != gen || !rs.connected) return;
  rs.connected = rs.live = false;
  rs.last_error = ec;
  s->t->close();
  s->credit_cv.notify_all();
  s->reader_cv.notify_all();
  rs.kept_cv.notify_all();
  asio::co_spawn(s->ex, reconnect(s), asio::detached);
}

/// Sends one frame on connection `gen`. False when that connection is gone
/// (the reconnector then owns the blob's next attempt).
asio::awaitable<bool> send_on(std::shared_ptr<sender_state> s, std::uint64_t gen,
                              frame_header h, std::span<const std::byte> payload) {
  auto& rs = *s->rs;
  if (s->error || s->gen != gen || !rs.connected) co_return false;
  auto t = s->t;
  s->dog.begin_wait();
  auto ec = co_await send_frame(*t, h, payload);
  s->dog.end_wait();
  if (ec) {
    connection_lost(s, gen, ec);
    co_return false;
  }
  s->dog.progress();
  co_return s->gen == gen && rs.connected;
}

/// Window credit on connection `gen` (as acquire_credit in producer.cpp).
asio::awaitable<bool> credit_on(std::shared_ptr<sender_state> s, std::uint64_t gen,
                                std::uint64_t n) {
  auto& rs = *s->rs;
  bool counted = false;
  while (!s->error && s->gen == gen && rs.connected) {
    const bool fits = s->in_flight <= s->window_bytes && n <= s->window_bytes - s->in_flight;
    if (n == 0 || s->in_flight == 0 || fits) {
      s->in_flight += n;
      co_return true;
    }
    if (!counted) ++s->stats.credit_waits, counted = true;
    s->dog.begin_wait();
    const bool cancelled = co_await s->credit_cv.wait();
    s->dog.end_wait();
    if (cancelled) co_return false;
  }
  co_return false;
}

/// Sends what connection s->gen has not seen of `kb`. With `resyncing`,
/// runs before the connection is live (the reconnector); otherwise only
/// when it is (producers), so resent blobs begin before new ones.
asio::awaitable<void> sync(std::shared_ptr<sender_state> s, std::shared_ptr<kept_blob> kb,
                           bool resyncing) {
  auto& rs = *s->rs;
  auto usable = [&] {
    return !s->error && rs.connected && (rs.live || resyncing) && !kb->delivered;
  };
  if (!usable()) co_return;
  const std::error_code locked = co_await kb->send_lock.lock();
  if (locked) co_return;  // closed
  unlock_guard guard(kb->send_lock);
  if (!usable()) co_return;
  const std::uint64_t gen = s->gen;
  if (kb->gen != gen) {
    kb->gen = gen;
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
    frame_header hb{.type = frame_type::blob_begin, .length = TAG_SIZE, .blob_id = id};
    const bool begun = co_await send_on(s, gen, hb, kb->tag);
    if (!begun) co_return;
    kb->begun = true;
  }
  // Delivered while we send (the consumer had it already): stop, and end
  // the blob on this connection so it does not stay open there.
  while (kb->end != kept_blob::end_kind::abort && !kb->delivered &&
         kb->entries_sent < kb->entries.size()) {
    const std::size_t i = kb->entries_sent;
    const kept_entry& e = kb->entries[i];  // deque: stable while others are added
    const std::uint64_t len = e.bytes.size();
    const bool credit = co_await credit_on(s, gen, len);
    if (!credit) co_return;
    frame_header hb{.type = frame_type::entry_begin,
                    .length = static_cast<std::uint32_t>(e.begin.size()),
                    .blob_id = id,
                    .arg = i};
    const bool announced = co_await send_on(s, gen, hb, e.begin);
    if (!announced) co_return;
    for (std::uint64_t pos = 0; pos < len;) {
      const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(s->chunk_bytes, len - pos));
      frame_header d{.type = frame_type::data, .length = n, .blob_id = id, .arg = e.off + pos};
      const bool sent = co_await send_on(s, gen, d, std::span(e.bytes).subspan(pos, n));
      if (!sent) co_return;
      ++s->stats.data_frames_sent;
      pos += n;
    }
    ++kb->entries_sent;
  }
  if (kb->end_sent) co_return;
  if (kb->end == kept_blob::end_kind::tail && !kb->delivered) {
    const bool tail_credit = co_await credit_on(s, gen, kb->tail.size());
    if (!tail_credit) co_return;
    frame_header ht{.type = frame_type::tail,
                    .length = static_cast<std::uint32_t>(kb->tail.size()),
                    .blob_id = id};
    const bool tail_sent = co_await send_on(s, gen, ht, kb->tail);
    if (!tail_sent) co_return;
    kb->end_sent = true;
  } else if (kb->end == kept_blob::end_kind::abort || kb->delivered) {
    const std::string reason = kb->delivered ? std::string("delivered already") : kb->abort_reason;
    frame_header ha{.type = frame_type::blob_abort,
                    .length = static_cast<std::uint32_t>(reason.size()),
                    .blob_id = id};
    const bool abort_sent = co_await send_on(s, gen, ha, std::as_bytes(std::span(reason)));
    if (!abort_sent) co_return;
    kb->end_sent = true;
  }
}

/// sync() for a producer: its entry is kept already, so a cancellation of
/// the producer must not leave the entry half sent on a live connection.
asio::awaitable<void> sync_shielded(std::shared_ptr<sender_state> s,
                                    std::shared_ptr<kept_blob> kb) {
  co_await asio::this_coro::reset_cancellation_state(asio::disable_cancellation());
  co_await sync(s, std::move(kb), false);
  co_await asio::this_coro::reset_cancellation_state();
}

/// Re-sends every kept blob on connection `gen`, oldest first, then makes
/// it live. Blobs kept meanwhile are picked up by the next pass.
asio::awaitable<void> resync(std::shared_ptr<sender_state> s, std::uint64_t gen) {
  auto& rs = *s->rs;
  for (;;) {
    if (s->error || s->gen != gen || !rs.connected) co_return;
    std::vector<std::shared_ptr<kept_blob>> todo;
    for (auto& kb : rs.kept)
      if (!kb->delivered && !kb->synced(gen)) todo.push_back(kb);
    if (todo.empty()) break;
    for (auto& kb : todo) {
      co_await sync(s, kb, true);
      if (s->error || s->gen != gen || !rs.connected) co_return;
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

/// Reads acknowledgements of connection `gen` until it ends.
asio::awaitable<void> read_acks(std::shared_ptr<sender_state> s, std::shared_ptr<transport> t,
                                std::uint64_t gen) {
  auto& rs = *s->rs;
  for (;;) {
    auto [ec, h] = co_await t->receive_header();
    if (s->error || s->gen != gen) break;
    if (ec) {
      // After our `close`, the consumer closing its end is the orderly end.
      if (!s->closing) connection_lost(s, gen, ec);
      break;
    }
    s->dog.progress();
    if (h.type == frame_type::ack && h.length == 0 && h.arg <= s->in_flight) {
      s->in_flight -= h.arg;
      s->credit_cv.notify_all();
      rs.failures = 0;  // the connection works: later retries start over
      if (h.blob_id == 0) continue;
      auto it = rs.on_wire.find(h.blob_id);
      if (it != rs.on_wire.end()) {
        auto kb = std::move(it->second);
        rs.on_wire.erase(it);
        kb->delivered = true;
        ++s->stats.blobs_delivered;
        forget(rs, kb);
        continue;
      }
      s->message = "ack for blob " + std::to_string(h.blob_id) + ", not awaiting delivery";
    } else if (h.type == frame_type::close && h.length <= max_reason_bytes) {
      std::vector<std::byte> reason(h.length);
      if (h.length != 0) (void)co_await t->receive_payload(reason);
      if (!s->closing) connection_lost(s, gen, make_error_code(errc::peer_closed));
      break;
    } else {
      s->message = std::string("unexpected ") + frame_type_name(h.type) + " frame from consumer";
    }
    s->fail(make_error_code(errc::protocol_violation));
    break;
  }
  if (s->gen == gen) {
    s->reader_done = true;
    s->reader_cv.notify_all();
  }
}

struct attempt_result {
  std::error_code ec;
  std::unique_ptr<transport> t;
  hello peer;
};

asio::awaitable<attempt_result> attempt(std::shared_ptr<sender_state> s) {
  attempt_result r;
  auto [ec, t] = co_await s->rs->connect();
  r.ec = ec;
  if (!r.ec && !t) r.ec = make_error_code(errc::peer_failed);
  if (r.ec) co_return r;
  auto [hec, peer] = co_await handshake(*t, s->opt.chunk_bytes, s->rs->session);
  r.ec = hec;
  r.peer = peer;
  if (r.ec) {
    t->close();
    co_return r;
  }
  r.t = std::move(t);
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

void install(const std::shared_ptr<sender_state>& s, std::unique_ptr<transport> t,
             const hello& peer) {
  auto& rs = *s->rs;
  s->t = std::shared_ptr<transport>(std::move(t));
  ++s->gen;
  s->in_flight = 0;
  s->next_blob_id = 1;
  s->chunk_bytes = peer.max_chunk_bytes;
  s->window_bytes = peer.window_bytes;
  s->max_key_bytes = peer.max_key_bytes;
  s->max_meta_bytes = peer.max_meta_bytes;
  s->reader_done = false;
  rs.max_kept_blobs = peer.dedup_window;
  rs.on_wire.clear();
  rs.connected = true;
  rs.live = false;
  s->dog.progress();
  asio::co_spawn(s->ex, read_acks(s, s->t, s->gen), asio::detached);
  rs.kept_cv.notify_all();
}

/// Connects until it works or max_attempts consecutive attempts failed.
asio::awaitable<std::error_code> connect_loop(std::shared_ptr<sender_state> s) {
  auto& rs = *s->rs;
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
      if (r.t) r.t->close();
      break;
    }
    if (!r.ec) {
      install(s, std::move(r.t), r.peer);
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
  co_await resync(s, s->gen);
}

/// Waits for kept_cv; true when the waiting coroutine was cancelled.
asio::awaitable<bool> wait_kept(std::shared_ptr<sender_state> s) {
  s->dog.begin_wait();
  const bool cancelled = co_await s->rs->kept_cv.wait();
  s->dog.end_wait();
  co_return cancelled;
}

/// Admits `n` more kept bytes for `kb` (listing it first, within the
/// consumer's de-duplication window).
asio::awaitable<std::error_code> admit(std::shared_ptr<sender_state> s,
                                       std::shared_ptr<kept_blob> kb, std::uint64_t n) {
  auto& rs = *s->rs;
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

asio::awaitable<std::tuple<std::error_code, hello>> handshake(transport& t,
                                                              std::uint32_t chunk_bytes,
                                                              const session_id& session) {
  using ret = std::tuple<std::error_code, hello>;
  const auto violation = make_error_code(errc::protocol_violation);
  hello mine{.role = wire_role::sender, .max_chunk_bytes = chunk_bytes, .session = session};
  const auto payload = encode_hello(mine);
  frame_header h{.type = frame_type::hello, .length = hello_size};
  if (auto ec = co_await send_frame(t, h, payload)) co_return ret{ec, hello{}};
  auto [ec, got] = co_await t.receive_header();
  if (ec) co_return ret{ec, hello{}};
  if (got.type != frame_type::hello || got.length != hello_size) co_return ret{violation, hello{}};
  std::array<std::byte, hello_size> buf;
  if (auto rec = co_await t.receive_payload(buf)) co_return ret{rec, hello{}};
  auto peer = decode_hello(buf);
  if (!peer) co_return ret{peer.code(), hello{}};
  if (peer->role != wire_role::consumer || peer->max_chunk_bytes > chunk_bytes ||
      peer->window_bytes == 0)
    co_return ret{violation, hello{}};
  // A resend session needs the consumer to de-duplicate for it.
  if (session != NO_SESSION && (peer->session != session || peer->dedup_window == 0))
    co_return ret{violation, hello{}};
  co_return ret{std::error_code{}, *peer};
}

asio::awaitable<std::error_code> kept_emit(std::shared_ptr<blob_state> b, std::string key,
                                           value v) {
  auto s = b->sender;
  auto kb = b->kept;
  if (b->ended || b->broken) co_return make_error_code(errc::closed);
  if (s->error) co_return s->error;
  // Tags identify blobs across reconnects; device values cannot be kept
  // by a CPU copy (resend sessions are host memory only).
  if (kb->tag == NO_TAG || key.size() > s->max_key_bytes || v.memory != memory_kind::host)
    co_return make_error_code(errc::invalid_argument);
  auto added = b->builder.add(std::move(key), std::move(v));
  if (!added) co_return added.code();  // nothing kept: the blob stays usable
  const planned_entry& pe = **added;
  b->broken = true;  // planned but not kept: only abort() is left
  const auto meta = pe.entry.meta();
  if (meta.size() > s->max_meta_bytes) co_return make_error_code(errc::invalid_argument);
  kept_entry e;
  e.begin = encode_entry_begin(pe.entry.key, meta);
  e.off = pe.entry.off;
  const std::uint64_t n = pe.entry.len + e.begin.size();
  if (auto ec = co_await admit(s, kb, n)) co_return ec;
  e.bytes.resize(pe.entry.len);
  if (auto r = write_entry(pe, e.bytes); !r) {
    s->rs->kept_bytes -= n;
    kb->bytes -= n;
    co_return r.code();
  }
  if (!pe.contiguous) ++s->stats.gathered_entries;
  s->stats.bytes_sent += pe.entry.len;
  ++s->stats.entries_sent;
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
  if (kb->attempts == 0) {  // never on any wire: nobody to tell
    forget(*s->rs, kb);
    co_return std::error_code{};
  }
  co_await sync_shielded(s, kb);
  co_return s->error;
}

void kept_dropped(const std::shared_ptr<sender_state>& s, std::shared_ptr<kept_blob> kb) {
  if (!kb->listed || kb->end != kept_blob::end_kind::open || s->error) return;
  kb->abort_reason = "blob_writer dropped";
  kb->end = kept_blob::end_kind::abort;
  if (kb->attempts == 0) return forget(*s->rs, kb);
  asio::co_spawn(s->ex, sync(s, std::move(kb), false), asio::detached);
}

void resend_stalled(const std::shared_ptr<sender_state>& s) {
  connection_lost(s, s->gen, make_error_code(errc::timed_out));
}

asio::awaitable<std::error_code> resend_start(std::shared_ptr<sender_state> s) {
  s->rs->session = random_session();
  co_return co_await connect_loop(s);
}

asio::awaitable<std::error_code> resend_shutdown(std::shared_ptr<sender_state> s) {
  auto& rs = *s->rs;
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
  const std::uint64_t gen = s->gen;
  auto t = s->t;
  frame_header h{.type = frame_type::close};
  const std::error_code close_ec = co_await send_frame(*t, h, {});
  if (!close_ec) {
    // The consumer answers our close by closing its end.
    while (!s->error && s->gen == gen && !s->reader_done) {
      s->dog.begin_wait();
      const bool cancelled = co_await s->reader_cv.wait();
      s->dog.end_wait();
      if (cancelled) break;
    }
  }
  // Everything ended was delivered: whatever the close did, we are done.
  const bool violated = s->error == errc::protocol_violation;
  s->fail(make_error_code(errc::closed));
  co_return violated ? make_error_code(errc::protocol_violation) : std::error_code{};
}

}  // namespace blobpipe::detail
