// blobpipe/transport/transport.hpp — a frame-level, full-duplex connection.
//
// A transport moves frames (blobpipe/wire.hpp): a header, then payload
// bytes. It knows nothing of blobs, dtypes or msgpack. Its shape follows
// what UCX active messages allow: the sender hands over a header and a
// scatter list; the receiver first learns the header, then names the
// destination for the payload, which lands there directly:
//
//   co_await t.send(h, bufs);                       // header + iovecs
//   auto [ec, h] = co_await t.receive_header();     // decide where it goes
//   ec = co_await t.receive_payload(dest);          // straight into dest
//
// post_payload(dest) is receive_payload split in two: it starts the
// transfer and returns a receipt to co_await later; UCX lets several be in
// flight (payload_window()) while the next headers are received.
//
// TCP (blobpipe/tcp.hpp) reads the payload with one read into `dest`; an
// in-process loopback (blobpipe/loopback.hpp) copies from the sender's
// buffers into `dest`; UCX calls ucp_am_recv_data_nbx with `dest`.
//
// Threading: one transport lives on one executor. Use it from coroutines on
// that executor only (a single-threaded io_context or a strand).
// Source: docs/wire.md "Transport".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

/// Limits a transport applies before returning a header.
struct transport_options {
  /// A header whose length exceeds this is a protocol_violation (bytes).
  std::uint32_t max_frame_bytes = default_max_frame_bytes;
};

/// A payload receive started by transport::post_payload and not yet waited
/// for. Move-only; wait() once, and wait for or destroy it before its
/// transport. Destroying a receipt before its payload has all arrived
/// closes the transport (the stream cannot go on without it). Over UCX the
/// transfer then ends when the forced close completes, asynchronously, so
/// the destination must outlive that too: wait() (it completes with
/// `closed` after a close) rather than drop a receipt whose buffer is
/// about to be freed.
class payload_receipt {
 public:
  /// What a transport keeps for one posted payload.
  class pending {
   public:
    virtual ~pending() = default;
    /// Completes when the bytes are in the destination, or failed.
    virtual asio::awaitable<std::error_code> wait() = 0;
    /// Whether wait() would complete at once. Default: false (not known).
    virtual bool ready() const noexcept { return false; }
  };

  /// An empty receipt: wait() returns invalid_argument.
  payload_receipt() = default;
  explicit payload_receipt(std::unique_ptr<pending> p) noexcept : p_(std::move(p)) {}
  /// A receipt for a receive that already ended with `done` (success or not).
  explicit payload_receipt(std::error_code done) noexcept : done_(done), ended_(true) {}
  /// Moving leaves `other` empty.
  payload_receipt(payload_receipt&& other) noexcept
      : p_(std::move(other.p_)),
        done_(std::exchange(other.done_, {})),
        ended_(std::exchange(other.ended_, false)) {}
  payload_receipt& operator=(payload_receipt&& other) noexcept {
    p_ = std::move(other.p_);
    done_ = std::exchange(other.done_, {});
    ended_ = std::exchange(other.ended_, false);
    return *this;
  }

  /// Waits until the payload is in the destination given to post_payload.
  /// Errors: those of transport::receive_payload; invalid_argument on an
  /// empty receipt or a second wait().
  asio::awaitable<std::error_code> wait();

  /// Whether wait() would complete without waiting: the bytes are in (or
  /// the receive failed) already. A receive that only starts inside wait()
  /// (the default post_payload) is never ready; an empty receipt is.
  bool ready() const noexcept { return p_ ? p_->ready() : true; }

 private:
  std::unique_ptr<pending> p_;
  std::error_code done_;
  bool ended_ = false;
};

/// The frame-level interface every transport implements.
///
/// Sends may be issued concurrently by many coroutines: each frame goes out
/// whole (header and payload are never interleaved with another frame), and
/// waiting senders go in FIFO order, so producers sending chunk by chunk
/// interleave fairly. Receiving is single-consumer: receive_header, then
/// exactly one receive_payload when length > 0, then the next header.
///
/// Errors (every awaitable): closed (close() was called on this object,
/// before or during the operation), peer_closed (the peer ended the
/// connection), peer_failed (reset or I/O failure), protocol_violation
/// (receive_header: a header that decode_frame_header rejects; the transport
/// is then closed), invalid_argument (a broken REQUIRES).
/// Cancelling a send mid-frame (for instance through a `||` timeout) would
/// leave half a frame on the stream, so it closes the transport instead.
class transport {
 public:
  virtual ~transport() = default;
  transport() = default;
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// The executor every operation runs on.
  virtual asio::any_io_executor get_executor() const = 0;

  /// Sends one frame: `h` then the payload buffers in order. Completes when
  /// the bytes are handed off (TCP: written to the socket; loopback:
  /// copied into the receiver's destination), so the payload memory may be
  /// reused afterwards and never needs a staging copy.
  /// REQUIRES: h.length == total size of `payload`.
  virtual asio::awaitable<std::error_code> send(const frame_header& h,
                                                std::span<const asio::const_buffer> payload) = 0;

  /// Waits for the next frame header, decoded and checked
  /// (decode_frame_header with the options' max_frame_bytes).
  virtual asio::awaitable<std::tuple<std::error_code, frame_header>> receive_header() = 0;

