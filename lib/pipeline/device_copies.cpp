#include "lib/pipeline/device_copies.hpp"

#include <asio/post.hpp>

#include "lib/runtime/async_sync.hpp"

namespace blobpipe::detail {

// Shared with the host functions' posts, which may run after the queue is
// gone (they hold it by shared_ptr). `done` and `wake` are touched only on
// the executor; the CUDA thread reads only `ex`, which never changes.
struct copy_progress : std::enable_shared_from_this<copy_progress> {
  explicit copy_progress(asio::any_io_executor e) : ex(std::move(e)), wake(ex) {}
  const asio::any_io_executor ex;
  std::uint64_t done = 0;
  async_condition wake;
};

namespace {

/// Runs on a CUDA thread after each copy: no CUDA calls here, only a post.
/// The queue synchronises its stream before it lets `progress` go, so the
/// raw pointer is alive whenever CUDA calls this.
void on_copy_done(void* user) {
  auto* p = static_cast<copy_progress*>(user);
  asio::post(p->ex, [sp = p->shared_from_this()] {
    ++sp->done;
    sp->wake.notify_all();
  });
}

}  // namespace

copy_queue::copy_queue(asio::any_io_executor ex, cuda::ring_lease ring)
    : ring_(std::move(ring)), progress_(std::make_shared<copy_progress>(std::move(ex))) {}

copy_queue::~copy_queue() {
  if (ring_) (void)ring_->get_stream().synchronize();
}

std::uint64_t copy_queue::completed() const noexcept { return progress_->done; }

result<std::uint64_t> copy_queue::issue(void* dst, const void* src, std::size_t n) {
  auto& s = ring_->get_stream();
  if (auto r = s.copy_async(dst, src, n); !r) return r.err();
  if (auto r = s.launch_host_func(&on_copy_done, progress_.get()); !r) return r.err();
  return ++issued_;
}

asio::awaitable<result<void>> copy_queue::wait(std::uint64_t n) {
  auto p = progress_;
  while (p->done < n) {
    (void)co_await p->wake.wait_for(poll_interval);
    if (p->done >= n) break;
    // No news: has the stream failed (its host functions will never run)?
    auto q = ring_->get_stream().query();
    if (!q) co_return q.err();
  }
  co_return result<void>{};
}

}  // namespace blobpipe::detail
