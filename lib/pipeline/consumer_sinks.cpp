// The consumer's side of the push decoder (docs/wire.md "Consumer"): the
// decoder has checked each frame; these callbacks choose where entry bytes
// land (their own buffer, the blob's assembly region, a host buffer bound
// for the device), write file sinks, and turn what happened into events.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/consumer_state.hpp"

namespace blobpipe::detail {
namespace {

using status = result<void>;

status violation(std::string what) { return {errc::protocol_violation, std::move(what)}; }

std::string num(std::uint64_t v) { return std::to_string(v); }

/// Whether this thread is running `ex` now (io_context executors and
/// strands of them; false for any other kind, which is then posted to).
bool running_in_this_thread(const asio::any_io_executor& ex) noexcept {
  using io_executor = asio::io_context::executor_type;
  if (auto* io = ex.target<io_executor>()) return io->running_in_this_thread();
  if (auto* st = ex.target<asio::strand<io_executor>>()) return st->running_in_this_thread();
  return false;
}

/// Owns an entry's bytes and its window credit; see received_entry::storage.
/// An application may drop entries on any thread (a trainer hands them to
/// its own threads), but the consumer's state belongs to its executor:
/// from elsewhere the credit goes back through a post there, and the
/// state is never touched (nor kept alive) on the dropping thread.
struct entry_lease {
  std::weak_ptr<consumer_state> owner;
  asio::any_io_executor ex;  // the owner's
  std::uint64_t credit = 0;
  aligned_bytes own;
  std::shared_ptr<reserved_region> region;
  std::shared_ptr<const void> device;  // consumer_options::landing: the device buffer
  // Set on the owner's executor while it holds a reference (on_yield,
  // promote_held), read here after the last reference went: the
  // reference count orders the two.
  bool yielded = false;  // next() gave it to the application
  bool held = false;     // in the held allowance: its credit went back already
  // consumer_options::waits_reported: the reader handed it to the
  // application (mark_delivered, any thread); only then may it move.
  std::atomic<bool> delivered{false};
  ~entry_lease() {
    own.reset();  // back to the pool before the credit lets the next entry in
    // The consumer gone, there is no credit to give back, and `ex` may
    // name an io_context that is gone too (entries may outlive both).
    if (owner.expired()) return;
    auto back = [n = credit, y = yielded, h = held](consumer_state& s) {
      if (h) s.release_held(n);
      else s.release(n, y);
    };
    if (running_in_this_thread(ex)) {
      if (auto s = owner.lock()) back(*s);
    } else {
      try {
        asio::post(ex, [owner = std::move(owner), back] {
          if (auto s = owner.lock()) back(*s);
        });
      } catch (...) {  // out of memory for the handler: the credit is lost
      }
    }
  }
};

entry_lease& lease_of(const std::shared_ptr<const void>& storage) {
  // Every entry's storage is an entry_lease (or a small_entry_lease,
  // whose base it is); the object itself is not const.
  return *const_cast<entry_lease*>(static_cast<const entry_lease*>(storage.get()));
}

/// An entry of at most this many bytes lands inside its lease: one
/// allocation where a lease and a 64-byte aligned buffer were two (the
/// small entries of an RL sample: a reward, a pickled meta dict).
constexpr std::size_t small_entry_bytes = 256;

struct small_entry_lease : entry_lease {
  std::array<std::byte, small_entry_bytes + ALIGN - 1> room;  // bytes from a 64-byte boundary
  std::byte* bytes() noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(room.data());
    return room.data() + (align_up(at) - at);
  }
};

/// One heap block for a received entry and its lease (a small entry's
/// bytes inside the lease): one allocation per entry where there were two
/// (docs/performance.md "Receive path per small entry"). Each of the two
/// keeps its own shared_ptr count, as when they were apart: the entry
/// holds its storage, and storage may outlive the entry, so one count for
/// both would keep itself alive. Their control blocks are placed in the
/// block (in_block below); the block goes when both have gone. Entries
/// may be dropped on any thread: the count of parts left is atomic.
template <class Lease>
struct entry_block {
  // Room for each control block allocate_shared makes: the object, and
  // (libstdc++) a vtable pointer, two counts and the allocator.
  static constexpr std::size_t control_bytes = 64;
  alignas(std::max_align_t) std::array<std::byte, sizeof(received_entry) + control_bytes> entry_room;
  alignas(std::max_align_t) std::array<std::byte, sizeof(Lease) + control_bytes> lease_room;
  std::atomic<int> parts{2};

