// The loops every sender shares (lib/pipeline/sender_state.hpp): the
// handshake, the ack reader, the wait for window credit, and the entry
// path with its one chunk loop, each around the sans-IO sender_session
// (which decides and frames). docs/wire.md "Sender", "Flow control".
#include <algorithm>
#include <array>
#include <cstring>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/pipeline/resend.hpp"
#include "lib/pipeline/sender_state.hpp"

namespace blobpipe::detail {

namespace {

/// Chunks of one entry queued ahead of the one being written: enough to
/// keep the writer busy and to fill the largest write window (UCX's 8
/// bulk payloads in flight, transport::write_window), few enough that
/// producers' chunks interleave.
constexpr std::size_t chunks_ahead = 8;

}  // namespace

// ---- state ------------------------------------------------------------------

sender_state::sender_state(asio::any_io_executor e, sender_options o, bool resend_session)
    : ex(std::move(e)),
      opt(std::move(o)),
      session(sender_session_options{.resend = resend_session,
                                     .unacked_bytes = opt.resend.unacked_bytes}),
      credit_cv(ex),
      reader_cv(ex),
      stall_watch(ex, opt.stall_timeout, {}),
      tasks(ex) {
  stall_watch.owes(true);  // whenever the sender waits on the consumer, it is owed
}

sender_state::~sender_state() = default;

void sender_state::fail(std::error_code ec) noexcept {
  if (!error) error = ec;
  session.fail(error);
  if (queue) queue->fail(ec);
  credit_cv.notify_all();
  reader_cv.notify_all();
  stall_watch.stop();
  if (resend) resend_failed(*this);
}

void sender_state::violation(std::string what) {
  message = std::move(what);
  fail(make_error_code(errc::protocol_violation));
}

void sender_state::take(const sender_input& in) {
  if (in.acks == 0) return;
  credit_cv.notify_all();
  stall_watch.progress();
  if (resend)
    for (const auto& b : in.delivered) resend_acked(*this, b);
}

sender_stats sender_state::stats() const noexcept {
  sender_stats st;
  static_cast<sender_counts&>(st) = session.counts();
  static_cast<sender_io_counts&>(st) = io;
  if (queue) st.queued_high_water = std::max<std::uint64_t>(st.queued_high_water, queue->copied_high_water());
  st.tasks_running = tasks.running() + (queue ? queue->writer_running() : 0);
  return st;
}

// ---- the consumer's frames --------------------------------------------------

asio::awaitable<std::error_code> read_consumer(std::shared_ptr<sender_state> s,
                                               std::shared_ptr<ack_reader> r) {
  auto [ec, got] = co_await r->link->read_some(r->buffer);
  if (ec) co_return ec;
  // A replaced link's last words: the session reads another one now.
  if (s->session.attempt() != r->attempt) co_return make_error_code(errc::closed);
  std::string refused;
  if (got.bulk_bytes != 0) {
    refused = "the consumer sent a bulk message";
  } else {
    auto in = s->session.consume(std::span(r->buffer).first(got.bytes));
    if (in) {
      s->take(*in);
      co_return std::error_code{};
    }
    // Its message (the frame or the check: a bad ack, a hello the session
    // cannot go on with, check_kept's kept entry) is the attempt's reason.
    refused = in.message();
  }
  r->message = std::move(refused);
  r->link->close();
  co_return make_error_code(errc::protocol_violation);
}

std::string closed_by_consumer(std::string_view reason) {
  if (reason.empty()) return "the consumer closed the stream (no reason given)";
  return "the consumer closed the stream: " + escape(reason, max_reason_bytes);
}

namespace {

/// Reads the consumer's frames on one connection until it ends.
asio::awaitable<void> read_acks(std::shared_ptr<sender_state> s, std::shared_ptr<ack_reader> r) {
  for (;;) {
    std::error_code ec = co_await read_consumer(s, r);
    if (s->error || s->session.connection() != r->connection) break;
    // A close frame says why the consumer ended the stream (a refusal:
    // an entry over its limits, a violation); its reason is the error's.
    const bool peer_closed = s->session.peer_closed();
    const std::string& reason = s->session.close_reason();
    const bool refused = peer_closed && !reason.empty();
    if (!ec && peer_closed) ec = make_error_code(errc::peer_closed);
    if (ec == errc::protocol_violation) {
      s->violation(r->message);
      break;
    }
    if (ec) {
      const std::string why = peer_closed ? closed_by_consumer(reason) : std::string();
      // After our `close`, the consumer closing its end is the orderly
      // end, unless its close gave a reason: then it refused something.
      if (s->resend) {
        if (!s->closing) connection_lost(s, r->connection, ec, why);
      } else {
        if (!why.empty() && (refused || !s->closing) && s->message.empty()) s->message = why;
        s->fail(s->closing && ec == errc::peer_closed && !refused ? make_error_code(errc::closed)
                                                                  : ec);
      }
      break;
    }
    s->stall_watch.progress();
  }
  if (s->session.connection() == r->connection) {
    s->reader_done = true;
    s->reader_cv.notify_all();
  }
}

}  // namespace

asio::awaitable<std::tuple<std::error_code, std::shared_ptr<ack_reader>>> handshake(
    std::shared_ptr<sender_state> s, std::shared_ptr<transport> link) {
  using ret = std::tuple<std::error_code, std::shared_ptr<ack_reader>>;
  auto reader = std::make_shared<ack_reader>(link);
  // handshake_timeout: closing the link ends the write or read below.
  deadline bound(link->get_executor(), s->opt.handshake_timeout,
                 [weak = std::weak_ptr<transport>(link)] {
                   if (auto l = weak.lock()) l->close();
                 });
  const auto failed = [&](std::error_code ec) {
    if (!bound.expired()) return ret{ec, reader};
    reader->message = bound.reason("no handshake with the consumer", "handshake_timeout");
    return ret{make_error_code(errc::timed_out), reader};
  };
  const hello mine{.role = wire_role::sender,
                   .max_chunk_bytes = s->opt.chunk_bytes,
                   .session = s->resend ? s->resend->session : NO_SESSION,
                   .features = offered_features(s->opt),
                   .inline_bytes = s->opt.inline_bytes};
  outbox out;
  reader->attempt = s->session.offer(mine, out);
  const auto bytes = out.pieces()[0].bytes(out);
  const asio::const_buffer buf(bytes.data(), bytes.size());
  if (auto ec = co_await link->write(std::span(&buf, 1))) co_return failed(ec);
  while (!s->session.answer()) {
    const std::error_code ec = co_await read_consumer(s, reader);
    if (ec) co_return failed(ec);
    if (s->session.peer_closed() && !s->session.answer())
      co_return ret{make_error_code(errc::peer_closed), reader};
  }
  co_return ret{std::error_code{}, std::move(reader)};
}

void install(const std::shared_ptr<sender_state>& s, std::shared_ptr<ack_reader> reader) {
  const hello& peer = *s->session.answer();
  if (!s->queue || s->queue->link_ptr() != reader->link) {
    if (s->queue) {
      s->queue->fail(make_error_code(errc::closed));
      s->io.queued_high_water =
          std::max<std::uint64_t>(s->io.queued_high_water, s->queue->copied_high_water());
    }
    s->queue = std::make_shared<send_queue>(reader->link, s->opt.max_queued_bytes);
  }
  s->session.connect(sender_limits::from_hello(peer), &s->queue->frames());
  // A failed write ends the connection as a failed read does (read_acks).
  s->queue->start([weak = std::weak_ptr<sender_state>(s), conn = s->session.connection()](std::error_code ec) {
    auto st = weak.lock();
    if (!st || st->error || st->session.connection() != conn) return;
    if (st->resend) {
      connection_lost(st, conn, ec);
    } else {
      st->fail(ec);
    }
  });
  reader->connection = s->session.connection();
  s->reader_done = false;
  s->stall_watch.progress();
  s->tasks.spawn(read_acks(s, std::move(reader)));
}

// ---- credit -----------------------------------------------------------------

std::uint64_t offered_features(const sender_options& opt) noexcept {
  return feature_blob_groups | feature_credit_grants | feature_compact_entries |
         (opt.entry_timestamps ? feature_entry_timestamps : 0);
}

namespace {

/// A producer's wait for credit on one connection: counted once, and with
/// credit grants asked of the consumer (added to what the others wait for)
/// and withdrawn when the wait ends.
class credit_wish {
 public:
  credit_wish(sender_state& s, const std::shared_ptr<send_queue>& q)
      : s_(s), q_(q), conn_(s.session.connection()) {}
  credit_wish(const credit_wish&) = delete;
  credit_wish& operator=(const credit_wish&) = delete;
  ~credit_wish() {
    if (n_ != 0) s_.session.withdraw_credit(n_, conn_);
  }
  void ask(std::uint64_t n) {
    if (q_->error()) {
      s_.session.note_credit_wait();
      return;
    }
    n_ = n;
    s_.session.ask_credit(n);
    q_->kick();
  }

