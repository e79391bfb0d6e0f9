// The consumer's ack writer (ack_writer in consumer_state.hpp; docs/wire.md
// "Delivery", "Flow control", "Closing"): what the session owes the sender
// (credit released, blobs delivered) flows back from a coroutine of its
// own, coalesced, as the application releases entries; the session's close
// frame goes last.
#include <utility>

#include "lib/pipeline/consumer_state.hpp"

namespace blobpipe::detail {

asio::awaitable<void> ack_loop(std::shared_ptr<consumer_state> s) {
  consumer_session& session = s->session;
  outbox& out = session.out();
  while (!session.acks_stopped()) {
    if (!session.acks_due()) {
      const bool cancelled = co_await s->acker.cv.wait();
      if (cancelled) break;
      continue;
    }
    out.clear();
    session.frame_acks();
    const std::error_code ec = co_await write_frames(*s->t, out);
    if (ec) break;
  }
  if (!session.refusal()) co_return;
  // The consumer refuses the stream: its reason goes last, then the
  // connection closes (close_bound closes it should this write hang).
  out.clear();
  session.frame_close();
  (void)co_await write_frames(*s->t, out);
  s->t->close();
}

}  // namespace blobpipe::detail