  void drop() noexcept {
    if (parts.fetch_sub(1, std::memory_order_acq_rel) == 1)
      std::unique_ptr<entry_block>{this}.reset();  // make_entry gave it up to the two parts
  }
};

struct entry_part {};  // in_block: the received_entry's room
struct lease_part {};  // in_block: the lease's room

/// Hands allocate_shared the room of one part of an entry_block; giving it
/// back drops that part.
template <class T, class Block, class Part>
struct in_block {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = in_block<U, Block, Part>;
  };
  Block* block;
  explicit in_block(Block* b) noexcept : block(b) {}
  template <class U>
  in_block(const in_block<U, Block, Part>& o) noexcept : block(o.block) {}
  T* allocate(std::size_t n) {
    std::byte* room;
    std::size_t room_bytes;
    if constexpr (std::is_same_v<Part, lease_part>) {
      static_assert(sizeof(T) <= sizeof(block->lease_room));
      room = block->lease_room.data();
      room_bytes = block->lease_room.size();
    } else {
      static_assert(sizeof(T) <= sizeof(block->entry_room));
      room = block->entry_room.data();
      room_bytes = block->entry_room.size();
    }
    static_assert(alignof(T) <= alignof(std::max_align_t));
    if (n * sizeof(T) > room_bytes) throw std::bad_alloc();  // never: sized for it
    return reinterpret_cast<T*>(room);
  }
  void deallocate(T*, std::size_t) noexcept { block->drop(); }
  friend bool operator==(const in_block& a, const in_block& b) noexcept {
    return a.block == b.block;
  }
};

/// A received_entry and its lease, of type Lease, in one allocation.
template <class Lease>
std::pair<std::shared_ptr<received_entry>, std::shared_ptr<Lease>> make_entry() {
  using block_t = entry_block<Lease>;
  auto block = std::make_unique<block_t>();
  auto lease = std::allocate_shared<Lease>(in_block<Lease, block_t, lease_part>(block.get()));
  auto entry = std::allocate_shared<received_entry>(
      in_block<received_entry, block_t, entry_part>(block.get()));
  block.release();  // both parts made: the last one to go frees it (drop)
  return {std::move(entry), std::move(lease)};
}

// event::reason is never empty when event::error is set: a producer's
// abort without words, or a failure without a message, says its code.
std::string reason_for(std::error_code ec, std::string reason) {
  return ec && reason.empty() ? ec.message() : reason;
}

event blob_event(event_kind k, const sink_blob& b) {
  event ev;
  ev.kind = k;
  ev.blob_id = b.id;
  ev.tag = b.tag;
  ev.group = b.group;
  return ev;
}

void abort_blob(consumer_state& s, sink_blob& b, std::error_code ec, std::string reason,
                bool resend = false) {
  if (!b.discard) {
    auto ev = blob_event(event_kind::blob_aborted, b);
    ev.error = ec;
    ev.reason = reason_for(ec, std::move(reason));
    ev.resend = resend;
    s.push(std::move(ev));
    ++s.stats.blobs_aborted;
  }
  b.discard = true;
}

/// Resend sessions: `b` reached its end for good (complete, or aborted by
/// either side); remember its tag and tell the sender to let it go.
void mark_delivered(consumer_state& s, const sink_blob& b) {
  if (s.session == NO_SESSION || s.ack_stopped) return;
  s.log->record(s.session, b.tag);
  s.delivered_ids.push_back(b.id);
  if (!std::exchange(s.ack_due, true)) s.ack_cv.notify_all();
}

sink_blob& blob_of(void* blob) { return *static_cast<sink_blob*>(blob); }

}  // namespace

