// blobpipe/transport/transport.hpp — a full-duplex, ordered byte connection.
//
// A transport moves bytes. It knows nothing of frames, blobs, dtypes or
// msgpack: the protocol (blobpipe/protocol/) turns calls into bytes and
// bytes into events, and the pipeline (blobpipe/pipeline/) runs the I/O
// loop between them. The interface has what both kinds of link need:
//
// - Byte streams (TCP, the in-process loopback): write() a gather list;
//   read_some() whatever has arrived into the reader's buffer;
//   read_exact() the next n bytes straight into their final place, so a
//   large payload is read where it belongs, with no copy.
// - Messages (UCX active messages): write() sends the bytes as one message;
//   write_bulk() sends a header and a payload as a message whose payload
//   the receiver fetches itself (rendezvous, for large ones). read_some()
//   yields the bytes of the messages in order, and stops after a bulk
//   message's header, reporting its payload (read_result::bulk_bytes),
//   which read_exact() or post_read() then land straight in the reader's
//   destination.
//
//   co_await t.write(bufs);                               // frames, gathered
//   auto [ec, got] = co_await t.read_some(rx_buffer);     // what is there
//   ec = co_await t.read_exact(entry_bytes);              // straight into place
//
// One writer and one reader at a time (the pipeline owns both); writes
// and reads may run concurrently with each other.
//
// Threading: one transport lives on one executor. Use it from coroutines on
// that executor only (a single-threaded io_context or a strand). The two
// ends of an in-process pair may live on different executors.
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

namespace blobpipe {

/// Limits a transport applies, and where an accepted one lives (one
/// options type for listeners and connect functions).
struct transport_options {
  /// Largest bulk message (write_bulk) payload accepted, bytes; a larger
  /// one is a protocol_violation. Byte streams ignore it.
  std::uint32_t max_bulk_bytes = 1u << 30;
  /// listener::accept: the executor the accepted transport lives on (a
  /// fan-in server's receive thread, server_options::threads). Empty: the
  /// listener's own. TCP honours it; UCX (one worker per io_context) and
  /// inproc (the pair is made at connect) ignore it, so check the
  /// transport's get_executor(). connect functions ignore it.
  asio::any_io_executor executor;
  /// TCP: a fixed send and receive buffer each socket asks the kernel for
  /// (SO_SNDBUF and SO_RCVBUF, socket(7)), bytes; 0 (the default) leaves
  /// the kernel's autotuning. Asked only where the system's maximum
  /// (net.core.wmem_max, net.core.rmem_max) grants this size whole, so a
  /// capped buffer never replaces autotuning. A fixed buffer turns
  /// autotuning off for that socket: below what autotuning reaches
  /// (net.ipv4.tcp_wmem, tcp_rmem) it can slow a link with a long round
  /// trip. Linux doubles the value for its bookkeeping. What 4 MiB changed
  /// over loopback is in docs/performance.md "Socket buffers". Other
  /// transports ignore it.
  std::uint32_t socket_buffer_bytes = 0;
};

/// A read started by transport::post_read, or a write started by
/// transport::post_write_bulk, and not yet waited for.
/// Move-only; wait() once, and wait for or destroy it before its transport.
/// Destroying a receipt before its bytes have all arrived closes the
/// transport (the stream cannot go on without them). Over UCX the transfer
/// then ends when the forced close completes, asynchronously, so the
/// destination must outlive that too: wait() (it completes with `closed`
/// after a close) rather than drop a receipt whose buffer is about to be
/// freed.
class payload_receipt {
 public:
  /// What a transport keeps for one posted read.
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
  /// A receipt for a read that already ended with `done` (success or not).
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

  /// Waits until the bytes are in the destination given to post_read.
  /// Errors: those of transport::read_exact; invalid_argument on an empty
  /// receipt or a second wait().
  asio::awaitable<std::error_code> wait();

  /// Whether wait() would complete without waiting: the bytes are in (or
  /// the read failed) already. A read that only starts inside wait() (the
  /// default post_read) is never ready; an empty receipt is.
  bool ready() const noexcept { return p_ ? p_->ready() : true; }

 private:
  std::unique_ptr<pending> p_;
  std::error_code done_;
  bool ended_ = false;
};

/// The byte-level interface every transport implements.
///
/// Errors (every awaitable): closed (close() was called on this object,
/// before or during the operation), peer_closed (the peer ended the
/// connection), peer_failed (reset or I/O failure), protocol_violation
/// (a message transport received bytes it cannot deliver as specified: a
/// bulk payload read with another size; the transport is then closed),
/// invalid_argument (a broken REQUIRES).
/// Cancelling a write part way (for instance through a `||` timeout) would
/// leave half of it on the stream, so it closes the transport instead.
class transport {
 public:
  /// What read_some() delivered.
  struct read_result {
    std::size_t bytes = 0;       ///< bytes written into the buffer (>= 1 on success)
    /// > 0: the bytes delivered end with a bulk message's header, and its
    /// payload of this many bytes is not in the byte stream: land it with
    /// read_exact() or post_read() (exactly this size) before the next
    /// read_some(). Always 0 on byte streams.
    std::size_t bulk_bytes = 0;
  };

  virtual ~transport() = default;
  transport() = default;
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// The executor every operation runs on.
  virtual asio::any_io_executor get_executor() const = 0;

  // ---- writing (one writer at a time) ----

