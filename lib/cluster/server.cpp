// The fan-in server (blobpipe/cluster/server.hpp): an accept loop, one
// pump per connection from its consumer into the merged queue, and next()
// taking events out of it; with server_options::threads, the pumps on
// receive threads (server_state.hpp). docs/cluster.md "Fan-in".
#include "blobpipe/cluster/server.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "blobpipe/transport/url.hpp"
#include "lib/cluster/server_state.hpp"
#include "lib/runtime/deadline.hpp"

namespace blobpipe {
namespace detail {
namespace {

using clock = std::chrono::steady_clock;
/// Resend sessions remembered, to count reconnects.
constexpr std::size_t sessions_remembered = 4096;

server_event_kind kind_of(event_kind k) {
  switch (k) {
    case event_kind::entry_ready: return server_event_kind::entry_ready;
    case event_kind::blob_complete: return server_event_kind::blob_complete;
    case event_kind::blob_aborted: return server_event_kind::blob_aborted;
    case event_kind::end_of_stream: break;
  }
  return server_event_kind::connection_closed;
}

/// The most credit one item of a connection can need: its largest entry
/// with the largest key and meta, or its largest tail (saturating).
std::uint64_t max_item_credit(const consumer_options& o) noexcept {
  const std::uint64_t room = std::uint64_t{o.max_key_bytes} + o.max_meta_bytes + entry_overhead_bytes;
  const std::uint64_t entry =
      o.max_entry_bytes > ~std::uint64_t{0} - room ? ~std::uint64_t{0} : o.max_entry_bytes + room;
  return std::max<std::uint64_t>(entry, o.max_tail_bytes);
}

double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

/// Counts a resend session's second and later connections as reconnects.
void note_session(server_state& s, server_conn& cn) {
  const session_id& id = cn.info->session;
  if (id == NO_SESSION) return;
  std::string key(reinterpret_cast<const char*>(id.data()), id.size());
  if (!s.sessions.insert(key).second) {
    cn.home.metrics.reconnects = 1;
    return;
  }
  s.session_order.push_back(std::move(key));
  if (s.session_order.size() > sessions_remembered) {
    s.sessions.erase(s.session_order.front());
    s.session_order.pop_front();
  }
}

/// Home: connection `cn`'s stream ended (its pump is done): it ends; kept
/// (for its buffered bytes and counters) only if it opened.
void leave(server_state& s, server_conn& cn) {
  const conn_state was = cn.home.state;
  if (was == conn_state::ended) return;  // its slot was reclaimed in its handshake
  s.move(cn, conn_state::ended);
  if (was == conn_state::handshaking) s.conns.erase(cn.info->id);  // nothing to keep
  s.ready.notify_all();
}

/// Home: connection `cn`'s consumer yielded `ev`.
void arrived(server_state& s, const std::shared_ptr<server_conn>& conn, event ev) {
  conn_home& cn = conn->home;
  // Ended before its stream did: its slot was reclaimed as its handshake
  // finished, and what it sends is dropped.
  if (cn.state == conn_state::ended) {
    if (ev.kind != event_kind::entry_ready) s.uncredited_left(conn);
    return;
  }
  ++cn.queued;
  if (ev.kind != event_kind::end_of_stream) cn.useful = clock::now();
  if (ev.kind == event_kind::end_of_stream) {
    s.push({server_event_kind::connection_closed, conn->info, std::move(ev)});
    return;
  }
  auto outcomes = s.groups.observe(ev, clock::now(), conn->info->id);
  s.push({kind_of(ev.kind), conn->info, std::move(ev)});
  s.push_groups(outcomes);
  s.watch_groups();
}

/// On connection `conn`'s executor: hands `ev` home, where arrived()
/// takes it. From a receive thread, events gather in conn.homebound and
/// one post takes each batch home, in order: an event handed after the
/// batch was taken starts the next one, and every post here or in
/// at_home() runs in the order it was made.
void hand_home(server_state& s, const std::shared_ptr<server_conn>& conn, event ev) {
  if (conn->at_home) {
    arrived(s, conn, std::move(ev));
    return;
  }
  homebound_events& hb = conn->homebound;
  {
    std::lock_guard lock(hb.mu);
    hb.queue.push_back(std::move(ev));
    if (std::exchange(hb.posted, true)) return;  // the batch on its way takes it
  }
  try {
    asio::post(s.ex, [state = s.shared_from_this(), conn] {
      std::vector<event> batch;
      {
        std::lock_guard lock(conn->homebound.mu);
        batch.swap(conn->homebound.queue);
        conn->homebound.posted = false;
      }
      for (event& e : batch) arrived(*state, conn, std::move(e));
    });
  } catch (...) {
    std::lock_guard lock(hb.mu);
    hb.posted = false;  // the next event posts again
    throw;
  }
}

/// One connection, on its executor (cx): the handshake (bounded by
/// handshake_timeout), then its consumer's events handed home until its
/// end of stream.
asio::awaitable<void> serve(std::shared_ptr<server_state> s, std::shared_ptr<server_conn> cn,
                            std::unique_ptr<transport> t) {
  // However this ends (an exception too), the connection leaves the count.
  struct on_exit {
    std::shared_ptr<server_state> s;
    std::shared_ptr<server_conn> cn;
    ~on_exit() {
      try {
        s->at_home(*cn, [s = s, cn = cn] { leave(*s, *cn); });
      } catch (...) {  // no memory to post it: the count stays high
      }
    }
  } bye{s, cn};
  conn_io& io = cn->io;
  if (io.reclaimed) co_return;  // its slot went before it started
  io.raw = t.get();
  consumer_options copt = s->opt.connection;
  copt.pool = s->pool;
  // The application waits in server::next(), not where the pump does.
  copt.waits_reported = true;
  // Fair turns among the connections sharing a thread (docs/cluster.md).
  if (copt.turn_work_bytes == 0) copt.turn_work_bytes = server_turn_work_bytes;
  if (s->opt.latency) copt.accept_features |= feature_entry_timestamps;
  std::error_code ec;
  consumer c;
  {
    // The server's handshake_timeout: closing the transport ends start().
    detail::deadline handshake_bound(
        cn->cx, s->opt.handshake_timeout, [w = std::weak_ptr<server_conn>(cn)] {
          if (auto conn = w.lock(); conn && conn->io.raw) conn->io.raw->close();
        });
    std::tie(ec, c) = co_await consumer::start(std::move(t), std::move(copt));
  }
  io.raw = nullptr;
  if (!ec && io.reclaimed) ec = make_error_code(errc::closed);  // reclaimed as it finished
  if (ec) {
    s->at_home(*cn, [s, cn] {
      // A reclaimed one (ended already) was counted then.
      if (cn->home.state != conn_state::ended) ++s->counts.handshake_failures;
    });
    co_return;
  }
  io.c.emplace(std::move(c));
  const session_id session = io.c->session();
  const std::uint64_t member = io.c->stats().pool_member;
  if (s->closed) io.c->close();
  s->at_home(*cn, [s, cn, session, member] {
    if (cn->home.state == conn_state::ended) return;  // reclaimed as it finished
    s->move(*cn, conn_state::open);
    cn->home.useful = clock::now();
    cn->home.pool_member = member;
    cn->info->session = session;
    note_session(*s, *cn);
    ++cn->home.queued;
    s->push({server_event_kind::connection_opened, cn->info, {}});
  });
  s->drain_one(io);
  const std::size_t room = s->opt.max_queued_events_per_connection;
  std::vector<event> batch;  // what one read completed (next_batch), reused
  for (bool end = false; !end;) {
    // Events that hold no credit are bounded per connection: at the bound
    // its consumer is asked for nothing more, so it reads nothing more and
    // its sender waits in the transport's flow control, until the
    // application takes one (server_state::uncredited_left wakes us). A
    // batch takes at most the room left, so it cannot pass the bound.
    std::size_t queued = cn->uncredited_queued.load(std::memory_order_acquire);
    while (queued >= room && !s->closed) {
      (void)co_await io.room->wait();
      queued = cn->uncredited_queued.load(std::memory_order_acquire);
    }
    batch.clear();
    co_await io.c->next_batch(batch, queued < room ? room - queued : 1);
    cn->credit_requests.store(io.c->stats().credit_requests, std::memory_order_relaxed);
    for (event& ev : batch) {
      end = ev.kind == event_kind::end_of_stream;
      if (end && !io.closed_why.empty()) ev.reason = io.closed_why;
      if (ev.kind != event_kind::entry_ready)
        cn->uncredited_queued.fetch_add(1, std::memory_order_acq_rel);
      hand_home(*s, cn, std::move(ev));
    }
    if (!end) s->drain_one(io);
  }
}

/// Frees the slot of the oldest connection still in its handshake: closes
/// it and counts it out at once (its serve() ends on its own). An honest
/// hello takes one round trip, so the oldest unfinished handshake is the
/// likeliest to be a silent or trickling peer. Connection `spared` (0:
/// none) is left alone. False when every other open connection has
/// finished its handshake.
bool reclaim_a_handshake(server_state& s, std::uint64_t spared = 0) {
  for (auto it = s.conns.begin(); it != s.conns.end(); ++it) {  // ids: oldest first
    std::shared_ptr<server_conn> cn = it->second;
    if (cn->home.state != conn_state::handshaking || it->first == spared) continue;
    // Ended now: serve()'s exit then leaves it alone, and its events,
    // should its handshake finish now, are dropped.
    s.move(*cn, conn_state::ended);
    ++s.counts.handshake_failures;
    s.conns.erase(it);
    // consumer::start fails with closed, or, had it finished, the consumer
    // is closed: serve() ends either way.
    server_state::on_conn(*cn, [cn] {
      cn->io.reclaimed = true;
      if (auto* raw = std::exchange(cn->io.raw, nullptr)) raw->close();
      if (cn->io.c) cn->io.c->close();
    });
    return true;
  }
  return false;
}

/// What a reclaim frees: a slot (or a descriptor), or credit others wait for.
enum class reclaim_kind { slot, credit };

/// On connection `cn`'s executor: whether it may be reclaimed now: no blob
/// open and nothing buffered or held (no entry the application holds, no
/// tail being checked), and for credit, unused credit to give back.
bool reclaimable(const server_state& s, const conn_io& cn, reclaim_kind kind) {
  if (!cn.c || cn.reclaimed || cn.c->open_blobs() != 0) return false;
  // Closed by the other reclaim (slots and the credit watch interleave at
  // home): it frees nothing twice.
  if (!cn.closed_why.empty()) return false;
  // Entries the application holds: in the window, or in the held allowance.
  const consumer_stats st = cn.c->stats();
  if (st.buffered_bytes != 0 || st.held_bytes != 0) return false;
  return kind == reclaim_kind::slot || s.pool->unused_bytes(st.pool_member) != 0;
}

/// On one executor: the first of `idle` (its connections, idlest first)
/// that may be reclaimed, or null.
asio::awaitable<std::shared_ptr<server_conn>> first_reclaimable(
    std::shared_ptr<server_state> s, std::vector<std::shared_ptr<server_conn>> idle,
    reclaim_kind kind) {
  for (auto& cn : idle)
    if (reclaimable(*s, cn->io, kind)) co_return cn;
  co_return nullptr;
}

/// On connection `cn`'s executor: closes its consumer if it may still be
/// reclaimed, its connection_closed saying it was idle `idle_ms` and
/// `cause`; whether it did. Its unused credit goes back to the pool now,
/// for the requests waiting, not once its stream has ended.
asio::awaitable<bool> close_if_idle(std::shared_ptr<server_state> s,
                                    std::shared_ptr<server_conn> cn, reclaim_kind kind,
                                    long long idle_ms, std::string cause) {
  conn_io& io = cn->io;
  if (!reclaimable(*s, io, kind)) co_return false;
  const std::uint64_t member = io.c->stats().pool_member;
  std::string why = "reclaimed: idle " + std::to_string(idle_ms) + " ms with no blob open";
  if (kind == reclaim_kind::credit)
    why += ", holding " + std::to_string(s->pool->unused_bytes(member)) + " bytes of unused credit,";
  else
    why += " and nothing held";
  io.closed_why = why + " " + cause;
  // Its next() ends: connection_closed, with the reason, which its sender
  // reads in a close frame too.
  io.c->close(io.closed_why);
  if (member != 0) s->pool->close(member);
  co_return true;
}

/// Reclaims the connection that has sent nothing useful (no event: entry,
/// blob end) for longest, at least idle_reclaim_after, and may be reclaimed
/// (checked on its own executor, close_if_idle): closes it, saying
/// `cause`, and counts it out (serve() pushes its connection_closed).
/// False when none qualifies.
asio::awaitable<bool> reclaim_an_idle_connection(std::shared_ptr<server_state> s,
                                                 reclaim_kind kind, std::string cause) {
  if (s->opt.idle_reclaim_after.count() <= 0) co_return false;
  const auto now = clock::now();
  const auto idlest_first = [](const auto& a, const auto& b) {
    return a->home.useful < b->home.useful;
  };
  std::vector<std::shared_ptr<server_conn>> idle;
  for (auto& [id, cn] : s->conns)
    if (cn->home.state == conn_state::open && now - cn->home.useful >= s->opt.idle_reclaim_after)
      idle.push_back(cn);
  std::sort(idle.begin(), idle.end(), idlest_first);
  // Every candidate is looked at, so that no crowd holding something (a
  // blob open) shields the idle ones behind it; the work is one round trip
  // per executor (each looks at its own connections, idlest first), not
  // one per candidate.
  std::vector<std::pair<asio::any_io_executor, std::vector<std::shared_ptr<server_conn>>>> by_cx;
  for (auto& cn : idle) {
    auto it = std::find_if(by_cx.begin(), by_cx.end(), [&](const auto& g) { return g.first == cn->cx; });
    if (it == by_cx.end()) it = by_cx.insert(by_cx.end(), {cn->cx, {}});
    it->second.push_back(cn);
  }
  std::vector<std::shared_ptr<server_conn>> found;
  for (auto& [cx, group] : by_cx)
    if (auto cn = co_await asio::co_spawn(cx, first_reclaimable(s, std::move(group), kind),
                                          asio::use_awaitable))
      found.push_back(std::move(cn));
  std::sort(found.begin(), found.end(), idlest_first);
  for (auto& cn : found) {
    if (cn->home.state != conn_state::open) continue;  // it ended while we looked
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - cn->home.useful)
            .count();
    if (!co_await asio::co_spawn(cn->cx, close_if_idle(s, cn, kind, ms, cause), asio::use_awaitable))
      continue;
    // Its pump has not ended yet: its slot is free now, and next() ends
    // only after its connection_closed (leave() ends it then).
    if (cn->home.state == conn_state::open) s->move(*cn, conn_state::closing);
    co_return true;
  }
  co_return false;
}

/// Whether an accept failed for want of a descriptor (the process's or the
/// system's table full; tcp::listener passes these on as is).
bool out_of_descriptors(std::error_code ec) noexcept {
  return ec == std::errc::too_many_files_open || ec == std::errc::too_many_files_open_in_system;
}

asio::awaitable<void> accept_loop(std::shared_ptr<server_state> s) {
  while (s->accepting) {
    // With receive threads, each connection is made on the next one's
    // executor (a listener that cannot keeps it on its own: home).
    transport_options topt;
    const std::size_t turn = s->rx ? s->rx->next() : 0;
    if (s->rx) topt.executor = s->rx->ctx[turn]->get_executor();
    auto [ec, t] = co_await s->lis->accept(topt);
    if (!s->accepting) break;
    if (ec) {
      if (ec == errc::closed || ec == asio::error::operation_aborted) break;
      // Out of descriptors before max_connections: the oldest connection
      // still in its handshake, failing that the idlest connection, gives
      // its descriptor to the one waiting in the backlog (each reclaim lets
      // one accept through, so this is no spin: yield, then accept again).
      bool reclaimed = false;
      if (out_of_descriptors(ec)) {
        // Accept fails as soon as the table is full, whether or not a
        // connection waits: the one accepted last, which took the last
        // descriptor, is spared, so that its handshake can finish.
        reclaimed = reclaim_a_handshake(*s, s->next_id);
        if (!reclaimed)
          reclaimed = co_await reclaim_an_idle_connection(
              s, reclaim_kind::slot,
              "while accept was out of descriptors (server_options::idle_reclaim_after)");
      }
      if (reclaimed) {
        co_await asio::post(s->ex, asio::use_awaitable);
        continue;
      }
      // Transient (out of descriptors with nothing to reclaim, a
      // connection reset in the backlog): try again shortly rather than spin
      // (a pause, which fails nothing: not a deadline).
      (void)co_await pause(accept_retry_pause);
      continue;
    }
    // Full: a connection still in its handshake gives way first; only
    // when every slot holds a finished handshake is the new one refused.
    if (s->lifecycle.live() >= s->opt.max_connections && !reclaim_a_handshake(*s)) {
      // Then one that has sent nothing useful for long.
      if (!co_await reclaim_an_idle_connection(
              s, reclaim_kind::slot,
              "while every slot was taken (server_options::max_connections, "
              "idle_reclaim_after)")) {
        ++s->counts.refused;
        continue;  // dropping the transport closes it
      }
    }
    ++s->counts.accepted;
    auto cn = std::make_shared<server_conn>();
    cn->info = std::make_shared<connection_info>();
    cn->info->id = ++s->next_id;
    cn->home.accepted = clock::now();
    cn->info->peer = t->peer_address();  // here: home reads it (stats) as it starts
    cn->cx = s->ex;
    if (s->rx && t->get_executor() != s->ex) {
      cn->cx = t->get_executor();
      cn->at_home = false;
      cn->thread = turn + 1;
    }
    cn->io.room.emplace(cn->cx);
    if (!s->any_connection) {
      s->any_connection = true;
      s->started = cn->home.accepted;
    }
    s->conns[cn->info->id] = cn;
    cn->home.state = s->lifecycle.admit();
    auto cx = cn->cx;
    s->tasks.spawn(cx, serve(s, cn, std::move(t)));
  }
  s->accept_done = true;
  s->ready.notify_all();
}

/// While a credit request waits for free budget (credit_pool::starved):
/// reclaims the idlest connection holding unused credit, one at a time
/// (each gives its credit back at once), and with none to reclaim looks
/// again every quarter of idle_reclaim_after (at least every 10 ms).
/// Cancelled (server_state::timers) at close: it then ends at its next
/// wait, never by an exception.
asio::awaitable<void> run_credit_watch(std::shared_ptr<server_state> s) {
  co_await asio::this_coro::throw_if_cancelled(false);
  const auto period =
      std::max<std::chrono::milliseconds>(s->opt.idle_reclaim_after / 4, std::chrono::milliseconds(10));
  for (;;) {
    s->credit_watch_due->store(false);
    if (s->closed || !s->pool->starved()) break;
    if (co_await reclaim_an_idle_connection(
            s, reclaim_kind::credit,
            "while another connection's credit request waited for free budget "
            "(server_options::idle_reclaim_after)"))
      continue;
    if (co_await pause(period)) break;  // cancelled
  }
  s->credit_watch_running = false;
}

/// Expires the open groups at their deadlines (group_timeout) while any is
/// open. Cancelled (server_state::timers) at close.
asio::awaitable<void> run_group_timer(std::shared_ptr<server_state> s) {
  co_await asio::this_coro::throw_if_cancelled(false);
  while (!s->closed && s->groups.open() > 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(s->groups.next_deadline() -
                                                                   clock::now());
    const bool cancelled =
        co_await s->groups_changed.wait_for(std::max(left, std::chrono::milliseconds(0)));
    if (cancelled || s->closed) break;
    s->push_groups(s->groups.expire(clock::now()));
  }
  s->group_timer_running = false;
}

}  // namespace

receive_threads::receive_threads(std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    ctx.push_back(std::make_unique<asio::io_context>(1));
    work.push_back(asio::make_work_guard(*ctx.back()));
  }
  for (std::size_t i = 0; i < n; ++i)
    threads.emplace_back([this, c = ctx[i].get()] {
      for (;;) {
        try {
          c->run();
          break;
        } catch (...) {  // a handler threw: its connection is lost, the others go on
        }
      }
      {
        std::lock_guard lock(m);
        ++done;
      }
      done_cv.notify_all();
    });
}

