// Shared state of a consumer (internal): the I/O around a consumer_session
// (blobpipe/protocol/consumer_session.hpp), which decides what the
// protocol decides (the hello's answer, credit, duplicates, acks, the close
// frame) and asks this state where each entry's bytes go. The state reads
// bytes into a receive buffer and hands them to the session, runs the
// sinks (memory, file, device), queues events for next() and writes what
// the session's outbox holds. Entry leases (entry_lease.hpp) point back at
// the state weakly, so releasing an entry after the consumer is gone is
// harmless.
//
//   consumer_session the protocol's decisions (blobpipe/protocol)
//   event_delivery   events for next(), and the end once decided
//   receive_landing  the receive side: buffer, posted reads, open blobs'
//                    sinks, recycled entry buffers (I/O in consumer.cpp,
//                    sinks in consumer_sinks.cpp)
//   held_entries     yielded entries waiting to move into the held
//                    allowance, whose figures are the session's
//                    (consumer_credit.cpp)
//   ack_writer       the coroutine that writes the session's acks and close
//                    frame (consumer_acks.cpp)
//   device_uploads   entries copied to device memory (consumer_uploads.cpp)
//   stream_ending    this side ending the stream: the session's timer, the
//                    timeout's reason, the close frame's linger
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/protocol/consumer_session.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/runtime/task_group.hpp"
#include "lib/pipeline/device_landing.hpp"
#include "lib/pipeline/entry_lease.hpp"
#include "lib/pipeline/receive_buffers.hpp"
#include "lib/runtime/async_sync.hpp"

