// The shared receive budget (blobpipe/pipeline/credit_pool.hpp): its
// accounting and its grant policy.
#include "blobpipe/pipeline/credit_pool.hpp"

#include <algorithm>

namespace blobpipe {

credit_pool::credit_pool(std::uint64_t budget_bytes, std::uint64_t initial_grant_bytes,
                         std::uint64_t stream_bytes, std::uint64_t max_item_bytes)
    : budget_(std::max<std::uint64_t>(budget_bytes, 1)),
      initial_(initial_grant_bytes),
      stream_(stream_bytes),
      max_item_(max_item_bytes) {
  stats_.budget_bytes = budget_;
}

credit_pool_stats credit_pool::stats() const noexcept {
  std::lock_guard lock(mu_);
  credit_pool_stats s = stats_;
  s.connections = members_.size();
  s.requests_waiting = 0;
  for (const auto& [id, m] : members_) s.requests_waiting += m.want != 0;
  return s;
}

std::uint64_t credit_pool::free_bytes() const noexcept {
  // The oversized grant is beyond the budget: it takes nothing from it.
  const std::uint64_t within = stats_.committed_bytes - stats_.oversized_bytes;
  return within >= budget_ ? 0 : budget_ - within;
}

void credit_pool::take_back(std::uint64_t id, member& m, std::uint64_t n) noexcept {
  m.outstanding -= n;
  stats_.committed_bytes -= n;
  if (id != oversized_) return;
  stats_.oversized_bytes -= std::min(n, stats_.oversized_bytes);
  if (stats_.oversized_bytes == 0) oversized_ = 0;  // another may have one now
}

bool credit_pool::pressed(std::uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = members_.find(id);
  if (it == members_.end() || !it->second.open) return false;
  const member& m = it->second;
  const std::uint64_t unused = m.outstanding - buffered_of(m);
  if (unused <= std::max(initial_, stream_)) return false;
  // Another member's request waits (not only this one's own).
  return unmet_ > (m.want != 0 ? 1u : 0u);
}

void credit_pool::on_starved(starved_fn fn) {
  std::lock_guard lock(mu_);
  starved_fn_ = std::make_shared<const starved_fn>(std::move(fn));
}

bool credit_pool::starved() const {
  std::lock_guard lock(mu_);
  return starved_ != 0;
}

std::uint64_t credit_pool::unused_bytes(std::uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = members_.find(id);
  if (it == members_.end() || !it->second.open) return 0;
  return it->second.outstanding - buffered_of(it->second);
}

std::shared_ptr<const credit_pool::starved_fn> credit_pool::starved_call() const {
  return starved_ != 0 && starved_fn_ && *starved_fn_ ? starved_fn_ : nullptr;
}

bool credit_pool::holds(std::uint64_t id) const {
  std::lock_guard lock(mu_);
  return members_.count(id) != 0;
}

std::uint64_t credit_pool::buffered_of(const member& m) const {
  return std::min(m.buffered->load(std::memory_order_relaxed), m.outstanding);
}

std::uint64_t credit_pool::scan_members() {
  std::uint64_t active = 0;
  waiting_.clear();
  for (auto& [id, m] : members_) {
    if (!m.open) continue;
    if (m.want != 0) {
      ++active;
      waiting_.emplace_back(id, &m);
    } else if (buffered_of(m) != 0) {
      ++active;
    }
  }
  if (waiting_.size() > 1)
    std::sort(waiting_.begin(), waiting_.end(),
              [](const auto& x, const auto& y) { return x.second->want_seq < y.second->want_seq; });
  return std::max<std::uint64_t>(active, 1);
}

std::uint64_t credit_pool::target(std::uint64_t members) const noexcept {
  const std::uint64_t n = std::max<std::uint64_t>(members, 1);
  const std::uint64_t share = budget_ / n;
  if (stream_ == 0) return share;
  return std::min(share, std::max(stream_ / n, min_target_bytes));
}

void credit_pool::make(due_grants& due) {
  for (auto& [fn, bytes] : due)
    if (*fn) (*fn)(bytes);
}

void credit_pool::give(member& m, std::uint64_t bytes, due_grants& due) {
  if (bytes == 0) return;
  m.outstanding += bytes;
  stats_.committed_bytes += bytes;
  stats_.committed_high_water = std::max(stats_.committed_high_water, stats_.committed_bytes);
  ++stats_.grants;
  stats_.granted_bytes += bytes;
  due.emplace_back(m.grant, bytes);
}

void credit_pool::drop_if_done(std::map<std::uint64_t, member>::iterator it) {
  if (!it->second.open && it->second.outstanding == 0) members_.erase(it);
}

std::pair<std::uint64_t, std::uint64_t> credit_pool::join(grant_fn grant,
                                                          buffered_figure buffered) {
  std::lock_guard lock(mu_);
  const std::uint64_t id = ++next_id_;
  member& m = members_[id];
  m.grant = std::make_shared<const grant_fn>(std::move(grant));
  m.buffered = std::move(buffered);
  ++open_;
  // Small: a grant cannot be taken back, and an idle sender keeps what it
  // was given (docs/cluster.md "Fan-in").
  const std::uint64_t first =
      std::min({initial_, budget_ / initial_grant_divisor, target(open_), free_bytes()});
  m.outstanding = first;
  stats_.committed_bytes += first;
  stats_.committed_high_water = std::max(stats_.committed_high_water, stats_.committed_bytes);
  return {id, first};
}

void credit_pool::released(std::uint64_t id, std::uint64_t bytes) {
  due_grants due;
  std::shared_ptr<const starved_fn> starving;
  {
    std::lock_guard lock(mu_);
    auto it = members_.find(id);
    if (it == members_.end()) return;  // forgotten
    const std::uint64_t n = std::min(bytes, it->second.outstanding);
    take_back(id, it->second, n);
    const bool open = it->second.open;
    drop_if_done(it);
    distribute(open ? id : 0, n, due);
    starving = starved_call();
  }
  make(due);
  if (starving) (*starving)();
}

void credit_pool::request(std::uint64_t id, std::uint64_t bytes) {
  due_grants due;
  std::shared_ptr<const starved_fn> starving;
  {
    std::lock_guard lock(mu_);
    auto it = members_.find(id);
    if (it == members_.end() || !it->second.open) return;
    ++stats_.credit_requests;
    member& m = it->second;
    if (m.want == 0) m.want_seq = ++next_seq_;
    m.want = bytes;
    if (bytes == 0) m.want_seq = 0;
    distribute(0, 0, due);
    starving = starved_call();
  }
  make(due);
  if (starving) (*starving)();
}

void credit_pool::close(std::uint64_t id) {
  due_grants due;
  {
    std::lock_guard lock(mu_);
    auto it = members_.find(id);
    if (it == members_.end() || !it->second.open) return;
    member& m = it->second;
    m.open = false;
    m.want = 0;
    --open_;
    take_back(id, m, m.outstanding - buffered_of(m));
    drop_if_done(it);
    distribute(0, 0, due);
  }
  make(due);
}

void credit_pool::forget(std::uint64_t id) {
  due_grants due;
  {
    std::lock_guard lock(mu_);
    auto it = members_.find(id);
    if (it == members_.end()) return;
    if (it->second.open) --open_;
    take_back(id, it->second, it->second.outstanding);
    members_.erase(it);
    distribute(0, 0, due);
  }
  make(due);
}

// REQUIRES: mu_ held. Grants go into `due`, made once it is let go.
void credit_pool::distribute(std::uint64_t returning, std::uint64_t returned, due_grants& due) {
  // 1. Credit requests, oldest first, each granted whole within its
  // member's share, from the free budget; one that cannot be met now
  // waits without holding up the others. Step 2 brings a window back to
  // its target.
  const std::uint64_t active = scan_members();
  const std::uint64_t goal = target(active);
  const std::uint64_t share = std::max<std::uint64_t>(budget_ / active, 1);
  unmet_ = 0;
  starved_ = 0;
  for (auto& [id, mp] : waiting_) {
    member& m = *mp;
    // No item needs more than max_item_ (a request for 2^64 - 1 asks for
    // no more than that).
    const std::uint64_t want = std::min(m.want, max_item_);
    const std::uint64_t allowance = m.outstanding - buffered_of(m);
    if (want > allowance) {
      const std::uint64_t deficit = want - allowance;
      const bool within_share = m.outstanding <= share && deficit <= share - m.outstanding;
      if (within_share) {
        if (deficit > free_bytes()) {  // releases will make room: wait
          ++unmet_;
          ++starved_;
          continue;
        }
        give(m, deficit, due);
      } else if (want > share && oversized_ == 0) {
        // An item larger than its share: beyond the budget, one at a
        // time server-wide (deficit <= want <= max_item_).
        oversized_ = id;
        stats_.oversized_bytes += deficit;
        ++stats_.overcommits;
        give(m, deficit, due);
      } else {
        // Its own buffered bytes must go first (their release, or the held
        // allowance), or the oversized grant is another's: wait.
        ++unmet_;
        continue;
      }
    }
    m.want = 0;
    m.want_seq = 0;
  }
  // 2. Released credit back to its member (no more than it released, so
  // nothing grows without a request), up to its target.
  if (returning == 0) return;
  auto it = members_.find(returning);
  if (it == members_.end() || !it->second.open) return;
  member& m = it->second;
  if (m.outstanding < goal)
    give(m, std::min({returned, goal - m.outstanding, free_bytes()}), due);
}

}  // namespace blobpipe
