// One UCX connection: an endpoint, the messages received on it, and its
// close.
//
// Bytes travel as active messages (runtime.hpp's am_message). A write() is
// one message with no AM header and the bytes as its data, sent eagerly
// (UCP_AM_SEND_FLAG_EAGER: several frames in one message). A write_bulk()
// is one message with a short opaque AM header (the pipeline puts a frame
// header there) and a payload as its data, which UCX sends by rendezvous
// when large. The AM callback queues each message as UCX handed it over:
// eager data is kept in UCX's own buffer (UCP_AM_FLAG_PERSISTENT_DATA), a
// rendezvous payload as its descriptor. read_some() copies queued bytes
// out, and stops after a bulk message's header; read_exact(dest) then
// copies its eager payload once into `dest` or starts
// ucp_am_recv_data_nbx with `dest`, so a rendezvous payload lands there
// directly.
//
// Close is a small handshake so the peer can tell an orderly close from a
// failure (UCX reports both as an endpoint error): the closer sends
// am_goodbye; the peer records it (its reads end with peer_closed once
// the queued messages are consumed) and answers am_goodbye_ack; the closer
// then closes the endpoint in flush mode (ucp_ep_close_nbx). A close with
// operations in flight, or after a peer failure, forces the endpoint
// closed instead (UCP_EP_CLOSE_FLAG_FORCE), which completes those
// operations with UCS_ERR_CANCELED. Until the endpoint is released the
// runtime keeps the connection alive, bounded by close_linger.
//
// Ownership: the transport object and coroutines in flight own a
// connection together with its runtime; while closing, the runtime owns it.
// So `rt_` outlives every use.
#pragma once

#include <array>
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>
#include <ucp/api/ucp.h>

#include "blobpipe/transport/transport.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "lib/runtime/async_sync.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/transport/ucx/handles.hpp"
#include "lib/transport/ucx/request.hpp"
#include "lib/transport/ucx/runtime.hpp"

namespace blobpipe::ucx::detail {

class runtime;

class connection : public std::enable_shared_from_this<connection> {
  struct passkey {};

 public:
  static std::shared_ptr<connection> make(runtime& rt, transport_options opt);
  connection(passkey, runtime& rt, transport_options opt);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  /// For ucp_ep_params_t::err_handler (UCP_ERR_HANDLING_MODE_PEER).
  ucp_err_handler_t err_handler() noexcept { return {&connection::on_error, this}; }
  /// Takes the endpoint created with err_handler() and routes its AMs here.
  void attach(ucp_ep_h ep);
  void set_options(transport_options opt) noexcept { opt_ = opt; }

  /// Largest AM header a bulk message may carry, bytes.
  static constexpr std::size_t max_bulk_header = 64;

  // The transport interface (blobpipe/transport/transport.hpp). `memory`
  // is where the payload buffers live: UCS_MEMORY_TYPE_HOST, or
  // UCS_MEMORY_TYPE_CUDA for write_bulk_device / read_exact_device.
  /// One message: `header` (empty for plain bytes, which go eagerly) and
  /// the data `payload`.
  asio::awaitable<std::error_code> send(std::span<const std::byte> header,
                                        std::span<const asio::const_buffer> payload,
                                        ucs_memory_type_t memory = UCS_MEMORY_TYPE_HOST);
  /// A message started by post_send: ended already (`slot` null, `ec` its
  /// outcome) or a send UCX still runs, reading the header, the payload
  /// bytes and `iov` (the payload's buffer list) until it completes.
  struct posted_send {
    std::error_code ec;
    std::unique_ptr<request_slot> slot;
    std::vector<ucp_dt_iov_t> iov;
  };
  /// send() in two halves (transport::post_write_bulk): ucp_am_send_nbx
  /// now, so the message is ordered after every message started before
  /// and before every one started after; its end awaited by wait_send.
  /// `header` and the payload's bytes must stay valid until then.
  posted_send post_send(std::span<const std::byte> header,
                        std::span<const asio::const_buffer> payload,
                        ucs_memory_type_t memory = UCS_MEMORY_TYPE_HOST);
  asio::awaitable<std::error_code> wait_send(posted_send& ps);
  /// Whether wait_send(ps) completes at once.
  static bool send_ready(const posted_send& ps) noexcept {
    return !ps.slot || !ps.slot->pending();
  }
  /// For a posted send nobody will wait for: closes the connection if UCX
  /// may still read its buffers, then forgets it.
  void drop_send(posted_send& ps) noexcept;
  asio::awaitable<std::tuple<std::error_code, transport::read_result>> read_some(
      std::span<std::byte> buf);
  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest,
                                              ucs_memory_type_t memory = UCS_MEMORY_TYPE_HOST);
  void close() noexcept;
  bool is_open() const noexcept;
  /// Whether read_some() completes without waiting: a message is queued,
  /// or it returns an error at once (closed, peer gone).
  bool readable() const noexcept { return closed_by_us_ || !rx_.empty() || peer_gone(); }
  /// Whether a bulk payload announced by read_some() awaits read_exact.
  bool bulk_pending() const noexcept { return current_.has_value(); }

  /// A bulk payload read started by post_payload: ended already (`slot`
  /// null, `ec` its outcome) or a rendezvous fetch UCX still runs.
  struct posted_payload {
    std::error_code ec;
    std::unique_ptr<request_slot> slot;
    bool rndv = false;
    std::size_t bytes = 0;
  };
  /// read_exact of the pending bulk payload in two halves
  /// (transport::post_read): start the copy or the fetch into `dest` now,
  /// await its end later. Any number may be in flight; read_some may go on
  /// meanwhile.
  posted_payload post_payload(std::span<std::byte> dest,
                              ucs_memory_type_t memory = UCS_MEMORY_TYPE_HOST);
  asio::awaitable<std::error_code> wait_payload(posted_payload& pp);
  /// Whether wait_payload(pp) completes at once (UCX called back already).
  static bool payload_ready(const posted_payload& pp) noexcept {
    return !pp.slot || !pp.slot->pending();
  }
  /// For a posted payload nobody will wait for: closes the connection if
  /// the fetch is still running, then forgets it.
  void drop_payload(posted_payload& pp) noexcept;

