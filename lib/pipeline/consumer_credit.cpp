// The consumer's side of credit: the session (consumer_session.hpp) keeps
// the window, the grants and the held allowance's figures; this joins it
// to a shared pool (blobpipe/pipeline/credit_pool.hpp) on its own thread,
// brings credit back from entry leases dropped on any thread, and moves
// yielded entries into the held allowance (consumer_options::held_bytes,
// docs/reliability.md "Held entries").
#include <algorithm>

#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include "lib/pipeline/consumer_state.hpp"
#include "lib/pipeline/entry_lease.hpp"

namespace blobpipe::detail {

bool running_in_this_thread(const asio::any_io_executor& ex) noexcept {
  using io_executor = asio::io_context::executor_type;
  if (auto* io = ex.target<io_executor>()) return io->running_in_this_thread();
  if (auto* st = ex.target<asio::strand<io_executor>>()) return st->running_in_this_thread();
  return false;
}

entry_lease::~entry_lease() {
  own.reset();  // back to the pool before the credit lets the next entry in
  // The consumer gone, there is no credit to give back, and `ex` may
  // name an io_context that is gone too (entries may outlive both).
  if (owner.expired()) return;
  auto back = [n = credit, y = yielded, h = held](consumer_state& s) {
    if (h) s.release_held(n);
    else s.release(n, y);
  };
  if (running_in_this_thread(ex)) {
    if (auto s = owner.lock()) back(*s);
  } else {
    try {
      asio::post(ex, [owner = std::move(owner), back] {
        if (auto s = owner.lock()) back(*s);
      });
    } catch (...) {  // out of memory for the handler: the credit is lost
    }
  }
}

// ---- the pool ---------------------------------------------------------------------

std::uint64_t consumer_state::pool_join() {
  // The pool may be called from another connection's thread (a server's
  // receive threads): the grant is made on ours, and from there our
  // buffered bytes are what the session published (credit_pool.hpp
  // "Threading"); the state itself is never locked there, so its last
  // reference cannot go on a thread that is not ours.
  auto [id, first] = opt.pool->join(
      [w = weak_from_this(), ex = ex](std::uint64_t credit) {
        asio::dispatch(ex, [w, credit] {
          if (auto s = w.lock()) s->grant(credit);
        });
      },
      [w = weak_from_this(), ex = ex,
       seen = session.buffered_published()]() -> std::uint64_t {
        if (!running_in_this_thread(ex)) return seen->load(std::memory_order_relaxed);
        auto s = w.lock();
        return s ? s->session.buffered_bytes() : 0;
      });
  pool_member = id;
  return first;
}

bool consumer_state::pool_pressed() {
  return pool_member != 0 && opt.pool->pressed(pool_member);
}

void consumer_state::pool_request(std::uint64_t n) { opt.pool->request(pool_member, n); }

void consumer_state::pool_released(std::uint64_t n) {
  if (pool_member != 0) opt.pool->released(pool_member, n);
}

void consumer_state::grant(std::uint64_t n) noexcept { session.grant(n, clock_now()); }

// ---- credit coming back ----------------------------------------------------------

void consumer_state::release(std::uint64_t n, bool yielded) noexcept {
  if (yielded) session.release_yielded(n, clock_now());
  else session.release(n);
}

// ---- the held allowance ----------------------------------------------------------

void held_entries::queue_unpromoted(std::weak_ptr<const void> storage) {
  if (unpromoted.size() >= 2 * unpromoted_compacted + 64) {
    std::erase_if(unpromoted, [](const auto& w) { return w.expired(); });
    unpromoted_compacted = unpromoted.size();
  }
  unpromoted.push_back(std::move(storage));
}

void consumer_state::release_held(std::uint64_t n) noexcept {
  session.release_held(n, clock_now());
  promote_held();
}

void consumer_state::on_yield(const event& ev) {
  if (ev.kind != event_kind::entry_ready || !ev.entry || !ev.entry->storage) {
    session.yielded(0);
    return;
  }
  entry_lease& lease = lease_of(ev.entry->storage);
  lease.yielded = true;
  session.yielded(lease.credit);
  // An assembled blob's entries share its region, which only the whole
  // blob frees: they stay in the window.
  if (opt.held_bytes != 0 && !lease.region && !events.ended) {
    held.queue_unpromoted(ev.entry->storage);
    promote_held();
  }
}

void consumer_state::promote_held() noexcept {
  const auto now = clock_now();
  while (!held.unpromoted.empty()) {
    auto storage = held.unpromoted.front().lock();
    if (!storage) {  // dropped already: its release is on its way
      held.unpromoted.pop_front();
      continue;
    }
    entry_lease& lease = lease_of(storage);
    // A reader's queue is not the application's hands: entries move once
    // delivered, which happens in yield order.
    if (opt.waits_reported && !lease.delivered.load(std::memory_order_acquire)) break;
    if (!session.hold(lease.credit, now)) break;  // its credit went back if it moved
    held.unpromoted.pop_front();
    lease.held = true;
  }
}

}  // namespace blobpipe::detail