receive_threads::~receive_threads() { finish(); }

std::size_t receive_threads::next() noexcept { return turn++ % ctx.size(); }

void receive_threads::finish() noexcept {
  work.clear();
  {
    std::unique_lock lock(m);
    // Closed connections end within a few handler runs; one that does not
    // (a bug) must not hang the application's exit.
    if (!done_cv.wait_for(lock, finish_limit, [&] { return done == threads.size(); }))
      for (auto& c : ctx) c->stop();
  }
  for (auto& t : threads)
    if (t.joinable()) t.join();
}

server_state::server_state(asio::any_io_executor e, std::unique_ptr<listener> l, server_options o)
    : rx(o.threads > 1 ? std::make_shared<receive_threads>(o.threads) : nullptr),
      ex(std::move(e)),
      opt(std::move(o)),
      lis(std::move(l)),
      pool(std::make_shared<credit_pool>(opt.budget_bytes, opt.initial_grant_bytes,
                                         opt.stream_bytes, max_item_credit(opt.connection))),
      ready(ex),
      groups({.timeout = opt.group_timeout,
              .max_open = opt.max_open_groups,
              .max_open_per_opener = opt.max_open_groups_per_connection,
              .remembered = opt.max_open_groups}),
      groups_changed(ex),
      tasks(ex),
      timers(ex) {
  // Resend sessions reconnect to this server: its connections share a log
  // (not the process's, which other servers in the process share).
  if (!opt.connection.delivered) opt.connection.delivered = std::make_shared<delivery_log>();
}