  /// Completes once UCX has connected the endpoint (ucp_ep_flush_nbx).
  /// Errors: peer_failed, closed.
  asio::awaitable<std::error_code> wait_connected();

  // ---- set up by the rendezvous (rendezvous.hpp; connection_link.cpp) ----

  /// Connecting side: sends am_verify with `n` as its header and waits
  /// until UCX has sent it. Errors: peer_failed, closed.
  asio::awaitable<std::error_code> send_verify(const nonce& n);
  /// Listening side: waits until am_verify came (runtime::expect_verify):
  /// on this endpoint (true) or on another one (false: the endpoints did
  /// not pair), or the connection ended (false).
  asio::awaitable<bool> wait_verified();
  /// From runtime::on_verify, inside ucp_worker_progress.
  void on_verify(ucp_ep_h reply_ep) noexcept;

  /// close() without the goodbye, the endpoint forced closed: for a
  /// rendezvous that failed (the peer may never have had this endpoint).
  /// Keeps the worker alive for failed_wireup_linger even if this was its
  /// last user: the peer's UCX may still be connecting to it, and UCX 1.13
  /// can abort the peer if the worker is gone meanwhile (docs/ucx.md
  /// "Foreign bytes").
  void close_now() noexcept;

  /// Keeps the rendezvous socket for the connection's life. Nothing more is
  /// written to it; it is read only to learn that the peer went: end of
  /// file, a reset, or any byte, before the peer's goodbye, is a peer
  /// failure, reported at once (UCX's own detection over shared memory
  /// waits for its keepalive, UCX_KEEPALIVE_INTERVAL, 20 s). It is closed
  /// once the endpoint is released, so the peer sees the goodbye first.
  void attach_link(asio::ip::tcp::socket s);

  const std::string& error_text() const noexcept { return error_text_; }
  const stats& counters() const noexcept { return stats_; }
  ucp_ep_h endpoint_handle() const noexcept { return ep_.get(); }

  // Called by the runtime's AM callbacks, inside ucp_worker_progress.
  ucs_status_t on_message(std::span<const std::byte> header, void* data, std::size_t length,
                          std::uint64_t recv_attr);
  void on_goodbye();
  void on_goodbye_ack();

  // For the runtime's shutdown, which runs ucp_worker_progress itself in
  // between: force-close the endpoint if still open (ucp_ep_close_nbx,
  // FORCE); whether a close request is still pending; then release
  // everything without waiting any longer (requests freed).
  void force_close() noexcept;
  bool close_pending() const noexcept { return close_req_ != nullptr; }
  void abandon() noexcept;

 private:
  enum class link { open, saying_goodbye, closing, released };

  struct incoming {
    std::array<std::byte, max_bulk_header> header{};
    std::size_t header_length = 0;  // 0: plain bytes; else a bulk message
    bool header_too_long = false;   // more than max_bulk_header: a violation
    void* data = nullptr;           // UCX's eager data or rendezvous descriptor
    std::size_t length = 0;         // data bytes
    std::size_t offset = 0;         // plain bytes: how many read_some() took
    bool rndv = false;
    std::vector<std::byte> copy;  // only when UCX did not let us keep `data`
    const std::byte* bytes() const noexcept {
      return data ? static_cast<const std::byte*>(data) : copy.data();
    }
  };

  asio::awaitable<std::error_code> read_stream(std::span<std::byte> dest);
  std::error_code violation(std::string why);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t st);
  void finish_payload(posted_payload& pp);
  void count_payload(const posted_payload& pp) noexcept;
  static void on_closed(void* request, ucs_status_t st, void* user_data);

  std::error_code gone_code() const noexcept;
  std::error_code fail(ucs_status_t st, const char* what);
  bool peer_gone() const noexcept;
  void release(incoming& f) noexcept;
  void drop_received() noexcept;
  void keep_alive();
  void watch_link();
  void on_link_lost(std::error_code ec);
  void close_link() noexcept;
  void say_goodbye();
  /// Sends a payload-less control AM (goodbye, goodbye_ack); nobody waits
  /// for it. `inside_progress`: called from a UCX callback (no kick).
  void send_control(unsigned am_id, bool inside_progress = false) noexcept;
  void close_endpoint(bool force);
  void released();
  template <class F>
  void post_self(F f);

  runtime* rt_;
  std::shared_ptr<runtime> rt_keepalive_;  // set while closing
  endpoint ep_;
  ucp_ep_h ep_key_ = nullptr;  // routing key, kept after ep_ is released
  transport_options opt_;
  std::deque<incoming> rx_;
  std::optional<incoming> current_;  // bulk header returned, payload not yet read
  blobpipe::detail::async_condition rx_ready_;
  slot_list inflight_;
  std::optional<blobpipe::detail::deadline> linger_;  // keep_alive()'s bound on the close
  void* close_req_ = nullptr;
  link link_ = link::open;
  bool closed_by_us_ = false;
  bool peer_goodbye_ = false;
  ucs_status_t peer_error_ = UCS_OK;
  std::string error_text_;
  stats stats_;
  std::optional<asio::ip::tcp::socket> link_sock_;  // see attach_link
  enum class verify_state { waiting, on_this_endpoint, on_another } verify_ = verify_state::waiting;
};

}  // namespace blobpipe::ucx::detail
