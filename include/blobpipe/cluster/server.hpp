// blobpipe/cluster/server.hpp — many senders into one receiver (fan-in).
//
// A server accepts any number of senders on one listener and yields one
// merged stream of events; every event names its connection (a stable id
// and the peer's address). Each connection has its own consumer
// (blobpipe/pipeline/consumer.hpp) and all of them share one receive
// budget (credit_pool.hpp): the sum of bytes buffered across connections
// stays within server_options::budget_bytes, and a slow application slows
// every sender alike. A sender that misbehaves (a protocol violation), dies
// or stalls ends only its own connection: its open blobs are reported
// aborted and the others go on. Blob groups (a GRPO group of samples from
// several workers) are gathered across connections: group_complete comes
// after the last member's blob_complete.
//
//   auto srv = blobpipe::server::listen(ex, "tcp://0.0.0.0:5555").value();
//   for (;;) {
//     auto ev = co_await srv.next();
//     if (ev.kind == blobpipe::server_event_kind::end_of_stream) break;
//     if (ev.kind == blobpipe::server_event_kind::entry_ready)
//       use(ev.connection->id, ev.ev.entry->view);   // bytes valid while held
//   }
//
// Lifetime: stop_accepting() closes the listener and lets open connections
// finish; drain() also closes each connection once it has no blob open;
// close() closes everything now. next() yields end_of_stream once the
// listener is closed and no connection is left (after close(): with
// `closed`), and repeats it.
//
// Threading: the server's state (its event queue, groups, counters) lives
// on one executor, the `ex` given to start or listen: call next(),
// stats(), stop_accepting(), drain(), disconnect() and close() from there
// (next() from a coroutine, one at a time), and next() resumes there, so
// the application's awaits and everything it does with an event run on
// `ex`. Connections run on `ex` too (server_options::threads 1, the
// default), or on the server's own receive threads (threads >= 2: the
// decoding and the sockets' I/O of each connection on one of them), and
// hand their events to `ex` in order. The credit pool is shared by all
// (thread-safe). Entries may be held and dropped on any thread (as a
// consumer's: the release goes back to the entry's connection).
// Source: docs/cluster.md "Fan-in".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/cluster/metrics.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/pipeline/credit_pool.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe {

namespace detail {
struct server_state;
}

