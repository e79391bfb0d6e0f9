#include "lib/transport/ucx/request.hpp"

#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx::detail {

void slot_list::push(request_slot* s) noexcept {
  s->prev_ = nullptr;
  s->next_ = head_;
  if (head_) head_->prev_ = s;
  head_ = s;
}

void slot_list::erase(request_slot* s) noexcept {
  if (s->prev_)
    s->prev_->next_ = s->next_;
  else if (head_ == s)
    head_ = s->next_;
  if (s->next_) s->next_->prev_ = s->prev_;
  s->next_ = s->prev_ = nullptr;
}

void slot_list::abandon_all() noexcept {
  while (head_) head_->abandon();  // abandon() unlinks
}

request_slot::request_slot(const asio::any_io_executor& ex, slot_list* list)
    : wake_(ex), list_(list) {
  wake_.expires_at(asio::steady_timer::time_point::max());
}

request_slot::~request_slot() {
  if (pending()) abandon();
}

void request_slot::bind_send(ucp_request_param_t& p) noexcept {
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &request_slot::on_send;
  p.user_data = this;
}

void request_slot::bind_recv(ucp_request_param_t& p) noexcept {
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &request_slot::on_recv;
  p.user_data = this;
}

void request_slot::start(ucs_status_ptr_t p) noexcept {
  auto s = sort_status(p);
  if (s.what != status_kind::pending) {
    status_ = s.status;
    return;
  }
  if (completed_) return;  // the callback already ran and freed it
  request_ = s.request;
  if (list_) list_->push(this);
}

void request_slot::on_send(void* request, ucs_status_t st, void* user_data) {
  static_cast<request_slot*>(user_data)->complete(request, st, 0);
}

void request_slot::on_recv(void* request, ucs_status_t st, std::size_t length, void* user_data) {
  static_cast<request_slot*>(user_data)->complete(request, st, length);
}

void request_slot::complete(void* request, ucs_status_t st, std::size_t length) noexcept {
  // Freeing inside the callback is allowed: UCX returns the request to its
  // pool once the callback has returned.
  ucp_request_free(request);
  completed_ = true;
  status_ = st;
  length_ = length;
  if (request_ != nullptr) {
    request_ = nullptr;
    if (list_) list_->erase(this);
  }
  wake_.cancel();
}

void request_slot::abandon() noexcept {
  if (!pending()) return;
  // No callback comes after ucp_request_free.
  ucp_request_free(request_);
  request_ = nullptr;
  if (list_) list_->erase(this);
  completed_ = true;
  status_ = UCS_ERR_CANCELED;
  wake_.cancel();
}

asio::awaitable<bool> request_slot::wait(const std::function<void()>& on_cancel) {
  constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
  bool cancelled = false;
  while (pending()) {
    co_await wake_.async_wait(use_tuple);
    if (!pending()) break;
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() == asio::cancellation_type::none) continue;  // spurious wake
    // The buffers stay in use until UCX lets go of them, so cancelling
    // cannot simply return: make UCX finish, then keep waiting. Resetting
    // the state keeps the next co_await from throwing operation_aborted.
    co_await asio::this_coro::reset_cancellation_state();
    if (!cancelled) {
      cancelled = true;
      on_cancel();
    }
  }
  co_return cancelled;
}

}  // namespace blobpipe::ucx::detail
