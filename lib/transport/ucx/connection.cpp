#include "lib/transport/ucx/connection.hpp"

#include <algorithm>
#include <cstring>

#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include "lib/transport/ucx/runtime.hpp"
#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx::detail {

std::shared_ptr<connection> connection::make(runtime& rt, transport_options opt) {
  return std::make_shared<connection>(passkey{}, rt, opt);
}

connection::connection(passkey, runtime& rt, transport_options opt)
    : rt_(&rt), opt_(opt), rx_ready_(rt.executor()) {}

connection::~connection() {
  drop_received();
  inflight_.abandon_all();
  if (close_req_) ucp_request_free(close_req_);
  if (ep_key_) rt_->detach(ep_key_, this);
  // ep_ (if still held) is force-closed by its destructor.
}

void connection::attach(ucp_ep_h ep) {
  ep_ = endpoint(ep);
  ep_key_ = ep;
  rt_->attach(ep, this);
}

template <class F>
void connection::post_self(F f) {
  asio::post(rt_->executor(), [weak = weak_from_this(), f = std::move(f)]() mutable {
    if (auto self = weak.lock()) f(*self);
  });
}

// ---- state -----------------------------------------------------------------

bool connection::peer_gone() const noexcept {
  return peer_goodbye_ || peer_error_ != UCS_OK || link_ == link::released;
}

std::error_code connection::gone_code() const noexcept {
  if (closed_by_us_) return make_error_code(errc::closed);
  if (peer_goodbye_) return make_error_code(errc::peer_closed);
  return make_error_code(errc::peer_failed);
}

std::error_code connection::fail(ucs_status_t st, const char* what) {
  if (!closed_by_us_ && !peer_goodbye_ && error_text_.empty())
    error_text_ = status_message(what, st);
  return gone_code();
}

bool connection::is_open() const noexcept {
  return !closed_by_us_ && link_ == link::open && !peer_gone();
}

void connection::release(incoming& f) noexcept {
  if (f.data) ucp_am_data_release(rt_->worker(), std::exchange(f.data, nullptr));
}

void connection::drop_received() noexcept {
  for (auto& f : rx_) release(f);
  rx_.clear();
  if (current_) release(*current_);
  current_.reset();
}

// ---- sending ---------------------------------------------------------------

asio::awaitable<std::error_code> connection::send(std::span<const std::byte> header,
                                                  std::span<const asio::const_buffer> payload,
                                                  ucs_memory_type_t memory) {
  auto self = shared_from_this();
  posted_send ps = post_send(header, payload, memory);
  co_return co_await wait_send(ps);
}

connection::posted_send connection::post_send(std::span<const std::byte> header,
                                              std::span<const asio::const_buffer> payload,
                                              ucs_memory_type_t memory) {
  posted_send ps;
  if (closed_by_us_ || link_ != link::open || peer_gone()) {
    ps.ec = gone_code();
    return ps;
  }
  if (header.size() > max_bulk_header) {
    error_text_ = "write_bulk: header of " + std::to_string(header.size()) + " bytes (max 64)";
    ps.ec = make_error_code(errc::invalid_argument);
    return ps;
  }
  // The payload goes out of the caller's buffers: one buffer as contiguous
  // data, several as an iov (UCX reads header and iov array until
  // completion; `ps` keeps the array, the caller the rest).
  ps.iov.reserve(payload.size());
  for (const auto& b : payload)
    if (b.size() > 0) ps.iov.push_back({const_cast<void*>(b.data()), b.size()});

  ps.slot = std::make_unique<request_slot>(rt_->executor(), &inflight_);
  ucp_request_param_t p{};
  ps.slot->bind_send(p);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the receiver routes by its reply endpoint
  // Plain bytes (many small frames) go eagerly: the reader copies them out
  // of UCX's buffer; a rendezvous would cost a round trip per message.
  if (header.empty()) p.flags |= UCP_AM_SEND_FLAG_EAGER;
  if (memory != UCS_MEMORY_TYPE_HOST) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = memory;
  }
  const void* buffer = nullptr;
  std::size_t count = 0;
  if (ps.iov.size() == 1) {
    buffer = ps.iov[0].buffer;
    count = ps.iov[0].length;
  } else if (ps.iov.size() > 1) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    buffer = ps.iov.data();
    count = ps.iov.size();
  }
  ps.slot->start(ucp_am_send_nbx(ep_.get(), am_message, header.empty() ? nullptr : header.data(),
                                 header.size(), buffer, count, &p));
  // Progress now, from the caller (never inside a UCX callback), not after
  // another trip through the executor: a request UCX can finish at once
  // then needs no wake-up at all, and even a send done at once may have
  // left bytes queued inside UCX. Should it throw (bad_alloc), the send
  // ends first: UCX reads `ps.iov` until then.
  try {
    rt_->progress_now();
  } catch (...) {
    drop_send(ps);
    throw;
  }
  return ps;
}

