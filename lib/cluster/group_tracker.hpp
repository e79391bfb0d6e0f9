// Blob groups on the receiving side (internal): which groups are open, how
// many members have completed, and when a group ends (docs/cluster.md
// "Blob groups"). Sans I/O and sans clock: the server feeds it its events
// and the time, and yields what it returns.
//
//   group_tracker g({.timeout = 60s});
//   for (auto& ge : g.observe(ev, now)) push(ge);   // after ev itself
//   for (auto& ge : g.expire(now)) push(ge);        // on a timer
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe::detail {

/// A group that ended.
struct group_outcome {
  blob_group group;
  bool complete = false;    ///< every member completed; else aborted
  std::error_code error;    ///< aborted: why (aborted, timed_out, invalid_argument, too_large)
  std::string reason;       ///< aborted: one line
};

class group_tracker {
 public:
  using clock = std::chrono::steady_clock;
  struct limits {
    /// From the first member's first event (0: never).
    std::chrono::milliseconds timeout{60'000};
    std::size_t max_open = 65536;               ///< groups open at once
    /// Groups open at once that one opener (a connection: the one whose
    /// member's event opened the group) has opened, so that one cannot
    /// take every slot.
    std::size_t max_open_per_opener = 65536;
    std::size_t remembered = 65536;             ///< ended ids kept to ignore late members
  };

  explicit group_tracker(limits l) : limits_(l) {}

  /// Takes one event of a member blob (ev.group set; others are ignored):
  /// blob_complete counts the member, blob_aborted (resend false) aborts
  /// the group, any event opens it. A group whose id ended already is not
  /// reopened (its late members are counted in late_members()).
  /// A group this event opens is charged to `opener` (the member's
  /// connection) until it ends.
  std::vector<group_outcome> observe(const event& ev, clock::time_point now,
                                     std::uint64_t opener = 0);
  /// Aborts every group whose timeout passed (timed_out).
  std::vector<group_outcome> expire(clock::time_point now);
  /// Aborts every open group with `ec` ("... members complete when `why`").
  std::vector<group_outcome> abort_all(std::error_code ec, const std::string& why);

  std::size_t open() const noexcept { return open_.size(); }
  /// The earliest deadline of an open group (time_point::max() when none).
  clock::time_point next_deadline() const noexcept;
  std::uint64_t late_members() const noexcept { return late_; }

 private:
  struct state {
    blob_group group;
    std::uint32_t completed = 0;
    clock::time_point deadline;
    std::uint64_t opener = 0;
  };
  group_outcome end(std::uint64_t id, bool complete, std::error_code ec, std::string reason);

  limits limits_;
  std::unordered_map<std::uint64_t, state> open_;
  std::unordered_map<std::uint64_t, std::size_t> opened_by_;  // opener -> groups open
  std::deque<std::uint64_t> ended_order_;  // ids of ended groups, oldest first
  std::unordered_set<std::uint64_t> ended_;
  std::uint64_t late_ = 0;
};

}  // namespace blobpipe::detail
