// The consumer: a pull state machine over frames (docs/wire.md "Consumer").
// next() reads one frame at a time and hands it to the frame handlers
// (consumer_frames.cpp), which turn frames into events. Acknowledgements
// flow back from a separate coroutine as the user releases entries.
#include "blobpipe/pipeline/consumer.hpp"

#include <algorithm>
#include <array>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>

#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/consumer_state.hpp"

namespace blobpipe {
namespace detail {
namespace {

asio::awaitable<void> ack_loop(std::shared_ptr<consumer_state> s) {
  while (!s->ack_stopped) {
    if (s->pending_ack == 0 && s->delivered_ids.empty()) {
      if (co_await s->ack_cv.wait()) break;
      continue;
    }
    // A delivery ack carries the credit released so far as well.
    std::uint64_t id = 0;
    if (!s->delivered_ids.empty()) {
      id = s->delivered_ids.front();
      s->delivered_ids.pop_front();
    }
    const std::uint64_t n = std::exchange(s->pending_ack, 0);
    frame_header h{.type = frame_type::ack, .blob_id = id, .arg = n};
    if (co_await send_frame(*s->t, h, {})) break;
    ++s->stats.acks_sent;
  }
}

/// Closes the connection when the sender stalls (consumer_options
/// stall_timeout, idle_timeout); next() then reports timed_out.
asio::awaitable<void> watch(std::shared_ptr<consumer_state> s) {
  const bool expired = co_await s->dog.expired();
  if (!expired) co_return;
  s->timeout_reason = std::string("no bytes from the sender for ") +
                      std::to_string(s->dog.limit().count()) + " ms (" + s->dog.tripped() +
                      "_timeout)";
  s->t->close();
}

}  // namespace
}  // namespace detail

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
      (opt.assemble == assemble_mode::file && !opt.file_slot_for) || opt.payload_window == 0)
    co_return ret{make_error_code(errc::invalid_argument), consumer{}};
  if (auto r = detail::device_lander::check(opt); !r) co_return ret{r.code(), consumer{}};
  auto s = std::make_shared<detail::consumer_state>(std::move(t), std::move(opt));
  s->log = s->opt.delivered ? s->opt.delivered : delivery_log::process_default();
  if (s->dog.enabled()) asio::co_spawn(s->ex, detail::watch(s), asio::detached);
  auto fail = [&](std::error_code ec) {
    s->dog.stop();
    s->t->close();
    return ret{s->timeout_reason.empty() ? ec : make_error_code(errc::timed_out), consumer{}};
  };
  s->dog.owes(true);  // the hello is due
  s->dog.begin_wait();
  auto [ec, h] = co_await s->t->receive_header();
  if (ec) co_return fail(ec);
  if (h.type != frame_type::hello || h.length != hello_size)
    co_return fail(make_error_code(errc::protocol_violation));
  std::array<std::byte, hello_size> buf;
  if (auto rec = co_await s->t->receive_payload(buf)) co_return fail(rec);
  s->dog.end_wait();
  auto peer = decode_hello(buf);
  if (!peer) co_return fail(peer.code());
  if (peer->role != wire_role::sender) co_return fail(make_error_code(errc::protocol_violation));
  s->chunk_bytes = std::min(peer->max_chunk_bytes, s->opt.max_chunk_bytes);
  s->payload_window = std::min(s->opt.payload_window, s->t->payload_window());
  if (s->opt.landing.enabled)
    s->landing = std::make_unique<detail::device_lander>(
        s->ex, s->opt.landing, s->chunk_bytes, s->t->accepts_device_memory());
  s->session = peer->session;
  hello mine{.role = wire_role::consumer,
             .max_chunk_bytes = s->chunk_bytes,
             .max_key_bytes = s->opt.max_key_bytes,
             .window_bytes = s->opt.window_bytes,
             .max_meta_bytes = s->opt.max_meta_bytes,
             .dedup_window = s->log->window(),
             .session = peer->session};
  const auto reply = encode_hello(mine);
  if (auto sec = co_await send_frame(*s->t, frame_header{.type = frame_type::hello,
                                                         .length = hello_size},
                                     reply))
    co_return fail(sec);
  asio::co_spawn(s->ex, detail::ack_loop(s), asio::detached);
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

namespace detail {

asio::awaitable<event> next_event(std::shared_ptr<consumer_state> s) {
  for (;;) {
    if (!s->pending.empty()) {
      event ev = std::move(s->pending.front());
      s->pending.pop_front();
      co_return ev;
    }
    if (s->ended) co_return s->final_event;
    s->dog.owes(!s->blobs.empty());
    s->dog.begin_wait();
    result<void> r;
    if (should_land(*s)) {
      // A posted chunk completes an entry, and either no frame is waiting
      // or it has landed: yield that entry before reading on.
      r = co_await land_oldest(*s);
    } else {
      auto [ec, h] = co_await s->t->receive_header();
      s->dog.progress();
      s->dog.owes(true);  // the payload (if any) is due now
      if (ec) {
        r = error{ec, s->t->last_error().empty() ? ec.message() : s->t->last_error()};
      } else {
        r = co_await on_frame(s, h);
      }
    }
    if (!r) co_await abandon_posted(*s);
    s->dog.progress();
    s->dog.end_wait();
    if (!r && !s->timeout_reason.empty()) {
      // The watchdog closed the transport; the read failed with `closed`.
      s->end(make_error_code(errc::timed_out), s->timeout_reason);
    } else if (!r) {
      s->end(r.code(), r.message());
    }
  }
}

}  // namespace detail

void consumer::close() noexcept {
  if (!state_) return;
  state_->ack_stopped = true;
  state_->ack_cv.notify_all();
  state_->dog.stop();
  state_->t->close();
}

std::uint32_t consumer::chunk_bytes() const noexcept { return state_ ? state_->chunk_bytes : 0; }
std::uint64_t consumer::window_bytes() const noexcept {
  return state_ ? state_->opt.window_bytes : 0;
}
consumer_stats consumer::stats() const noexcept {
  if (!state_) return consumer_stats{};
  consumer_stats st = state_->stats;
  st.recycle_kept_bytes = state_->recycled->kept_bytes();
  return st;
}

}  // namespace blobpipe
