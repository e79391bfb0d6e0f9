// The consumer's delivery log and acker (delivery_acks in
// consumer_state.hpp; docs/wire.md "Delivery", "Flow control"): credit
// released and blobs delivered flow back to the sender from a coroutine
// of their own, coalesced, as the application releases entries.
#include <utility>

#include "lib/pipeline/consumer_state.hpp"

namespace blobpipe::detail {

void delivery_acks::delivered(const tag_t& tag, std::uint64_t blob_id) {
  if (session == NO_SESSION || stopped) return;
  log->record(session, tag);
  acknowledge(blob_id);
}

asio::awaitable<void> ack_loop(std::shared_ptr<consumer_state> s) {
  delivery_acks& a = s->acks;
  outbox out;
  while (!a.stopped) {
    if (a.pending_ack == 0 && a.delivered_ids.empty()) {
      a.due = false;
      const bool cancelled = co_await a.cv.wait();
      if (cancelled) break;
      continue;
    }
    out.clear();
    std::uint64_t credit = std::exchange(a.pending_ack, 0);
    do {
      std::uint64_t id = 0;
      if (!a.delivered_ids.empty()) {
        id = a.delivered_ids.front();
        a.delivered_ids.pop_front();
      }
      frame_ack(out, std::exchange(credit, 0), id);
      ++s->stats.acks_sent;
    } while (!a.delivered_ids.empty());
    a.due = false;
    const std::error_code ec = co_await write_frames(*s->t, out);
    if (ec) break;
  }
  if (!a.close_reason) co_return;
  // The consumer refuses the stream: its reason goes last, then the
  // connection closes (close_bound closes it should this write hang).
  out.clear();
  frame_close(out, *a.close_reason);
  (void)co_await write_frames(*s->t, out);
  s->t->close();
}

}  // namespace blobpipe::detail
