// blobpipe/producer.hpp — streaming blobs out: sender and blob_writer.
//
// A `sender` owns one transport. Any number of coroutines open blobs on it
// and emit (key, value) pairs; each entry is planned incrementally
// (layout_builder: entry i's offset depends only on entries before it) and
// sent at once, before later values exist. Entries are split into data
// frames of at most the negotiated chunk size, so blobs from concurrent
// producers interleave on the connection. `finish()` sends the index and
// footer (write_tail) last.
//
//   auto [ec, s] = co_await blobpipe::sender::start(std::move(t));
//   auto blob = s.open_blob();                          // random uuid4 tag
//   co_await blob.emit("0@input_ids", blobpipe::value::tensor(ids));
//   co_await blob.emit("reward", blobpipe::value::tensor(reward, {}));
//   co_await blob.finish();
//   co_await s.shutdown();                              // orderly close
//
// Zero copy: an entry's data frames point at the value's own memory
// (planned_entry.source.data) when the value is contiguous. A strided value
// is the one exception: write_entry gathers it into a temporary of
// entry.len bytes, which is then sent the same way.
//
// Backpressure: the consumer grants a window (bytes). Before an entry
// (entry.len bytes) or a tail (tail_size bytes) is sent, the sender waits
// until the bytes it has sent and the consumer has not yet released, plus
// the new ones, fit the window. An entry larger than the whole window is
// admitted alone, once nothing else is outstanding, so a small window never
// deadlocks. Waiting suspends the producer (no busy loop, nothing dropped).
//
// Threading: a sender and its blobs live on the transport's executor; call
// them from coroutines on that executor only.
// Source: docs/wire.md "Sender", "Flow control".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>

#include <asio/awaitable.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/footer.hpp"
#include "blobpipe/layout.hpp"
#include "blobpipe/transport.hpp"

namespace blobpipe {

namespace detail {
struct sender_state;
struct blob_state;
}  // namespace detail

struct sender_options {
  /// Largest data frame payload proposed in the handshake, bytes; the
  /// consumer may lower it. Entries longer than this go out in chunks.
  std::uint32_t chunk_bytes = default_chunk_bytes;
};

/// Counters for tests and benchmarks.
struct sender_stats {
  std::uint64_t entries_sent = 0;
  std::uint64_t data_frames_sent = 0;
  std::uint64_t bytes_sent = 0;       ///< entry + tail payload bytes
  std::uint64_t credit_waits = 0;     ///< times a producer waited for the window
  std::uint64_t gathered_entries = 0; ///< strided values copied via write_entry
};

/// One blob being streamed. A cheap handle (copies refer to the same blob).
/// Calls on one blob are serialised in call order: emit from several
/// coroutines is allowed, each entry goes out whole.
/// If the last handle goes away before finish() or abort(), the blob is
/// aborted ("blob_writer dropped").
class blob_writer {
 public:
  blob_writer() = default;

  /// Plans `v` as the next entry and sends it: entry_begin, then its bytes
  /// in chunks. Completes when every byte was handed to the transport; `v`'s
  /// memory must stay valid and unchanged until then (not longer).
  /// Errors: those of layout_builder::add (invalid_argument, unknown_kind,
  /// unknown_dtype, too_large; the blob stays usable), closed (blob finished
  /// or aborted, or the sender closed), peer_closed, peer_failed,
  /// protocol_violation (the consumer broke the protocol), invalid_argument
  /// (key longer than the consumer's max_key_bytes).
  asio::awaitable<std::error_code> emit(std::string key, value v);

  /// Ends the blob: index + v3 footer from write_tail, as one tail frame.
  /// Errors: too_large (the footer cannot address the blob; the blob is
  /// aborted), closed, peer_closed, peer_failed, protocol_violation.
  asio::awaitable<std::error_code> finish();

  /// Abandons the blob; the consumer reports it aborted with `reason`
  /// (truncated to max_reason_bytes). No-op after finish() or abort().
  /// Errors: closed, peer_closed, peer_failed.
  asio::awaitable<std::error_code> abort(std::string reason);

  const tag_t& tag() const noexcept;
  std::uint64_t id() const noexcept;      ///< blob_id on the wire
  std::size_t entry_count() const noexcept;
  explicit operator bool() const noexcept { return state_ != nullptr; }

 private:
  friend class sender;
  explicit blob_writer(std::shared_ptr<detail::blob_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::blob_state> state_;
};

/// Owns a transport and streams blobs over it. Move-only; destroying it
/// closes the connection (as close()).
class sender {
 public:
  sender() = default;
  sender(sender&&) noexcept = default;
  sender& operator=(sender&&) noexcept;
  ~sender();

  /// Runs the handshake (sends hello, waits for the consumer's) and starts
  /// reading acknowledgements. On error the transport is closed.
  /// Errors: protocol_violation (bad hello: magic, version, role, chunk),
  /// peer_closed, peer_failed, closed.
  static asio::awaitable<std::tuple<std::error_code, sender>> start(
      std::unique_ptr<transport> t, sender_options opt = {});

  /// Opens a blob with `tag` (default: a random uuid4). Nothing is sent until
  /// the first emit, finish or abort. REQUIRES: a started sender.
  blob_writer open_blob(const tag_t& tag = random_tag());

  /// Orderly close: sends `close`, then waits until the consumer has read
  /// everything and closed its end. Blobs still open are aborted by the
  /// consumer. Errors: closed, peer_failed, protocol_violation.
  asio::awaitable<std::error_code> shutdown();

  /// Closes now: every pending emit/finish/abort/shutdown completes with
  /// `closed`; blobs in flight are reported aborted by the consumer.
  void close() noexcept;

  /// The first error that ended the connection; empty while healthy.
  std::error_code error() const noexcept;

  /// Negotiated data frame size and the consumer's window, bytes.
  std::uint32_t chunk_bytes() const noexcept;
  std::uint64_t window_bytes() const noexcept;
  /// Bytes sent and not yet released by the consumer.
  std::uint64_t in_flight_bytes() const noexcept;
  sender_stats stats() const noexcept;

 private:
  explicit sender(std::shared_ptr<detail::sender_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::sender_state> state_;
};

}  // namespace blobpipe
