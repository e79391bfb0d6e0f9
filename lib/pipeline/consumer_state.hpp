// Shared state of a consumer (internal): an I/O loop around the push
// decoder (blobpipe/protocol/decoder.hpp). The loop reads bytes into a
// receive buffer and hands them to the decoder, which checks every frame
// and calls this state back (it is the decoder's listener); the callbacks
// pick each entry's destination (sinks) and queue events for next().
// Entry leases point back at the state weakly, so releasing an entry
// after the consumer is gone is harmless.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "lib/pipeline/device_landing.hpp"
#include "lib/pipeline/receive_buffers.hpp"
#include "lib/pipeline/watchdog.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

/// Bytes the consumer reads at once into its receive buffer.
inline constexpr std::size_t receive_buffer_bytes = 256u << 10;
/// The receive buffer until the sender's hello arrived: room for the
/// largest hello frame, so a connection that never says hello costs no
/// more than this (issue 26: 1,100 silent connections held 288 MB).
inline constexpr std::size_t hello_receive_bytes = frame_header_size + max_hello_bytes;
/// A payload with at least this many bytes still to come, and nothing of
/// it buffered, is read straight into its destination (read_exact).
inline constexpr std::uint64_t direct_read_bytes = 64u << 10;
/// A connection's turn on its thread, in bytes of decoder work
/// (decoder::work(): bytes decoded, every frame counted as at least
/// decoder::frame_work_floor_bytes): one receive buffer's worth, so at most
/// 64 frames. Once a turn is spent the consumer yields its executor
/// (asio::post) before decoding more, and what it read and has not decoded
/// waits in the receive buffer: every other connection on the thread gets
/// its turn first, so a peer flooding tiny frames (begin+abort pairs) gets
/// no more of the thread than one sending large ones (issue 26;
/// docs/cluster.md "Fair turns").
inline constexpr std::uint64_t turn_work_bytes = receive_buffer_bytes;

/// A blob between blob_begin and its end, as the consumer's sinks see it
/// (the decoder keeps the protocol's view of it).
struct sink_blob {
  std::uint64_t id = 0;
  tag_t tag = NO_TAG;
  std::shared_ptr<received_entry> cur;      // the entry receiving bytes
  std::shared_ptr<reserved_region> region;  // assemble_mode::memory
  file_slot file;                           // assemble_mode::file
  std::uint64_t file_end = 0;               // blob bytes written to the file
  bool discard = false;    // reported aborted already (sink failed): drop its bytes
  bool duplicate = false;  // resend session: delivered before; drop silently
  // consumer_options::landing: cur goes to this device buffer.
  std::shared_ptr<cuda::device_buffer> device;
  std::optional<blob_group> group;  // feature_blob_groups: named at blob_begin
};

/// An event decided, and what must happen before it is yielded.
struct ready_event {
  event ev;
  /// Posted reads (transport::post_read) numbered up to this one must have
  /// landed first: entries are yielded in frame order, each once its bytes
  /// are in.
  std::uint64_t after_read = 0;
  /// consumer_options::landing: the entry (whose bytes are on the host
  /// still) and its device buffer, to copy there first.
  std::shared_ptr<received_entry> upload;
  std::shared_ptr<cuda::device_buffer> device;
};

/// Events decided and not yet yielded, oldest first: a vector read from
/// its head, whose storage is reused once the queue drains (next() drains
/// it after each read). A std::deque of these events (about 200 bytes
/// each) allocated a node every two events. Holds at most what one read
/// decodes plus what waits for posted reads; storage past
/// max_kept_events is given back when the queue drains.
class event_queue {
 public:
  static constexpr std::size_t max_kept_events = 4096;

