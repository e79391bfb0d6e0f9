// Blob groups on the receiving side: see group_tracker.hpp.
#include "lib/cluster/group_tracker.hpp"

namespace blobpipe::detail {

namespace {
std::string num(std::uint64_t v) { return std::to_string(v); }
}  // namespace

group_outcome group_tracker::end(std::uint64_t id, bool complete, std::error_code ec,
                                 std::string reason) {
  auto it = open_.find(id);
  group_outcome out{it->second.group, complete, ec, std::move(reason)};
  if (auto o = opened_by_.find(it->second.opener); o != opened_by_.end() && --o->second == 0)
    opened_by_.erase(o);
  open_.erase(it);
  ended_.insert(id);
  ended_order_.push_back(id);
  if (ended_order_.size() > limits_.remembered) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
  return out;
}

std::vector<group_outcome> group_tracker::observe(const event& ev, clock::time_point now,
                                                  std::uint64_t opener) {
  std::vector<group_outcome> out;
  if (!ev.group || ev.kind == event_kind::end_of_stream) return out;
  const blob_group& g = *ev.group;
  if (ended_.count(g.id)) {
    // A member counts once, when it ends.
    if (ev.kind == event_kind::blob_complete || (ev.kind == event_kind::blob_aborted && !ev.resend))
      ++late_;
    return out;
  }
  auto it = open_.find(g.id);
  if (it == open_.end()) {
    const auto mine = opened_by_.find(opener);
    const std::size_t opened = mine == opened_by_.end() ? 0 : mine->second;
    if (open_.size() >= limits_.max_open || opened >= limits_.max_open_per_opener) {
      // Not opened: refused at once (its later members are late ones).
      const std::string why =
          open_.size() >= limits_.max_open
              ? "more than " + num(limits_.max_open) + " groups open"
              : "its connection has " + num(opened) + " groups open, the most one may open";
      open_[g.id] = state{g, 0, now, ~std::uint64_t{0}};  // charged to nobody
      out.push_back(end(g.id, false, make_error_code(errc::too_large),
                        "group " + num(g.id) + ": " + why));
      return out;
    }
    const auto deadline =
        limits_.timeout.count() > 0 ? now + limits_.timeout : clock::time_point::max();
    it = open_.emplace(g.id, state{g, 0, deadline, opener}).first;
    ++opened_by_[opener];
  }
  state& st = it->second;
  if (st.group.size != g.size) {
    out.push_back(end(g.id, false, make_error_code(errc::invalid_argument),
                      "group " + num(g.id) + ": a member says " + num(g.size) +
                          " members, another " + num(st.group.size)));
    return out;
  }
  if (ev.kind == event_kind::blob_complete) {
    if (++st.completed == st.group.size) out.push_back(end(g.id, true, {}, {}));
  } else if (ev.kind == event_kind::blob_aborted && !ev.resend) {
    out.push_back(end(g.id, false, ev.error ? ev.error : make_error_code(errc::aborted),
                      "group " + num(g.id) + ": member blob " + tag_hex(ev.tag) +
                          " aborted: " + ev.reason));
  }
  return out;
}

std::vector<group_outcome> group_tracker::expire(clock::time_point now) {
  std::vector<std::uint64_t> due;
  for (const auto& [id, st] : open_)
    if (st.deadline <= now) due.push_back(id);
  std::vector<group_outcome> out;
  for (auto id : due) {
    const state& st = open_.at(id);
    const auto ms = limits_.timeout.count();
    out.push_back(end(id, false, make_error_code(errc::timed_out),
                      "group " + num(id) + ": " + num(st.completed) + " of " +
                          num(st.group.size) + " members complete after " + num(ms) +
                          " ms (group_timeout)"));
  }
  return out;
}

std::vector<group_outcome> group_tracker::abort_all(std::error_code ec, const std::string& why) {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, st] : open_) ids.push_back(id);
  std::vector<group_outcome> out;
  for (auto id : ids) {
    const state& st = open_.at(id);
    out.push_back(end(id, false, ec,
                      "group " + num(id) + ": " + num(st.completed) + " of " +
                          num(st.group.size) + " members complete when " + why));
  }
  return out;
}

group_tracker::clock::time_point group_tracker::next_deadline() const noexcept {
  auto t = clock::time_point::max();
  for (const auto& [id, st] : open_) t = std::min(t, st.deadline);
  return t;
}

}  // namespace blobpipe::detail
