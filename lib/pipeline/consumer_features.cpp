// The consumer's side of the optional wire features (docs/wire_features.md):
// which it accepts, blob groups on its events, and credit grants from a
// shared pool (blobpipe/pipeline/credit_pool.hpp) in place of its own window.
#include "lib/pipeline/consumer_state.hpp"

#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>

namespace blobpipe::detail {
namespace {

/// Whether this thread runs `ex` now (io_context executors and strands of
/// them; false for any other kind).
bool on_own_thread(const asio::any_io_executor& ex) noexcept {
  using io_executor = asio::io_context::executor_type;
  if (auto* io = ex.target<io_executor>()) return io->running_in_this_thread();
  if (auto* st = ex.target<asio::strand<io_executor>>()) return st->running_in_this_thread();
  return false;
}

}  // namespace

std::uint64_t consumer_state::negotiate_features(const hello& h, decoder_limits& l) {
  std::uint64_t accept = opt.accept_features & (feature_entry_timestamps | feature_blob_groups);
  if (opt.pool) accept |= feature_credit_grants;
  features = h.features & accept & known_features;
  l.features = features;
  if (!(features & feature_credit_grants)) return l.window_bytes = opt.window_bytes;
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
      [w = weak_from_this(), ex = ex, seen = buffered_published]() -> std::uint64_t {
        if (!on_own_thread(ex)) return seen->load(std::memory_order_relaxed);
        auto s = w.lock();
        return s ? s->frames.buffered_bytes() : 0;
      });
  pool_member = id;
  // Credit others wait for and this sender does not use ends it after
  // stall_timeout (credit_pool::pressed).
  stall_watch.pressure([w = weak_from_this()] {
    auto s = w.lock();
    return s && s->pool_member != 0 && s->opt.pool->pressed(s->pool_member);
  });
  return l.window_bytes = first;
}

void consumer_state::grant(std::uint64_t credit) noexcept {
  frames.grant(credit);
  credit_wanted -= std::min(credit, credit_wanted);
  update_watch();
  if (ack_stopped) return;
  pending_ack += credit;
  if (!std::exchange(ack_due, true)) ack_cv.notify_all();
}

void consumer_state::publish_buffered() noexcept {
  buffered_published->store(frames.buffered_bytes(), std::memory_order_relaxed);
}

bool consumer_state::pool_released(std::uint64_t credit) noexcept {
  if (pool_member == 0) return false;
  publish_buffered();
  if (credit != 0) opt.pool->released(pool_member, credit);
  return true;
}

result<void> consumer_state::on_blob_group(void* blob, std::uint64_t, const blob_group& g) {
  static_cast<sink_blob*>(blob)->group = g;
  return {};
}

result<void> consumer_state::on_credit_request(std::uint64_t credit) {
  ++stats.credit_requests;
  // What the sender waits for (its waiting items' total): until granted,
  // a silence is not its fault (update_watch).
  credit_wanted = credit;
  if (pool_member == 0) return {};
  publish_buffered();
  opt.pool->request(pool_member, credit);
  return {};
}

}  // namespace blobpipe::detail
