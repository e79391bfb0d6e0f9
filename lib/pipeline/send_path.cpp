// The steps every sender shares (lib/pipeline/sender_state.hpp): the
// handshake, the ack reader, window credit, and the entry path with its
// one chunk loop. docs/wire.md "Sender", "Flow control".
#include <algorithm>
#include <array>
#include <cstring>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "lib/pipeline/handshake_deadline.hpp"
#include "lib/pipeline/resend.hpp"
#include "lib/pipeline/sender_state.hpp"

namespace blobpipe::detail {

namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

/// Chunks of one entry queued ahead of the one being written: enough to
/// keep the writer busy, few enough that producers' chunks interleave.
constexpr std::size_t chunks_ahead = 4;

}  // namespace

// ---- state ------------------------------------------------------------------

sender_state::sender_state(asio::any_io_executor e, sender_options o)
    : ex(std::move(e)), opt(std::move(o)), credit_cv(ex), reader_cv(ex),
      stall_watch(ex, opt.stall_timeout, {}) {
  stall_watch.owes(true);  // whenever the sender waits on the consumer, it is owed
}

sender_state::~sender_state() = default;

void sender_state::fail(std::error_code ec) noexcept {
  if (!error) error = ec;
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

result<void> sender_state::on_ack(std::uint64_t conn, std::uint64_t credit,
                                  std::uint64_t blob_id) {
  if (conn != connection) return {};  // a replaced connection's last words
  if (features & feature_credit_grants) {
    // A grant: what we hold comes back first, the rest widens the window
    // (docs/wire_features.md "Credit grants").
    const std::uint64_t back = std::min(credit, in_flight);
    in_flight -= back;
    window_bytes += credit - back;
  } else if (credit > in_flight) {
    return {errc::protocol_violation, "ack returns " + num(credit) + " credit bytes, " +
                                          num(in_flight) + " in flight"};
  } else {
    in_flight -= credit;
  }
  credit_cv.notify_all();
  stall_watch.progress();
  if (resend) return resend_acked(*this, blob_id);
  if (blob_id != 0)
    return {errc::protocol_violation,
            "ack delivers blob " + num(blob_id) + " to a sender without a resend session"};
  return {};
}

// ---- the consumer's frames --------------------------------------------------

ack_reader::ack_reader(std::shared_ptr<transport> l)
    : link(std::move(l)), frames(wire_role::consumer, decoder_limits{}, *this) {}

asio::awaitable<std::error_code> ack_reader::read_more() {
  auto [ec, got] = co_await link->read_some(buffer);
  if (ec) co_return ec;
  if (got.bulk_bytes != 0) {
    message = "the consumer sent a bulk message";
    link->close();
    co_return make_error_code(errc::protocol_violation);
  }
  auto r = frames.consume(std::span(buffer).first(got.bytes));
  if (!r) {
    message = r.message();
    link->close();
    co_return r.code();
  }
  co_return std::error_code{};
}

result<void> ack_reader::on_hello(const hello& h) {
  peer = h;
  return {};
}

result<void> ack_reader::on_ack(std::uint64_t credit, std::uint64_t blob_id) {
  if (!sender) return {errc::protocol_violation, "ack before the handshake ended"};
  return sender->on_ack(connection, credit, blob_id);
}

result<void> ack_reader::on_close(std::string_view) {
  peer_closed = true;
  return {};
}

namespace {

/// Reads the consumer's frames on one connection until it ends.
asio::awaitable<void> read_acks(std::shared_ptr<sender_state> s, std::shared_ptr<ack_reader> r) {
  for (;;) {
    std::error_code ec = co_await r->read_more();
    if (s->error || s->connection != r->connection) break;
    if (!ec && r->peer_closed) ec = make_error_code(errc::peer_closed);
    if (ec == errc::protocol_violation) {
      s->violation(r->message);
      break;
    }
    if (ec) {
      // After our `close`, the consumer closing its end is the orderly end.
      if (s->resend) {
        if (!s->closing) connection_lost(s, r->connection, ec);
      } else {
        s->fail(s->closing && ec == errc::peer_closed ? make_error_code(errc::closed) : ec);
      }
      break;
    }
    s->stall_watch.progress();
  }
  if (s->connection == r->connection) {
    s->reader_done = true;
    s->reader_cv.notify_all();
  }
}

}  // namespace

asio::awaitable<std::tuple<std::error_code, std::shared_ptr<ack_reader>>> handshake(
    std::shared_ptr<transport> link, const sender_options& opt, const session_id& session) {
  using ret = std::tuple<std::error_code, std::shared_ptr<ack_reader>>;
  const auto violation = [&](std::string why) {
    link->close();
    auto r = std::make_shared<ack_reader>(link);
    r->message = std::move(why);
    return ret{make_error_code(errc::protocol_violation), std::move(r)};
  };
  auto reader = std::make_shared<ack_reader>(link);
  // handshake_timeout: closing the link ends the write or read below.
  handshake_deadline deadline(link->get_executor(), opt.handshake_timeout,
                              [weak = std::weak_ptr<transport>(link)] {
                                if (auto l = weak.lock()) l->close();
                              });
  const auto failed = [&](std::error_code ec) {
    if (!deadline.expired()) return ret{ec, reader};
    reader->message = "no handshake with the consumer within " +
                      num(opt.handshake_timeout.count()) + " ms (handshake_timeout)";
    return ret{make_error_code(errc::timed_out), reader};
  };
  hello mine{.role = wire_role::sender,
             .max_chunk_bytes = opt.chunk_bytes,
             .session = session,
             .features = offered_features(opt),
             .inline_bytes = opt.inline_bytes};
  outbox out;
  frame_hello(out, mine);
  const auto bytes = out.pieces()[0].bytes(out);
  const asio::const_buffer buf(bytes.data(), bytes.size());
  if (auto ec = co_await link->write(std::span(&buf, 1))) co_return failed(ec);
  while (!reader->peer) {
    const std::error_code ec = co_await reader->read_more();
    if (ec) co_return failed(ec);
    if (reader->peer_closed && !reader->peer) co_return ret{make_error_code(errc::peer_closed), reader};
  }
  const hello& peer = *reader->peer;
  if (peer.max_chunk_bytes > opt.chunk_bytes)
    co_return violation("hello: chunk " + num(peer.max_chunk_bytes) + " above the proposal");
  if (peer.inline_bytes > opt.inline_bytes)
    co_return violation("hello: inline_bytes " + num(peer.inline_bytes) + " above the proposal");
  if (peer.window_bytes == 0 && !(peer.features & feature_credit_grants))
    co_return violation("hello: zero window");
  if ((peer.features & ~mine.features) != 0)
    co_return violation("hello: the consumer accepts features that were not offered");
  // A resend session needs the consumer to de-duplicate for it.
  if (session != NO_SESSION && (peer.session != session || peer.dedup_window == 0))
    co_return violation("hello: the consumer keeps no delivery log for this session");
  co_return ret{std::error_code{}, std::move(reader)};
}

void install(const std::shared_ptr<sender_state>& s, std::shared_ptr<ack_reader> reader) {
  const hello& peer = *reader->peer;
  if (!s->queue || s->queue->link_ptr() != reader->link) {
    if (s->queue) s->queue->fail(make_error_code(errc::closed));
    s->queue = std::make_shared<send_queue>(reader->link, s->opt.max_queued_bytes);
  }
  ++s->connection;
  // A failed write ends the connection as a failed read does (read_acks).
  s->queue->start([weak = std::weak_ptr<sender_state>(s), conn = s->connection](std::error_code ec) {
    auto st = weak.lock();
    if (!st || st->error || st->connection != conn) return;
    if (st->resend) {
      connection_lost(st, conn, ec);
    } else {
      st->fail(ec);
    }
  });
  reader->sender = s.get();  // read_acks holds `s` for as long as `reader` lives
  reader->connection = s->connection;
  s->chunk_bytes = peer.max_chunk_bytes;
  s->inline_bytes = peer.inline_bytes;
  s->window_bytes = peer.window_bytes;
  s->features = peer.features;
  s->credit_wanted = 0;
  s->max_key_bytes = peer.max_key_bytes;
  s->max_meta_bytes = peer.max_meta_bytes;
  s->in_flight = 0;
  s->next_blob_id = 1;
  s->reader_done = false;
  s->stall_watch.progress();
  asio::co_spawn(s->ex, read_acks(s, std::move(reader)), asio::detached);
}

// ---- credit -----------------------------------------------------------------

std::uint64_t offered_features(const sender_options& opt) noexcept {
  return feature_blob_groups | feature_credit_grants |
         (opt.entry_timestamps ? feature_entry_timestamps : 0);
}

namespace {

/// A producer's part of sender_state::credit_wanted while it waits on a
/// connection with credit grants: asked for in a credit request, and
/// withdrawn when the wait ends (unless the connection was replaced,
/// which starts the sum over).
class credit_wish {
 public:
  credit_wish(sender_state& s, const std::shared_ptr<send_queue>& q)
      : s_(s), q_(q), conn_(s.connection) {}
  credit_wish(const credit_wish&) = delete;
  credit_wish& operator=(const credit_wish&) = delete;
  ~credit_wish() {
    if (n_ != 0 && s_.connection == conn_) s_.credit_wanted -= std::min(n_, s_.credit_wanted);
  }
  void ask(std::uint64_t n) {
    if (!(s_.features & feature_credit_grants) || q_->error()) return;
    n_ = n;
    s_.credit_wanted += n;
    frame_credit_request(q_->frames(), s_.credit_wanted);
    q_->kick();
    ++s_.stats.credit_requests;
  }

 private:
  sender_state& s_;
  const std::shared_ptr<send_queue>& q_;
  std::uint64_t conn_;
  std::uint64_t n_ = 0;
};

}  // namespace

bool take_credit(sender_state& s, std::uint64_t n) noexcept {
  const bool fits = s.in_flight <= s.window_bytes && n <= s.window_bytes - s.in_flight;
  // With credit grants nothing goes beyond the credit granted: the pool
  // grants an oversized item its credit instead.
  if (n != 0 && !fits && (s.in_flight != 0 || (s.features & feature_credit_grants)))
    return false;
  s.in_flight += n;
  return true;
}

asio::awaitable<std::error_code> acquire_credit(std::shared_ptr<sender_state> s,
                                                std::shared_ptr<send_queue> q, std::uint64_t n) {
  bool counted = false;
  // Credit grants: what this producer waits for is asked of the pool
  // (added to what the others wait for), and taken back once it is in.
  credit_wish wish(*s, q);
  for (;;) {
    if (s->error) co_return s->error;
    if (q != s->queue) co_return make_error_code(errc::closed);
    if (take_credit(*s, n)) co_return std::error_code{};
    if (!counted) {
      ++s->stats.credit_waits, counted = true;
      wish.ask(n);
    }
    s->stall_watch.begin_wait();
    const bool cancelled = co_await s->credit_cv.wait();
    s->stall_watch.end_wait();
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
}

// ---- entries ----------------------------------------------------------------

void frame_abort(send_queue& q, std::uint64_t blob_id, std::string_view reason) {
  frame_blob_abort(q.frames(), blob_id, reason);
  q.kick();
}

asio::awaitable<std::error_code> send_entry(std::shared_ptr<sender_state> s,
                                            std::shared_ptr<send_queue> q, std::uint64_t blob_id,
                                            std::uint64_t index, const planned_entry& pe,
                                            std::span<const std::byte> meta,
                                            std::uint64_t emitted_ns) {
  const Entry& e = pe.entry;
  if (!pe.contiguous && e.len != 0) ++s->stats.gathered_entries;
  // The clock is read only when something needs it (not per entry).
  if (s->stats.first_entry_ns == 0) s->stats.first_entry_ns = emitted_ns ? emitted_ns : steady_ns();
  std::optional<std::uint64_t> stamp;
  if (s->features & feature_entry_timestamps) stamp = emitted_ns ? emitted_ns : steady_ns();
  if (e.len != 0 && e.len <= s->inline_bytes) {
    // Small: copied into the frame, so the producer may go on at once.
    auto room = frame_entry_begin_inline(q->frames(), blob_id, index, e, meta, stamp);
    if (pe.contiguous) {
      std::memcpy(room.data(), pe.source.data, e.len);
    } else {
      // Host memory and exactly e.len bytes: write_entry cannot fail here.
      (void)write_entry(pe, room);
    }
    q->kick();
    co_return std::error_code{};
  }
  frame_entry_begin(q->frames(), blob_id, index, e, meta, stamp);
  q->kick();
  if (e.len == 0) co_return std::error_code{};
  if (pe.contiguous)
    co_return co_await send_chunks(s, q, blob_id, e.off, std::span(pe.source.data, e.len));
  // A strided value: gathered once into a temporary that lives until its
  // chunks are written (the documented exception to zero copy).
  std::vector<std::byte> gathered(e.len);
  if (auto r = write_entry(pe, gathered); !r) {
    // Announced already: the blob cannot go on without these bytes.
    q->fail(r.code());
    co_return r.code();
  }
  co_return co_await send_chunks(s, q, blob_id, e.off, gathered);
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
    // be taken back, and its memory may go once it returns.
    q->fail(make_error_code(errc::closed));
    if (!s->resend) s->fail(make_error_code(errc::closed));
    co_return make_error_code(errc::closed);
  }
  if (!ec) s->stall_watch.progress();
  co_return ec;
}

}  // namespace

