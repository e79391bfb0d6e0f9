// One connection's outgoing frames (internal): producers frame into an
// outbox (blobpipe/protocol/framer.hpp) and return; one writer coroutine
// hands everything queued to the transport in one write while producers
// keep framing into a second outbox (write combining: no timer, so a lone
// frame goes out at once, and frames that pile up during a write go out
// together in the next). docs/wire.md "Sender".
//
//   frame_blob_begin(q->frames(), id, tag);
//   q->kick();                                  // the writer takes it
//   auto ec = co_await q->wait_written(q->ticket());   // zero-copy frames
//
// A ticket names everything framed so far (bytes queued since the queue
// began); wait_written(t) completes once the transport took all of it, so
// memory referenced by external pieces (outbox::append_external) may be
// reused afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

#include <asio/awaitable.hpp>

#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/transport/transport.hpp"
#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/task_group.hpp"

namespace blobpipe::detail {

class send_queue : public std::enable_shared_from_this<send_queue> {
 public:
  /// `max_queued_bytes`: copied bytes queued beyond which room() waits.
  send_queue(std::shared_ptr<transport> t, std::size_t max_queued_bytes);

  /// Starts the writer coroutine on the transport's executor.
  /// `on_write_failed` is called once if a write fails (the queue has
  /// failed by then), so the owner learns it without waiting on the queue.
  void start(std::function<void(std::error_code)> on_write_failed = {});

  /// Where producers append frames; call kick() afterwards.
  outbox& frames() noexcept { return front_; }
  /// Wakes the writer if it waits for frames.
  void kick() noexcept;

  /// Everything framed so far (see the file comment).
  std::uint64_t ticket() const noexcept { return taken_ + front_.size(); }
  /// Completes once the transport took every byte up to `ticket`.
  /// Errors: the connection's error; operation_aborted when the awaiting
  /// coroutine was cancelled (the frames stay queued).
  asio::awaitable<std::error_code> wait_written(std::uint64_t ticket);
  /// Completes once no byte of the frames up to `ticket` is read any
  /// more: the transport took them, or the queue failed and no write is in
  /// flight (a failed queue writes nothing more, and the sends it had in
  /// flight end with the transport it closed). A producer whose chunks
  /// are queued waits here, whatever ended its wait (the queue failed, it
  /// was cancelled), before its memory may go. The caller's cancellation
  /// does not end the wait.
  /// REQUIRES: asio::this_coro::throw_if_cancelled is off.
  asio::awaitable<void> frames_released(std::uint64_t ticket);
  /// Whether room() would wait.
  bool full() const noexcept { return front_.copied_bytes() > max_queued_bytes_; }
  /// The most copied bytes held at once (framed and not yet written: the
  /// producers' outbox and the one being written), bytes; updated at each
  /// kick().
  std::size_t copied_high_water() const noexcept { return copied_high_water_; }
  /// Waits while more than max_queued_bytes copied bytes wait for the
  /// writer (backpressure on producers whose entries are copied). It ends
  /// when the writer takes them, not when their write completes, so
  /// producers frame the next batch while one is written (at most twice
  /// max_queued_bytes copied bytes are held).
  asio::awaitable<std::error_code> room();

  /// Ends the queue: the transport is closed, every waiter wakes with `ec`.
  void fail(std::error_code ec) noexcept;
  /// Drops the transport once the queue has failed and its writer has
  /// ended (or never ran), so a failed sender holds no closed transport
  /// (its memory, a UCX endpoint's). No-op otherwise. link() must not be
  /// used after it (error() is set: every caller checks it first).
  void release_link() noexcept;
  std::error_code error() const noexcept { return error_; }
  /// Whether the transport took every byte up to `ticket` (the writer
  /// recorded it), failed since or not.
  bool wrote(std::uint64_t ticket) const noexcept { return written_ >= ticket; }
  /// Completes once the writer (run) has ended: after fail(), at once or
  /// when its write in flight ends (fail closed the transport). Run on
  /// the transport's executor; one joiner at a time.
  asio::awaitable<void> join_writer() { co_await writer_.join(); }
  /// 1 while the writer runs, else 0.
  std::size_t writer_running() const noexcept { return writer_.running(); }
  transport& link() noexcept { return *t_; }
  const std::shared_ptr<transport>& link_ptr() const noexcept { return t_; }

 private:
  asio::awaitable<void> run(std::shared_ptr<send_queue> self);
  asio::awaitable<std::error_code> write_out(const outbox& o);
  asio::awaitable<std::error_code> write_pieces(const outbox& o);  // write_out's loop
  asio::awaitable<std::error_code> flush();  // writes gather_

  std::shared_ptr<transport> t_;
  std::function<void(std::error_code)> on_write_failed_;
  std::size_t max_queued_bytes_;
  outbox front_;  // producers append here
  outbox back_;   // the writer's, while it writes
  std::uint64_t taken_ = 0;    // bytes the writer has taken from front_
  std::uint64_t written_ = 0;  // bytes the transport has taken
  bool writer_idle_ = false;
  bool writing_ = false;  // the writer is in write_out (frames_released)
  std::error_code error_;
  async_condition work_cv_;   // the writer waits for frames
  async_condition wrote_cv_;  // written_ advanced, or the queue failed
  async_condition room_cv_;   // the writer took front_, or the queue failed
  task_group writer_;         // run(): ends when the queue fails or closes
  bool room_waited_ = false;  // a producer waits on room_cv_
  std::vector<asio::const_buffer> gather_;  // the writer's scratch list
  std::size_t gathered_ = 0;                // bytes in gather_
  /// The buffer each bulk payload's array points at (a deque: stable),
  /// and the bulk payloads started by write_out (post_write_bulk) and not
  /// yet waited for, oldest first, at most the transport's write_window()
  /// (declared last: destroyed first, before what they point at).
  std::deque<asio::const_buffer> bulk_payloads_;
  std::deque<payload_receipt> bulk_in_flight_;
  std::size_t copied_high_water_ = 0;       // copied_high_water()
};

}  // namespace blobpipe::detail
