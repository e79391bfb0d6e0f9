#include "lib/pipeline/send_queue.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include <asio/error.hpp>

namespace blobpipe::detail {

send_queue::send_queue(std::shared_ptr<transport> t, std::size_t max_queued_bytes)
    : t_(std::move(t)),
      max_queued_bytes_(max_queued_bytes),
      work_cv_(t_->get_executor()),
      wrote_cv_(t_->get_executor()),
      room_cv_(t_->get_executor()),
      writer_(t_->get_executor()) {}

void send_queue::start(std::function<void(std::error_code)> on_write_failed) {
  on_write_failed_ = std::move(on_write_failed);
  writer_.spawn(run(shared_from_this()));
}

void send_queue::kick() noexcept {
  copied_high_water_ =
      std::max(copied_high_water_, front_.copied_bytes() + back_.copied_bytes());
  if (writer_idle_) {
    writer_idle_ = false;
    work_cv_.notify_all();
  }
}

void send_queue::release_link() noexcept {
  if (error_ && writer_.running() == 0) t_.reset();
}

void send_queue::fail(std::error_code ec) noexcept {
  if (!error_) error_ = ec;
  if (t_) t_->close();
  work_cv_.notify_all();
  wrote_cv_.notify_all();
  room_cv_.notify_all();
}

// (No co_await inside a condition in these loops: GCC 12 miscompiles
// some of those coroutines into a trap.)
asio::awaitable<std::error_code> send_queue::wait_written(std::uint64_t ticket) {
  while (written_ < ticket && !error_) {
    const bool cancelled = co_await wrote_cv_.wait();
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  co_return written_ >= ticket ? std::error_code{} : error_;
}

asio::awaitable<void> send_queue::frames_released(std::uint64_t ticket) {
  // The writer notifies wrote_cv_ when written_ advances, and fail() when
  // the queue fails and when a write ends after that.
  while (written_ < ticket && (!error_ || writing_))
    co_await wrote_cv_.wait_ignoring_cancellation();
}

asio::awaitable<std::error_code> send_queue::room() {
  while (full() && !error_) {
    room_waited_ = true;
    const bool cancelled = co_await room_cv_.wait();
    if (cancelled) co_return std::error_code(asio::error::operation_aborted);
  }
  co_return error_;
}

// `self` keeps the queue alive for as long as the writer runs.
asio::awaitable<void> send_queue::run([[maybe_unused]] std::shared_ptr<send_queue> self) {
  // The writer ends when the queue failed, having cleared writing_ and
  // notified wrote_cv_ after its last write. Should a write throw
  // (bad_alloc), the same holds: the queue fails, so a producer in
  // frames_released() or wait_written() goes on.
  struct on_throw {
    send_queue& q;
    ~on_throw() {
      if (std::uncaught_exceptions() == 0) return;
      q.writing_ = false;
      if (!q.error_) q.fail(make_error_code(errc::closed));
      q.wrote_cv_.notify_all();
    }
  } ended{*this};
  for (;;) {
    if (error_) break;
    if (front_.empty()) {
      writer_idle_ = true;
      (void)co_await work_cv_.wait();
      continue;
    }
    std::swap(front_, back_);
    taken_ += back_.size();
    // Producers held back by room() frame into the emptied outbox while
    // this write is in flight. Waking them only once it completed made
    // them and an in-process reader take turns (docs/performance.md
    // "In process against TCP").
    if (std::exchange(room_waited_, false)) room_cv_.notify_all();
    const std::uint64_t end = taken_;
    writing_ = true;
    const std::error_code ec = co_await write_out(back_);
    writing_ = false;
    back_.clear();
    if (ec) {
      fail(ec);
      if (on_write_failed_) on_write_failed_(error_);
      break;
    }
    written_ = end;
    wrote_cv_.notify_all();
  }
}

asio::awaitable<std::error_code> send_queue::write_out(const outbox& o) {
  // Byte streams: everything in one gather write. Message transports
  // (UCX): runs of frames as messages of at most max_write_bytes, and
  // each bulk payload as a message of its own with its frame header, up
  // to write_window() of them in flight; all have ended when this returns
  // (the outbox and the values it points at are reused after).
  std::error_code ec = co_await write_pieces(o);
  // Failed: the sends still in flight end with the transport, not when
  // the peer gets round to fetching them.
  if (ec && !bulk_in_flight_.empty()) t_->close();
  while (!bulk_in_flight_.empty()) {
    const std::error_code ended = co_await bulk_in_flight_.front().wait();
    if (!ec) ec = ended;
    bulk_in_flight_.pop_front();
  }
  bulk_payloads_.clear();
  co_return ec;
}

asio::awaitable<std::error_code> send_queue::write_pieces(const outbox& o) {
  const bool split_bulk = t_->sends_bulk();
  const std::size_t window = split_bulk ? std::max<std::size_t>(t_->write_window(), 1) : 1;
  const std::size_t max_write = split_bulk ? t_->max_write_bytes() : SIZE_MAX;
  gather_.clear();
  gathered_ = 0;
  const auto pieces = o.pieces();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    auto bytes = pieces[i].bytes(o);
    // A bulk payload's frame header ends the piece before it. Device
    // memory always goes as a bulk payload (write_bulk_device), never
    // through write(), which reads host memory.
    const bool header_of_bulk = i + 1 < pieces.size() && !pieces[i].external &&
                                ((split_bulk && pieces[i + 1].bulk) || pieces[i + 1].device >= 0);
    if (header_of_bulk) bytes = bytes.first(bytes.size() - frame_header_size);
    while (!bytes.empty()) {
      const std::size_t n = std::min(bytes.size(), max_write - gathered_);
      gather_.emplace_back(bytes.data(), n);
      gathered_ += n;
      bytes = bytes.subspan(n);
      if (gathered_ == max_write) {
        const std::error_code ec = co_await flush();
        if (ec) co_return ec;
      }
    }
    if (header_of_bulk) {
      const std::error_code flushed = co_await flush();
      if (flushed) co_return flushed;
      const auto full = pieces[i].bytes(o);
      const auto header = full.last(frame_header_size);
      const auto payload = pieces[i + 1].bytes(o);
      const asio::const_buffer& data = bulk_payloads_.emplace_back(payload.data(), payload.size());
      if (pieces[i + 1].device >= 0) {
        const std::error_code ec =
            co_await t_->write_bulk_device(header, std::span(&data, 1), pieces[i + 1].device);
        if (ec) co_return ec;
      } else {
        // A full window waits for its oldest: with a window of 1 (a
        // transport whose write starts in wait()) that is this write, so
        // nothing written after it can pass it.
        bulk_in_flight_.push_back(t_->post_write_bulk(header, std::span(&data, 1)));
        if (bulk_in_flight_.size() >= window) {
          const std::error_code ec = co_await bulk_in_flight_.front().wait();
          bulk_in_flight_.pop_front();
          if (ec) co_return ec;
        }
      }
      ++i;  // the payload went with its header
    }
  }
  co_return co_await flush();
}

asio::awaitable<std::error_code> send_queue::flush() {
  if (gather_.empty()) co_return std::error_code{};
  auto ec = co_await t_->write(gather_);
  gather_.clear();
  gathered_ = 0;
  co_return ec;
}

}  // namespace blobpipe::detail