consumer_state::consumer_state(std::unique_ptr<transport> tr, consumer_options o)
    : t(std::move(tr)),
      ex(t->get_executor()),
      opt(std::move(o)),
      frames(wire_role::sender, decoder_limits{}, *this),
      rx(hello_receive_bytes),  // receive_buffer_bytes once the hello arrived
      stall_watch(ex, opt.stall_timeout, opt.idle_timeout, opt.held_timeout),
      ack_cv(ex),
      recycled(std::make_shared<buffer_pool>(opt.recycle_bytes)) {
  frames.set_limits({.window_bytes = opt.window_bytes,
                     .max_chunk_bytes = opt.max_chunk_bytes,
                     .inline_bytes = opt.inline_bytes,
                     .max_key_bytes = opt.max_key_bytes,
                     .max_meta_bytes = opt.max_meta_bytes,
                     .max_entry_bytes = opt.max_entry_bytes,
                     .max_tail_bytes = opt.max_tail_bytes,
                     .max_blob_bytes = opt.max_blob_bytes,
                     .max_open_blobs = opt.max_open_blobs,
                     .max_entries_per_blob = opt.max_entries_per_blob});
}

// ---- the decoder's events ----------------------------------------------------

status consumer_state::on_hello(const hello& h) {
  if (peer) return violation("a second hello");
  // Checked before `peer` is set, so the handshake fails. A shared budget
  // (consumer_options::pool: a fan-in server) bounds only senders that
  // take their credit from it: one offering no credit grants would get a
  // window of its own, outside the budget (docs/cluster.md).
  if (opt.pool && !(h.features & feature_credit_grants))
    return violation(
        "hello: the sender does not offer credit grants (feature_credit_grants), which a "
        "consumer sharing a receive budget (a fan-in server) requires");
  peer = h;
  // Negotiated: the smaller chunk and copy threshold; no optional feature
  // is known to this release (decode_hello checked the rest).
  auto l = frames.limits();
  l.max_chunk_bytes = chunk_bytes = std::min(h.max_chunk_bytes, opt.max_chunk_bytes);
  l.inline_bytes = std::min(h.inline_bytes, opt.inline_bytes);
  window_offer = negotiate_features(h, l);  // consumer_features.cpp
  frames.set_limits(l);
  session = h.session;
  return {};
}

result<void*> consumer_state::on_blob_begin(std::uint64_t blob_id, const tag_t& tag) {
  sink_blob& b = blobs[blob_id];
  b.id = blob_id;
  b.tag = tag;
  if (session != NO_SESSION && log->contains(session, tag)) {
    // Resent after a lost acknowledgement: delivered already. Its frames
    // are still checked and read, then dropped; the sender may let it go.
    b.duplicate = b.discard = true;
    ++stats.duplicates_dropped;
    delivered_ids.push_back(b.id);
    if (!std::exchange(ack_due, true)) ack_cv.notify_all();
  } else if (opt.assemble == assemble_mode::memory) {
    auto r = reserved_region::make(opt.max_blob_bytes);
    if (r) b.region = std::move(*r);
    else abort_blob(*this, b, r.code(), r.message());
  } else if (opt.assemble == assemble_mode::file) {
    auto slot = opt.file_slot_for ? opt.file_slot_for(b.id, b.tag)
                                  : result<file_slot>(errc::invalid_argument,
                                                      "file sink: no file_slot_for");
    if (slot) b.file = *slot;
    else abort_blob(*this, b, slot.code(), slot.message());
  }
  return static_cast<void*>(&b);
}