void server_state::push(server_event ev) {
  queue.push_back(std::move(ev));
  ready.notify_all();
}

void server_state::push_groups(const std::vector<group_outcome>& outcomes) {
  for (const auto& o : outcomes) {
    server_event ev;
    ev.kind = o.complete ? server_event_kind::group_complete : server_event_kind::group_aborted;
    ev.ev.group = o.group;
    ev.ev.error = o.error;
    ev.ev.reason = o.reason;
    ++(o.complete ? counts.groups_complete : counts.groups_aborted);
    push(std::move(ev));
  }
  // No group left to time out: the timer must not hold the executor's
  // run() for up to group_timeout (run_group_timer then ends).
  if (!outcomes.empty() && groups.open() == 0) groups_changed.notify_all();
}

void server_state::watch_groups() {
  if (group_timer_running || groups.open() == 0 || opt.group_timeout.count() <= 0 || closed)
    return;
  group_timer_running = true;
  timers.spawn(run_group_timer(shared_from_this()));
}

void server_state::uncredited_left(const std::shared_ptr<server_conn>& cn) {
  // Its pump waits only at the bound, and it takes an event only below
  // it: the count is never above it.
  if (cn->uncredited_queued.fetch_sub(1, std::memory_order_acq_rel) !=
      opt.max_queued_events_per_connection)
    return;
  on_conn(*cn, [cn] { cn->io.room->notify_all(); });
}