namespace blobpipe::detail {

/// How long a consumer that refuses the stream waits for its close frame
/// to be written before it closes the connection regardless (close_with).
inline constexpr std::chrono::milliseconds close_linger{1000};
/// Whether an end of the stream with `ec` is the sender's fault, which the
/// consumer tells it in a close frame: a protocol violation (a limit
/// included) or a timeout (stall, idle, held, credit pressure).
bool tells_sender(std::error_code ec) noexcept;

/// Bytes the consumer reads at once into its receive buffer.
inline constexpr std::size_t receive_buffer_bytes = 256u << 10;
/// The receive buffer until the sender's hello arrived: room for the
/// largest hello frame, so a connection that never says hello costs no
/// more than this (about 4 KiB, where a full receive buffer is 256 KiB).
inline constexpr std::size_t hello_receive_bytes = frame_header_size + max_hello_bytes;
/// A payload with at least this many bytes still to come, and nothing of
/// it buffered, is read straight into its destination (read_exact).
inline constexpr std::uint64_t direct_read_bytes = 64u << 10;
// A connection's turn on its thread (consumer_options::turn_work_bytes):
// once a turn is spent the consumer yields its executor (asio::post)
// before decoding more, and what it read and has not decoded waits in the
// receive buffer, so every other connection on the thread gets its turn
// first and a peer flooding tiny frames (begin+abort pairs) gets no more of
// the thread than one sending large ones (docs/cluster.md "Fair turns").
// Its default for a server's connections: server_turn_work_bytes, one
// receive buffer.
static_assert(server_turn_work_bytes == receive_buffer_bytes);

/// A blob between blob_begin and its end, as the consumer's sinks see it
/// (the session's view, session_blob, is its base).
struct sink_blob : session_blob {
  std::shared_ptr<received_entry> cur;      // the entry receiving bytes
  std::shared_ptr<reserved_region> region;  // assemble_mode::memory
  file_slot file;                           // assemble_mode::file
  std::uint64_t file_end = 0;               // blob bytes written to the file
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
  /// Appends an empty event and returns it, to be filled in place.
  ready_event& emplace_back() {
    // A long-lived queue that never drains (reads fenced behind a posted
    // one) moves its live events down instead of growing forever.
    if (head_ >= 64 && 2 * head_ >= q_.size()) {
      q_.erase(q_.begin(), q_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
    return q_.emplace_back();
  }
  /// Drops the oldest event (whatever it still holds goes with it).
  void pop_front() noexcept {
    // Destroyed and made anew in place: assigning a fresh one would build
    // it, then move and release every field.
    static_assert(std::is_nothrow_default_constructible_v<ready_event>);
    ready_event& r = q_[head_++];
    std::destroy_at(&r);
    std::construct_at(&r);
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

/// Device uploads (consumer_options::landing, docs/cuda.md): entries whose
/// home is device memory land on the host first, then upload() copies them
/// before they are yielded. `lander` is set once the hello came, only with
/// landing enabled.
struct device_uploads {
  std::unique_ptr<device_lander> lander;

  /// Whether entry `e` goes to the device.
  bool selects(const Entry& e) const { return lander && lander->selects(e); }
  /// Copies `r`'s entry to its device buffer and makes it a device entry;
  /// counts it in `stats`. Errors: cuda_failure.
  asio::awaitable<result<void>> upload(ready_event& r, consumer_stats& stats);
};

/// The receive side ("landing"): where bytes from the transport go before
/// the decoder and the sinks have them. Owns the receive buffer, a bulk
/// payload announced and not yet read, the open blobs' sink state, the
/// reads posted (transport::post_read) and not yet waited for, and the
/// uploads of entries whose home is device memory.
/// Invariants: reads are numbered from 1 in posting order; reads
/// 1..reads_landed have been waited for, and `posted` holds exactly
/// reads_landed+1..reads_posted, oldest first, at most read_window of
/// them. `posted` is declared after `blobs`: destroyed before the buffers
/// they write into.
struct receive_landing {
  std::vector<std::byte> rx;     // the receive buffer
  // rx[rx_at, rx_end): read, not yet decoded (a turn ran out first).
  std::size_t rx_at = 0;
  std::size_t rx_end = 0;
  // A message transport's bulk payload announced with the bytes in rx,
  // checked once they are all decoded (then bulk_pending).
  std::size_t bulk_announced = 0;
  std::size_t bulk_pending = 0;  // a bulk payload read_some announced, bytes
  std::map<std::uint64_t, sink_blob> blobs;
  std::deque<posted_read> posted;
  std::uint64_t reads_posted = 0;  // numbered from 1
  std::uint64_t reads_landed = 0;  // reads 1..reads_landed have been waited for
  std::size_t read_window = 1;     // min(opt.payload_window, t->read_window())
  // Released entry buffers kept for reuse (consumer_options::recycle_bytes).
  std::shared_ptr<buffer_pool> recycled;
  // Released small entries' blocks kept for reuse
  // (consumer_options::recycle_small_entries; null when 0).
  std::shared_ptr<block_pool> small_blocks;
  // Entries whose home is device memory (consumer_options::landing).
  device_uploads device;

  /// Hands the memory a read cut short may still write into (UCX lands
  /// such fetches late) to `t`.retire: the buffers of posted reads and of
  /// the open blobs' current entries and regions.
  void retire_buffers(transport& t);
};

/// Yielded entries waiting to move into the held allowance
/// (consumer_options::held_bytes, docs/reliability.md "Held entries"): the
/// allowance's figures are the session's (consumer_session::hold); their
/// storage (entry leases) waits here, oldest first.
struct held_entries {
  std::deque<std::weak_ptr<const void>> unpromoted;
  std::size_t unpromoted_compacted = 0;  // size after the last sweep of expired ones

  /// Queues a yielded entry's storage to move into the held allowance,
  /// sweeping out dropped ones once the queue doubled since the last sweep.
  void queue_unpromoted(std::weak_ptr<const void> storage);
};

/// Where the consumer's credit comes back from, besides its own reads:
/// its entries' leases (dropped on any thread), the pool it is a member
/// of, and the held allowance (entries the application holds move there,
/// and their credit goes back).
struct credit_returns {
  std::shared_ptr<lease_home> leases;  // every entry's lease shares it (made with the first)
  std::uint64_t pool_member = 0;       // opt.pool's id for us (0: not pooled)
  held_entries held;                   // yielded, waiting for the held allowance
};

/// Delivery to next(): events decided and not yet yielded, and the end
/// of the stream once decided.
struct event_delivery {
  event_queue pending;
  bool ended = false;
  event final_event;                        // end_of_stream, repeated forever
  std::optional<std::string> close_reason;  // the sender's close frame, once decoded
};

/// Ending the stream from this side: the timer that calls the session's
/// on_time() when it says (watch, consumer.cpp), the reason an expired
/// clock or the handshake's deadline gave (next() then reports timed_out
/// with it), and the bound on the close frame's write (close_with()).
struct stream_ending {
  explicit stream_ending(const asio::any_io_executor& ex) : timer(ex) {}
  asio::steady_timer timer;
  std::string timeout_reason;
  std::optional<deadline> close_bound;  // closes the transport after close_linger
};

/// The ack writer (ack_loop, consumer_acks.cpp): wakes when the session
/// says acks are due, and writes what it framed.
struct ack_writer {
  explicit ack_writer(const asio::any_io_executor& ex) : cv(ex) {}
  async_condition cv;
  bool running = false;  // ack_loop started (our hello is sent)
};

/// The consumer: the session's listener (consumer_sinks.cpp) and the I/O
/// around it.
struct consumer_state final : consumer_session_listener,
                              std::enable_shared_from_this<consumer_state> {
  /// `one_larger_alone`: held_bytes was left at its default (see
  /// consumer_session_options::one_larger_alone).
  consumer_state(std::unique_ptr<transport> tr, consumer_options o, bool one_larger_alone);
  /// With reads still posted (the application dropped the consumer between
  /// next() calls), hands their buffers to the transport to keep.
  ~consumer_state() override;
  consumer_state(const consumer_state&) = delete;
  consumer_state& operator=(const consumer_state&) = delete;

  // consumer_session_listener: sinks (consumer_sinks.cpp)
  result<session_blob*> blob_begin(std::uint64_t blob_id, const tag_t& tag,
                                   bool duplicate) override;
  result<std::span<std::byte>> entry_begin(session_blob& b, const entry_announcement& a) override;
  result<void> entry_complete(session_blob& b) override;
  result<bool> blob_complete(session_blob& b, blob_index index,
                             std::span<const std::byte> tail) override;
  void blob_abort(session_blob& b, std::error_code ec, std::string reason, bool resend) override;
  void blob_end(session_blob& b) override;
  void blob_in_group(session_blob& b, const blob_group& g) override;
  void closed(std::string_view reason) override;
  // consumer_session_listener: the pool and the ack writer (consumer_credit.cpp)
  std::uint64_t pool_join() override;
  void pool_request(std::uint64_t credit) override;
  void pool_released(std::uint64_t credit) override;
  void acks_due() override { acker.cv.notify_all(); }
  bool pool_pressed() override;

  /// The pool granted `credit` to this connection: tell the sender.
  void grant(std::uint64_t credit) noexcept;
  /// Returns `credit` bytes (an entry released); the session tells the
  /// sender or the pool. `yielded`: the application had it, in the window.
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
  /// Moves `lease`'s yielded entry into the held allowance if it may move
  /// now (delivered, where waits are reported) and fits; its credit goes
  /// back to the sender. False: it stays in the window.
  bool hold_now(entry_lease& lease, consumer_session::time_point now) noexcept;

  /// The time for a session call that may change what its clocks see:
  /// the clock's while they run (a wait open), else none (not read).
  consumer_session::time_point clock_now() const noexcept {
    return session.clocks_running() ? std::chrono::steady_clock::now()
                                     : consumer_session::time_point{};
  }
  /// The time for wait_begins()/wait_ends(): the clock's while a limit is set.
  consumer_session::time_point wait_now() const noexcept {
    return session.clocks_set() ? std::chrono::steady_clock::now()
                                : consumer_session::time_point{};
  }
  /// Stops the session's clocks and their timer (the watch coroutine ends).
  void stop_clocks() noexcept {
    session.stop_clocks();
    ending.timer.cancel();
  }
  /// Queues `ev` behind the posted reads so far.
  void push(event&& ev);
  /// Ends the stream: open blobs become aborted events, then end_of_stream.
  /// An end for a fault of the sender's (tells_sender) closes through
  /// close_with, so the sender learns why.
  void end(std::error_code ec, std::string reason);
  /// Closes the connection, telling the sender `reason` in a close frame
  /// (docs/wire.md "Closing"): the acker writes it after what it is writing
  /// and then closes the transport; close_linger after this call the
  /// transport is closed whatever the write's state (a sender that reads
  /// nothing cannot hold it open). Before the acker runs (the handshake:
  /// the sender expects our hello first) it closes at once. Idempotent.
  void close_with(std::string reason);
  /// A posted read of blob `blob_id` failed: none of that blob's later
  /// events may be yielded (a completion becomes an abort).
  void lose_blob(std::uint64_t blob_id, std::error_code ec, const std::string& reason);

  std::unique_ptr<transport> t;
  asio::any_io_executor ex;
  consumer_options opt;
  consumer_session session;
  credit_returns credit;
  event_delivery events;
  receive_landing receive;
  ack_writer acker;
  stream_ending ending;
  // The acker (ack_loop) and the session's timer (watch): cancelled by
  // consumer::close(), joined before the first end_of_stream.
  task_group tasks;
  consumer_stats stats;
};

/// Writes `out` (frames the consumer sends: hello, acks) in one write.
asio::awaitable<std::error_code> write_frames(transport& t, const outbox& out);

/// Writes the acks the session owes (consumer_session::frame_acks),
/// coalesced: one write of what was owed each time it runs; then, when the
/// session refused the stream, its close frame, and closes the transport.
asio::awaitable<void> ack_loop(std::shared_ptr<consumer_state> s);

/// consumer::next() with the caller's cancellation turned into errors.
asio::awaitable<event> next_event(std::shared_ptr<consumer_state> s);

/// consumer::next_batch(): next_event(), then every event ready without
/// waiting, up to `max_events` in all, appended to `out`; returns how many.
asio::awaitable<std::size_t> next_events(std::shared_ptr<consumer_state> s,
                                         std::vector<event>& out, std::size_t max_events);

/// One step of input: decodes what the receive buffer still holds, else
/// reads what the transport has (or a payload straight into its
/// destination, or posts its read) and decodes it, at most a turn's work
/// (consumer_options::turn_work_bytes); a turn spent yields the executor first. An error
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
