// The consumer's side of the optional wire features (docs/wire_features.md):
// which it accepts, blob groups on its events, and credit grants from a
// shared pool (blobpipe/pipeline/credit_pool.hpp) in place of its own window.
#include "lib/pipeline/consumer_state.hpp"

namespace blobpipe::detail {

std::uint64_t consumer_state::negotiate_features(const hello& h, decoder_limits& l) {
  std::uint64_t accept = opt.accept_features & (feature_entry_timestamps | feature_blob_groups);
  if (opt.pool) accept |= feature_credit_grants;
  features = h.features & accept & known_features;
  l.features = features;
  if (!(features & feature_credit_grants)) return l.window_bytes = opt.window_bytes;
  // The pool's: each grant raises the decoder's window (grant()), each
  // release lowers it (decoder::release) and goes to the pool.
  auto [id, first] = opt.pool->join(
      [w = weak_from_this()](std::uint64_t credit) {
        if (auto s = w.lock()) s->grant(credit);
      },
      [w = weak_from_this()]() -> std::uint64_t {
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

bool consumer_state::pool_released(std::uint64_t credit) noexcept {
  if (pool_member == 0) return false;
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
  if (pool_member != 0) opt.pool->request(pool_member, credit);
  return {};
}

}  // namespace blobpipe::detail