void server_state::watch_credit() {
  if (credit_watch_running || closed || opt.idle_reclaim_after.count() <= 0) return;
  credit_watch_running = true;
  timers.spawn(run_credit_watch(shared_from_this()));
}

void server_state::account(const server_event& ev) {
  if (!ev.connection) return;
  auto it = conns.find(ev.connection->id);
  if (it == conns.end()) return;
  conn_home& cn = it->second->home;
  if (cn.queued > 0) --cn.queued;
  cn.yielded_since_wait = true;
  if (ev.kind != server_event_kind::entry_ready && ev.kind != server_event_kind::connection_opened)
    uncredited_left(it->second);
  endpoint_metrics& m = cn.metrics;
  switch (ev.kind) {
    case server_event_kind::entry_ready: {
      ++m.entries;
      m.bytes += ev.ev.entry->entry.len;
      if (const auto& sent = ev.ev.entry->sent_ns) {
        // Another host's clock may be ahead of ours: no negative latency.
        const std::uint64_t now = static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
                .count());
        if (*sent <= now) m.latency.record(now - *sent);
      }
      if (!m.first_entry_s) m.first_entry_s = seconds_since(cn.accepted);
      if (!first_entry_s) first_entry_s = seconds_since(started);
      break;
    }
    case server_event_kind::blob_complete: ++m.blobs; break;
    case server_event_kind::blob_aborted:
      if (!ev.ev.resend) ++m.aborts;
      break;
    default: break;
  }
}

