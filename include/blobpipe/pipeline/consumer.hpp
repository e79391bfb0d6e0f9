// blobpipe/pipeline/consumer.hpp — receiving streamed blobs as events.
//
// `co_await consumer.next()` reads frames and yields one event at a time:
//   entry_ready    — an entry's bytes have all arrived: tag, Entry and a
//                    zero-copy entry_view into the receive buffer. Yielded
//                    before later entries of the blob and before its tail.
//   blob_complete  — the tail arrived and the received index and footer
//                    agree with the entries seen (keys, offsets, lengths,
//                    kinds, dtypes, shapes) and the tag from blob_begin.
//   blob_aborted   — the producer aborted the blob, or the connection ended
//                    or broke before its tail; never followed by complete.
//   end_of_stream  — the connection ended; `error` is empty after an
//                    orderly close, else why (protocol_violation, peer_closed,
//                    peer_failed, closed). Every later next() repeats it.
//
//   auto [ec, c] = co_await blobpipe::consumer::start(std::move(t), {.window_bytes = 64 << 20});
//   for (;;) {
//     auto ev = co_await c.next();
//     if (ev.kind == blobpipe::event_kind::end_of_stream) break;
//     if (ev.kind == blobpipe::event_kind::entry_ready)
//       use(ev.entry->view);          // bytes valid while ev.entry is held
//   }
//
// next_batch() yields the same events, every one a read completed at once
// (one resumption for all of them; small entries come hundreds a read):
//
//   std::vector<blobpipe::event> evs;
//   for (;;) {
//     evs.clear();
//     co_await c.next_batch(evs);
//     for (auto& ev : evs) handle(ev);  // as the loop above
//     if (evs.back().kind == blobpipe::event_kind::end_of_stream) break;
//   }
//
// The receive path is an I/O loop around the push decoder
// (blobpipe/protocol/decoder.hpp): it reads what has arrived into a
// 256 KiB receive buffer and decodes every frame in it. Copies (docs/wire.md
// "Consumer"): an entry sent inline (the sender's copy threshold,
// inline_bytes) is copied once out of the receive buffer into its own
// 64-byte aligned buffer; a larger one is read from the socket straight into
// that buffer (or the blob's assembly buffer) at the chunk's offset, except
// for bytes that arrived in the same read as its frame header (at most the
// receive buffer's size), which are copied once. Allocations: an entry of
// up to 256 bytes lands, 64-byte aligned, in the one heap block that also
// holds its received_entry and the lease of its window credit (the shape's
// dims are inline, shape_t), a block kept from a released entry once the
// consumer is warm (recycle_small_entries), else one allocation; a
// larger one takes a block of that kind and a buffer of its own (or one kept for
// reuse, recycle_bytes, or its place in an assembled blob; docs/performance.md
// "Per small entry, instructions").
//
// Memory: every byte the consumer holds counts against its window, in
// credit bytes: an entry costs len + 2 * (key + meta) + entry_overhead_bytes
// (its bytes, its key and meta, and their bookkeeping), a tail its length
// while it is checked. The sender only sends what fits the window
// (blobpipe/pipeline/producer.hpp), and the consumer rejects a sender that
// overruns it (protocol_violation). An entry's part is released when the
// last copy of its `std::shared_ptr<const received_entry>` is dropped, the
// rest when its blob ends; the credit then goes back to the sender, in
// coalesced acks. One entry larger than the whole window is admitted when
// nothing else is buffered.
//
// Held allowance (consumer_options::held_bytes): an entry next() has
// yielded and the application still holds moves out of the window, its
// credit going back to the sender, while the entries so moved fit in
// held_bytes; dropping it then frees the allowance, not the window. So
// the entry credit of one consumer stays within window_bytes + held_bytes
// (neither is a hard limit: one larger entry, admitted alone to the window
// or moved alone into an empty allowance, takes its own credit instead).
// An application that holds more than that, and waits for an entry that
// cannot come, gets timed_out after held_timeout, naming both, instead of
// waiting forever.
//
// Threading: one next() or next_batch() at a time, on the transport's
// executor. Entries may be held and dropped on any thread, as long as
// that executor's execution context (the io_context) still exists:
// dropped elsewhere, an entry's window credit goes back through a post to
// that executor, and a small entry's block to the consumer's pool.
// Source: docs/wire.md "Consumer", "Flow control", "Limits".
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/credit_pool.hpp"
#include "blobpipe/pipeline/delivery.hpp"
#include "blobpipe/cuda.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/index.hpp"
#include "blobpipe/protocol/wire.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe {

