// Copies on a staging ring's stream, awaited on an executor (internal).
//
// Each copy is numbered (1, 2, ... in issue order); the stream runs them in
// that order. After each copy a host function (cudaLaunchHostFunc) posts
// "one more done" to the executor, so a coroutine waiting for copy n
// sleeps on a condition (lib/runtime) and no thread blocks. CUDA does not call host
// functions once a stream has failed, so the wait also wakes on a slow
// timer (poll_interval) and asks the stream (cudaStreamQuery) whether it
// failed: an error can never leave a waiter asleep.
//
//   copy_queue q(ex, std::move(lease));
//   auto n = q.issue(q.slot(0), dev_ptr, bytes).value();   // device -> pinned
//   if (auto r = co_await q.wait(n); !r) ...               // slot 0 is ready
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/errors.hpp"
#include "lib/cuda/staging.hpp"

namespace blobpipe::detail {

struct copy_progress;

class copy_queue {
 public:
  /// How often a waiter checks the stream for a failure (host functions
  /// report success promptly; this only bounds how long an error takes).
  static constexpr std::chrono::milliseconds poll_interval{20};

  copy_queue(asio::any_io_executor ex, cuda::ring_lease ring);
  copy_queue(const copy_queue&) = delete;
  copy_queue& operator=(const copy_queue&) = delete;
  /// Waits for the stream (cudaStreamSynchronize): the slots and the
  /// copies' sources and destinations must outlive the copies. Blocks the
  /// calling thread for at most the copies still queued.
  ~copy_queue();

  cuda::staging_ring& ring() const noexcept { return *ring_; }
  std::byte* slot(std::size_t i) const noexcept { return ring_->slot(i); }

  /// Queues a copy of `n` bytes (cudaMemcpyAsync, cudaMemcpyDefault) and
  /// the host function that reports it. Returns its number.
  /// Errors: cuda_failure.
  [[nodiscard]] result<std::uint64_t> issue(void* dst, const void* src, std::size_t n);

  /// Waits until copies 1..n are done. Errors: cuda_failure (the stream
  /// failed; the message is CUDA's). REQUIRES: no other wait() pending on
  /// this queue (one timer serves one waiter).
  asio::awaitable<result<void>> wait(std::uint64_t n);

  std::uint64_t issued() const noexcept { return issued_; }
  std::uint64_t completed() const noexcept;

 private:
  cuda::ring_lease ring_;
  std::shared_ptr<copy_progress> progress_;
  std::uint64_t issued_ = 0;
};

}  // namespace blobpipe::detail