void server_state::sweep() {
  for (auto it = conns.begin(); it != conns.end();) {
    // Its events all yielded (counted), and its buffered bytes all
    // released: the pool let go of its member. (With receive threads an
    // entry's credit may leave the pool, into the held allowance, before
    // the events queued behind it are yielded.) Run after every event:
    // the shared_ptr is copied only for a connection that goes.
    const conn_home& h = it->second->home;
    if (h.state == conn_state::ended && h.queued == 0 &&
        (h.pool_member == 0 || !pool->holds(h.pool_member))) {
      std::shared_ptr<server_conn> cn = it->second;
      cn->home.metrics.credit_waits = cn->credit_requests.load(std::memory_order_relaxed);
      retired.merge(cn->home.metrics);
      it = conns.erase(it);
      // Its consumer goes on its own executor, as it lived.
      on_conn(*cn, [cn] {
        cn->io.c.reset();
        cn->io.room.reset();
      });
    } else {
      ++it;
    }
  }
}

void server_state::drain_one(conn_io& cn) noexcept {
  // On its connection's executor.
  if (draining && cn.c && cn.c->open_blobs() == 0) cn.c->close();
}

void server_state::close_listener() noexcept {
  accepting = false;
  if (lis) lis->close();
  ready.notify_all();
}

}  // namespace detail

