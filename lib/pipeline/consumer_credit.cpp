// The consumer's credit (consumer_credit in consumer_state.hpp): the
// optional features it accepts (docs/wire_features.md), credit grants
// from a shared pool (blobpipe/pipeline/credit_pool.hpp) in place of its
// own window, credit coming back as entries are released (entry_lease),
// and the held allowance (consumer_options::held_bytes,
// docs/reliability.md "Held entries").
#include <algorithm>

#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include "lib/pipeline/consumer_state.hpp"
#include "lib/pipeline/entry_lease.hpp"

namespace blobpipe::detail {

namespace {

/// Whether the credit the sender holds unused (the window less what is
/// buffered) covers `wanted` bytes: a request for that much is met with
/// no grant, and the sender can send on.
bool unused_credit_covers(const decoder& frames, std::uint64_t wanted) noexcept {
  const std::uint64_t window = frames.limits().window_bytes;
  const std::uint64_t used = frames.buffered_bytes();
  return used <= window && wanted <= window - used;
}

}  // namespace

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

// ---- features and the pool ------------------------------------------------------

std::uint64_t consumer_state::negotiate_features(const hello& h, decoder_limits& l) {
  std::uint64_t accept = opt.accept_features & (feature_entry_timestamps | feature_blob_groups);
  if (opt.pool) accept |= feature_credit_grants;
  credit.features = h.features & accept & known_features;
  l.features = credit.features;
  if (!(credit.features & feature_credit_grants)) return l.window_bytes = opt.window_bytes;
  // The pool's: each grant raises the decoder's window (grant()), each
  // release lowers it (decoder::release) and goes to the pool. The pool
  // may be called from another connection's thread (a server's receive
  // threads): the grant is made on ours, and from there our buffered
  // bytes are what we published (credit_pool.hpp "Threading"); the state
  // itself is never locked there, so its last reference cannot go on a
  // thread that is not ours.
  auto [id, first] = opt.pool->join(
      [w = weak_from_this(), ex = ex](std::uint64_t credit) {
        asio::dispatch(ex, [w, credit] {
          if (auto s = w.lock()) s->grant(credit);
        });
      },
      [w = weak_from_this(), ex = ex, seen = credit.buffered_published]() -> std::uint64_t {
        if (!running_in_this_thread(ex)) return seen->load(std::memory_order_relaxed);
        auto s = w.lock();
        return s ? s->frames.buffered_bytes() : 0;
      });
  credit.pool_member = id;
  // Credit others wait for and this sender does not use ends it after
  // stall_timeout (credit_pool::pressed).
  stall_watch.pressure([w = weak_from_this()] {
    auto s = w.lock();
    return s && s->credit.pool_member != 0 && s->opt.pool->pressed(s->credit.pool_member);
  });
  return l.window_bytes = first;
}

void consumer_state::grant(std::uint64_t n) noexcept {
  frames.grant(n);
  credit.credit_wanted -= std::min(n, credit.credit_wanted);
  // The pool grants a request's deficit: the request is met once the
  // unused credit covers it, and the stall clock may run again.
  if (unused_credit_covers(frames, credit.credit_wanted)) credit.credit_wanted = 0;
  update_watch();
  acks.return_credit(n);
}

void consumer_state::publish_buffered() noexcept { credit.publish(frames.buffered_bytes()); }

bool consumer_state::pool_released(std::uint64_t n) noexcept {
  if (credit.pool_member == 0) return false;
  publish_buffered();
  if (n != 0) opt.pool->released(credit.pool_member, n);
  return true;
}

result<void> consumer_state::on_credit_request(std::uint64_t n) {
  ++stats.credit_requests;
  // What the sender waits for (its waiting items' total): until granted,
  // a silence is not its fault (update_watch). A request its unused
  // credit covers is met at once: it waits for nothing, so it cannot keep
  // the stall clock (and idle reclaim) off by asking for what it holds.
  credit.credit_wanted = unused_credit_covers(frames, n) ? 0 : n;
  update_watch();
  if (credit.pool_member == 0) return {};
  publish_buffered();
  opt.pool->request(credit.pool_member, n);
  return {};
}

// ---- credit coming back ----------------------------------------------------------

void consumer_state::release(std::uint64_t n, bool yielded) noexcept {
  if (yielded) {
    credit.held_in_window -= std::min(n, credit.held_in_window);
    update_watch();
  }
  frames.release(n);
  if (pool_released(n)) return;  // the pool decides who gets it
  if (n == 0) return;
  acks.return_credit(n);
}

void consumer_state::collect_returned_credit() noexcept {
  const std::uint64_t n = frames.take_returned_credit();
  stats.buffered_bytes = frames.buffered_bytes();
  stats.buffered_high_water = std::max(stats.buffered_high_water, stats.buffered_bytes);
  if (n == 0 || pool_released(n)) return;
  acks.return_credit(n);
}

// ---- the held allowance ----------------------------------------------------------

void consumer_credit::queue_unpromoted(std::weak_ptr<const void> storage) {
  if (unpromoted.size() >= 2 * unpromoted_compacted + 64) {
    std::erase_if(unpromoted, [](const auto& w) { return w.expired(); });
    unpromoted_compacted = unpromoted.size();
  }
  unpromoted.push_back(std::move(storage));
}

void consumer_state::release_held(std::uint64_t n) noexcept {
  credit.held_credit -= std::min(n, credit.held_credit);
  promote_held();
  update_watch();
}

void consumer_state::on_yield(const event& ev) {
  if (opt.waits_reported) credit.app_waiting = false;
  if (ev.kind != event_kind::entry_ready || !ev.entry || !ev.entry->storage) return;
  entry_lease& lease = lease_of(ev.entry->storage);
  lease.yielded = true;
  credit.held_in_window += lease.credit;
  // An assembled blob's entries share its region, which only the whole
  // blob frees: they stay in the window.
  if (opt.held_bytes != 0 && !lease.region && !ended) {
    credit.queue_unpromoted(ev.entry->storage);
    promote_held();
  }
}

void consumer_state::promote_held() noexcept {
  while (!credit.unpromoted.empty()) {
    auto storage = credit.unpromoted.front().lock();
    if (!storage) {  // dropped already: its release is on its way
      credit.unpromoted.pop_front();
      continue;
    }
    entry_lease& lease = lease_of(storage);
    // A reader's queue is not the application's hands: entries move once
    // delivered, which happens in yield order.
    if (opt.waits_reported && !lease.delivered.load(std::memory_order_acquire)) break;
    // With the default allowance and no pool, one entry larger than the
    // allowance moves alone, into an empty one (as the window admits one
    // larger entry alone): the loop that keeps the previous event while it
    // waits goes on whatever an entry's size.
    const std::uint64_t room = opt.held_bytes - std::min(credit.held_credit, opt.held_bytes);
    if (lease.credit > room && (credit.held_credit != 0 || !credit.one_larger_alone)) break;
    credit.unpromoted.pop_front();
    lease.held = true;
    credit.held_credit += lease.credit;
    stats.held_high_water = std::max(stats.held_high_water, credit.held_credit);
    release(lease.credit, true);
  }
}

}  // namespace blobpipe::detail