namespace detail {
struct consumer_state;
}

inline constexpr std::uint64_t default_window_bytes = 64ull << 20;  ///< 64 MiB
inline constexpr std::uint64_t default_recycle_bytes = 64ull << 20;  ///< 64 MiB
/// consumer_options::recycle_small_entries: 4096 blocks.
inline constexpr std::uint64_t default_recycle_small_entries = 4096;
/// consumer_options::held_bytes: as much as window_bytes (the default).
inline constexpr std::uint64_t held_bytes_of_window = ~0ull;

/// Where a complete blob ends up, besides the per-entry views.
enum class assemble_mode {
  none,    ///< entries only; each in its own 64-byte aligned buffer
  memory,  ///< the whole blob in one buffer (completed_blob::bytes)
  file,    ///< written at an offset of a file (consumer_options::file_slot)
};

/// Where assemble_mode::file writes one blob: at `offset` of `fd`.
struct file_slot {
  int fd = -1;               ///< open for writing; not closed by the consumer
  std::uint64_t offset = 0;  ///< bytes from file start of the blob's byte 0
};

/// consumer_options::turn_work_bytes of a fan-in server's connections
/// (docs/cluster.md "Fair turns"): one receive buffer, 256 KiB, so at most
/// 64 frames a turn.
inline constexpr std::uint64_t server_turn_work_bytes = 256u << 10;

struct consumer_options {
  /// Most bytes buffered at once (entries not released + a tail being
  /// checked), advertised to the sender in the handshake.
  std::uint64_t window_bytes = default_window_bytes;
  /// Largest data frame accepted, bytes; the handshake picks
  /// min(this, the sender's proposal).
  std::uint32_t max_chunk_bytes = default_chunk_bytes;
  /// Largest entry accepted inline in its entry_begin, bytes (<=
  /// max_inline_bytes); the handshake picks min(this, the sender's copy
  /// threshold).
  std::uint32_t inline_bytes = default_inline_bytes;
  std::uint32_t max_key_bytes = default_max_key_bytes;    ///< bytes
  std::uint32_t max_meta_bytes = default_max_meta_bytes;  ///< bytes
  std::uint64_t max_entry_bytes = 1ull << 32;   ///< one entry's len, bytes
  std::uint32_t max_tail_bytes = 256u << 20;    ///< index + footer, bytes
  /// Whole blob (data + tail), bytes. assemble_mode::memory reserves this
  /// much address space per open blob (pages are committed as bytes land).
  std::uint64_t max_blob_bytes = 1ull << 32;
  std::uint32_t max_open_blobs = 4096;          ///< blobs begun and not ended
  std::uint64_t max_entries_per_blob = 1u << 24;
  /// Chunk payloads fetched at once (transport::post_read) when the
  /// transport allows more than one (read_window(); UCX does, for bulk
  /// payloads): the next chunk, of the same entry or of a later one
  /// (another producer's), starts arriving before the previous one has
  /// ended, instead of each costing a round trip. Entries are still
  /// yielded in frame order, each as soon as its bytes and those of the
  /// entries before it are in: while nothing further is waiting
  /// (transport::readable), next() waits for the oldest fetch rather than
  /// the next bytes. 1: one at a time. File sinks and device landing
  /// always read one at a time.
  /// It bounds fetches in flight, not memory (window_bytes does): 16 lets
  /// a consumer fetch a data frame from each of 16 producers at once, and
  /// over UCX keeps later frames' fetches going while one lands
  /// (docs/ucx.md "The pipeline over UCX").
  std::size_t payload_window = 16;
  /// Entry buffers kept for later entries once released, bytes (0: none).
  /// Bytes landing in fresh memory cost a page fault and a zeroed page per
  /// 4 KiB, and the C allocator returns buffers of several MiB to the
  /// kernel when they are freed, so without reuse every large entry pays
  /// that again (docs/ucx.md "The pipeline over UCX"). Buffers of 64 KiB
  /// and more are kept, in size classes
  /// (at most 12.5% larger than the entry; that rounding is memory beyond
  /// the window too); once this is exceeded the least recently released
  /// go first, and a buffer larger than this is never kept. Kept buffers
  /// are memory on top of the window (consumer_stats::recycle_kept_bytes).
  std::uint64_t recycle_bytes = default_recycle_bytes;
  /// Small entries' blocks kept for later entries once released, count (0:
  /// none). An entry of up to 256 bytes lands in one heap block with its
  /// received_entry and lease (about 1.2 KB; the file comment); a kept
  /// block is reused without operator new or delete, whichever thread
  /// dropped the entry (docs/performance.md "Per small entry, instructions"). Once
  /// this many are kept, a released block is freed. Kept blocks are
  /// memory on top of the window (consumer_stats::small_entry_kept_bytes):
  /// the default keeps at most about 5 MB.
  std::uint64_t recycle_small_entries = default_recycle_small_entries;