asio::awaitable<std::error_code> send_chunks(std::shared_ptr<sender_state> s,
                                             std::shared_ptr<send_queue> q, std::uint64_t blob_id,
                                             std::uint64_t off, std::span<const std::byte> bytes,
                                             int device) {
  const bool bulk = q->link().sends_bulk();
  std::array<std::uint64_t, chunks_ahead> ahead{};  // chunk k's ticket at k % chunks_ahead
  std::size_t k = 0;
  std::uint64_t last = q->ticket();
  for (std::size_t pos = 0; pos < bytes.size(); ++k) {
    if (q->error()) co_return q->error();
    const auto n = std::min<std::size_t>(s->chunk_bytes, bytes.size() - pos);
    frame_data(q->frames(), blob_id, off + pos, bytes.subspan(pos, n), s->chunk_bytes,
               /*copy=*/false, bulk, device);
    q->kick();
    ++s->stats.data_frames_sent;
    pos += n;
    if (k >= chunks_ahead) {
      const std::error_code ec = co_await wait_chunks(s, q, ahead[k % chunks_ahead]);
      if (ec) co_return ec;
    }
    last = ahead[k % chunks_ahead] = q->ticket();
  }
  co_return co_await wait_chunks(s, q, last);
}

}  // namespace blobpipe::detail