result<std::span<std::byte>> consumer_state::on_entry_begin(void* blob,
                                                            const entry_announcement& a) {
  sink_blob& b = blob_of(blob);
  const Entry& e = *a.entry;
  std::byte* dest = nullptr;
  const bool small = !b.discard && !b.region && e.len != 0 && e.len <= small_entry_bytes &&
                     !(landing && landing->selects(e));
  // The entry and its lease share one allocation (entry_block), each with
  // its own count: storage may outlive the entry.
  std::shared_ptr<received_entry> owned;
  std::shared_ptr<entry_lease> owned_lease;
  if (small) {
    auto [entry, in_lease] = make_entry<small_entry_lease>();
    dest = in_lease->bytes();
    owned = std::move(entry);
    owned_lease = std::move(in_lease);
  } else {
    std::tie(owned, owned_lease) = make_entry<entry_lease>();
  }
  entry_lease& lease = *owned_lease;
  lease.owner = weak_from_this();
  // Untracked: a held entry must not keep the io_context's run() going.
  lease.ex = asio::prefer(ex, asio::execution::outstanding_work.untracked);
  lease.credit = a.credit;
  b.device.reset();
  if (small) {
    // dest is inside the lease already
  } else if (!b.discard && b.region) {
    dest = b.region->data() + e.off;  // validate_entry: off + len <= max_blob_bytes
    lease.region = b.region;
  } else if (!b.discard) {
    if (landing && landing->selects(e)) {
      // consumer_options::landing: its home is device memory (docs/cuda.md);
      // the bytes land here first and are copied there before the yield.
      auto buf = landing->allocate(e.len);
      if (buf) {
        lease.device = *buf;
        b.device = std::move(*buf);
      } else {
        abort_blob(*this, b, buf.code(), "entry " + quote(e.key) + ": " + buf.message());
      }
    }
    if (!b.discard) {
      bool reused = false;
      lease.own = recycled->acquire(e.len, reused);
      if (!lease.own && e.len != 0)
        return make_error(errc::too_large, "cannot allocate " + num(e.len) + " bytes for entry " +
                                           quote(e.key));
      if (reused) ++stats.buffers_reused;
      dest = lease.own.get();
    }
  }
  received_entry& cur = *owned;
  cur.blob_id = b.id;
  cur.tag = b.tag;
  cur.index = a.index;
  const std::uint64_t len = e.len;
  // An inline entry's row is the decoder's to give: taken, not copied.
  if (a.take) cur.entry = std::move(*a.take);
  else cur.entry = e;
  cur.sent_ns = a.sent_ns;
  // The decoder validated the row: the view needs no second check.
  cur.view = view_valid_entry(cur.entry, std::span<const std::byte>(dest, dest ? len : 0));
  cur.storage = std::move(owned_lease);
  b.cur = std::move(owned);
  return std::span<std::byte>(dest, dest ? len : 0);
}

status consumer_state::on_entry_complete(void* blob, std::uint64_t) {
  sink_blob& b = blob_of(blob);
  auto cur = std::move(b.cur);  // a discarded entry's credit goes back here
  if (b.discard) return {};
  const auto bytes = cur->view.bytes;
  if (b.file.fd >= 0 && opt.assemble == assemble_mode::file) {
    // File sinks never post reads: the bytes are in.
    auto r = write_zeros_at(b.file.fd, b.file.offset + b.file_end, cur->entry.off - b.file_end);
    if (r) r = write_at(b.file.fd, b.file.offset + cur->entry.off, bytes);
    if (!r) {
      abort_blob(*this, b, r.code(), r.message());
      return {};
    }
    b.file_end = cur->entry.off + cur->entry.len;
  }
  ++stats.entries_received;
  auto ev = blob_event(event_kind::entry_ready, b);
  ev.entry = cur;
  push(std::move(ev));
  if (b.device) {
    pending.back().upload = std::move(cur);
    pending.back().device = std::move(b.device);
  }
  return {};
}

asio::awaitable<result<void>> consumer_state::upload(ready_event& r) {
  received_entry& e = *r.upload;
  auto done = co_await landing->upload(e.view.bytes, r.device, r.device->data());
  if (!done) co_return done;
  ++stats.device_entries;
  stats.device_chunks = landing->chunks();
  e.memory = memory_kind::cuda_device;
  e.device = cuda::device_view{&e.entry, r.device->data(), e.entry.len, landing->device(),
                               e.view.type, e.view.shape};
  e.view.bytes = {};  // device memory: not for the CPU
  // The host copy has served: its buffer goes back to the pool now.
  const_cast<entry_lease*>(static_cast<const entry_lease*>(e.storage.get()))->own.reset();
  r.upload.reset();
  co_return done;
}

