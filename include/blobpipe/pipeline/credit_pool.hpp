// blobpipe/pipeline/credit_pool.hpp — one receive budget shared by many
// connections.
//
// A consumer alone advertises a window of its own. Consumers given the same
// credit_pool (consumer_options::pool; a fan-in server gives one to every
// connection it accepts) instead take their credit from one budget, with
// the credit-grants wire feature (docs/wire_features.md): each connection
// starts with a small grant, every credit byte it uses and the application
// releases goes back to the pool, and the pool decides which connection
// gets it. So the sum of bytes buffered across the connections (entries
// the application holds, tails being checked) stays within the budget, and
// a slow application slows every sender alike.
//
//   auto pool = std::make_shared<blobpipe::credit_pool>(256 << 20);
//   auto [ec, c] = co_await blobpipe::consumer::start(std::move(t), {.pool = pool});
//
// Policy, in order, each time credit comes back or a sender asks. Each
// active connection (something buffered, or a request waiting) has a
// share, budget_bytes over the active connections: the most credit it may
// hold outstanding (granted, not released) through requests. It also has
// a target: stream_bytes over the active connections (at least
// min_target_bytes, at most its share), so the credit in flight stays
// about stream_bytes however many senders stream at once. Credit in
// flight is memory the bytes pass through (socket buffers, send queues,
// receive buffers): sixteen connections holding 1 MiB each moved 0.23 GB/s
// where the same sixteen holding 128 KiB each moved 0.46 (docs/cluster.md).
// 1. Credit requests (a sender waiting for credit says how much its
//    waiting items need in all, capped here at max_item_bytes), oldest
//    first, each granted whole from the free budget when the connection's
//    outstanding credit stays within its share. One that cannot be met now
//    waits and does not hold up the requests behind it. A request larger
//    than the share (an item larger than a share) is granted beyond the
//    budget, at most max_item_bytes, to one connection at a time
//    server-wide (the "oversized grant"); others wait for it to be
//    released. A request within the share that its connection's buffered
//    bytes keep from fitting waits for their release: entries the
//    application holds leave the window for the held allowance
//    (consumer_options::held_bytes), which is what lets a connection whose
//    group members the application holds go on (docs/cluster.md).
// 2. Credit a connection released goes back to it (no more than it
//    released) while it holds less than its target. So a streaming sender
//    keeps its credit without asking again; as others become busy its
//    target shrinks, and what it releases beyond it (a request's grant
//    included) stays free for them. Credit grows only on request.
// 3. What is left stays free.
// A connection starts with min(initial_grant_bytes, budget / 16, its target
// among the open connections, the free budget), possibly 0 (it then asks when it has something to
// send). Grants cannot be taken back, and a sender that goes idle keeps
// its unused credit until its connection ends: starting small bounds that,
// and a connection holding more unused credit than
// max(initial_grant_bytes, stream_bytes) while another connection's
// request waits is pressed() (its consumer ends it after stall_timeout
// without a byte from it).
//
// So committed credit stays within budget_bytes + max_item_bytes: every
// grant but the oversized one comes from the free budget, and there is
// at most one oversized grant (counted in overcommits) at a time.
//
// Threading: a pool is thread-safe, so its members may run on different
// threads (a fan-in server with server_options::threads): every call takes
// one mutex, and every budget update happens under it. Grants are counted
// under the mutex and their grant_fn is called after it is unlocked, on
// the calling thread; a consumer's grant_fn dispatches to its own executor
// (consumer_options::pool). What a member buffers is read from the figure
// its session publishes (consumer_session::buffered_published, the one
// owner of its credit, blobpipe/protocol/consumer_session.hpp) after
// every read, release and request, and before each of its calls here: so
// a member's own calls see its exact buffered bytes, and other members'
// decisions use what it had at its last read. Reading it is one relaxed
// load, so a decision costs no call into any member.
// Source: docs/cluster.md "Fan-in", docs/wire_features.md "Credit grants".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