 private:
  sender_state& s_;
  const std::shared_ptr<send_queue>& q_;
  std::uint64_t conn_;
  std::uint64_t n_ = 0;
};

}  // namespace

asio::awaitable<std::error_code> acquire_credit(std::shared_ptr<sender_state> s,
                                                std::shared_ptr<send_queue> q, std::uint64_t n) {
  bool asked = false;
  credit_wish wish(*s, q);
  for (;;) {
    if (s->error) co_return s->error;
    if (q != s->queue) co_return make_error_code(errc::closed);
    if (s->session.take_credit(n)) co_return std::error_code{};
    if (!asked) {
      asked = true;
      wish.ask(n);
    }
    s->stall_watch.begin_wait();
    const bool cancelled = co_await s->credit_cv.wait();
    s->stall_watch.end_wait();
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
}

asio::awaitable<std::error_code> wait_room(std::shared_ptr<sender_state> s,
                                           std::shared_ptr<send_queue> q) {
  while (q->full()) {
    s->stall_watch.begin_wait();
    const std::error_code ec = co_await q->room();
    s->stall_watch.end_wait();
    if (ec) co_return ec;
    // The writer took a batch: the transport is taking bytes.
    s->stall_watch.progress();
  }
  co_return std::error_code{};
}

asio::awaitable<std::error_code> end_tasks(std::shared_ptr<sender_state> s) {
  s->fail(make_error_code(errc::closed));  // an earlier error stays; the queue closes its link
  // A connect function that ignores its cancellation would hold the join
  // for as long as it runs: handshake_timeout bounds the wait (it is the
  // bound of the attempt's other half, the handshake).
  std::error_code late;
  asio::cancellation_signal stop_join;
  {
    deadline bound(s->ex, s->opt.handshake_timeout,
                   [&stop_join] { stop_join.emit(asio::cancellation_type::all); });
    // (Cancelled, the join's coroutine ends with operation_aborted thrown:
    // taken as a value here, and expected only once the bound passed.)
    auto [thrown] = co_await asio::co_spawn(
        s->ex, s->tasks.join(),
        asio::bind_cancellation_slot(stop_join.slot(),
                                     asio::experimental::as_tuple(asio::use_awaitable)));
    if (thrown && !bound.expired()) std::rethrow_exception(thrown);
    if (bound.expired() && s->tasks.running() != 0) {
      late = make_error_code(errc::timed_out);
      if (s->message.empty())
        s->message = bound.reason(
            "shutdown: the sender's tasks (a connect function that ignores its "
            "cancellation) did not end",
            "handshake_timeout");
    }
  }
  if (auto q = s->queue) {
    co_await q->join_writer();
    q->release_link();
  }
  co_return late;
}

std::string failure_text(const sender_state& s) {
  return s.message.empty() ? s.error.message() : s.message;
}

// ---- entries ----------------------------------------------------------------

bool begin_entry(sender_state& s, send_queue& q, sender_blob& b, const planned_entry& pe,
                 std::span<const std::byte> meta, std::uint64_t emitted_ns) {
  const Entry& e = pe.entry;
  if (!pe.contiguous && e.len != 0) ++s.io.gathered_entries;
  auto room = s.session.add_entry(b, e, meta, emitted_ns, entry_route::automatic);
  if (!room.empty()) {
    // Small: copied into the frame, so the producer may go on at once.
    if (pe.contiguous) {
      std::memcpy(room.data(), pe.source.data, e.len);
    } else {
      // Host memory and exactly e.len bytes: write_entry cannot fail here.
      (void)write_entry(pe, room);
    }
    q.kick();
    return true;
  }
  q.kick();
  return e.len == 0;
}

asio::awaitable<std::error_code> send_entry_bytes(std::shared_ptr<sender_state> s,
                                                  std::shared_ptr<send_queue> q, sender_blob& b,
                                                  const planned_entry& pe) {
  const Entry& e = pe.entry;
  if (pe.contiguous)
    co_return co_await send_chunks(s, q, b, std::span(pe.source.data, e.len));
  // A strided value: gathered once into a temporary that lives until its
  // chunks are written (the documented exception to zero copy).
  std::vector<std::byte> gathered(e.len);
  if (auto r = write_entry(pe, gathered); !r) {
    // Announced already: the blob cannot go on without these bytes.
    q->fail(r.code());
    co_return r.code();
  }
  co_return co_await send_chunks(s, q, b, gathered);
}

namespace {

/// Waits until the transport took everything up to `ticket` (send_chunks).
asio::awaitable<std::error_code> wait_chunks(std::shared_ptr<sender_state> s,
                                             std::shared_ptr<send_queue> q, std::uint64_t ticket) {
  s->stall_watch.begin_wait();
  auto ec = co_await q->wait_written(ticket);
  s->stall_watch.end_wait();
  if (ec == asio::error::operation_aborted) {
    // The producer was cancelled with its bytes still queued: they cannot
    // be taken back (send_chunks waits for the sends reading them).
    q->fail(make_error_code(errc::closed));
    if (!s->resend) s->fail(make_error_code(errc::closed));
    co_return make_error_code(errc::closed);
  }
  if (!ec) s->stall_watch.progress();
  co_return ec;
}

}  // namespace

asio::awaitable<std::error_code> send_chunks(std::shared_ptr<sender_state> s,
                                             std::shared_ptr<send_queue> q, sender_blob& b,
                                             std::span<const std::byte> bytes, int device) {
  if (q->error()) co_return q->error();  // (its transport may be released)
  const bool bulk = q->link().sends_bulk();
  std::array<std::uint64_t, chunks_ahead> ahead{};  // chunk k's ticket at k % chunks_ahead
  std::size_t queued = 0;                           // chunks framed
  std::uint64_t last = q->ticket();
  std::error_code ec;
  for (std::size_t pos = 0; pos < bytes.size(); ++queued) {
    if (q->error()) {
      ec = q->error();
      break;
    }
    // The connection was replaced while we waited: these frames are not its.
    if (q != s->queue) {
      ec = make_error_code(errc::closed);
      break;
    }
    const std::size_t n = s->session.add_chunk(b, bytes.subspan(pos), bulk, device);
    if (n == 0) {  // the entry needs no more
      ec = make_error_code(errc::closed);
      break;
    }
    q->kick();
    pos += n;
    if (queued >= chunks_ahead) {
      ec = co_await wait_chunks(s, q, ahead[queued % chunks_ahead]);
      if (ec) break;
    }
    last = ahead[queued % chunks_ahead] = q->ticket();
  }
  if (!ec) ec = co_await wait_chunks(s, q, last);
  if (ec && queued > 0) {
    // Stopped (cancelled, the sender closed, the queue replaced) with
    // chunks queued: `bytes` may go once this returns, so not before no
    // frame queued so far is read: written, or its queue failed and the
    // sends in flight ended with the transport it closed. A cancellation neither ends this wait nor is
    // lost (the caller's next co_await throws): an awaitable co_awaited
    // in a cancelled coroutine throws, so throw_if_cancelled is off here.
    const std::uint64_t framed = q->ticket();
    const bool throws = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await q->frames_released(framed);
    co_await asio::this_coro::throw_if_cancelled(throws);
  }
  co_return ec;
}

}  // namespace blobpipe::detail