  /// Whether receive_header() would complete without waiting for the peer:
  /// a frame (or the end of the stream) is here already. A receiver with
  /// payloads posted uses it to choose between the next header and the
  /// oldest receipt. Default: false (not known; the caller then waits for
  /// the receipt first). UCX: a frame is queued, or the connection ended.
  virtual bool header_ready() const noexcept { return false; }

  /// Receives the whole payload of the frame whose header was returned last
  /// directly into `dest`. REQUIRES: dest.size() == that header's length > 0.
  virtual asio::awaitable<std::error_code> receive_payload(std::span<std::byte> dest) = 0;

  /// How many posted payloads (post_payload) may be in flight, not yet
  /// waited for, while the caller goes on to receive_header for the next
  /// frames. 1 (the default): wait() each receipt before the next
  /// receive_header. UCX allows many, so the fetches of consecutive
  /// rendezvous payloads overlap instead of costing a round trip each.
  virtual std::size_t payload_window() const noexcept { return 1; }

  /// Starts receiving the payload of the frame whose header was returned
  /// last into `dest` and returns at once; receipt.wait() completes when
  /// the bytes are there. `dest` must stay valid until then. Up to
  /// payload_window() receipts may be outstanding; the header after a
  /// posted frame may be received before its receipt is waited for.
  /// REQUIRES: as receive_payload. Errors (from wait()): as receive_payload.
  /// Default: the receive happens inside wait() (receive_payload), so
  /// payload_window() must stay 1.
  virtual payload_receipt post_payload(std::span<std::byte> dest);

  /// Keeps `owner` (the memory a receive was writing into) alive for as
  /// long as this transport may still write into it after the receive was
  /// cut short (closed or failed before the payload was all in).
  /// Default: released at once (TCP and loopback write only inside the
  /// receive). UCX: held for retire_linger (10 s) while its worker lives,
  /// since a rendezvous fetch cut by a close can still land afterwards
  /// (UCX 1.13 cannot cancel an active-message receive).
  virtual void retire(std::shared_ptr<const void> owner) { (void)owner; }

  /// Closes the connection now. Every pending and later operation completes
  /// with `closed`; the peer sees peer_closed. Idempotent, never throws.
  virtual void close() noexcept = 0;

  /// False once closed (by either side, as far as this side knows).
  virtual bool is_open() const noexcept = 0;

  // ---- CUDA device memory (docs/cuda.md "Transports") ----
  //
  // A transport that can read and write CUDA device memory itself (UCX
  // built with cuda_copy/cuda_ipc: ucx_info -d lists them) overrides these
  // three; the pipeline then hands it device pointers and skips its pinned
  // staging. Every other transport keeps the defaults, and device bytes
  // reach it already staged in pinned host memory.

  /// True when send_device() and receive_payload_device() work. Default:
  /// false (the pipeline stages device bytes through pinned host buffers).
  virtual bool accepts_device_memory() const noexcept { return false; }

  /// As send(), with every payload buffer in device memory of CUDA device
  /// `device` (UCX: op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE,
  /// memory_type = UCS_MEMORY_TYPE_CUDA). Completes when the device bytes
  /// may be reused. Default: invalid_argument.
  virtual asio::awaitable<std::error_code> send_device(const frame_header& h,
                                                       std::span<const asio::const_buffer> payload,
                                                       int device);

  /// As receive_payload(), into device memory of CUDA device `device`;
  /// completes when the bytes are there. Default: invalid_argument.
  virtual asio::awaitable<std::error_code> receive_payload_device(std::span<std::byte> dest,
                                                                  int device);

  /// One line on the last failure (for example "frame header: unknown frame
  /// type 9"); empty when none. For logs: tests compare codes, not text.
  const std::string& last_error() const noexcept { return last_error_; }

 protected:
  std::string last_error_;
};

/// What every transport's listener offers (tcp::listener, ucx::listener),
/// so a consumer side can hold either without knowing which:
///
///   std::unique_ptr<blobpipe::listener> l =
///       std::make_unique<tcp::listener>(tcp::listen(ex, 0).value());
///   auto [ec, t] = co_await l->accept();
class listener {
 public:
  virtual ~listener() = default;

  /// The bound port (useful after listening on port 0).
  virtual std::uint16_t port() const noexcept = 0;

  /// Waits for the next connection and returns it as a transport. The
  /// listener must outlive a pending accept.
  /// Errors: closed (close() called, before or while waiting); when the
  /// awaiting coroutine is cancelled, operation_aborted (UCX) or closed
  /// (TCP); each listener documents its others.
  virtual asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> accept(
      transport_options opt = {}) = 0;

  /// Stops listening; a pending accept completes with `closed`.
  /// Idempotent, never throws.
  virtual void close() noexcept = 0;

 protected:
  listener() = default;
  listener(listener&&) = default;
  listener& operator=(listener&&) = default;
};

/// Sends a frame with one contiguous payload (may be empty).
asio::awaitable<std::error_code> send_frame(transport& t, const frame_header& h,
                                            std::span<const std::byte> payload);

}  // namespace blobpipe
