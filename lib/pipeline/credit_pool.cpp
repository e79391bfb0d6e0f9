// The shared receive budget (blobpipe/pipeline/credit_pool.hpp): its
// accounting and its grant policy.
#include "blobpipe/pipeline/credit_pool.hpp"

#include <algorithm>

namespace blobpipe {

credit_pool::credit_pool(std::uint64_t budget_bytes, std::uint64_t initial_grant_bytes,
                         std::uint64_t stream_bytes)
    : budget_(std::max<std::uint64_t>(budget_bytes, 1)),
      initial_(initial_grant_bytes),
      stream_(stream_bytes) {
  stats_.budget_bytes = budget_;
}

credit_pool_stats credit_pool::stats() const noexcept {
  credit_pool_stats s = stats_;
  s.connections = members_.size();
  s.requests_waiting = 0;
  for (const auto& [id, m] : members_) s.requests_waiting += m.want != 0;
  return s;
}

std::uint64_t credit_pool::free_bytes() const noexcept {
  return stats_.committed_bytes >= budget_ ? 0 : budget_ - stats_.committed_bytes;
}

std::uint64_t credit_pool::buffered_of(const member& m) const {
  return std::min(m.buffered ? m.buffered() : 0, m.outstanding);
}

std::uint64_t credit_pool::active_members() const {
  std::uint64_t active = 0;
  for (const auto& [id, m] : members_)
    if (m.open && (m.want != 0 || buffered_of(m) != 0)) ++active;
  return std::max<std::uint64_t>(active, 1);
}

std::uint64_t credit_pool::target(std::uint64_t members) const noexcept {
  const std::uint64_t n = std::max<std::uint64_t>(members, 1);
  const std::uint64_t share = budget_ / n;
  if (stream_ == 0) return share;
  return std::min(share, std::max(stream_ / n, min_target_bytes));
}

void credit_pool::give(member& m, std::uint64_t bytes) {
  if (bytes == 0) return;
  m.outstanding += bytes;
  stats_.committed_bytes += bytes;
  stats_.committed_high_water = std::max(stats_.committed_high_water, stats_.committed_bytes);
  ++stats_.grants;
  stats_.granted_bytes += bytes;
  m.grant(bytes);
}

void credit_pool::drop_if_done(std::map<std::uint64_t, member>::iterator it) {
  if (!it->second.open && it->second.outstanding == 0) members_.erase(it);
}

std::pair<std::uint64_t, std::uint64_t> credit_pool::join(grant_fn grant, buffered_fn buffered) {
  const std::uint64_t id = ++next_id_;
  member& m = members_[id];
  m.grant = std::move(grant);
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
  auto it = members_.find(id);
  if (it == members_.end()) return;  // forgotten
  const std::uint64_t n = std::min(bytes, it->second.outstanding);
  it->second.outstanding -= n;
  stats_.committed_bytes -= n;
  const bool open = it->second.open;
  drop_if_done(it);
  distribute(open ? id : 0, n);
}

void credit_pool::request(std::uint64_t id, std::uint64_t bytes) {
  auto it = members_.find(id);
  if (it == members_.end() || !it->second.open) return;
  ++stats_.credit_requests;
  member& m = it->second;
  if (m.want == 0) m.want_seq = ++next_seq_;
  m.want = bytes;
  if (bytes == 0) m.want_seq = 0;
  distribute(0, 0);
}

void credit_pool::close(std::uint64_t id) {
  auto it = members_.find(id);
  if (it == members_.end() || !it->second.open) return;
  member& m = it->second;
  m.open = false;
  m.want = 0;
  --open_;
  const std::uint64_t unused = m.outstanding - buffered_of(m);
  m.outstanding -= unused;
  stats_.committed_bytes -= unused;
  drop_if_done(it);
  distribute(0, 0);
}

void credit_pool::forget(std::uint64_t id) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  if (it->second.open) --open_;
  stats_.committed_bytes -= it->second.outstanding;
  members_.erase(it);
  distribute(0, 0);
}

void credit_pool::distribute(std::uint64_t returning, std::uint64_t returned) {
  if (distributing_) return;
  distributing_ = true;
  struct reset {
    bool& b;
    ~reset() { b = false; }
  } guard{distributing_};
  // 1. Credit requests, oldest first, each granted whole from the free
  // budget, whatever the member's target: the application may hold every
  // byte the member has (a group it waits to complete), and only a grant
  // lets that member go on. Step 2 brings its window back to its target.
  const std::uint64_t goal = target(active_members());
  waiting_.clear();
  for (auto& [id, m] : members_)
    if (m.open && m.want != 0) waiting_.push_back(&m);
  std::sort(waiting_.begin(), waiting_.end(),
            [](const member* x, const member* y) { return x->want_seq < y->want_seq; });
  for (member* mp : waiting_) {
    member& m = *mp;
    const std::uint64_t allowance = m.outstanding - buffered_of(m);
    if (m.want > allowance) {
      const std::uint64_t deficit = m.want - allowance;
      if (deficit > free_bytes()) {
        bool anything_buffered = false;
        for (const auto& [id, other] : members_) anything_buffered |= buffered_of(other) != 0;
        if (anything_buffered) return;  // releases will make room; nothing else meanwhile
        ++stats_.overcommits;  // no release can ever make room: beyond the budget
      }
      give(m, deficit);
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
  if (m.outstanding < goal) give(m, std::min({returned, goal - m.outstanding, free_bytes()}));
}

}  // namespace blobpipe