struct credit_pool_stats {
  std::uint64_t budget_bytes = 0;
  /// Granted and not yet released, all connections (>= what they buffer), bytes.
  std::uint64_t committed_bytes = 0;
  std::uint64_t committed_high_water = 0;  ///< most ever committed, bytes
  std::uint64_t connections = 0;           ///< members (open, or closed with bytes held)
  std::uint64_t requests_waiting = 0;      ///< credit requests not yet met
  std::uint64_t credit_requests = 0;       ///< requests received
  std::uint64_t grants = 0;                ///< grants made (initial ones excluded)
  std::uint64_t granted_bytes = 0;
  /// Oversized grants: beyond the budget, for a request larger than its
  /// connection's share (see the file comment).
  std::uint64_t overcommits = 0;
  /// Credit of the oversized grant not yet released (0 or 1 connection's;
  /// at most max_item_bytes), bytes.
  std::uint64_t oversized_bytes = 0;
};

class credit_pool {
 public:
  /// Default initial grant per connection, bytes.
  static constexpr std::uint64_t default_initial_grant_bytes = 1u << 20;
  /// No initial grant exceeds the budget over this.
  static constexpr std::uint64_t initial_grant_divisor = 16;
  /// Default credit all active connections hold together while the
  /// application keeps up (stream_bytes), bytes.
  static constexpr std::uint64_t default_stream_bytes = 1u << 20;
  /// No connection's target is below this, bytes (unless the budget is).
  static constexpr std::uint64_t min_target_bytes = 64u << 10;
  /// Default max_item_bytes: entry_credit(4 GiB, 64 KiB key, 4 KiB meta),
  /// a consumer's default limits, bytes.
  static constexpr std::uint64_t default_max_item_bytes =
      entry_credit(1ull << 32, default_max_key_bytes, default_max_meta_bytes);

  /// `budget_bytes`: what all members may buffer at once. `stream_bytes`:
  /// the credit the active members hold together while the application
  /// keeps up (each one's target is stream_bytes / active, at least
  /// min_target_bytes, at most budget_bytes / active); 0: no such target
  /// (each may hold budget_bytes / active). `max_item_bytes`: the most
  /// credit one item can need (entry_credit of the largest entry, key and
  /// meta the members' decoders admit, or their largest tail): no request
  /// is granted more, and the one oversized grant is at most this.
  /// REQUIRES: budget_bytes >= 1.
  explicit credit_pool(std::uint64_t budget_bytes,
                       std::uint64_t initial_grant_bytes = default_initial_grant_bytes,
                       std::uint64_t stream_bytes = default_stream_bytes,
                       std::uint64_t max_item_bytes = default_max_item_bytes);
  credit_pool(const credit_pool&) = delete;
  credit_pool& operator=(const credit_pool&) = delete;

  std::uint64_t budget_bytes() const noexcept { return budget_; }
  credit_pool_stats stats() const noexcept;

  // ---- for consumers (consumer_options::pool uses these) ----

  /// Sends `bytes` of credit to a member's sender (an ack).
  using grant_fn = std::function<void(std::uint64_t bytes)>;
  /// The credit a member's session holds buffered, bytes, as it last
  /// published it (stored by the member's thread, read under the mutex).
  using buffered_figure = std::shared_ptr<const std::atomic<std::uint64_t>>;

  /// A connection joins. Returns its member id and its initial grant
  /// (bytes; for its hello), already counted as committed.
  /// REQUIRES: `buffered` is not null.
  std::pair<std::uint64_t, std::uint64_t> join(grant_fn grant, buffered_figure buffered);
  /// Member `id` released `bytes` (entries dropped, a tail checked).
  void released(std::uint64_t id, std::uint64_t bytes);
  /// Member `id`'s sender waits for credit: its waiting items need
  /// `bytes` in all (a credit request; replaces the last one).
  void request(std::uint64_t id, std::uint64_t bytes);
  /// Member `id`'s connection ended: it gets no more grants, and what it
  /// was granted but did not use goes back to the pool. What it buffers
  /// stays counted until released.
  void close(std::uint64_t id);
  /// Whether member `id` holds more unused credit (granted, not buffered)
  /// than max(initial_grant_bytes, stream_bytes) while another member's
  /// request waits: credit the others need and it does not use. Its
  /// consumer then ends it after stall_timeout with no byte from it.
  bool pressed(std::uint64_t id) const;
  /// Whether member `id` is still counted: open, or closed with credit
  /// not yet released (what it buffered). A fan-in server keeps an ended
  /// connection until this is false.
  bool holds(std::uint64_t id) const;
  /// Member `id` is gone with whatever it held (its consumer was
  /// destroyed: its entries can no longer report their release). The
  /// budget may then be exceeded by entries the application still holds.
  void forget(std::uint64_t id);

