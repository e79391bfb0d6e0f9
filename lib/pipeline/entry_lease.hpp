// A received entry's lease (internal): what owns an entry's bytes and its
// window credit (received_entry::storage). The sinks make it
// (consumer_sinks.cpp), the held allowance moves it (consumer_credit.cpp),
// a device upload frees its host copy (consumer_uploads.cpp); dropping
// the last reference gives the credit back.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include <asio/any_io_executor.hpp>

#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/receive_buffers.hpp"

namespace blobpipe::detail {

struct consumer_state;

/// Whether this thread is running `ex` now (io_context executors and
/// strands of them; false for any other kind, which is then posted to).
bool running_in_this_thread(const asio::any_io_executor& ex) noexcept;

/// Where the leases of one consumer give their credit back. An
/// application may drop entries on any thread (a trainer hands them to
/// its own threads, a fan-in server's application runs on its home
/// thread), but the consumer's state belongs to its executor: from
/// elsewhere the credit goes back through a post there, and the state is
/// never touched (nor kept alive) on the dropping thread. Drops on other
/// threads add their credit to sums here, and one post returns all that
/// gathered before it ran: one wake of the consumer's thread for a batch
/// of drops, however many.
class lease_home : public std::enable_shared_from_this<lease_home> {
 public:
  /// `ex`: the owner's executor (held untracked: leases do not keep its
  /// io_context running).
  lease_home(std::weak_ptr<consumer_state> owner, asio::any_io_executor ex);

  /// An entry of `credit` bytes was dropped, on any thread. `yielded`:
  /// the application had it, in the window; `held`: it was in the held
  /// allowance (its credit went back already). Nothing happens once the
  /// consumer is gone: its executor may be gone too.
  void give_back(std::uint64_t credit, bool yielded, bool held) noexcept;

 private:
  /// Credit gathered from other threads, by how it goes back.
  struct sums {
    std::uint64_t window = 0;   // consumer_state::release(n)
    std::uint64_t yielded = 0;  // consumer_state::release(n, true)
    std::uint64_t held = 0;     // consumer_state::release_held(n)
  };
  static void apply(consumer_state& s, const sums& back) noexcept;
  /// On the owner's executor: returns what gathered.
  void drain() noexcept;

  std::weak_ptr<consumer_state> owner_;
  asio::any_io_executor ex_;
  std::mutex mu_;      // guards pending_ and posted_ (any thread)
  sums pending_;
  bool posted_ = false;  // a drain() is on its way to ex_
};

/// Owns an entry's bytes and its window credit; see received_entry::storage.
struct entry_lease {
  std::shared_ptr<lease_home> home;  // its consumer's (null: no credit to give back)
  std::uint64_t credit = 0;
  aligned_bytes own;
  std::shared_ptr<reserved_region> region;
  std::shared_ptr<const void> device;  // consumer_options::landing: the device buffer
  // Set on the owner's executor while it holds a reference (on_yield,
  // promote_held), read here after the last reference went: the
  // reference count orders the two.
  bool yielded = false;  // next() gave it to the application
  bool held = false;     // in the held allowance: its credit went back already
  // consumer_options::waits_reported: the reader handed it to the
  // application (mark_delivered, any thread); only then may it move.
  std::atomic<bool> delivered{false};
  /// Gives the credit back (consumer_credit.cpp).
  ~entry_lease();
};

inline entry_lease& lease_of(const std::shared_ptr<const void>& storage) {
  // Every entry's storage is an entry_lease (or a small_entry_lease,
  // whose base it is); the object itself is not const.
  return *const_cast<entry_lease*>(static_cast<const entry_lease*>(storage.get()));
}

/// An entry of at most this many bytes lands inside its lease: one
/// allocation where a lease and a 64-byte aligned buffer were two (the
/// small entries of an RL sample: a reward, a pickled meta dict).
inline constexpr std::size_t small_entry_bytes = 256;

struct small_entry_lease : entry_lease {
  std::array<std::byte, small_entry_bytes + ALIGN - 1> room;  // bytes from a 64-byte boundary
  std::byte* bytes() noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(room.data());
    return room.data() + (align_up(at) - at);
  }
};

}  // namespace blobpipe::detail
