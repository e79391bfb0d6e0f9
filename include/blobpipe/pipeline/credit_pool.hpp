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
// target: stream_bytes over the active connections (at least
// min_target_bytes, at most the budget over them), so the credit in flight
// stays about stream_bytes however many senders stream at once. Credit in
// flight is memory the bytes pass through (socket buffers, send queues,
// receive buffers): sixteen connections holding 1 MiB each moved 0.23 GB/s
// where the same sixteen holding 128 KiB each moved 0.46 (docs/cluster.md).
// 1. Credit requests (a sender waiting for credit says how much its
//    waiting items need in all), oldest first, each granted whole from the
//    free budget. While the oldest cannot be met nothing else is granted,
//    so a large request is not starved by small ones. This holds whatever
//    the connection's target: the application may hold every byte the
//    connection has (a group it waits to complete), and only a grant lets
//    it go on; the budget still bounds it.
// 2. Credit a connection released goes back to it (no more than it
//    released) while it holds less than its target. So a streaming sender
//    keeps its credit without asking again; as others become busy its
//    target shrinks, and what it releases beyond it (a request's grant
//    included) stays free for them. Credit grows only on request.
// 3. What is left stays free.
// A connection starts with min(initial_grant_bytes, budget / 16, its target
// among the open connections, the free budget), possibly 0 (it then asks when it has something to
// send). Grants cannot be taken back, and a sender that goes idle keeps
// its unused credit until its connection ends: starting small bounds that.
//
// An item larger than any grant could become: when the oldest request
// cannot be met and nothing is buffered on any connection (so no release
// can ever free more), it is granted anyway. The budget is then exceeded by
// at most that one item's credit until it is released; no second such
// grant happens while anything is buffered. This is the pool's form of the
// single-window rule "an entry larger than the whole window is admitted
// alone", and it keeps any item size from deadlocking.
//
// Threading: a pool and every consumer using it live on one executor
// (one thread, or a strand). Entries may still be released on any thread
// (they post back to their consumer's executor).
// Source: docs/cluster.md "Fan-in", docs/wire_features.md "Credit grants".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

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
  /// Grants beyond the budget for an item no release could make room
  /// for (see the file comment).
  std::uint64_t overcommits = 0;
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

  /// `budget_bytes`: what all members may buffer at once. `stream_bytes`:
  /// the credit the active members hold together while the application
  /// keeps up (each one's target is stream_bytes / active, at least
  /// min_target_bytes, at most budget_bytes / active); 0: no such target
  /// (each may hold budget_bytes / active).
  /// REQUIRES: budget_bytes >= 1.
  explicit credit_pool(std::uint64_t budget_bytes,
                       std::uint64_t initial_grant_bytes = default_initial_grant_bytes,
                       std::uint64_t stream_bytes = default_stream_bytes);
  credit_pool(const credit_pool&) = delete;
  credit_pool& operator=(const credit_pool&) = delete;

  std::uint64_t budget_bytes() const noexcept { return budget_; }
  credit_pool_stats stats() const noexcept;

  // ---- for consumers (consumer_options::pool uses these) ----

  /// Sends `bytes` of credit to a member's sender (an ack).
  using grant_fn = std::function<void(std::uint64_t bytes)>;
  /// The credit a member's decoder holds buffered now, bytes.
  using buffered_fn = std::function<std::uint64_t()>;

  /// A connection joins. Returns its member id and its initial grant
  /// (bytes; for its hello), already counted as committed.
  std::pair<std::uint64_t, std::uint64_t> join(grant_fn grant, buffered_fn buffered);
  /// Member `id` released `bytes` (entries dropped, a tail checked).
  void released(std::uint64_t id, std::uint64_t bytes);
  /// Member `id`'s sender waits for credit: its waiting items need
  /// `bytes` in all (a credit request; replaces the last one).
  void request(std::uint64_t id, std::uint64_t bytes);
  /// Member `id`'s connection ended: it gets no more grants, and what it
  /// was granted but did not use goes back to the pool. What it buffers
  /// stays counted until released.
  void close(std::uint64_t id);
  /// Member `id` is gone with whatever it held (its consumer was
  /// destroyed: its entries can no longer report their release). The
  /// budget may then be exceeded by entries the application still holds.
  void forget(std::uint64_t id);

 private:
  struct member {
    grant_fn grant;
    buffered_fn buffered;
    std::uint64_t outstanding = 0;  // granted, not yet released
    std::uint64_t want = 0;         // a credit request not yet met (0: none)
    std::uint64_t want_seq = 0;     // its age, for first-come order
    bool open = true;
  };

  std::uint64_t free_bytes() const noexcept;
  std::uint64_t buffered_of(const member& m) const;
  /// Open members with something buffered or a request waiting (at least 1).
  std::uint64_t active_members() const;
  /// What each of `members` active members may hold (see the constructor).
  std::uint64_t target(std::uint64_t members) const noexcept;
  void give(member& m, std::uint64_t bytes);
  void drop_if_done(std::map<std::uint64_t, member>::iterator it);
  /// Runs the policy; `returning`: the member whose release of
  /// `returned` bytes triggered it (0: none).
  void distribute(std::uint64_t returning, std::uint64_t returned);

  std::uint64_t budget_;
  std::uint64_t initial_;
  std::uint64_t stream_;
  std::vector<member*> waiting_;  // distribute's scratch: requests by age
  std::map<std::uint64_t, member> members_;
  std::uint64_t next_id_ = 0;
  std::uint64_t next_seq_ = 0;
  std::uint64_t open_ = 0;
  bool distributing_ = false;  // a grant callback may re-enter: run the policy once
  credit_pool_stats stats_;
};

}  // namespace blobpipe