// ---- server ----------------------------------------------------------------

namespace {

/// close(), then lets the receive threads wind the connections down and
/// joins them (their io_contexts live on with the state, idle).
void close_and_join(server& srv, const std::shared_ptr<detail::server_state>& s) noexcept {
  srv.close();
  if (s && s->rx) s->rx->finish();
}

}  // namespace

server& server::operator=(server&& o) noexcept {
  if (this != &o) {
    close_and_join(*this, state_);
    state_ = std::move(o.state_);
  }
  return *this;
}

server::~server() { close_and_join(*this, state_); }

result<server> server::start(asio::any_io_executor ex, std::unique_ptr<listener> l,
                             server_options opt) {
  if (!l || opt.budget_bytes == 0 || opt.max_connections == 0 || opt.threads == 0)
    return {errc::invalid_argument,
            "server: no listener, budget_bytes 0, max_connections 0 or threads 0"};
  if (opt.max_queued_events_per_connection == 0)
    return {errc::invalid_argument, "server: max_queued_events_per_connection 0"};
  auto s = std::make_shared<detail::server_state>(ex, std::move(l), std::move(opt));
  // A request left waiting for free budget starts the credit watch at
  // home. Called on any connection's thread: it holds neither the state
  // nor a lock, only posts.
  s->pool->on_starved([w = std::weak_ptr<detail::server_state>(s), due = s->credit_watch_due,
                       home = s->ex] {
    if (due->exchange(true)) return;
    asio::post(home, [w] {
      if (auto st = w.lock()) st->watch_credit();
    });
  });
  if (auto* u = dynamic_cast<url_listener*>(s->lis.get())) s->url = u->url();
  s->tasks.spawn(detail::accept_loop(s));
  return server(std::move(s));
}