status consumer_state::on_blob_complete(void* blob, std::uint64_t blob_id, blob_index index,
                                        std::span<const std::byte> tail) {
  // A pool must see the tail's credit released before the next frame.
  if (pool_member != 0) collect_returned_credit();
  sink_blob& b = blob_of(blob);
  auto erase = [&] { blobs.erase(blob_id); };  // `b` dies here
  if (b.discard) {
    if (!b.duplicate) mark_delivered(*this, b);  // reported aborted already: final
    erase();
    return {};
  }
  if (session != NO_SESSION && log->contains(session, b.tag)) {
    // Another connection of the session delivered this tag while this
    // attempt was in flight (the sender resent it after losing that
    // connection). This attempt's entries were yielded: void them.
    abort_blob(*this, b, make_error_code(errc::aborted),
               "delivered on another connection of the session", true);
    ++stats.duplicates_dropped;
    delivered_ids.push_back(b.id);
    if (!std::exchange(ack_due, true)) ack_cv.notify_all();
    erase();
    return {};
  }
  auto done = std::make_shared<completed_blob>();
  done->blob_id = b.id;
  done->nbytes = index.nbytes;
  const std::uint64_t data_end = index.data_end();
  if (b.region) {
    std::memcpy(b.region->data() + data_end, tail.data(), tail.size());
    done->bytes = std::span<const std::byte>(b.region->data(), done->nbytes);
    done->storage = b.region;
  }
  if (opt.assemble == assemble_mode::file) {
    auto r = write_zeros_at(b.file.fd, b.file.offset + b.file_end, data_end - b.file_end);
    if (r) r = write_at(b.file.fd, b.file.offset + data_end, tail);
    if (!r) {
      abort_blob(*this, b, r.code(), r.message());
      erase();
      return {};
    }
    done->file = b.file;
  }
  done->index = std::move(index);
  auto ev = blob_event(event_kind::blob_complete, b);
  ev.blob = std::move(done);
  push(std::move(ev));
  ++stats.blobs_completed;
  mark_delivered(*this, b);
  erase();
  return {};
}

status consumer_state::on_blob_abort(void* blob, std::uint64_t blob_id, std::string_view reason) {
  sink_blob& b = blob_of(blob);
  abort_blob(*this, b, make_error_code(errc::aborted), std::string(reason));
  if (!b.duplicate) mark_delivered(*this, b);  // the producer's abort is final
  blobs.erase(blob_id);  // drops a partial entry, returning its credit
  return {};
}

status consumer_state::on_close(std::string_view reason) {
  // The stream ends once the reads still posted have landed (read_input).
  close_reason = std::string(reason);
  return {};
}

// ---- bookkeeping --------------------------------------------------------------

void consumer_state::push(event ev) {
  ready_event r;
  r.ev = std::move(ev);
  r.after_read = reads_posted;
  pending.push_back(std::move(r));
}

void consumer_state::release(std::uint64_t credit, bool yielded) noexcept {
  if (yielded) {
    held_in_window -= std::min(credit, held_in_window);
    update_watch();
  }
  frames.release(credit);
  if (pool_released(credit)) return;  // the pool decides who gets it
  if (ack_stopped || credit == 0) return;
  pending_ack += credit;
  if (!std::exchange(ack_due, true)) ack_cv.notify_all();
}

void consumer_state::release_held(std::uint64_t credit) noexcept {
  held_credit -= std::min(credit, held_credit);
  promote_held();
  update_watch();
}

void consumer_state::on_yield(const event& ev) {
  if (opt.waits_reported) app_waiting = false;
  if (ev.kind != event_kind::entry_ready || !ev.entry || !ev.entry->storage) return;
  entry_lease& lease = lease_of(ev.entry->storage);
  lease.yielded = true;
  held_in_window += lease.credit;
  // An assembled blob's entries share its region, which only the whole
  // blob frees: they stay in the window.
  if (opt.held_bytes != 0 && !lease.region && !ended) {
    if (unpromoted.size() >= 2 * unpromoted_compacted + 64) {
      std::erase_if(unpromoted, [](const auto& w) { return w.expired(); });
      unpromoted_compacted = unpromoted.size();
    }
    unpromoted.push_back(ev.entry->storage);
    promote_held();
  }
}

void consumer_state::promote_held() noexcept {
  while (!unpromoted.empty()) {
    auto storage = unpromoted.front().lock();
    if (!storage) {  // dropped already: its release is on its way
      unpromoted.pop_front();
      continue;
    }
    entry_lease& lease = lease_of(storage);
    // A reader's queue is not the application's hands: entries move once
    // delivered, which happens in yield order.
    if (opt.waits_reported && !lease.delivered.load(std::memory_order_acquire)) break;
    if (lease.credit > opt.held_bytes - std::min(held_credit, opt.held_bytes)) break;
    unpromoted.pop_front();
    lease.held = true;
    held_credit += lease.credit;
    stats.held_high_water = std::max(stats.held_high_water, held_credit);
    release(lease.credit, true);
  }
}