  // `{}` on the members below: see sender_options::resend.

  /// Resend sessions (docs/wire.md "Delivery"): the tags of blobs already
  /// delivered, shared by every consumer that may serve the same sender
  /// across its reconnects (all connections one listener accepts). Null:
  /// delivery_log::process_default(). Its window is advertised in the hello.
  std::shared_ptr<delivery_log> delivered{};

  /// The longest start() may take: waiting for the sender's hello and
  /// writing the answer (0: no limit). Past it start() closes the
  /// connection and fails with timed_out. On by default, so a connection
  /// that never says hello (a port scanner, a stray client, a peer that
  /// hangs) cannot hold a consumer, or the slot an application keeps for
  /// it, for longer.
  std::chrono::milliseconds handshake_timeout{10'000};

  /// Timeouts after the handshake (0: none). next() ends the stream with
  /// timed_out, tells the sender why in a close frame and closes the
  /// connection, when it has waited on the sender for this long:
  /// `stall_timeout` without progress (an entry or blob completed, or 1 MiB
  /// of entry and tail bytes: so also a sender slower than 1 MiB per
  /// stall_timeout, or sending only frames that complete nothing) while
  /// the sender owes bytes (a frame is incomplete, or a blob is open while
  /// the sender holds credit to send on: not while it waits for credit the
  /// application holds, or asked for credit not yet met), `idle_timeout`
  /// with no byte arriving at all. Both apply to the sender's hello as
  /// well. docs/reliability.md "Timeouts".
  /// Both are off by default for a plain consumer (a fan-in server sets
  /// stall_timeout to 60 s for its connections): a worker may keep a blob
  /// open between entries for as long as generation takes (a group's
  /// completions emitted as each finishes), which the stall clock cannot
  /// tell from a hung one. Set stall_timeout when producers emit a blob's
  /// entries back to back.
  /// An idle producer sends nothing (the wire has no keepalive frame), so
  /// idle_timeout also ends a healthy but quiet connection (a plain sender
  /// then fails; a resend session reconnects). That is why it is off by
  /// default: rollout workers are quiet for as long as generation or a
  /// training step takes, minutes, and no default fits every job; a
  /// peer that is gone is reported by the transport instead (TCP: reset or
  /// end of file; UCX: peer error handling and its link). An application
  /// that knows how long its producers may be quiet sets it (the rollout
  /// example: 30 s).
  std::chrono::milliseconds stall_timeout{0};
  std::chrono::milliseconds idle_timeout{0};

  /// Held allowance, bytes of credit (docs/reliability.md "Held entries"):
  /// entries the application has been given and still holds leave the
  /// window for it, oldest first, while they fit, and their credit goes
  /// back to the sender at once. So a loop that keeps the previous event
  /// (and its value) while it waits for the next one, as the README's
  /// does, never starves the sender, whatever an entry's size: with the
  /// default allowance and no pool, one entry larger than the allowance
  /// moves alone into an empty one (an explicit value is a cap; a pooled
  /// connection's credit stays the pool's). Entries of
  /// an assembled blob (assemble_mode::memory) stay in the window.
  /// Memory: the consumer's entries take at most window_bytes (or their
  /// share of the pool; or one entry's credit, when a single entry larger
  /// than the window was admitted alone) + held_bytes (or one entry's
  /// credit, when a single larger entry moved alone) of credit. Default
  /// (held_bytes_of_window): window_bytes. 0: entries hold window credit
  /// until dropped.
  std::uint64_t held_bytes = held_bytes_of_window;
  /// The longest next() waits with the held allowance full and part of
  /// the window held by the application, nothing arriving, before it ends
  /// the stream with timed_out and a reason naming the window, the bytes
  /// held and held_bytes (0: no limit). The sender may be waiting for the
  /// credit the application holds: no byte may ever come. Checked a
  /// quarter of the limit at a time (like stall_timeout), so it trips
  /// within 1.25 times it.
  std::chrono::milliseconds held_timeout{30'000};
  /// For a reader that calls next() ahead of the application and queues
  /// its events (the Python binding, the fan-in server): an entry is the
  /// application's once the reader says so (mark_delivered()), and the
  /// application waits only when the reader says so
  /// (consumer::application_waits()); held entries move into the held
  /// allowance then, and held_timeout counts only then. So the reader's
  /// queue stays within the window. false: an entry is the application's
  /// when next() yields it, and the application waits whenever next()
  /// waits.
  bool waits_reported = false;
  /// Fair turns (docs/cluster.md "Fair turns"), bytes of decoding work:
  /// after this much (every frame counted as at least 4 KiB,
  /// decoder::frame_work_floor_bytes) next() lets every other handler
  /// ready on its executor run before it decodes more, so connections
  /// sharing a thread share it whatever their frames. 0: no turns, the
  /// whole read is decoded at once (a consumer alone on its thread; each
  /// yield costs a post and coroutine frames Asio may not recycle, about
  /// 0.13 allocations per 64-byte entry in //test:receive_alloc_test).
  /// A fan-in server sets it to server_turn_work_bytes for its
  /// connections when this is 0.
  std::uint64_t turn_work_bytes = 0;

  assemble_mode assemble = assemble_mode::none;
  /// assemble_mode::file: called at blob_begin to place the blob. An error
  /// aborts that blob (its bytes are still received, then dropped).
  std::function<result<file_slot>(std::uint64_t blob_id, const tag_t& tag)> file_slot_for{};

  /// Land entries in CUDA device memory (docs/cuda.md "Consumer"): the
  /// selected entries are yielded with received_entry::device set once
  /// their bytes are on the device. start() fails with cuda_failure when
  /// there is no device, invalid_argument with another assemble mode.
  cuda::landing_options landing{};

  /// Optional wire features accepted when the sender offers them
  /// (docs/wire_features.md): feature_entry_timestamps
  /// (received_entry::sent_ns), feature_blob_groups (event::group) and
  /// feature_compact_entries (entry rows in a fixed binary form instead of
  /// msgpack; leave it out and the sender sends msgpack meta maps).
  /// feature_credit_grants is accepted exactly when `pool` is set.
  std::uint64_t accept_features = feature_blob_groups | feature_compact_entries;

  /// A receive budget shared with other consumers (credit_pool.hpp; a
  /// fan-in server sets it). Null: this consumer's own window_bytes. Set:
  /// a sender offering credit grants (every blobpipe sender does) gets its
  /// credit from the pool and window_bytes is not used; a sender that
  /// does not offer them (an older release) is refused at its hello
  /// (protocol_violation), as its window would be outside the pool. The pool and this
  /// consumer must live on one executor. Keep the consumer until its
  /// entries are released (stats().buffered_bytes == 0): destroyed
  /// earlier, the pool forgets what they hold.
  std::shared_ptr<credit_pool> pool{};
};

/// consumer::next_batch's max_events: events one call appends at most.
inline constexpr std::size_t default_batch_events = 1024;

enum class event_kind { entry_ready, blob_complete, blob_aborted, end_of_stream };

/// A received entry. Holding it keeps its bytes (and their window credit);
/// dropping the last shared_ptr releases both.
struct received_entry {
  std::uint64_t blob_id = 0;
  tag_t tag = NO_TAG;
  std::size_t index = 0;   ///< position in the blob (index row number)
  Entry entry;             ///< row as announced (offsets from blob start)
  entry_view view;         ///< typed, zero-copy; view.entry == &entry
  /// Keeps view.bytes alive and returns the window credit when released.
  std::shared_ptr<const void> storage;
  /// cuda_device when the entry landed in device memory
  /// (consumer_options::landing): `device` then views it, and view.bytes
  /// is empty (view.type and view.shape are set). host otherwise.
  memory_kind memory = memory_kind::host;
  cuda::device_view device;  ///< memory == cuda_device; kept alive by `storage`
  /// The sender's monotonic clock (steady_clock, nanoseconds) when the
  /// entry was emitted (feature_entry_timestamps); empty when not stamped.
  /// Comparable with this host's steady_clock only when the sender runs
  /// on this host.
  std::optional<std::uint64_t> sent_ns;

  received_entry() = default;
  received_entry(const received_entry&) = delete;  // view.entry points into *this
  received_entry& operator=(const received_entry&) = delete;
};

/// A blob whose tail checked out.
struct completed_blob {
  std::uint64_t blob_id = 0;
  blob_index index;               ///< footer + rows parsed from the tail
  std::uint64_t nbytes = 0;       ///< whole blob, bytes
  /// assemble_mode::memory: the whole blob, byte-identical to write(plan)
  /// (pads zero); empty otherwise.
  std::span<const std::byte> bytes;
  file_slot file;                 ///< assemble_mode::file: where it was written
  std::shared_ptr<const void> storage;  ///< keeps `bytes` alive
};

/// One thing that happened on the stream (see the file comment).
struct event {
  event_kind kind = event_kind::end_of_stream;
  std::uint64_t blob_id = 0;
  tag_t tag = NO_TAG;
  std::shared_ptr<const received_entry> entry;  ///< entry_ready
  std::shared_ptr<const completed_blob> blob;   ///< blob_complete
  /// blob_aborted: aborted (the producer aborted), protocol_violation,
  /// peer_closed, closed, the error of file_slot_for, or io (a write to
  /// the file_slot failed: the reason says pwrite's error). end_of_stream:
  /// empty after an orderly close, else why.
  std::error_code error;
  /// One line: the producer's reason or what broke; never empty when
  /// `error` is set.
  std::string reason;
  /// blob_aborted in a resend session: only this attempt is void (the
  /// connection broke, or another connection delivered the same tag first).
  /// The sender holds the blob until it is delivered, so drop this
  /// attempt's entries and expect the tag again (on a consumer sharing this
  /// delivery_log), unless it already completed there. Every tag ends
  /// exactly once in blob_complete or in blob_aborted with resend false.
  bool resend = false;
  /// entry_ready, blob_complete, blob_aborted: the blob's group
  /// (feature_blob_groups), when the sender named one.
  std::optional<blob_group> group;
};

/// Heap bytes that event `ev` holds and no window credit bounds, bytes:
/// for blob_aborted and end_of_stream the event and its reason, for
/// blob_complete the event and its index rows (the tail's credit goes back
/// once the tail is checked); 0 for entry_ready, whose entry holds its
/// credit until dropped. A queue of events toward the application (a
/// thread that reads ahead, a fan-in server's merged queue) counts these
/// against a bound of its own and stops reading past it, as the window
/// bounds the entries (docs/reliability.md "Bounded memory").
std::size_t event_bytes_beyond_window(const event& ev) noexcept;

/// Counters for tests and benchmarks.
struct consumer_stats {
  std::uint64_t buffered_bytes = 0;      ///< credit held now, bytes
  std::uint64_t buffered_high_water = 0; ///< most credit ever held, bytes
  std::uint64_t entries_received = 0;
  std::uint64_t blobs_completed = 0;
  std::uint64_t blobs_aborted = 0;
  std::uint64_t acks_sent = 0;
  std::uint64_t device_entries = 0;  ///< entries landed in device memory
  std::uint64_t device_chunks = 0;   ///< host-to-device copies from pinned buffers
  std::uint64_t duplicates_dropped = 0;  ///< resent blobs already delivered
  /// Chunks posted while earlier ones were still posted and not waited
  /// for (consumer_options::payload_window): the reads that overlapped.
  std::uint64_t chunks_overlapped = 0;
  /// Entries given a buffer kept from a released entry at entry_begin
  /// (consumer_options::recycle_bytes; counted even if the blob is later
  /// aborted), and the bytes kept for reuse now.
  std::uint64_t buffers_reused = 0;
  std::uint64_t recycle_kept_bytes = 0;
  /// Small entries given a block kept from a released one
  /// (consumer_options::recycle_small_entries), and the bytes of the
  /// blocks kept for reuse now.
  std::uint64_t small_entries_reused = 0;
  std::uint64_t small_entry_kept_bytes = 0;
  /// Credit requests from a sender waiting for credit (consumer_options::pool).
  std::uint64_t credit_requests = 0;
  /// Credit of entries the application holds outside the window now
  /// (consumer_options::held_bytes), and the most ever, bytes.
  std::uint64_t held_bytes = 0;
  std::uint64_t held_high_water = 0;
  /// Credit of entries the application holds inside the window now (the
  /// held allowance was full), bytes.
  std::uint64_t held_in_window_bytes = 0;
  /// Its member id in consumer_options::pool (credit_pool::holds); 0: not
  /// pooled.
  std::uint64_t pool_member = 0;
  /// Turns whose work was spent (a receive buffer's worth, every frame
  /// counted as at least 4 KiB), after which next() let every other
  /// handler ready on its executor run before decoding more
  /// (docs/cluster.md "Fair turns").
  std::uint64_t turns_yielded = 0;
  /// The consumer's own coroutines running now (its acker, its stall
  /// watchdog): 0 once next() has yielded end_of_stream, which waits for
  /// them (a close frame to the sender is written by then, or its 1 s
  /// linger has passed).
  std::uint64_t tasks_running = 0;
};

/// consumer_options::waits_reported: the reader handed `e` to the
/// application; it may move into the held allowance at the application's
/// next wait (consumer::application_waits). Call in the order next()
/// yielded the entries; any thread.
void mark_delivered(const received_entry& e) noexcept;

/// Receives blobs from one transport. Move-only; destroying it closes the
/// connection (as close()).
class consumer {
 public:
  consumer() = default;
  consumer(consumer&&) noexcept = default;
  consumer& operator=(consumer&&) noexcept;
  ~consumer();

  /// Waits for the sender's hello, checks it, answers with the negotiated
  /// chunk size, this window and the delivery log's window. On error the
  /// transport is closed. handshake_timeout bounds the whole; stall_timeout
  /// and idle_timeout apply to the sender's hello as well.
  /// Errors: timed_out (handshake_timeout, stall_timeout or idle_timeout
  /// passed), protocol_violation (bad hello or a non-hello first frame),
  /// invalid_argument (options out of range, e.g. payload_window 0), peer_closed, peer_failed, closed,
  /// cuda_failure (landing enabled without a device: cuda::device_count()
  /// says why).
  static asio::awaitable<std::tuple<std::error_code, consumer>> start(
      std::unique_ptr<transport> t, consumer_options opt = {});

  /// The next event. Never throws for stream problems: a broken peer yields
  /// blob_aborted for each open blob, then end_of_stream with the error.
  /// The first end_of_stream comes once the consumer's own coroutines have
  /// ended (consumer_stats::tasks_running): after it, nothing of the
  /// consumer runs on its executor.
  /// Cancelling the awaiting coroutine (terminal) ends the stream the same
  /// way, with the error the interrupted wait reported (operation_aborted,
  /// closed, peer_failed), instead of throwing out of a half-read frame.
  /// REQUIRES: no other next() pending on this consumer.
  asio::awaitable<event> next();

  /// The events next() would yield now, several at once: waits as next()
  /// does for the first, then appends to `out` (after what it holds) every
  /// further event decided already and ready without waiting, up to
  /// `max_events` in all (at least one is taken whatever it says), and
  /// returns how many it appended. So a batch is what one read completed
  /// (or the rest of it, past max_events), never more: it waits for, and
  /// reads, nothing after its first event. The sequence over calls is
  /// exactly next()'s, and next() and next_batch() may be mixed.
  /// end_of_stream comes last in a batch, alone when the consumer's own
  /// coroutines have still to end (it waits for them as next() does), and
  /// every later call repeats it, alone.
  /// Caller-owned `out`: its storage is reused from call to call, so a
  /// loop that clears it allocates nothing once it has grown; the events
  /// are the caller's to keep or move.
  /// Held allowance, clocks and turns, as for next(): every entry of the
  /// batch is the application's when the call returns, and moves into the
  /// held allowance then if it fits (held_bytes); the application waits
  /// (held_timeout, and application_waits() without waits_reported) only
  /// while the call waits for its first event. The stall and idle clocks
  /// run only while it waits. A turn spent (turn_work_bytes: a fan-in
  /// server's connections) ends the batch, as the rest of the read waits
  /// for the connection's next turn.
  /// Errors and cancellation: as next(). REQUIRES: no other next() or
  /// next_batch() pending on this consumer.
  asio::awaitable<std::size_t> next_batch(std::vector<event>& out,
                                          std::size_t max_events = default_batch_events);

  /// consumer_options::waits_reported: the application now waits for an
  /// event and none is queued for it; held_timeout counts until next()
  /// yields again. Call on the consumer's executor.
  void application_waits() noexcept;

  /// Closes now: a pending next() yields the open blobs as aborted (closed)
  /// then end_of_stream (closed); the sender sees peer_closed. The
  /// consumer's own coroutines are cancelled. Entries
  /// whose fetches had already landed (payload_window above 1), with every
  /// fetch before them, are yielded before the aborts.
  void close() noexcept;
  /// As close(), telling the sender `reason` first, in a close frame
  /// (docs/wire.md "Closing"): for an application that ends a stream for a
  /// reason the sender should see in its error (a fan-in server reclaiming
  /// an idle connection). The frame goes after any ack being written; the
  /// connection closes once it is written, or 1 s later regardless (a
  /// sender that reads nothing). Before the handshake finished it closes
  /// at once, without the frame.
  void close(std::string reason) noexcept;

  std::uint32_t chunk_bytes() const noexcept;   ///< negotiated, bytes
  std::uint64_t window_bytes() const noexcept;
  consumer_stats stats() const noexcept;
  /// Blobs begun and not yet ended on the wire (complete or aborted).
  std::size_t open_blobs() const noexcept;
  /// The sender's resend session (NO_SESSION: a plain sender).
  session_id session() const noexcept;
  /// The optional features negotiated (feature_* bits).
  std::uint64_t features() const noexcept;

 private:
  explicit consumer(std::shared_ptr<detail::consumer_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::consumer_state> state_;
};

}  // namespace blobpipe