result<server> server::listen(asio::any_io_executor ex, std::string_view url,
                              server_options opt) {
  auto l = blobpipe::listen(ex, url);
  if (!l) return l.err();
  return start(std::move(ex), std::move(*l), std::move(opt));
}

std::uint16_t server::port() const noexcept {
  return state_ && state_->lis ? state_->lis->port() : 0;
}

const std::string& server::url() const noexcept {
  static const std::string none;
  return state_ ? state_->url : none;
}

asio::awaitable<server_event> server::next() {
  auto s = state_;
  server_event out;
  out.ev.kind = event_kind::end_of_stream;
  if (!s) {
    out.ev.error = make_error_code(errc::closed);
    co_return out;
  }
  // As consumer::next: a cancelled wait is a value, not an exception.
  const bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  for (;;) {
    if (!s->queue.empty()) {
      out = std::move(s->queue.front());
      s->queue.pop_front();
      // The application's now: it may move into its connection's held
      // allowance (consumer_options::waits_reported).
      if (out.ev.entry) mark_delivered(*out.ev.entry);
      s->account(out);
      s->sweep();
      break;
    }
    if (s->finished()) {
      // Groups still open can no longer complete.
      const auto why =
          s->closed ? make_error_code(errc::closed) : make_error_code(errc::peer_closed);
      s->push_groups(s->groups.abort_all(why, "the server's last connection ended"));
      if (!s->queue.empty()) continue;
      // Nothing more can come: the timers wait on nothing any more, and the
      // accept loop and the connections' pumps end (or have ended).
      s->timers.cancel();
      co_await s->timers.join();
      co_await s->tasks.join();
      if (s->timers.running() != 0 || s->tasks.running() != 0) {  // next() was cancelled
        out.ev.error = std::error_code(asio::error::operation_aborted);
        break;
      }
      s->sweep();
      if (s->closed) out.ev.error = make_error_code(errc::closed);
      break;
    }
    // The application waits: each connection's held_timeout may count
    // (consumer_options::waits_reported).
    for (auto& [id, cn] : s->conns)
      if (cn->home.state == detail::conn_state::open &&
          std::exchange(cn->home.yielded_since_wait, false))
        detail::server_state::on_conn(*cn, [cn = cn] {
          if (cn->io.c) cn->io.c->application_waits();
        });
    const bool cancelled = co_await s->ready.wait();
    if (cancelled) {
      out.ev.error = std::error_code(asio::error::operation_aborted);
      break;
    }
  }
  co_await asio::this_coro::throw_if_cancelled(throws);
  co_return out;
}

