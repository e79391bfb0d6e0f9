// The consumer: an I/O loop around the push decoder (docs/wire.md
// "Consumer"). next() yields events decided already; when there are none
// it reads what the transport has into the receive buffer (or a large
// payload straight into its destination) and lets the decoder turn the
// bytes into events (consumer_sinks.cpp). Acknowledgements flow back from
// a separate coroutine (consumer_acks.cpp), coalesced, as the user
// releases entries. The session (consumer_session.hpp) decides what the
// protocol decides; consumer_state.hpp says which part of the state owns
// what.
#include "blobpipe/pipeline/consumer.hpp"

#include <algorithm>
#include <array>

#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "lib/pipeline/consumer_state.hpp"
#include "lib/runtime/deadline.hpp"

namespace blobpipe {
namespace detail {

asio::awaitable<std::error_code> write_frames(transport& t, const outbox& out) {
  std::vector<asio::const_buffer> bufs;
  for (const auto& p : out.pieces()) {
    const auto b = p.bytes(out);
    bufs.emplace_back(b.data(), b.size());
  }
  co_return co_await t.write(bufs);
}

void receive_landing::retire_buffers(transport& t) {
  for (auto& r : posted) t.retire(r.lands_in);
  for (auto& [id, b] : blobs) {
    if (b.cur) t.retire(b.cur->storage);
    t.retire(b.region);
  }
}

namespace {

/// The session's timer: calls on_time() when the session says, and closes
/// the connection when a clock expires (consumer_options stall_timeout,
/// idle_timeout, held_timeout, credit pressure), telling the sender why;
/// next() then reports timed_out. Ends when the session's clocks stop
/// (stop_clocks() also cancels the timer, to wake it).
asio::awaitable<void> watch(std::shared_ptr<consumer_state> s) {
  constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
  using clock = std::chrono::steady_clock;
  for (;;) {
    const auto at = s->session.next_deadline(clock::now());
    if (!at) co_return;
    s->ending.timer.expires_at(*at);
    const auto [ec] = co_await s->ending.timer.async_wait(use_tuple);
    if (ec) continue;  // woken by stop_clocks(): next_deadline() ends it
    auto expired = s->session.on_time(clock::now());
    if (!expired) continue;
    s->ending.timeout_reason = std::move(expired->reason);
    // The read waiting on the sender ends once the transport closes, after
    // the sender has been told why.
    s->close_with(s->ending.timeout_reason);
    co_return;
  }
}

result<void> transport_error(consumer_state& s, std::error_code ec) {
  return error{ec, s.t->last_error().empty() ? ec.message() : s.t->last_error()};
}

/// Decodes the receive buffer's undecoded bytes, at most a turn's work
/// (all of them before the sender's hello: at most hello_receive_bytes, so
/// a stream pipelined behind the hello is decoded with it).
result<void> decode_received(consumer_state& s) {
  const decoder& d = s.session.frames();
  receive_landing& in = s.receive;
  const std::uint64_t budget =
      s.session.peer() && s.opt.turn_work_bytes != 0 ? s.opt.turn_work_bytes : ~std::uint64_t{0};
  auto took = s.session.consume_some(std::span(in.rx).subspan(in.rx_at, in.rx_end - in.rx_at),
                                     budget, s.clock_now());
  if (!took) return took.err();
  in.rx_at += *took;
  if (in.rx_at != in.rx_end || in.bulk_announced == 0) return {};
  // A message transport's bulk payload must be exactly the rest of the
  // frame whose header ended the bytes read with it.
  const std::size_t bulk = std::exchange(in.bulk_announced, 0);
  if (!d.in_payload() || d.payload_remaining() != bulk)
    return result<void>(errc::protocol_violation, "a bulk payload of " + std::to_string(bulk) +
                                                       " bytes apart from its frame");
  in.bulk_pending = bulk;
  return {};
}

}  // namespace

asio::awaitable<result<void>> read_input(consumer_state& s) {
  const decoder& d = s.session.frames();
  receive_landing& in = s.receive;
  // Fair turns: a turn's work spent, every other handler ready on this
  // executor (the other connections' turns) runs before this one decodes
  // more (consumer_options::turn_work_bytes).
  if (s.opt.turn_work_bytes != 0 && d.work() >= s.opt.turn_work_bytes) {
    s.session.reset_work();
    ++s.stats.turns_yielded;
    co_await asio::post(s.ex, asio::use_awaitable);
  }
  result<void> r;
  const bool buffered = in.rx_at != in.rx_end;
  if (buffered && (s.session.acks_stopped() || !s.ending.timeout_reason.empty())) {
    // Closed on this side (close(), an expired clock) while bytes read waited
    // for their turn: they are dropped like bytes never read, and the
    // stream ends as a read would end it now. Decoded after close(), a
    // resend session's blob would complete without being recorded as
    // delivered (acks have stopped), and come again on its next connection.
    in.rx_at = in.rx_end;
    co_return transport_error(s, make_error_code(errc::closed));
  }
  if (buffered) {
    r = decode_received(s);
  } else if (d.in_payload() &&
             (in.bulk_pending != 0 || d.payload_remaining() >= direct_read_bytes)) {
    // A payload with nothing of it buffered: straight into its place.
    const auto target = s.session.payload_target();
    if (in.bulk_pending != 0 && in.bulk_pending != target.size())
      co_return result<void>(errc::protocol_violation,
                             "a bulk payload of " + std::to_string(in.bulk_pending) +
                                 " bytes for a frame expecting " + std::to_string(target.size()));
    const bool post = in.bulk_pending != 0 && d.payload_is_entry_bytes() && in.read_window > 1 &&
                      in.posted.size() < in.read_window;
    in.bulk_pending = 0;
    if (post) {
      // Entry bytes over UCX: the fetch lands while later frames are read;
      // the entries it completes wait for it (ready_event::after_read).
      if (!in.posted.empty()) ++s.stats.chunks_overlapped;
      posted_read p;
      p.number = ++in.reads_posted;
      p.blob_id = d.payload_blob_id();
      if (auto it = in.blobs.find(p.blob_id); it != in.blobs.end() && it->second.cur)
        p.lands_in = it->second.cur->storage;
      p.receipt = s.t->post_read(target);
      in.posted.push_back(std::move(p));
    } else if (auto ec = co_await s.t->read_exact(target)) {
      co_return transport_error(s, ec);
    }
    r = s.session.commit_payload(target.size(), s.clock_now());
  } else {
    auto [ec, got] = co_await s.t->read_some(in.rx);
    if (ec) co_return transport_error(s, ec);
    in.rx_at = 0;
    in.rx_end = got.bytes;
    in.bulk_announced = got.bulk_bytes;
    r = decode_received(s);
  }
  if (r && s.events.close_reason && !s.events.ended) {
    // An orderly close: what was posted before it lands, then the end.
    while (r && !in.posted.empty()) r = co_await land_oldest(s);
    if (r) s.end(std::error_code{}, *s.events.close_reason);
  }
  co_return r;
}

asio::awaitable<result<void>> land_oldest(consumer_state& s) {
  receive_landing& in = s.receive;
  // Waited for where it is listed: should this wait be cut off (the
  // io_context destroyed with it), ~consumer_state still finds the read's
  // buffer (lands_in) to retire.
  const std::error_code ec = co_await in.posted.front().receipt.wait();
  auto p = std::move(in.posted.front());
  in.posted.pop_front();
  in.reads_landed = p.number;
  if (!ec) co_return result<void>{};
  // A fetch cut short may still land (UCX): the transport keeps its
  // buffer. Nothing of its blob after it is true any more.
  s.t->retire(std::move(p.lands_in));
  auto err = transport_error(s, ec);
  s.lose_blob(p.blob_id, ec, err.message());
  co_return err;
}

asio::awaitable<void> abandon_posted(consumer_state& s) {
  receive_landing& in = s.receive;
  if (in.posted.empty()) co_return;
  s.t->close();
  while (!in.posted.empty()) {
    auto landed = co_await land_oldest(s);
    (void)landed;  // failures are recorded by land_oldest
  }
}

asio::awaitable<event> next_event(std::shared_ptr<consumer_state> s) {
  for (;;) {
    result<void> r;
    // A cancellation that came between two reads (after one completed,
    // before the next began) still ends the stream.
    const auto cancel = co_await asio::this_coro::cancellation_state;
    if (!s->events.ended && cancel.cancelled() != asio::cancellation_type::none) {
      r = result<void>(error{std::error_code(asio::error::operation_aborted),
                             "next() was cancelled"});
    } else if (!s->events.pending.empty() &&
               s->events.pending.front().after_read <= s->receive.reads_landed) {
      ready_event& front = s->events.pending.front();
      if (front.upload) {
        auto up = co_await s->receive.device.upload(front, s->stats);
        if (!up) s->lose_blob(front.ev.blob_id, up.code(), up.message());
        continue;
      }
      event ev = std::move(front.ev);
      s->events.pending.pop_front();
      s->on_yield(ev);
      co_return ev;
    } else if (s->events.pending.empty() && s->events.ended) {
      // The acker may still be telling the sender why (close_with, bounded
      // by close_linger); the session's timer ends with end(). Once they have
      // ended, a later call joins at once. Joined in a coroutine of its own:
      // a next() whose cancellation ended the stream still waits for them
      // (its own cancellation state stays set, and would end the join at
      // once); a cancellation after this one reaches the join through it.
      co_await asio::co_spawn(s->ex, s->tasks.join(), asio::use_awaitable);
      co_return s->events.final_event;
    } else {
      // Waiting on the sender: for bytes, or for the oldest posted read,
      // which an event waits for (its bytes, or an earlier entry's, are
      // still landing). Reads that have landed are taken first, so entries
      // come as soon as they can; else the fetches are kept overlapping
      // while more is waiting (a bulk payload announced already posts).
      const receive_landing& in = s->receive;
      const bool fenced = !s->events.pending.empty();
      const bool landed = !in.posted.empty() && in.posted.front().receipt.ready();
      const bool read_on =
          !fenced || (!s->events.ended && !landed && in.posted.size() < in.read_window &&
                      (in.bulk_pending != 0 || in.rx_at != in.rx_end || s->t->readable()));
      s->session.wait_begins(s->wait_now(), !in.posted.empty());
      // (Not a ?: of two co_awaits: GCC 12 evaluates them wrongly.)
      if (read_on) {
        r = co_await read_input(*s);
      } else {
        r = co_await land_oldest(*s);
      }
      // What the wait brought counts as progress (consumer_session::wait_ends).
      s->session.wait_ends(s->wait_now());
    }
    if (r) continue;
    co_await abandon_posted(*s);
    if (!s->ending.timeout_reason.empty()) {
      // An expired clock closed the transport; the read failed with `closed`.
      s->end(make_error_code(errc::timed_out), s->ending.timeout_reason);
    } else {
      s->end(r.code(), r.message());
    }
  }
}

asio::awaitable<std::size_t> next_events(std::shared_ptr<consumer_state> s,
                                         std::vector<event>& out, std::size_t max_events) {
  // Room for one more first: an event taken off the queue is never lost
  // to a failed append.
  if (out.size() == out.capacity()) out.reserve(std::max<std::size_t>(16, 2 * out.size()));
  event first = co_await next_event(s);
  const bool end = first.kind == event_kind::end_of_stream;
  out.push_back(std::move(first));
  std::size_t n = 1;
  if (end) co_return n;
  // What is ready without waiting: decided, its reads landed, nothing to
  // upload first (next_event does that, as the first of a later batch).
  // Nothing is read or decoded here: a spent turn's bytes wait for the
  // next call.
  event_queue& q = s->events.pending;
  while (n < max_events) {
    if (!q.empty()) {
      ready_event& front = q.front();
      if (front.after_read > s->receive.reads_landed || front.upload) break;
      out.push_back(std::move(front.ev));
      q.pop_front();
      s->on_yield(out.back());
      ++n;
      continue;
    }
    // The end, when next_event would yield it at once (its tasks are over).
    if (s->events.ended && s->tasks.running() == 0) {
      out.push_back(s->events.final_event);
      ++n;
    }
    break;
  }
  co_return n;
}

}  // namespace detail

std::size_t event_bytes_beyond_window(const event& ev) noexcept {
  if (ev.kind == event_kind::entry_ready) return 0;
  std::size_t n = sizeof(event) + ev.reason.capacity();
  if (ev.blob) {
    n += sizeof(completed_blob);
    for (const Entry& row : ev.blob->index.entries)
      n += sizeof(Entry) + row.key.capacity() + (row.dtype ? row.dtype->capacity() : 0);
  }
  return n;
}

consumer& consumer::operator=(consumer&& o) noexcept {
  if (this != &o) {
    close();
    state_ = std::move(o.state_);
  }
  return *this;
}

consumer::~consumer() { close(); }

asio::awaitable<std::tuple<std::error_code, consumer>> consumer::start(
    std::unique_ptr<transport> t, consumer_options opt) {
  using ret = std::tuple<std::error_code, consumer>;
  if (!t || opt.window_bytes == 0 || opt.max_chunk_bytes < min_chunk_bytes ||
      opt.max_tail_bytes <= FOOTER_SIZE || opt.max_meta_bytes == 0 ||
      opt.inline_bytes > max_inline_bytes ||
      (opt.assemble == assemble_mode::file && !opt.file_slot_for) || opt.payload_window == 0)
    co_return ret{make_error_code(errc::invalid_argument), consumer{}};
  if (auto r = detail::device_lander::check(opt); !r) co_return ret{r.code(), consumer{}};
  const bool default_held = opt.held_bytes == held_bytes_of_window;
  if (default_held) opt.held_bytes = opt.window_bytes;
  const bool one_larger_alone = default_held && !opt.pool;
  auto s = std::make_shared<detail::consumer_state>(std::move(t), std::move(opt), one_larger_alone);
  if (s->session.next_deadline({})) s->tasks.spawn(detail::watch(s));
  // handshake_timeout: closing the transport ends the read or write below.
  detail::deadline handshake_bound(
      s->ex, s->opt.handshake_timeout, [weak = std::weak_ptr<detail::consumer_state>(s)] {
        auto st = weak.lock();
        if (!st) return;
        st->ending.timeout_reason = detail::deadline::reason(
            "no handshake with the sender", st->opt.handshake_timeout, "handshake_timeout");
        st->t->close();
      });
  // A failed start stops its clocks and cancels their timer.
  auto fail = [&](std::error_code ec) {
    s->stop_clocks();
    s->tasks.cancel();
    s->t->close();
    return ret{s->ending.timeout_reason.empty() ? ec : make_error_code(errc::timed_out),
               consumer{}};
  };
  // The sender's hello: read until the session has it (the hello is owed).
  s->session.wait_begins(s->wait_now(), false);
  // Bytes after the hello in the same read are decoded too; a violation
  // among them (a second hello, say) is the stream's, reported by next().
  result<void> after_hello;
  while (!s->session.peer()) {
    const auto r = co_await detail::read_input(*s);
    if (r) continue;
    if (!s->session.peer()) co_return fail(r.code());
    after_hello = r;
  }
  s->session.wait_ends(s->wait_now());
  // The hello came: the full receive buffer now (the hello's read was
  // decoded whole: nothing is left in rx). Turns count from here.
  s->receive.rx.resize(detail::receive_buffer_bytes);
  s->session.reset_work();
  // File sinks and device landing read whole entries before yielding them
  // (no posting).
  s->receive.read_window = (s->opt.assemble == assemble_mode::file || s->opt.landing.enabled)
                               ? 1
                               : std::min(s->opt.payload_window, s->t->read_window());
  if (s->opt.landing.enabled)
    s->receive.device.lander =
        std::make_unique<detail::device_lander>(s->ex, s->opt.landing,
                                                s->session.answer().max_chunk_bytes);
  // The session framed its answer to the hello (consumer_session::answer).
  // A sender that wrote its whole stream at once, close frame included,
  // without waiting for this reply (pipelined) may have ended it within the
  // hello's read: end() has closed the transport, and the stream's events
  // are all decoded, so the consumer is returned to yield them, unanswered,
  // rather than failed as "closed".
  if (!s->events.ended) {
    if (auto ec = co_await detail::write_frames(*s->t, s->session.out())) co_return fail(ec);
    s->acker.running = true;  // our hello is out: frames may follow it
  }
  s->tasks.spawn(detail::ack_loop(s));
  // A violation pipelined behind the hello is told like any other.
  if (!after_hello) s->end(after_hello.code(), after_hello.message());
  co_return ret{std::error_code{}, consumer(std::move(s))};
}

asio::awaitable<event> consumer::next() {
  auto s = state_;  // the handle may move while we wait
  if (!s) {
    event ev;
    ev.error = make_error_code(errc::closed);
    co_return ev;
  }
  // A cancelled next() must not throw out of the middle of a frame (Asio's
  // default), which would leave the stream unusable and the sender stuck:
  // the cancelled wait fails instead, and the stream ends with its error.
  // The caller's own setting is restored before returning.
  const bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  event ev = co_await detail::next_event(s);
  co_await asio::this_coro::throw_if_cancelled(throws);
  co_return ev;
}

asio::awaitable<std::size_t> consumer::next_batch(std::vector<event>& out,
                                                 std::size_t max_events) {
  auto s = state_;  // the handle may move while we wait
  if (!s) {
    event ev;
    ev.error = make_error_code(errc::closed);
    out.push_back(std::move(ev));
    co_return 1;
  }
  // As next(): a cancelled wait ends the stream instead of throwing.
  const bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  const std::size_t n = co_await detail::next_events(s, out, max_events);
  co_await asio::this_coro::throw_if_cancelled(throws);
  co_return n;
}

void consumer::application_waits() noexcept {
  if (!state_ || !state_->opt.waits_reported || state_->events.ended) return;
  state_->session.application_waits(state_->clock_now());
  state_->promote_held();  // what the application was handed since
}

void consumer::close() noexcept {
  if (!state_) return;
  state_->session.stop_acks();
  state_->acker.cv.notify_all();
  state_->stop_clocks();
  state_->tasks.cancel();
  state_->t->close();
}

void consumer::close(std::string reason) noexcept {
  if (!state_) return;
  state_->stop_clocks();
  // The acker writes the frame and then closes (not cancelled: it is the
  // one that tells the sender).
  try {
    state_->close_with(std::move(reason));
  } catch (...) {  // out of memory for the frame or its linger: close now
    close();
  }
}

std::uint32_t consumer::chunk_bytes() const noexcept {
  return state_ ? state_->session.answer().max_chunk_bytes : 0;
}
std::uint64_t consumer::window_bytes() const noexcept {
  return state_ ? state_->opt.window_bytes : 0;
}
std::size_t consumer::open_blobs() const noexcept {
  return state_ ? state_->session.frames().open_blobs() : 0;
}
session_id consumer::session() const noexcept {
  return state_ ? state_->session.session() : NO_SESSION;
}
std::uint64_t consumer::features() const noexcept {
  return state_ ? state_->session.answer().features : 0;
}

consumer_stats consumer::stats() const noexcept {
  if (!state_) return consumer_stats{};
  consumer_stats st = state_->stats;
  const consumer_session& session = state_->session;
  st.buffered_bytes = session.buffered_bytes();
  st.buffered_high_water = session.counts().buffered_high_water;
  st.credit_requests = session.counts().credit_requests;
  st.duplicates_dropped = session.counts().duplicates_dropped;
  st.acks_sent = session.counts().acks_sent;
  st.held_high_water = session.counts().held_high_water;
  st.recycle_kept_bytes = state_->receive.recycled->kept_bytes();
  if (const auto& blocks = state_->receive.small_blocks)
    st.small_entry_kept_bytes = blocks->kept() * blocks->block_bytes();
  st.held_bytes = session.held_credit();
  st.held_in_window_bytes = session.held_in_window();
  st.pool_member = state_->credit.pool_member;
  st.tasks_running = state_->tasks.running();
  return st;
}

}  // namespace blobpipe
