// Shared state of a sender and its blobs (internal), and the steps every
// kind of sender shares: plain and resend sessions, host and device values
// all go through one credit wait, one entry path (send_entry: inline below
// the threshold, else one chunk loop), one abort and one ack reader.
// Coroutines hold the state by shared_ptr, never by raw `this`.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/transport/transport.hpp"
#include "lib/pipeline/send_queue.hpp"
#include "lib/pipeline/watchdog.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

struct resend_state;  // lib/pipeline/resend.hpp
struct kept_blob;

struct sender_state : std::enable_shared_from_this<sender_state> {
  sender_state(asio::any_io_executor e, sender_options o);
  ~sender_state();

  /// Ends the sender with `ec` (the first error wins) and wakes every waiter.
  void fail(std::error_code ec) noexcept;
  /// Ends the sender with protocol_violation and `what`.
  void violation(std::string what);
  /// Takes the consumer's acknowledgement on connection `connection`:
  /// `credit` returned, `blob_id` delivered (0: none; resend sessions only).
  result<void> on_ack(std::uint64_t connection, std::uint64_t credit, std::uint64_t blob_id);

  asio::any_io_executor ex;
  sender_options opt;
  // The current connection's queue. A resend session replaces it after a
  // failure (a coroutine still using the old one holds its own shared_ptr).
  std::shared_ptr<send_queue> queue;
  std::uint64_t connection = 0;      // connections made so far (its number)
  // What the consumer's hello set (per connection).
  std::uint32_t chunk_bytes = 0;     // negotiated
  std::uint32_t inline_bytes = 0;    // negotiated: entries up to this go inline
  std::uint64_t window_bytes = 0;
  std::uint64_t features = 0;        // accepted by the consumer (feature_* bits)
  std::uint64_t credit_wanted = 0;   // credit grants: what waiting producers asked for
  std::uint32_t max_key_bytes = 0;
  std::uint32_t max_meta_bytes = 0;
  std::uint64_t in_flight = 0;       // credit taken, not yet acknowledged
  std::uint64_t next_blob_id = 1;
  std::error_code error;             // set once; every later call returns it
  std::string message;               // what broke, for protocol violations
  bool closing = false;              // shutdown() sent `close`
  bool reader_done = false;          // the ack reader has ended
  async_condition credit_cv;         // in_flight fell, or the connection ended
  async_condition reader_cv;         // reader_done became true
  sender_stats stats;
  watchdog stall_watch;              // opt.stall_timeout
  std::string timeout_reason;        // set when the watchdog fired
  std::unique_ptr<resend_state> resend;  // resend sessions only
};

struct blob_state {
  blob_state(std::shared_ptr<sender_state> s, std::uint64_t blob_id, const tag_t& t)
      : sender(std::move(s)), id(blob_id), tag(t), lock(sender->ex) {}
  ~blob_state();  // aborts a begun, unfinished blob

  std::shared_ptr<sender_state> sender;
  std::uint64_t id;
  tag_t tag;
  std::optional<blob_group> group;  // blob_options::group
  layout_builder builder;
  async_mutex lock;      // one emit/finish/abort at a time, in call order
  bool begun = false;    // blob_begin framed
  bool ended = false;    // tail or abort framed
  bool broken = false;   // an entry went out incompletely; only abort() is left
  std::shared_ptr<kept_blob> kept;  // resend session: the bytes kept for resending
  std::vector<std::byte> meta;     // the entry being emitted: its Entry::meta()
  std::string last_error;  // why the last emit failed (blob_writer::last_error)
};

/// Reads the consumer's frames on one connection (its hello, then acks
/// and close) through the push decoder.
struct ack_reader final : decoder_listener {
  explicit ack_reader(std::shared_ptr<transport> link);

  /// Reads and decodes what the consumer sent next. Errors: the
  /// transport's, or the decoder's (protocol_violation; `message` says why).
  asio::awaitable<std::error_code> read_more();

  result<void> on_hello(const hello& h) override;
  result<void> on_ack(std::uint64_t credit, std::uint64_t blob_id) override;
  result<void> on_close(std::string_view reason) override;