asio::awaitable<std::error_code> connection::wait_send(posted_send& ps) {
  auto self = shared_from_this();
  if (!ps.slot) co_return ps.ec;
  if (ps.slot->pending()) {
    // A message cut off half way cannot be resumed: cancelling closes.
    if (co_await ps.slot->wait([this] { close(); })) co_return make_error_code(errc::closed);
  }
  const ucs_status_t st = ps.slot->status();
  ps.slot.reset();
  if (st != UCS_OK) co_return fail(st, "send");
  ++stats_.messages_sent;
  co_return std::error_code{};
}

void connection::drop_send(posted_send& ps) noexcept {
  // UCX may still read the caller's buffers: end the send first (close()
  // forces the endpoint closed while requests are in flight).
  if (ps.slot && ps.slot->pending()) close();
  ps.slot.reset();  // abandons the request if still pending
}

void connection::send_control(unsigned am_id, bool inside_progress) noexcept {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  auto s = sort_status(ucp_am_send_nbx(ep_.get(), am_id, nullptr, 0, nullptr, 0, &p));
  // Nobody waits for it: freeing the request lets UCX finish it alone.
  if (s.what == status_kind::pending) ucp_request_free(s.request);
  if (s.what == status_kind::failed && peer_error_ == UCS_OK) peer_error_ = s.status;
  if (!inside_progress) rt_->kick();
}

// ---- receiving -------------------------------------------------------------

