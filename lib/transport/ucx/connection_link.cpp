// What the rendezvous adds to a connection (connection.hpp): the am_verify
// exchange that proves two endpoints paired, and the rendezvous socket kept
// as the link whose end says the peer went.
#include <array>

#include <asio/error.hpp>

#include "lib/transport/ucx/connection.hpp"
#include "lib/transport/ucx/runtime.hpp"
#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx::detail {

asio::awaitable<std::error_code> connection::send_verify(const nonce& n) {
  auto self = shared_from_this();
  if (closed_by_us_ || link_ != link::open || peer_gone()) co_return gone_code();
  request_slot slot(rt_->executor(), &inflight_);
  ucp_request_param_t p{};
  slot.bind_send(p);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the listener checks which endpoint it came on
  // The header stays in this frame until the send completes (UCX 1.13 has
  // no flag to copy it).
  slot.start(ucp_am_send_nbx(ep_.get(), am_verify, n.data(), n.size(), nullptr, 0, &p));
  rt_->progress_now();
  if (slot.pending()) {
    if (co_await slot.wait([this] { close(); })) co_return make_error_code(errc::closed);
  }
  if (slot.status() != UCS_OK) co_return fail(slot.status(), "send verify");
  co_return std::error_code{};
}

void connection::on_verify(ucp_ep_h reply_ep) noexcept {
  if (verify_ != verify_state::waiting) return;
  verify_ = reply_ep == ep_key_ ? verify_state::on_this_endpoint : verify_state::on_another;
  rx_ready_.notify_all();
}

asio::awaitable<bool> connection::wait_verified() {
  auto self = shared_from_this();
  while (verify_ == verify_state::waiting && !closed_by_us_ && !peer_gone()) {
    if (co_await rx_ready_.wait()) co_return false;
  }
  co_return verify_ == verify_state::on_this_endpoint && !closed_by_us_ && !peer_gone();
}

void connection::close_now() noexcept {
  if (closed_by_us_) return;
  closed_by_us_ = true;
  drop_received();
  rx_ready_.notify_all();
  if (link_ != link::open) return;
  if (!ep_) {
    link_ = link::released;
    close_link();
    return;
  }
  close_endpoint(true);
  rt_->hold_for(failed_wireup_linger);
}

void connection::attach_link(asio::ip::tcp::socket s) {
  link_sock_.emplace(std::move(s));
  watch_link();
}

void connection::watch_link() {
  // The buffer belongs to the read (shared): a connection destroyed with
  // the read pending leaves it to the cancelled operation.
  auto byte = std::make_shared<std::array<char, 1>>();
  link_sock_->async_read_some(asio::buffer(*byte),
                              [weak = weak_from_this(), byte](std::error_code ec, std::size_t) {
                                if (auto self = weak.lock()) self->on_link_lost(ec);
                              });
}

void connection::on_link_lost(std::error_code ec) {
  // Closed by us (operation_aborted), or the peer's goodbye came first: an
  // orderly end, already being handled.
  if (ec == asio::error::operation_aborted || closed_by_us_ || peer_goodbye_ ||
      link_ == link::released)
    return;
  if (peer_error_ == UCS_OK) {
    peer_error_ = UCS_ERR_CONNECTION_RESET;
    if (error_text_.empty())
      error_text_ = ec ? "the peer's rendezvous link ended: " + ec.message()
                       : std::string("the peer wrote on its rendezvous link (a protocol violation)");
  }
  rx_ready_.notify_all();
  close_endpoint(true);
}

void connection::close_link() noexcept {
  if (!link_sock_) return;
  std::error_code ignored;
  link_sock_->close(ignored);
}

}  // namespace blobpipe::ucx::detail