  std::shared_ptr<transport> link;
  decoder frames;
  std::array<std::byte, 4096> buffer{};
  std::optional<hello> peer;          // the consumer's hello, once read
  bool peer_closed = false;           // its close frame arrived
  std::string message;                // why decoding failed
  // Set once the connection is installed: acks then go to the sender.
  sender_state* sender = nullptr;
  std::uint64_t connection = 0;
};

/// The handshake on `link` (every kind of sender): sends our hello with
/// `chunk_bytes` and `session`, reads and checks the consumer's.
/// Errors: protocol_violation, and the transport's.
asio::awaitable<std::tuple<std::error_code, std::shared_ptr<ack_reader>>> handshake(
    std::shared_ptr<transport> link, const sender_options& opt, const session_id& session);

/// Makes `link` (handshake done by `reader`) the sender's connection:
/// negotiated limits, a fresh send queue, the ack reader running.
void install(const std::shared_ptr<sender_state>& s, std::shared_ptr<ack_reader> reader);

/// The features a sender with `opt` offers in its hello.
std::uint64_t offered_features(const sender_options& opt) noexcept;

/// last_error() of an entry whose meta the consumer's max_meta_bytes
/// refuses (invalid_argument).
inline std::string meta_too_long(std::size_t meta_bytes, std::uint32_t max_meta_bytes) {
  return "the entry's meta (its index row) is " + std::to_string(meta_bytes) +
         " bytes, longer than the consumer's max_meta_bytes (" + std::to_string(max_meta_bytes) +
         " bytes)";
}

/// The steady clock in nanoseconds (the entry timestamps' clock).
inline std::uint64_t steady_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Takes `n` bytes of window credit if they fit now (or nothing is
/// outstanding: one entry larger than the window goes alone; not with
/// credit grants, where the sender asks instead).
bool take_credit(sender_state& s, std::uint64_t n) noexcept;
/// Waits until `n` bytes of credit fit on connection `q`, then takes them.
/// Errors: the sender's error, operation_aborted (cancelled), closed (`q`
/// is no longer the connection: a resend session reconnected).
asio::awaitable<std::error_code> acquire_credit(std::shared_ptr<sender_state> s,
                                                std::shared_ptr<send_queue> q, std::uint64_t n);

/// Frames one entry of blob `blob_id` on `q`: entry_begin, with the bytes
/// inline when 0 < len <= the negotiated inline size, else followed by
/// data frames (send_chunks). `bytes`: the entry's len contiguous host
/// bytes; for a strided host value (pe.contiguous false) they are gathered
/// with write_entry instead. Credit must be taken already. `emitted_ns`:
/// when the producer emitted it (steady_ns(); 0: now), stamped into
/// entry_begin when the consumer accepted feature_entry_timestamps.
/// Errors: the connection's; invalid_argument (a strided value whose
/// gather failed).
asio::awaitable<std::error_code> send_entry(std::shared_ptr<sender_state> s,
                                            std::shared_ptr<send_queue> q, std::uint64_t blob_id,
                                            std::uint64_t index, const planned_entry& pe,
                                            std::span<const std::byte> meta,
                                            std::uint64_t emitted_ns = 0);

/// The one chunk loop: data frames covering blob offsets [off, off +
/// bytes.size()) of blob `blob_id`, pointing at `bytes` (zero copy; on CUDA
/// device `device` when >= 0, for a transport that accepts it). Completes
/// once the transport has taken every byte, so `bytes` may be reused. A
/// few chunks are queued ahead, so producers' chunks interleave. If the
/// awaiting coroutine is cancelled with bytes still queued, the connection
/// is closed (a frame cannot be taken back and the memory may go).
/// Errors: the connection's, closed.
asio::awaitable<std::error_code> send_chunks(std::shared_ptr<sender_state> s,
                                             std::shared_ptr<send_queue> q, std::uint64_t blob_id,
                                             std::uint64_t off, std::span<const std::byte> bytes,
                                             int device = -1);

/// Frames blob_abort for `blob_id` (reason cut to max_reason_bytes).
void frame_abort(send_queue& q, std::uint64_t blob_id, std::string_view reason);

}  // namespace blobpipe::detail
