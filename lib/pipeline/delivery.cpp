// The delivery log (blobpipe/pipeline/delivery.hpp): per session, a FIFO of the
// last `window` tags with a hash set beside it for lookups.
#include "blobpipe/pipeline/delivery.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <unordered_set>

namespace blobpipe {

std::size_t delivery_log::key_hash::operator()(
    const std::array<std::byte, 16>& k) const noexcept {
  // Tags and sessions are uuid4-like random bytes; mixing both halves
  // still keeps a hand-made tag (a counter in either half) spread out.
  std::uint64_t a, b;
  std::memcpy(&a, k.data(), 8);
  std::memcpy(&b, k.data() + 8, 8);
  return static_cast<std::size_t>((a * 0x9E3779B97F4A7C15ull) ^ b ^ (b >> 29));
}

struct delivery_log::session_rec {
  std::deque<tag_t> order;  // oldest first
  std::unordered_set<tag_t, key_hash> set;
  std::uint64_t last_used = 0;
};

delivery_log::delivery_log(std::uint32_t window, std::size_t max_sessions)
    : window_(std::max<std::uint32_t>(window, 1)),
      max_sessions_(std::max<std::size_t>(max_sessions, 1)) {}

delivery_log::~delivery_log() = default;

bool delivery_log::contains(const session_id& session, const tag_t& tag) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  return it != sessions_.end() && it->second->set.count(tag) != 0;
}

void delivery_log::record(const session_id& session, const tag_t& tag) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    if (sessions_.size() >= max_sessions_) {
      auto lru = std::min_element(sessions_.begin(), sessions_.end(), [](auto& a, auto& b) {
        return a.second->last_used < b.second->last_used;
      });
      sessions_.erase(lru);  // O(sessions), only when a new session arrives
    }
    it = sessions_.emplace(session, std::make_unique<session_rec>()).first;
  }
  session_rec& r = *it->second;
  r.last_used = ++clock_;
  if (!r.set.insert(tag).second) return;
  r.order.push_back(tag);
  if (r.order.size() > window_) {
    r.set.erase(r.order.front());
    r.order.pop_front();
  }
}

std::size_t delivery_log::sessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

std::size_t delivery_log::tags() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (auto& [k, r] : sessions_) n += r->order.size();
  return n;
}

std::shared_ptr<delivery_log> delivery_log::process_default() {
  static const auto log = std::make_shared<delivery_log>();
  return log;
}

}  // namespace blobpipe