ucs_status_t connection::on_message(std::span<const std::byte> header, void* data,
                                    std::size_t length, std::uint64_t recv_attr) {
  const bool rndv = (recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const bool persistent = (recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
  if (closed_by_us_ || link_ == link::released) return rndv ? UCS_ERR_CANCELED : UCS_OK;
  incoming f;
  f.header_length = header.size();
  f.header_too_long = header.size() > f.header.size();
  std::memcpy(f.header.data(), header.data(), std::min(header.size(), f.header.size()));
  f.length = length;
  f.rndv = rndv;
  if (rndv || (persistent && length > 0)) {
    f.data = data;
  } else if (length > 0) {
    // Not expected with UCP_AM_FLAG_PERSISTENT_DATA; `data` dies with this call.
    auto* p = static_cast<const std::byte*>(data);
    f.copy.assign(p, p + length);
  }
  const bool kept = f.data != nullptr;
  rx_.push_back(std::move(f));
  ++stats_.messages_received;
  rx_ready_.notify_all();
  return kept ? UCS_INPROGRESS : UCS_OK;
}

std::error_code connection::violation(std::string why) {
  error_text_ = std::move(why);
  close();
  return make_error_code(errc::protocol_violation);
}

asio::awaitable<std::tuple<std::error_code, transport::read_result>> connection::read_some(
    std::span<std::byte> buf) {
  using ret = std::tuple<std::error_code, transport::read_result>;
  auto self = shared_from_this();
  if (closed_by_us_) co_return ret{gone_code(), {}};
  if (current_ || buf.size() < max_bulk_header) {
    error_text_ = current_ ? "read_some: a bulk payload is pending (read_exact it first)"
                           : "read_some: buffer below 64 bytes";
    co_return ret{make_error_code(errc::invalid_argument), {}};
  }
  while (rx_.empty() && !closed_by_us_ && !peer_gone()) {
    if (co_await rx_ready_.wait())
      co_return ret{std::error_code(asio::error::operation_aborted), {}};
  }
  // Messages that arrived whole before the peer left are still delivered;
  // a rendezvous payload needs the peer, so nothing from it on can be.
  if (!closed_by_us_ && !rx_.empty() && rx_.front().rndv && link_ != link::open) drop_received();
  if (closed_by_us_ || rx_.empty()) co_return ret{gone_code(), {}};

  incoming& f = rx_.front();
  if (f.header_length == 0) {
    // Plain bytes: copied out; what does not fit stays for the next read.
    if (f.rndv) co_return ret{violation("plain bytes sent by rendezvous (expected eager)"), {}};
    const std::size_t n = std::min(buf.size(), f.length - f.offset);
    std::memcpy(buf.data(), f.bytes() + f.offset, n);
    f.offset += n;
    if (f.offset == f.length) {
      release(f);
      rx_.pop_front();
    }
    co_return ret{std::error_code{}, {n, 0}};
  }
  if (f.header_too_long)
    co_return ret{violation("bulk message header of " + std::to_string(f.header_length) +
                            " bytes (max 64)"),
                  {}};
  if (f.length > opt_.max_bulk_bytes)
    co_return ret{violation("bulk payload of " + std::to_string(f.length) +
                            " bytes exceeds max_bulk_bytes " +
                            std::to_string(opt_.max_bulk_bytes)),
                  {}};
  const std::size_t n = f.header_length;
  std::memcpy(buf.data(), f.header.data(), n);
  transport::read_result got{n, f.length};
  if (f.length == 0) {
    release(f);
  } else {
    current_ = std::move(f);
  }
  rx_.pop_front();
  co_return ret{std::error_code{}, got};
}

asio::awaitable<std::error_code> connection::read_stream(std::span<std::byte> dest) {
  for (std::size_t done = 0; done < dest.size();) {
    if (!rx_.empty() && rx_.front().header_length != 0)
      co_return violation("a bulk message where the reader expected plain bytes");
    // read_some needs room for a bulk header; a short tail goes via a bounce.
    std::array<std::byte, max_bulk_header> bounce;
    const bool direct = dest.size() - done >= max_bulk_header;
    auto [ec, got] = co_await read_some(direct ? dest.subspan(done) : std::span(bounce));
    if (ec) co_return ec;
    if (got.bulk_bytes != 0)
      co_return violation("a bulk message where the reader expected plain bytes");
    if (!direct) {
      const std::size_t n = std::min(got.bytes, dest.size() - done);
      std::memcpy(dest.data() + done, bounce.data(), n);
      if (n < got.bytes) {  // put back what the reader did not ask for
        incoming back;
        back.copy.assign(bounce.begin() + n, bounce.begin() + got.bytes);
        back.length = back.copy.size();
        rx_.push_front(std::move(back));
      }
      done += n;
    } else {
      done += got.bytes;
    }
  }
  co_return std::error_code{};
}

connection::posted_payload connection::post_payload(std::span<std::byte> dest,
                                                    ucs_memory_type_t memory) {
  posted_payload out;
  if (closed_by_us_) {
    out.ec = gone_code();
    return out;
  }
  if (!current_) {
    error_text_ = "read_exact: no bulk payload pending";
    out.ec = make_error_code(errc::invalid_argument);
    return out;
  }
  if (dest.size() != current_->length) {
    out.ec = violation("bulk payload of " + std::to_string(current_->length) +
                       " bytes read as " + std::to_string(dest.size()));
    return out;
  }
  incoming f = std::move(*current_);
  current_.reset();
  out.rndv = f.rndv;
  out.bytes = dest.size();
  if (!f.rndv && !f.data && memory != UCS_MEMORY_TYPE_HOST) {
    // Only UCX can copy into device memory, and it kept no descriptor.
    error_text_ = "read_exact: eager payload without a UCX descriptor for device memory";
    out.ec = make_error_code(errc::invalid_argument);
    return out;
  }
  if (!f.rndv && memory == UCS_MEMORY_TYPE_HOST) {
    // Eager: the bytes arrived inside UCX's receive buffer; one copy.
    std::memcpy(dest.data(), f.data ? f.data : f.copy.data(), dest.size());
    release(f);
    count_payload(out);
    return out;
  }
  // Rendezvous: UCX fetches the payload straight into `dest` and owns the
  // descriptor from here on, whatever the outcome. (Eager data bound for
  // device memory takes this path too: UCX copies it to the device.)
  out.slot = std::make_unique<request_slot>(rt_->executor(), &inflight_);
  ucp_request_param_t p{};
  out.slot->bind_recv(p);
  if (memory != UCS_MEMORY_TYPE_HOST) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = memory;
  }
  out.slot->start(ucp_am_recv_data_nbx(rt_->worker(), std::exchange(f.data, nullptr),
                                       dest.data(), dest.size(), &p));
  // As in send(): a fetch UCX completes in this pass (a cma read does)
  // needs no wake-up.
  if (out.slot->pending()) {
    try {
      rt_->progress_now();
    } catch (...) {
      drop_payload(out);  // as in post_send: the fetch ends before `out`
      throw;
    }
  }
  if (!out.slot->pending()) finish_payload(out);
  return out;
}

void connection::finish_payload(posted_payload& pp) {
  auto slot = std::move(pp.slot);
  if (slot->status() != UCS_OK)
    pp.ec = fail(slot->status(), "read bulk payload");
  else
    count_payload(pp);
}

void connection::count_payload(const posted_payload& pp) noexcept {
  if (pp.rndv) {
    ++stats_.rndv_payloads;
    stats_.rndv_bytes += pp.bytes;
  } else {
    ++stats_.eager_payloads;
    stats_.eager_bytes += pp.bytes;
  }
}

asio::awaitable<std::error_code> connection::wait_payload(posted_payload& pp) {
  auto self = shared_from_this();
  if (pp.slot) {
    if (co_await pp.slot->wait([this] { close(); })) {
      pp.slot.reset();
      co_return make_error_code(errc::closed);
    }
    finish_payload(pp);
  }
  co_return pp.ec;
}

void connection::drop_payload(posted_payload& pp) noexcept {
  // The fetch may still be writing into its destination: end it first
  // (close() forces the endpoint closed while requests are in flight).
  if (pp.slot && pp.slot->pending()) close();
  pp.slot.reset();  // abandons the request if still pending
}

asio::awaitable<std::error_code> connection::read_exact(std::span<std::byte> dest,
                                                        ucs_memory_type_t memory) {
  auto self = shared_from_this();
  if (!current_) {
    if (memory != UCS_MEMORY_TYPE_HOST) {
      error_text_ = "read_exact: device memory needs a bulk payload";
      co_return make_error_code(errc::invalid_argument);
    }
    co_return co_await read_stream(dest);
  }
  posted_payload pp = post_payload(dest, memory);
  co_return co_await wait_payload(pp);
}

// ---- connecting ------------------------------------------------------------

asio::awaitable<std::error_code> connection::wait_connected() {
  auto self = shared_from_this();
  const ucs_status_t gone = peer_error_ != UCS_OK ? peer_error_ : UCS_ERR_UNREACHABLE;
  if (link_ != link::open || peer_gone()) co_return fail(gone, "connect");
  request_slot slot(rt_->executor(), &inflight_);
  ucp_request_param_t p{};
  slot.bind_send(p);
  slot.start(ucp_ep_flush_nbx(ep_.get(), &p));
  if (slot.pending()) {
    rt_->kick();
    if (co_await slot.wait([this] { close(); })) co_return make_error_code(errc::closed);
  }
  if (slot.status() != UCS_OK) co_return fail(slot.status(), "connect");
  if (peer_gone())
    co_return fail(peer_error_ != UCS_OK ? peer_error_ : UCS_ERR_UNREACHABLE, "connect");
  co_return std::error_code{};
}

// ---- closing ---------------------------------------------------------------

void connection::close() noexcept {
  if (closed_by_us_) return;
  closed_by_us_ = true;
  drop_received();
  rx_ready_.notify_all();
  if (link_ != link::open) return;  // already closing or released
  if (!ep_) {
    link_ = link::released;  // never connected
    close_link();
    return;
  }
  if (peer_error_ != UCS_OK || !inflight_.empty()) {
    close_endpoint(true);
  } else if (peer_goodbye_) {
    close_endpoint(false);  // the peer is closing too and was answered
  } else {
    say_goodbye();
  }
}

void connection::keep_alive() {
  if (rt_keepalive_) return;
  rt_keepalive_ = rt_->shared_from_this();
  rt_->retain(shared_from_this());
  linger_.emplace(rt_->executor(), close_linger, [weak = weak_from_this()] {
    auto self = weak.lock();
    if (!self) return;
    if (self->link_ == link::saying_goodbye) {
      self->close_endpoint(true);
    } else if (self->link_ == link::closing) {
      // UCX did not finish the close in time: stop waiting for it.
      if (self->close_req_) ucp_request_free(std::exchange(self->close_req_, nullptr));
      self->released();
    }
  });
}

void connection::say_goodbye() {
  keep_alive();
  link_ = link::saying_goodbye;
  send_control(am_goodbye);
  if (peer_error_ != UCS_OK) close_endpoint(true);
}

void connection::close_endpoint(bool force) {
  if (link_ == link::closing || link_ == link::released) return;
  keep_alive();
  link_ = link::closing;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &connection::on_closed;
  p.user_data = this;
  // Flush mode (no flag) sends what is queued first; FORCE after a failure
  // or with operations in flight, which it cancels.
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  auto s = sort_status(ucp_ep_close_nbx(ep_.release(), &p));
  if (s.what == status_kind::pending) {
    close_req_ = s.request;
    rt_->kick();
  } else {
    released();
  }
}

void connection::on_closed(void* request, ucs_status_t, void* user_data) {
  auto* c = static_cast<connection*>(user_data);
  ucp_request_free(request);
  c->close_req_ = nullptr;
  // The endpoint is gone and its address free for UCX to reuse for the
  // next connection (an accept handled before released() runs): stop
  // routing it here now, or that connection's frames would come here.
  if (c->ep_key_) c->rt_->detach(std::exchange(c->ep_key_, nullptr), c);
  c->post_self([](connection& self) { self.released(); });
}

void connection::released() {
  std::shared_ptr<runtime> rt_hold;
  auto self = shared_from_this();
  if (link_ == link::released) return;
  link_ = link::released;
  rt_->detach(std::exchange(ep_key_, nullptr), this);
  linger_.reset();
  // Force-closing purges the endpoint's requests from a callback UCX runs
  // on its next progress; let it, then abandon what is left (UCX will
  // not complete those any more; a fetch among them may still land, which
  // is what transport::retire is for).
  if (!inflight_.empty()) rt_->progress_now();
  inflight_.abandon_all();
  if (closed_by_us_) drop_received();
  rx_ready_.notify_all();
  close_link();  // only now: the peer has had our goodbye
  rt_hold = std::move(rt_keepalive_);
  rt_->release(this);
  // `self` goes before `rt_hold`: the connection ends before its runtime.
}

void connection::on_error(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* c = static_cast<connection*>(arg);
  if (c->link_ == link::released) return;
  if (c->peer_error_ == UCS_OK) c->peer_error_ = st;
  c->rx_ready_.notify_all();
  // A failed endpoint must still be closed, forced; not from inside UCX.
  c->post_self([](connection& self) { self.close_endpoint(true); });
}

void connection::on_goodbye() {
  if (link_ == link::saying_goodbye) {
    // Both ends close at once: the peer's goodbye answers ours.
    post_self([](connection& self) { self.close_endpoint(false); });
    return;
  }
  if (link_ != link::open) return;
  peer_goodbye_ = true;
  rx_ready_.notify_all();
  // Answered from the callback itself (UCX offers the reply endpoint for
  // exactly this), so the closer is not kept waiting on this side's
  // executor, which may be busy or already stopped.
  send_control(am_goodbye_ack, /*inside_progress=*/true);
}

void connection::on_goodbye_ack() {
  if (link_ == link::saying_goodbye)
    post_self([](connection& self) { self.close_endpoint(false); });
}

void connection::force_close() noexcept {
  if (!ep_) return;
  link_ = link::closing;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &connection::on_closed;
  p.user_data = this;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  auto s = sort_status(ucp_ep_close_nbx(ep_.release(), &p));
  if (s.what == status_kind::pending) close_req_ = s.request;
}

void connection::abandon() noexcept {
  linger_.reset();
  if (close_req_) ucp_request_free(std::exchange(close_req_, nullptr));
  ep_ = endpoint{};  // forced close, request freed
  if (ep_key_) rt_->detach(std::exchange(ep_key_, nullptr), this);
  link_ = link::released;
  inflight_.abandon_all();
  drop_received();
  close_link();
  rx_ready_.notify_all();
  rt_keepalive_.reset();
}

}  // namespace blobpipe::ucx::detail
