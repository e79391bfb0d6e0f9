// Shared state of a consumer (internal). Entry leases point back at it
// weakly, so releasing an entry after the consumer is gone is harmless.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "lib/pipeline/device_landing.hpp"
#include "lib/pipeline/receive_buffers.hpp"
#include "lib/pipeline/watchdog.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

/// A blob between blob_begin and its tail or abort.
struct open_blob {
  std::uint64_t id = 0;
  tag_t tag = NO_TAG;
  std::vector<Entry> entries;   // announced so far, in order
  std::uint64_t data_end = 0;   // aligned end of the last entry: the next offset
  // The entry being received (entry_begin seen, bytes still missing).
  std::shared_ptr<received_entry> cur;
  std::byte* dest = nullptr;    // where cur's byte 0 goes (null: discard)
  std::uint64_t received = 0;   // bytes of cur received
  // Sinks.
  std::shared_ptr<reserved_region> region;  // assemble_mode::memory
  file_slot file;                           // assemble_mode::file
  std::uint64_t file_end = 0;               // blob bytes written to the file
  bool discard = false;  // already reported aborted (sink failed): drop its bytes
  bool duplicate = false;  // resend session: delivered before; drop silently
  // consumer_options::landing: cur lands in device memory at `dest`.
  bool on_device = false;
  std::uint64_t device_gen = 0;  // device_lander::generation() at entry_begin
  std::shared_ptr<const void> device_keep;  // cur's device buffer, for the copies
};

/// A chunk payload posted (transport::post_payload), not yet waited for.
struct posted_chunk {
  std::uint64_t blob_id = 0;
  /// The entry this chunk completes, yielded once it has landed (null:
  /// more of the entry follows).
  std::shared_ptr<received_entry> completes;
  /// What owns the memory the chunk lands in (its entry's storage). Should
  /// the fetch be cut short, this goes to transport::retire, as UCX may
  /// still land it. Declared before `receipt`, so a receipt still in
  /// flight is dropped (closing the transport) before its buffer can go.
  std::shared_ptr<const void> lands_in;
  payload_receipt receipt;
};

struct consumer_state {
  consumer_state(std::unique_ptr<transport> tr, consumer_options o)
      : t(std::move(tr)), ex(t->get_executor()), opt(std::move(o)),
        dog(ex, opt.stall_timeout, opt.idle_timeout), ack_cv(ex),
        recycled(std::make_shared<buffer_pool>(opt.recycle_bytes)) {}
  /// With chunks still posted (the application dropped the consumer
  /// between next() calls), hands their buffers to the transport to keep.
  ~consumer_state();
  consumer_state(const consumer_state&) = delete;
  consumer_state& operator=(const consumer_state&) = delete;

  /// Counts `n` bytes as buffered (a new entry or tail).
  void reserve(std::uint64_t n) noexcept;
  /// Returns `n` buffered bytes; the acker tells the sender.
  void release(std::uint64_t n) noexcept;
  /// Ends the stream: open blobs become aborted events, then end_of_stream.
  void end(std::error_code ec, std::string reason);
  /// Hands the memory a receive cut short may still write into (UCX lands
  /// such fetches late) to transport::retire: the buffers of posted chunks
  /// and of the open blobs' current entries and regions.
  void retire_receive_buffers();

  std::unique_ptr<transport> t;
  asio::any_io_executor ex;
  consumer_options opt;
  std::uint32_t chunk_bytes = 0;  // negotiated
  std::map<std::uint64_t, open_blob> blobs;
  std::uint64_t last_blob_id = 0;
  std::deque<event> pending;      // events decided, not yet yielded
  bool ended = false;
  event final_event;              // end_of_stream, repeated forever
  std::vector<std::byte> scratch; // payloads of discarded blobs
  // Chunk payloads posted and not yet waited for, oldest first (after
  // `blobs`: destroyed before the buffers they write into). Entries whose
  // last chunk is here are yielded in this order as their bytes land.
  std::deque<posted_chunk> posted;
  std::size_t payload_window = 1;  // min(opt.payload_window, t->payload_window())
  bool fetch_lost = false;  // a posted chunk failed: no entry after it is yielded
  // Flow control.
  std::uint64_t pending_ack = 0;
  std::deque<std::uint64_t> delivered_ids;  // blobs to acknowledge as delivered
  // Resend session of the sender (NO_SESSION: none, no delivery acks).
  session_id session = NO_SESSION;
  std::shared_ptr<delivery_log> log;
  // Stall detection: the watchdog closes the transport; next() then
  // reports timed_out with this reason.
  watchdog dog;
  std::string timeout_reason;
  bool ack_stopped = false;
  async_condition ack_cv;
  consumer_stats stats;
  std::unique_ptr<device_lander> landing;  // consumer_options::landing enabled
  // Released entry buffers kept for reuse (consumer_options::recycle_bytes).
  std::shared_ptr<buffer_pool> recycled;
};

/// consumer::next() with the caller's cancellation turned into errors.
asio::awaitable<event> next_event(std::shared_ptr<consumer_state> s);

/// One frame, checked and turned into events (consumer_frames.cpp). An
/// error ends the stream.
asio::awaitable<result<void>> on_frame(std::shared_ptr<consumer_state> sp, const frame_header& h);

/// Whether next() should wait for the oldest posted chunk rather than read
/// the next frame: a posted chunk completes an entry, and either no frame
/// is waiting or that chunk and all before it have landed. So an entry is
/// yielded as soon as its bytes are in, while the fetches of later entries
/// stay in flight as long as their frames keep coming.
bool should_land(const consumer_state& s) noexcept;

/// Waits for the oldest posted chunk; if it completes an entry, that entry
/// becomes an event. If it failed, the buffer it was landing in is retired
/// (transport::retire: a cut-short fetch may still land) and no later entry
/// is yielded. An error ends the stream.
asio::awaitable<result<void>> land_oldest(consumer_state& s);

/// After a failure: ends the chunk payloads still posted (closing the
/// transport) and waits for each (land_oldest), so UCX has let go of them
/// or their buffers are retired before consumer_state::end() drops the
/// rest. Entries whose bytes had landed, with every chunk posted before
/// them, are still yielded (before the aborts).
asio::awaitable<void> abandon_posted(consumer_state& s);

}  // namespace blobpipe::detail