  bool empty() const noexcept { return head_ == q_.size(); }
  std::size_t size() const noexcept { return q_.size() - head_; }
  ready_event& front() noexcept { return q_[head_]; }
  ready_event& back() noexcept { return q_.back(); }
  ready_event& operator[](std::size_t i) noexcept { return q_[head_ + i]; }
  void push_back(ready_event r) {
    // A long-lived queue that never drains (reads fenced behind a posted
    // one) moves its live events down instead of growing forever.
    if (head_ >= 64 && 2 * head_ >= q_.size()) {
      q_.erase(q_.begin(), q_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
    q_.push_back(std::move(r));
  }
  /// Drops the oldest event (whatever it still holds goes with it).
  void pop_front() noexcept {
    q_[head_++] = ready_event{};
    if (head_ != q_.size()) return;
    head_ = 0;
    if (q_.capacity() > max_kept_events) q_ = std::vector<ready_event>();
    else q_.clear();
  }
  /// Removes event `i` (0: the oldest).
  void erase(std::size_t i) { q_.erase(q_.begin() + static_cast<std::ptrdiff_t>(head_ + i)); }
  /// Puts `r` before event `i`.
  void insert(std::size_t i, ready_event r) {
    q_.insert(q_.begin() + static_cast<std::ptrdiff_t>(head_ + i), std::move(r));
  }

 private:
  std::vector<ready_event> q_;
  std::size_t head_ = 0;
};

/// A read posted (transport::post_read), not yet waited for.
struct posted_read {
  std::uint64_t number = 0;
  std::uint64_t blob_id = 0;
  /// What owns the memory the read lands in (its entry's storage). Should
  /// the read be cut short, this goes to transport::retire, as UCX may
  /// still land it. Declared before `receipt`, so a receipt still in
  /// flight is dropped (closing the transport) before its buffer can go.
  std::shared_ptr<const void> lands_in;
  payload_receipt receipt;
};

struct consumer_state final : decoder_listener, std::enable_shared_from_this<consumer_state> {
  consumer_state(std::unique_ptr<transport> tr, consumer_options o);
  /// With reads still posted (the application dropped the consumer between
  /// next() calls), hands their buffers to the transport to keep.
  ~consumer_state() override;
  consumer_state(const consumer_state&) = delete;
  consumer_state& operator=(const consumer_state&) = delete;

  // decoder_listener (consumer_sinks.cpp)
  result<void> on_hello(const hello& h) override;
  result<void*> on_blob_begin(std::uint64_t blob_id, const tag_t& tag) override;
  result<std::span<std::byte>> on_entry_begin(void* blob, const entry_announcement& a) override;
  result<void> on_entry_complete(void* blob, std::uint64_t blob_id) override;
  result<void> on_blob_complete(void* blob, std::uint64_t blob_id, blob_index index,
                                std::span<const std::byte> tail) override;
  result<void> on_blob_abort(void* blob, std::uint64_t blob_id, std::string_view reason) override;
  result<void> on_close(std::string_view reason) override;
  // The optional features (consumer_features.cpp).
  result<void> on_blob_group(void* blob, std::uint64_t blob_id, const blob_group& g) override;
  result<void> on_credit_request(std::uint64_t credit) override;

  /// Negotiates the features of the sender's hello `h` (on_hello): which
  /// it accepts, and with credit grants joins opt.pool. Returns the window
  /// to advertise (the pool's initial grant, or opt.window_bytes).
  std::uint64_t negotiate_features(const hello& h, decoder_limits& l);
  /// The pool granted `credit` to this connection: tell the sender.
  void grant(std::uint64_t credit) noexcept;
  /// Hands `credit` released here to the pool; false when not pooled.
  bool pool_released(std::uint64_t credit) noexcept;
  /// Publishes the decoder's buffered bytes for the pool's calls from
  /// other threads (credit_pool.hpp "Threading").
  void publish_buffered() noexcept;

  /// consumer_options::landing: copies `r`'s entry to its device buffer
  /// and makes it a device entry. Errors: cuda_failure.
  asio::awaitable<result<void>> upload(ready_event& r);
  /// Returns `credit` bytes (an entry released); the acker tells the sender.
  /// `yielded`: the application had it, in the window (held_in_window).
  void release(std::uint64_t credit, bool yielded = false) noexcept;
  /// An entry held outside the window (consumer_options::held_bytes) was
  /// dropped: its allowance is free again (its credit went back already).
  void release_held(std::uint64_t credit) noexcept;
  /// next() yields `ev`: an entry goes to the application, and into the
  /// held allowance if it fits.
  void on_yield(const event& ev);
  /// Moves yielded entries still held into the held allowance, oldest
  /// first, while they fit; their credit goes back to the sender.
  void promote_held() noexcept;
  /// Tells the watchdog whether the sender is to blame for a silence (it
  /// holds credit, or a frame is half sent) and whether the application
  /// is (held_timeout).
  void update_watch() noexcept;
  /// Takes the credit the decoder released itself, for the next ack.
  void collect_returned_credit() noexcept;
  /// Queues `ev` behind the posted reads so far.
  void push(event ev);
  /// Ends the stream: open blobs become aborted events, then end_of_stream.
  void end(std::error_code ec, std::string reason);
  /// A posted read of blob `blob_id` failed: none of that blob's later
  /// events may be yielded (a completion becomes an abort).
  void lose_blob(std::uint64_t blob_id, std::error_code ec, const std::string& reason);
  /// Hands the memory a read cut short may still write into (UCX lands
  /// such fetches late) to transport::retire: the buffers of posted reads
  /// and of the open blobs' current entries and regions.
  void retire_receive_buffers();

  std::unique_ptr<transport> t;
  asio::any_io_executor ex;
  consumer_options opt;
  decoder frames;
  std::vector<std::byte> rx;      // the receive buffer
  // rx[rx_at, rx_end): read, not yet decoded (a turn ran out first).
  std::size_t rx_at = 0;
  std::size_t rx_end = 0;
  // A message transport's bulk payload announced with the bytes in rx,
  // checked once they are all decoded (then bulk_pending).
  std::size_t bulk_announced = 0;
  std::size_t bulk_pending = 0;   // a bulk payload read_some announced, bytes
  std::optional<hello> peer;      // the sender's hello, once read
  std::uint32_t chunk_bytes = 0;  // negotiated
  std::map<std::uint64_t, sink_blob> blobs;
  event_queue pending;  // events decided, not yet yielded
  bool ended = false;
  event final_event;              // end_of_stream, repeated forever
  std::optional<std::string> close_reason;  // the sender's close frame, once decoded
  // Reads posted and not yet waited for, oldest first (after `blobs`:
  // destroyed before the buffers they write into).
  std::deque<posted_read> posted;
  std::uint64_t reads_posted = 0;   // numbered from 1
  std::uint64_t reads_landed = 0;   // reads 1..reads_landed have been waited for
  std::size_t read_window = 1;      // min(opt.payload_window, t->read_window())
  // Flow control.
  std::uint64_t features = 0;       // negotiated (our hello's answer)
  std::uint64_t window_offer = 0;   // our hello's window_bytes
  std::uint64_t pool_member = 0;    // opt.pool's id for us (0: not pooled)
  // frames.buffered_bytes() as of our last read or pool call, for the
  // pool's calls from other threads (shared: the pool may read it after
  // we are gone).
  std::shared_ptr<std::atomic<std::uint64_t>> buffered_published =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::uint64_t pending_ack = 0;
  std::deque<std::uint64_t> delivered_ids;  // blobs to acknowledge as delivered
  bool ack_due = false;                     // ack_cv notified, ack not yet sent
  // Resend session of the sender (NO_SESSION: none, no delivery acks).
  session_id session = NO_SESSION;
  std::shared_ptr<delivery_log> log;
  // Stall detection: the watchdog closes the transport; next() then
  // reports timed_out with this reason.
  watchdog stall_watch;
  std::uint64_t bytes_in = 0;  // bytes read from the transport in all (stall progress)
  std::string timeout_reason;
  bool ack_stopped = false;
  async_condition ack_cv;
  consumer_stats stats;
  std::unique_ptr<device_lander> landing;  // consumer_options::landing enabled
  // Held allowance (consumer_options::held_bytes): credit of yielded
  // entries moved out of the window, and of yielded entries still in it;
  // the latter's storage (entry leases), oldest first, to move later.
  std::uint64_t held_credit = 0;
  std::uint64_t held_in_window = 0;
  std::deque<std::weak_ptr<const void>> unpromoted;
  std::size_t unpromoted_compacted = 0;  // size after the last sweep of expired ones
  bool app_waiting = false;              // opt.waits_reported: application_waits() since the last yield
  std::uint64_t credit_wanted = 0;       // the sender's last credit request not yet granted
  // Released entry buffers kept for reuse (consumer_options::recycle_bytes).
  std::shared_ptr<buffer_pool> recycled;
};

/// consumer::next() with the caller's cancellation turned into errors.
asio::awaitable<event> next_event(std::shared_ptr<consumer_state> s);

/// One step of input: decodes what the receive buffer still holds, else
/// reads what the transport has (or a payload straight into its
/// destination, or posts its read) and decodes it, at most a turn's work
/// (turn_work_bytes); a turn spent yields the executor first. An error
/// ends the stream.
asio::awaitable<result<void>> read_input(consumer_state& s);

/// Waits for the oldest posted read. If it failed, its buffer is retired
/// (transport::retire: a cut-short fetch may still land) and its blob is
/// lost (lose_blob). Errors: the read's.
asio::awaitable<result<void>> land_oldest(consumer_state& s);

/// After a failure: ends the reads still posted (closing the transport)
/// and waits for each (land_oldest), so UCX has let go of them or their
/// buffers are retired before consumer_state::end() drops the rest.
asio::awaitable<void> abandon_posted(consumer_state& s);

}  // namespace blobpipe::detail