  // ---- for the owner of the members (a fan-in server) ----

  /// Called when a request is left waiting for want of free budget (see
  /// starved()), after the mutex is let go, on the calling thread (any
  /// member's); it must not block. May be called again while the owner
  /// has not yet acted.
  using starved_fn = std::function<void()>;
  /// Sets the starved callback. REQUIRES: before the first join().
  void on_starved(starved_fn fn);
  /// Whether a request within its member's share waits because the free
  /// budget is short: only credit other members hold (used or not) can
  /// meet it. A fan-in server then reclaims connections that hold unused
  /// credit and have been idle (server_options::idle_reclaim_after).
  bool starved() const;
  /// Credit member `id` was granted and holds unused (not buffered),
  /// bytes; 0 for a member that is closed or unknown.
  std::uint64_t unused_bytes(std::uint64_t id) const;

 private:
  struct member {
    std::shared_ptr<const grant_fn> grant;  // shared: called after the mutex is let go
    buffered_figure buffered;
    std::uint64_t outstanding = 0;  // granted, not yet released
    std::uint64_t want = 0;         // a credit request not yet met (0: none)
    std::uint64_t want_seq = 0;     // its age, for first-come order
    bool open = true;
  };

  /// Grants decided under the mutex, made (grant_fn called) after it.
  using due_grants = std::vector<std::pair<std::shared_ptr<const grant_fn>, std::uint64_t>>;
  static void make(due_grants& due);

  std::uint64_t free_bytes() const noexcept;
  std::uint64_t buffered_of(const member& m) const;
  /// Open members with something buffered or a request waiting (at least
  /// 1); lists the waiting requests, oldest first, in waiting_.
  std::uint64_t scan_members();
  /// What each of `members` active members may hold (see the constructor).
  std::uint64_t target(std::uint64_t members) const noexcept;
  /// Lowers member `id`'s outstanding credit by `n` (<= it): the
  /// oversized grant first, then the budget's.
  void take_back(std::uint64_t id, member& m, std::uint64_t n) noexcept;
  void give(member& m, std::uint64_t bytes, due_grants& due);
  /// The starved callback to call once the mutex is let go (null: none).
  std::shared_ptr<const starved_fn> starved_call() const;
  void drop_if_done(std::map<std::uint64_t, member>::iterator it);
  /// Runs the policy; `returning`: the member whose release of
  /// `returned` bytes triggered it (0: none).
  void distribute(std::uint64_t returning, std::uint64_t returned, due_grants& due);

  std::uint64_t budget_;
  std::uint64_t initial_;
  std::uint64_t stream_;
  std::uint64_t max_item_;
  std::uint64_t oversized_ = 0;  // the member holding the oversized grant (0: none)
  std::uint64_t unmet_ = 0;      // requests left waiting by the last distribute()
  std::uint64_t starved_ = 0;    // of those, the ones waiting only for free budget
  std::shared_ptr<const starved_fn> starved_fn_;  // shared: called after the mutex is let go
  std::vector<std::pair<std::uint64_t, member*>> waiting_;  // distribute's scratch: requests by age
  std::map<std::uint64_t, member> members_;
  std::uint64_t next_id_ = 0;
  std::uint64_t next_seq_ = 0;
  std::uint64_t open_ = 0;
  credit_pool_stats stats_;
  // Guards everything above: members may call from different threads.
  mutable std::mutex mu_;
};

}  // namespace blobpipe