void consumer_state::update_watch() noexcept {
  // The sender is to blame for a silence while a frame of it is half
  // sent, a fetch is outstanding, or a blob is open and it holds credit
  // it could send on: not while it waits for credit the application
  // holds (docs/reliability.md "Held entries").
  const auto& l = frames.limits();
  const std::uint64_t used = frames.buffered_bytes();
  const bool has_credit = used < l.window_bytes && credit_wanted == 0 && held_in_window == 0;
  // An entry begun and not complete is owed whatever else the sender
  // waits for: its credit was taken whole when it was announced.
  stall_watch.owes(frames.in_frame() || !posted.empty() || frames.entries_open() != 0 ||
                   (frames.open_blobs() != 0 && has_credit));
  stall_watch.held(held_in_window != 0 && (!opt.waits_reported || app_waiting));
}

void consumer_state::collect_returned_credit() noexcept {
  const std::uint64_t n = frames.take_returned_credit();
  stats.buffered_bytes = frames.buffered_bytes();
  stats.buffered_high_water = std::max(stats.buffered_high_water, stats.buffered_bytes);
  if (n == 0 || pool_released(n)) return;
  if (ack_stopped) return;
  pending_ack += n;
  if (!std::exchange(ack_due, true)) ack_cv.notify_all();
}

void consumer_state::lose_blob(std::uint64_t blob_id, std::error_code ec,
                               const std::string& reason) {
  // Its entries after the lost bytes, and its completion, are not true:
  // they go, and a completion becomes an abort where it stood.
  std::optional<std::size_t> first;
  std::uint64_t after_read = 0;
  std::optional<blob_group> group;
  bool ended_here = false;
  for (std::size_t i = 0; i < pending.size();) {
    const auto& r = pending[i];
    if (r.ev.blob_id != blob_id || r.ev.kind == event_kind::blob_aborted) {
      ++i;
      continue;
    }
    if (!first) first = i, after_read = r.after_read, group = r.ev.group;
    if (r.ev.kind == event_kind::blob_complete) {
      ended_here = true;
      --stats.blobs_completed;
    }
    pending.erase(i);
  }
  if (auto it = blobs.find(blob_id); it != blobs.end()) {
    abort_blob(*this, it->second, ec, reason);
  } else if (ended_here) {
    ready_event r;
    r.ev.kind = event_kind::blob_aborted;
    r.ev.blob_id = blob_id;
    r.ev.error = ec;
    r.ev.reason = reason_for(ec, reason);
    r.ev.group = group;
    r.after_read = after_read;
    pending.insert(*first, std::move(r));
    ++stats.blobs_aborted;
  }
}

consumer_state::~consumer_state() {
  // Entries still held can no longer report their release.
  if (pool_member != 0) opt.pool->forget(pool_member);
  if (posted.empty()) return;
  t->close();
  try {
    retire_receive_buffers();
  } catch (...) {  // out of memory to keep them: nothing better to do here
  }
}

void consumer_state::retire_receive_buffers() {
  for (auto& r : posted) t->retire(r.lands_in);
  for (auto& [id, b] : blobs) {
    if (b.cur) t->retire(b.cur->storage);
    t->retire(b.region);
  }
}

void consumer_state::end(std::error_code ec, std::string reason) {
  if (ended) return;
  ended = true;
  const auto blob_ec = ec ? ec : make_error_code(errc::peer_closed);
  const std::string blob_reason =
      ec ? reason : std::string("sender closed the connection with the blob open");
  // In a resend session the sender keeps every blob it has not seen
  // delivered and sends it again on its next connection, unless it ended
  // the session itself (an orderly close).
  const bool resend = ec && session != NO_SESSION;
  for (auto& [id, b] : blobs) abort_blob(*this, b, blob_ec, blob_reason, resend);
  if (ec) retire_receive_buffers();  // a read cut short may still be landing
  ack_stopped = true;
  stall_watch.stop();
  t->close();
  posted.clear();  // empty: next() lands or abandons every posted read first
  blobs.clear();   // partial entries return their credit (no acks any more)
  if (pool_member != 0) opt.pool->close(pool_member);  // no more grants
  ack_cv.notify_all();
  final_event = event{};
  final_event.kind = event_kind::end_of_stream;
  final_event.error = ec;
  final_event.reason = reason_for(ec, std::move(reason));
}

}  // namespace blobpipe::detail

namespace blobpipe {

void mark_delivered(const received_entry& e) noexcept {
  if (e.storage) detail::lease_of(e.storage).delivered.store(true, std::memory_order_release);
}

}  // namespace blobpipe