struct server_options {
  /// The receive budget every connection shares, bytes (credit_pool): what
  /// all connections buffer at once stays within it (docs/cluster.md says
  /// when one item may exceed it).
  std::uint64_t budget_bytes = 256ull << 20;
  /// Credit a new connection starts with, at most, bytes.
  std::uint64_t initial_grant_bytes = credit_pool::default_initial_grant_bytes;
  /// Credit the streaming connections hold together while the application
  /// keeps up, bytes (credit_pool: each one's target is this over the
  /// active ones, at least 64 KiB); 0: up to budget_bytes over them.
  std::uint64_t stream_bytes = credit_pool::default_stream_bytes;
  /// Connections open at once, handshakes included. When all are taken,
  /// the oldest connection still in its handshake (a silent or trickling
  /// peer: an honest hello takes one round trip) is closed to make room
  /// (counted in handshake_failures); failing that, the connection idle
  /// longest as idle_reclaim_after says. Only when none qualifies is a new
  /// one accepted and closed at once: its sender's
  /// handshake fails with peer_closed (a resend session retries). The same
  /// when the process runs out of descriptors first (accept fails with
  /// EMFILE or ENFILE, say under `ulimit -n 1024`): the oldest connection
  /// still in its handshake is closed, failing that the connection idle
  /// longest as idle_reclaim_after says, and the one waiting is accepted.
  /// Accept fails as soon as the table is full, whether or not a peer
  /// waits, so the connection accepted last (it took the last descriptor)
  /// is spared there: its handshake can finish.
  std::size_t max_connections = 1024;
  /// Idle connections give way. A connection is idle when it has no blob
  /// open and nothing buffered (no entry held by the application, no tail
  /// being checked) and has had no event (connection_opened, an entry, a
  /// blob's end) for at least this long. The one idle longest is closed
  /// (every candidate is looked at, one round trip per receive thread):
  ///  - when every slot holds a finished handshake and a new connection
  ///    comes (max_connections), or accept fails for want of descriptors
  ///    and no handshake is left to close;
  ///  - while a credit request waits for free budget
  ///    (credit_pool::starved), if it holds unused credit: that credit
  ///    goes back to the pool at once (looked at every quarter of this,
  ///    at least every 10 ms, while requests wait).
  /// Its connection_closed comes with error closed and a reason starting
  /// "reclaimed: idle" and naming this option (and max_connections, or
  /// the credit it held); its sender sees peer_closed (a resend session
  /// reconnects). 0: never (a new connection is refused instead, and
  /// idle credit stays where it is).
  std::chrono::milliseconds idle_reclaim_after{10'000};
  /// Events of one connection that hold no credit (all but entry_ready:
  /// blob_complete, blob_aborted with its reason of up to 4 KiB,
  /// connection_closed), counted in events, queued for next() and not
  /// yet yielded, at most.
  /// At the bound the server takes no more events from that connection
  /// until the application takes one of them (its consumer reads nothing
  /// more, so its sender waits in the transport's flow control). Entries
  /// are bounded by the budget instead, and group events come at most
  /// one per member event. After close(), each connection's last events
  /// (what its closed consumer had decoded, at most a turn's worth) come
  /// without it. REQUIRES: >= 1.
  std::size_t max_queued_events_per_connection = 64;
  /// A sender's hello must arrive within this, or the connection is
  /// closed (0: no limit).
  std::chrono::milliseconds handshake_timeout{10'000};
  /// Each connection's consumer: limits, assembly, delivery log (null: one
  /// of the server's own, shared by its connections), and its
  /// stall timeout (default here 60 s: a sender that owes bytes, holds
  /// credit to send them and sends nothing for that long loses its
  /// connection, with its blobs aborted; a sender waiting for credit the
  /// application holds is not stalled). `held_bytes` is each connection's
  /// held allowance (default: connection.window_bytes, 64 MiB): entries the application holds
  /// leave the budget for it, so the entries of all connections take at
  /// most budget_bytes + connections * held_bytes of credit
  /// (docs/reliability.md "Held entries"); held_timeout counts while next()
  /// waits. `pool` and `waits_reported` are the server's; `window_bytes`
  /// is not used: a sender that does not offer credit grants (an older
  /// release) is refused at its hello, as its window would be outside the
  /// budget.
  consumer_options connection{.stall_timeout = std::chrono::seconds(60)};
  /// A group not complete this long after its first member's first event
  /// is aborted with timed_out (0: never).
  std::chrono::milliseconds group_timeout{60'000};
  /// Groups open at once (a group beyond it is aborted at once with
  /// too_large).
  std::size_t max_open_groups = 65536;
  /// Groups open at once that one connection opened (its member's event
  /// came first), so that one connection cannot take every slot: a group
  /// it would open beyond this is aborted at once with too_large. The slot
  /// is charged until the group ends, whoever completes it.
  std::size_t max_open_groups_per_connection = 4096;
  /// Accept entry timestamps (feature_entry_timestamps) for the latency
  /// histogram; received_entry::sent_ns is then set.
  bool latency = true;
  /// Receive threads the server starts and owns: 1 (the default): none,
  /// every connection runs on `ex` with the application. N >= 2: N
  /// threads, each running its own io_context; accepted TCP connections
  /// are spread over them in turn (transport_options::executor), so N
  /// cores decode. UCX and inproc connections stay on `ex` (their
  /// listeners make the transport on their own executor). Events still
  /// reach the application on `ex`, and every credit rule holds across
  /// threads (one thread-safe credit_pool; docs/cluster.md "Threads").
  /// Destroying the server joins the threads (REQUIRES: not on one of
  /// them), after letting its closed connections end (at most 10 s).
  std::size_t threads = 1;
};

enum class server_event_kind {
  connection_opened,  ///< a sender's handshake finished
  entry_ready,        ///< ev: as the connection's consumer yielded it
  blob_complete,      ///< ev: idem
  blob_aborted,       ///< ev: idem (ev.resend: only that attempt is void)
  group_complete,     ///< ev.group: every member completed (connection: null)
  group_aborted,      ///< ev.group, ev.error, ev.reason (connection: null)
  connection_closed,  ///< ev.error, ev.reason: how its stream ended (empty: in order)
  end_of_stream,      ///< no listener and no connection left (connection: null)
};

/// Who sent an event.
struct connection_info {
  std::uint64_t id = 0;  ///< 1, 2, ... in accept order; never reused by one server
  std::string peer;      ///< the sender's address (transport::peer_address)
  session_id session = NO_SESSION;  ///< its resend session (NO_SESSION: none)
};

struct server_event {
  server_event_kind kind = server_event_kind::end_of_stream;
  std::shared_ptr<const connection_info> connection;
  /// The connection's event (entry_ready, blob_complete, blob_aborted;
  /// connection_closed: its end_of_stream), or the group's (group_*:
  /// group, error, reason), or end_of_stream's error (closed after close()).
  event ev;
};

/// One connection's counters.
struct connection_stats {
  std::shared_ptr<const connection_info> info;
  bool open = false;        ///< its stream has not ended
  /// The receive thread it runs on, 1..server_options::threads; 0: on the
  /// server's executor (threads 1, or a UCX or inproc connection).
  std::size_t thread = 0;
  /// Its events queued for next() now, not yet yielded (every kind; those
  /// that hold no credit at most max_queued_events_per_connection).
  std::uint64_t queued_events = 0;
  endpoint_metrics metrics; ///< as yielded by next(); credit_waits: its requests
};

struct server_stats {
  /// Every connection ever served, as yielded by next().
  endpoint_metrics total;
  /// Connections open, or ended and still holding buffered bytes.
  std::vector<connection_stats> connections;
  credit_pool_stats pool;
  std::uint64_t accepted = 0;            ///< connections accepted
  std::uint64_t refused = 0;             ///< closed at once: max_connections reached
  std::uint64_t handshake_failures = 0;  ///< closed before their handshake finished
  std::uint64_t open = 0;                ///< connections open now (handshakes included)
  /// Events queued for next() now, not yet yielded (every kind).
  std::uint64_t queued_events = 0;
  std::uint64_t groups_complete = 0;
  std::uint64_t groups_aborted = 0;
  std::uint64_t groups_open = 0;
  std::uint64_t late_members = 0;  ///< members of groups that had ended already
  /// The server's own coroutines still running: its accept loop, one per
  /// connection, its group timer and credit watch. 0 once next() has
  /// yielded end_of_stream, which waits for them: after it, nothing of the
  /// server runs on its executor or its receive threads.
  std::uint64_t tasks_running = 0;
};

class server {
 public:
  server() = default;
  server(server&&) noexcept = default;
  server& operator=(server&&) noexcept;
  /// close(), then joins the receive threads (server_options::threads).
  ~server();

  /// Serves connections from `l` on `ex` (and its receive threads).
  /// Errors: invalid_argument (no listener, budget_bytes 0, max_connections
  /// 0, threads 0, max_queued_events_per_connection 0, or connection
  /// options a consumer refuses: see consumer::start).
  [[nodiscard]] static result<server> start(asio::any_io_executor ex,
                                            std::unique_ptr<listener> l,
                                            server_options opt = {});
  /// blobpipe::listen(ex, url), then start(). Errors: those of both.
  [[nodiscard]] static result<server> listen(asio::any_io_executor ex, std::string_view url,
                                             server_options opt = {});

  /// The listener's port (0 for inproc) and URL ("" when started with a
  /// listener that is not a url_listener).
  std::uint16_t port() const noexcept;
  const std::string& url() const noexcept;

  /// The next event (see server_event_kind). Never throws for a
  /// connection's problems: they end that connection (connection_closed).
  /// The end_of_stream that ends the stream comes once the server's own
  /// coroutines have ended (server_stats::tasks_running).
  /// Cancelling the awaiting coroutine yields end_of_stream with
  /// operation_aborted (the server goes on; next() may be called again).
  /// A server that holds none (default-constructed, or moved from) yields
  /// end_of_stream with `closed` at once.
  /// REQUIRES: no other next() pending.
  asio::awaitable<server_event> next();

  /// Stops listening; open connections go on.
  void stop_accepting() noexcept;
  /// Stops listening, and closes each connection once no blob is open on
  /// it (blobs being sent finish first; senders see peer_closed).
  void drain() noexcept;
  /// Closes connection `id` (as if its sender had gone): its open blobs
  /// are aborted (closed), then its connection_closed. A resend session
  /// reconnects. No-op for an unknown or ended connection.
  void disconnect(std::uint64_t id) noexcept;
  /// Closes the listener and every connection now: a pending next()
  /// yields their blob_aborted and connection_closed events (closed), then
  /// end_of_stream (closed). Idempotent.
  void close() noexcept;

  server_stats stats() const;
  /// stats() as one line of JSON (docs/cluster.md "Metrics").
  std::string stats_json() const;

 private:
  explicit server(std::shared_ptr<detail::server_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::server_state> state_;
};

/// stats as one line of JSON (what server::stats_json prints).
std::string to_json(const server_stats& st);

}  // namespace blobpipe
