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
  if (home) home->give_back(credit, yielded, held);
}

lease_home::lease_home(std::weak_ptr<consumer_state> owner, asio::any_io_executor ex)
    : owner_(std::move(owner)), ex_(std::move(ex)) {}

void lease_home::apply(consumer_state& s, const sums& back) noexcept {
  if (back.held != 0) s.release_held(back.held);
  if (back.yielded != 0) s.release(back.yielded, true);
  if (back.window != 0) s.release(back.window);
}

void lease_home::give_back(std::uint64_t credit, bool yielded, bool held) noexcept {
  // The consumer gone, there is no credit to give back, and ex_ may name
  // an io_context that is gone too (entries may outlive both).
  if (owner_.expired()) return;
  sums back;
  (held ? back.held : yielded ? back.yielded : back.window) = credit;
  if (running_in_this_thread(ex_)) {
    if (auto s = owner_.lock()) apply(*s, back);
    return;
  }
  bool post = false;
  {
    std::lock_guard lock(mu_);
    pending_.held += back.held;
    pending_.yielded += back.yielded;
    pending_.window += back.window;
    post = !std::exchange(posted_, true);
  }
  if (!post) return;  // the drain on its way takes this too
  try {
    asio::post(ex_, [home = shared_from_this()] { home->drain(); });
  } catch (...) {
    // Out of memory for the handler: the credit stays gathered until the
    // next drop on another thread posts again.
    std::lock_guard lock(mu_);
    posted_ = false;
  }
}

void lease_home::drain() noexcept {
  sums back;
  {
    std::lock_guard lock(mu_);
    back = std::exchange(pending_, sums{});
    posted_ = false;
  }
  if (auto s = owner_.lock()) apply(*s, back);
}

// ---- the pool ---------------------------------------------------------------------

std::uint64_t consumer_state::pool_join() {
  // The pool may be called from another connection's thread (a server's
  // receive threads): the grant is made on ours, and our buffered bytes
  // are read from what the session published (credit_pool.hpp
  // "Threading"); the state itself is never locked there, so its last
  // reference cannot go on a thread that is not ours.
  auto [id, first] = opt.pool->join(
      [w = weak_from_this(), ex = ex](std::uint64_t credit) {
        asio::dispatch(ex, [w, credit] {
          if (auto s = w.lock()) s->grant(credit);
        });
      },
      session.buffered_published());
  credit.pool_member = id;
  return first;
}

bool consumer_state::pool_pressed() {
  return credit.pool_member != 0 && opt.pool->pressed(credit.pool_member);
}

void consumer_state::pool_request(std::uint64_t n) { opt.pool->request(credit.pool_member, n); }

void consumer_state::pool_released(std::uint64_t n) {
  if (credit.pool_member != 0) opt.pool->released(credit.pool_member, n);
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
    // With none queued before it, it moves now or waits first in line:
    // what promote_held would do with it alone, without a weak reference
    // queued and locked again.
    if (credit.held.unpromoted.empty()) {
      if (!hold_now(lease, clock_now())) credit.held.queue_unpromoted(ev.entry->storage);
      return;
    }
    credit.held.queue_unpromoted(ev.entry->storage);
    promote_held();
  }
}

bool consumer_state::hold_now(entry_lease& lease, consumer_session::time_point now) noexcept {
  // A reader's queue is not the application's hands: entries move once
  // delivered, which happens in yield order.
  if (opt.waits_reported && !lease.delivered.load(std::memory_order_acquire)) return false;
  if (!session.hold(lease.credit, now)) return false;  // its credit went back if it moved
  lease.held = true;
  return true;
}

void consumer_state::promote_held() noexcept {
  const auto now = clock_now();
  while (!credit.held.unpromoted.empty()) {
    auto storage = credit.held.unpromoted.front().lock();
    if (!storage) {  // dropped already: its release is on its way
      credit.held.unpromoted.pop_front();
      continue;
    }
    if (!hold_now(lease_of(storage), now)) break;
    credit.held.unpromoted.pop_front();
  }
}

}  // namespace blobpipe::detail