  /// Writes `bytes` in order. Completes when every byte is handed off (TCP:
  /// written to the socket; loopback: copied by the reader; UCX: the
  /// message was sent or buffered by UCX), so the memory may be reused.
  virtual asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) = 0;

  /// Whether write_bulk() sends a separate message whose payload the
  /// reader fetches itself (UCX). False (the default): the pipeline writes
  /// large payloads with the rest through write().
  virtual bool sends_bulk() const noexcept { return false; }

  /// Writes `header`, then `payload`, as one message whose payload the
  /// reader lands with read_exact()/post_read() (UCX: an active message
  /// with `header` as its AM header and `payload` as its data, by
  /// rendezvous when large; ucp_am_send_nbx). Completes as write().
  /// Default: write() of header and payload. REQUIRES: header.size() <= 64.
  virtual asio::awaitable<std::error_code> write_bulk(std::span<const std::byte> header,
                                                      std::span<const asio::const_buffer> payload);

  /// How many messages started by post_write_bulk() may be in flight, not
  /// yet waited for, while the caller goes on writing. 1 (the default):
  /// wait() each receipt before writing on. UCX allows 8, so the
  /// rendezvous of consecutive bulk payloads overlap instead of costing a
  /// round trip each (docs/performance.md "UCX").
  virtual std::size_t write_window() const noexcept { return 1; }

  /// Starts write_bulk(header, payload) and returns at once; receipt.wait()
  /// completes as write_bulk() does. The message goes after every write
  /// started before this call and before every write started after it.
  /// `header`, the payload's bytes and the `payload` array must stay valid
  /// until wait() completes; destroying the receipt before then closes the
  /// transport. Up to write_window() receipts may be outstanding. Default:
  /// the write happens inside wait() (write_bulk), so write_window() must
  /// stay 1. Errors (from wait()): those of write_bulk().
  virtual payload_receipt post_write_bulk(std::span<const std::byte> header,
                                          std::span<const asio::const_buffer> payload);

  /// The most bytes worth passing to one write(), bytes (a hint for
  /// write combining: UCX sends each write as one eager message).
  virtual std::size_t max_write_bytes() const noexcept { return std::size_t{8} << 20; }

  // ---- reading (one reader at a time) ----

  /// Waits for bytes and copies what has arrived into `buf` (at least one
  /// byte, at most buf.size()). REQUIRES: !buf.empty(), no bulk payload
  /// pending (see read_result::bulk_bytes).
  virtual asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) = 0;

  /// Whether read_some() would complete without waiting for the peer:
  /// bytes (or the end of the stream) are here already. Default: false
  /// (not known). UCX: a message is queued, or the connection ended.
  virtual bool readable() const noexcept { return false; }

  /// Reads exactly dest.size() bytes into `dest`: the bulk payload
  /// read_some() announced (dest.size() must equal it), else the next
  /// bytes of the stream. REQUIRES: !dest.empty().
  virtual asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) = 0;

  /// How many posted reads (post_read) may be in flight, not yet waited
  /// for, while the caller goes on reading. 1 (the default): wait() each
  /// receipt before reading on. UCX allows many, so the fetches of
  /// consecutive rendezvous payloads overlap instead of costing a round
  /// trip each.
  virtual std::size_t read_window() const noexcept { return 1; }

  /// Starts read_exact(dest) and returns at once; receipt.wait() completes
  /// when the bytes are there. `dest` must stay valid until then. Up to
  /// read_window() receipts may be outstanding, and read_some() may go on
  /// meanwhile. Default: the read happens inside wait() (read_exact), so
  /// read_window() must stay 1.
  virtual payload_receipt post_read(std::span<std::byte> dest);

  /// Keeps `owner` (the memory a read was writing into) alive for as long
  /// as this transport may still write into it after the read was cut
  /// short (closed or failed before the bytes were all in).
  /// Default: released at once (TCP and loopback write only inside the
  /// read). UCX: held for retire_linger (10 s) while its worker lives,
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

  /// True when write_bulk_device() and read_exact_device() work. Default:
  /// false (the pipeline stages device bytes through pinned host buffers).
  virtual bool accepts_device_memory() const noexcept { return false; }

  /// As write_bulk(), with every payload buffer in device memory of CUDA
  /// device `device` (UCX: op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE,
  /// memory_type = UCS_MEMORY_TYPE_CUDA). Default: invalid_argument.
  virtual asio::awaitable<std::error_code> write_bulk_device(
      std::span<const std::byte> header, std::span<const asio::const_buffer> payload, int device);

  /// As read_exact() of a bulk payload, into device memory of CUDA device
  /// `device`. Default: invalid_argument.
  virtual asio::awaitable<std::error_code> read_exact_device(std::span<std::byte> dest,
                                                             int device);

  /// One line on the last failure (for example "read: Connection reset by
  /// peer"); empty when none. For logs: tests compare codes, not text.
  const std::string& last_error() const noexcept { return last_error_; }

  /// The far end as a URL (blobpipe/transport/url.hpp): "tcp://10.0.0.2:41234",
  /// "ucx://10.0.0.2:41234", "inproc://name"; empty when not known. For
  /// logs and per-connection metrics (a fan-in server names each event's
  /// connection with it).
  const std::string& peer_address() const noexcept { return peer_address_; }
  void set_peer_address(std::string url) { peer_address_ = std::move(url); }

 protected:
  std::string last_error_;
  std::string peer_address_;
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

}  // namespace blobpipe