void server::stop_accepting() noexcept {
  if (state_) state_->close_listener();
}

namespace {

/// On `cn`'s executor: closes its consumer, or its transport during the
/// handshake.
void close_conn(const std::shared_ptr<detail::server_conn>& cn) noexcept {
  try {
    detail::server_state::on_conn(*cn, [cn] {
      if (cn->io.c) cn->io.c->close();
      else if (cn->io.raw) cn->io.raw->close();
      if (cn->io.room) cn->io.room->notify_all();  // a pump waiting for room sees `closed`
    });
  } catch (...) {  // no memory to post it: it ends with its sender
  }
}

}  // namespace

void server::drain() noexcept {
  if (!state_) return;
  auto s = state_;
  s->close_listener();
  s->draining = true;
  for (auto& [id, cn] : s->conns) {
    if (!detail::holds_slot(cn->home.state)) continue;
    try {
      detail::server_state::on_conn(*cn, [s, cn = cn] { s->drain_one(cn->io); });
    } catch (...) {  // no memory to post it: it is drained after its next event
    }
  }
}

void server::disconnect(std::uint64_t id) noexcept {
  if (!state_) return;
  auto it = state_->conns.find(id);
  if (it == state_->conns.end() || !detail::holds_slot(it->second->home.state)) return;
  close_conn(it->second);
}

void server::close() noexcept {
  if (!state_ || state_->closed) return;
  auto& s = *state_;
  s.closed = true;
  s.close_listener();
  for (auto& [id, cn] : s.conns) close_conn(cn);
  s.timers.cancel();
}

server_stats server::stats() const {
  server_stats st;
  if (!state_) return st;
  const auto& s = *state_;
  st = s.counts;
  st.connections.clear();
  st.total = s.retired;
  for (const auto& [id, cn] : s.conns) {
    connection_stats c;
    c.info = cn->info;
    c.open = detail::holds_slot(cn->home.state);
    c.thread = cn->thread;
    c.queued_events = cn->home.queued;
    c.metrics = cn->home.metrics;
    if (cn->home.state != detail::conn_state::handshaking)
      c.metrics.credit_waits = cn->credit_requests.load(std::memory_order_relaxed);
    st.total.merge(c.metrics);
    st.connections.push_back(std::move(c));
  }
  if (s.first_entry_s) st.total.first_entry_s = s.first_entry_s;
  st.pool = s.pool->stats();
  st.open = s.lifecycle.live();
  st.queued_events = s.queue.size();
  st.groups_open = s.groups.open();
  st.late_members = s.groups.late_members();
  st.tasks_running = s.tasks.running() + s.timers.running();
  return st;
}

std::string server::stats_json() const { return to_json(stats()); }

std::string to_json(const server_stats& st) {
  const auto n = [](std::uint64_t v) { return std::to_string(v); };
  std::string out = "{\"role\":\"server\",\"accepted\":" + n(st.accepted) + ",\"refused\":" +
                    n(st.refused) + ",\"handshake_failures\":" + n(st.handshake_failures) +
                    ",\"open\":" + n(st.open) + ",\"queued_events\":" + n(st.queued_events) +
                    ",\"pool\":{\"budget_bytes\":" +
                    n(st.pool.budget_bytes) + ",\"committed_bytes\":" +
                    n(st.pool.committed_bytes) + ",\"committed_high_water\":" +
                    n(st.pool.committed_high_water) + ",\"requests_waiting\":" +
                    n(st.pool.requests_waiting) + ",\"credit_requests\":" +
                    n(st.pool.credit_requests) + ",\"overcommits\":" + n(st.pool.overcommits) +
                    "},\"groups\":{\"complete\":" + n(st.groups_complete) + ",\"aborted\":" +
                    n(st.groups_aborted) + ",\"open\":" + n(st.groups_open) +
                    ",\"late_members\":" + n(st.late_members) + "},\"total\":" +
                    to_json(st.total) + ",\"connections\":[";
  bool first = true;
  for (const auto& c : st.connections) {
    if (!first) out += ",";
    first = false;
    out += "{\"id\":" + n(c.info->id) + ",\"peer\":" + json_string(c.info->peer) +
           ",\"open\":" + (c.open ? "true" : "false") + ",\"metrics\":" + to_json(c.metrics) + "}";
  }
  return out + "]}";
}

}  // namespace blobpipe
