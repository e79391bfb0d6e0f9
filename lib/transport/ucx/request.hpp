// Awaiting one UCX request from a coroutine.
//
// A request_slot lives in the frame of the coroutine that started the
// operation, beside the buffers the operation uses. UCX's completion
// callback reaches the slot through `user_data`, records the status, frees
// the request and wakes the coroutine by cancelling a timer that never
// expires on its own (as lib/runtime/async_sync.hpp does). The coroutine
// therefore resumes from the executor's queue, never inside
// ucp_worker_progress, where calling back into UCX is not allowed.
//
//   request_slot slot(ex, inflight);
//   ucp_request_param_t p{};
//   slot.bind_send(p);
//   slot.start(ucp_am_send_nbx(ep, id, hdr, n, buf, len, &p));
//   co_await slot.wait([&] { transport.close(); });
//   if (slot.status() != UCS_OK) ...
//
// A slot on an endpoint sits in that endpoint's slot_list while pending,
// so the endpoint can abandon it once UCX has released the endpoint and
// will never call back.
#pragma once

#include <cstddef>
#include <functional>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <ucp/api/ucp.h>

namespace blobpipe::ucx::detail {

class request_slot;

/// The pending slots of one endpoint (intrusive, unordered).
class slot_list {
 public:
  slot_list() = default;
  slot_list(const slot_list&) = delete;
  slot_list& operator=(const slot_list&) = delete;
  bool empty() const noexcept { return head_ == nullptr; }
  /// Abandons every slot still listed (see request_slot::abandon).
  void abandon_all() noexcept;

 private:
  friend class request_slot;
  void push(request_slot* s) noexcept;
  void erase(request_slot* s) noexcept;
  request_slot* head_ = nullptr;
};

class request_slot {
 public:
  /// `list` (may be null) is where the slot waits while pending.
  request_slot(const asio::any_io_executor& ex, slot_list* list);
  /// A slot destroyed while pending (its coroutine frame was destroyed)
  /// abandons the request, so a later callback cannot touch freed memory.
  ~request_slot();
  request_slot(const request_slot&) = delete;
  request_slot& operator=(const request_slot&) = delete;

  /// Sets callback (send / flush / close signature) and user_data in `p`.
  void bind_send(ucp_request_param_t& p) noexcept;
  /// Sets callback (ucp_am_recv_data_nbx signature) and user_data in `p`.
  void bind_recv(ucp_request_param_t& p) noexcept;

  /// Takes what the *_nbx call returned (sorted by sort_status): done or
  /// failed sets the status now; a request makes the slot pending.
  void start(ucs_status_ptr_t p) noexcept;

  bool pending() const noexcept { return request_ != nullptr; }
  ucs_status_t status() const noexcept { return status_; }
  std::size_t length() const noexcept { return length_; }

  /// Waits until the request completes or is abandoned. When the waiting
  /// coroutine is cancelled first, `on_cancel` runs once (it must make UCX
  /// finish the request, e.g. by force-closing the endpoint) and the wait
  /// goes on: the request may still be using the caller's buffers.
  /// Returns true when a cancellation was seen.
  asio::awaitable<bool> wait(const std::function<void()>& on_cancel);

  /// Detaches from a request UCX will no longer complete (its endpoint is
  /// closed): ucp_request_free, status UCS_ERR_CANCELED, waiter woken.
  void abandon() noexcept;

 private:
  friend class slot_list;
  static void on_send(void* request, ucs_status_t st, void* user_data);
  static void on_recv(void* request, ucs_status_t st, std::size_t length, void* user_data);
  void complete(void* request, ucs_status_t st, std::size_t length) noexcept;

  asio::steady_timer wake_;
  slot_list* list_;
  void* request_ = nullptr;
  bool completed_ = false;  // the callback ran (possibly before start())
  ucs_status_t status_ = UCS_INPROGRESS;
  std::size_t length_ = 0;
  request_slot* next_ = nullptr;
  request_slot* prev_ = nullptr;
};

}  // namespace blobpipe::ucx::detail
