// The consumer's sinks (docs/wire.md "Consumer"): the session has checked
// each frame and decided what the protocol decides; these callbacks choose where entry bytes
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

#include <asio/execution.hpp>
#include <asio/prefer.hpp>

#include "blobpipe/format/layout.hpp"
#include "lib/pipeline/consumer_state.hpp"
#include "lib/pipeline/entry_lease.hpp"

namespace blobpipe::detail {
namespace {

using status = result<void>;

std::string num(std::uint64_t v) { return std::to_string(v); }

/// One heap block for a received entry and its lease (a small entry's
/// bytes inside the lease): one allocation per entry where there were two
/// (docs/performance.md "Per small entry, instructions"). Each of the two
/// keeps its own shared_ptr count, as when they were apart: the entry
/// holds its storage, and storage may outlive the entry, so one count for
/// both would keep itself alive. Their control blocks are placed in the
/// block (in_block below); the block goes when both have gone. Entries
/// may be dropped on any thread: the count of parts left is atomic. A
/// small entry's block comes from its consumer's block_pool
/// (consumer_options::recycle_small_entries) and goes back to it: the pool
/// lives while one of its blocks is out.
template <class Lease>
struct entry_block {
  // Room for each control block allocate_shared makes: the object, and
  // (libstdc++) a vtable pointer, two counts and the allocator.
  static constexpr std::size_t control_bytes = 64;
  alignas(std::max_align_t) std::array<std::byte, sizeof(received_entry) + control_bytes> entry_room;
  alignas(std::max_align_t) std::array<std::byte, sizeof(Lease) + control_bytes> lease_room;
  std::atomic<int> parts{2};
  std::shared_ptr<block_pool> pool;  // where the memory goes back (null: operator delete)

  /// A block in memory from `from` (null: operator new). Throws std::bad_alloc.
  static entry_block* make(const std::shared_ptr<block_pool>& from, bool& reused) {
    reused = false;
    // Default-initialized: the rooms are left as they are (allocate_shared
    // constructs in them); nothrow: an atomic and a null pointer.
    if (!from) return ::new (::operator new(sizeof(entry_block))) entry_block;
    auto* b = ::new (from->acquire(reused)) entry_block;
    b->pool = from;
    return b;
  }
  /// Destroys a block make() made and gives back its memory.
  static void unmake(entry_block* b) noexcept {
    auto from = std::move(b->pool);  // kept alive until the block is in it
    b->~entry_block();
    if (from) from->give_back(b);
    else ::operator delete(static_cast<void*>(b));
  }

  void drop() noexcept {
    if (parts.fetch_sub(1, std::memory_order_acq_rel) == 1)
      unmake(this);  // make_entry gave it up to the two parts
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
/// Nothing between the two allocate_shared calls may throw (a throw there
/// would drop a part and then delete the block again): both types are
/// nothrow default-constructible, checked here. A weak_ptr to the lease
/// (the held allowance's `unpromoted`) keeps the whole block, about 1 KB
/// for a small entry, until it is swept.
/// `pool`: where the block's memory comes from and goes back to (null:
/// operator new and delete); `reused` says whether it was a kept block.
template <class Lease>
std::pair<std::shared_ptr<received_entry>, std::shared_ptr<Lease>> make_entry(
    const std::shared_ptr<block_pool>& pool, bool& reused) {
  static_assert(std::is_nothrow_default_constructible_v<received_entry> &&
                std::is_nothrow_default_constructible_v<Lease>);
  using block_t = entry_block<Lease>;
  block_t* block = block_t::make(pool, reused);
  auto lease = std::allocate_shared<Lease>(in_block<Lease, block_t, lease_part>(block));
  auto entry = std::allocate_shared<received_entry>(
      in_block<received_entry, block_t, entry_part>(block));
  // Both parts made: the last one to go frees the block (drop).
  return {std::move(entry), std::move(lease)};
}

/// The size of a small entry's block (block_pool's blocks).
constexpr std::size_t small_block_bytes = sizeof(entry_block<small_entry_lease>);

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

sink_blob& blob_of(session_blob& blob) { return static_cast<sink_blob&>(blob); }

consumer_session_options session_options(const consumer_options& opt, bool one_larger_alone) {
  consumer_session_options o;
  o.limits = {.window_bytes = opt.window_bytes,
              .max_chunk_bytes = opt.max_chunk_bytes,
              .inline_bytes = opt.inline_bytes,
              .max_key_bytes = opt.max_key_bytes,
              .max_meta_bytes = opt.max_meta_bytes,
              .max_entry_bytes = opt.max_entry_bytes,
              .max_tail_bytes = opt.max_tail_bytes,
              .max_blob_bytes = opt.max_blob_bytes,
              .max_open_blobs = opt.max_open_blobs,
              .max_entries_per_blob = opt.max_entries_per_blob};
  o.accept_features = opt.accept_features;
  o.pooled = opt.pool != nullptr;
  o.held_bytes = opt.held_bytes;
  o.one_larger_alone = one_larger_alone;
  o.stall_timeout = opt.stall_timeout;
  o.idle_timeout = opt.idle_timeout;
  o.held_timeout = opt.held_timeout;
  o.waits_reported = opt.waits_reported;
  auto log = opt.delivered ? opt.delivered : delivery_log::process_default();
  o.dedup_window = log->window();
  o.delivered = std::move(log);
  return o;
}

}  // namespace

consumer_state::consumer_state(std::unique_ptr<transport> tr, consumer_options o,
                               bool one_larger_alone)
    : t(std::move(tr)),
      ex(t->get_executor()),
      opt(std::move(o)),
      session(session_options(opt, one_larger_alone), *this),
      acker(ex),
      ending(ex),
      tasks(ex) {
  receive.recycled = std::make_shared<buffer_pool>(opt.recycle_bytes);
  if (opt.recycle_small_entries != 0)
    receive.small_blocks =
        std::make_shared<block_pool>(small_block_bytes, opt.recycle_small_entries);
  receive.rx.resize(hello_receive_bytes);  // receive_buffer_bytes once the hello arrived
}

// ---- the session's events ----------------------------------------------------

result<session_blob*> consumer_state::blob_begin(std::uint64_t blob_id, const tag_t& tag,
                                                 bool duplicate) {
  sink_blob& b = receive.blobs[blob_id];
  b.id = blob_id;
  b.tag = tag;
  if (duplicate) {
    // its bytes are dropped (the session marks it discarded)
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
  return static_cast<session_blob*>(&b);
}

result<std::span<std::byte>> consumer_state::entry_begin(session_blob& blob,
                                                         const entry_announcement& a) {
  sink_blob& b = blob_of(blob);
  const Entry& e = *a.entry;
  std::byte* dest = nullptr;
  const bool small = !b.discard && !b.region && e.len != 0 && e.len <= small_entry_bytes &&
                     !receive.device.selects(e);
  // The entry and its lease share one allocation (entry_block), each with
  // its own count: storage may outlive the entry.
  std::shared_ptr<received_entry> owned;
  std::shared_ptr<entry_lease> owned_lease;
  bool block_reused = false;
  if (small) {
    auto [entry, in_lease] = make_entry<small_entry_lease>(receive.small_blocks, block_reused);
    dest = in_lease->bytes();
    owned = std::move(entry);
    owned_lease = std::move(in_lease);
    if (block_reused) ++stats.small_entries_reused;
  } else {
    std::tie(owned, owned_lease) = make_entry<entry_lease>(nullptr, block_reused);
  }
  entry_lease& lease = *owned_lease;
  if (!credit.leases)
    // Untracked: a held entry must not keep the io_context's run() going.
    credit.leases = std::make_shared<lease_home>(
        weak_from_this(), asio::prefer(ex, asio::execution::outstanding_work.untracked));
  lease.home = credit.leases;
  lease.credit = a.credit;
  b.device.reset();
  if (small) {
    // dest is inside the lease already
  } else if (!b.discard && b.region) {
    dest = b.region->data() + e.off;  // validate_entry: off + len <= max_blob_bytes
    lease.region = b.region;
  } else if (!b.discard) {
    if (receive.device.selects(e)) {
      // consumer_options::landing: its home is device memory (docs/cuda.md);
      // the bytes land here first and are copied there before the yield.
      auto buf = receive.device.lander->allocate(e.len);
      if (buf) {
        lease.device = *buf;
        b.device = std::move(*buf);
      } else {
        abort_blob(*this, b, buf.code(), "entry " + quote(e.key) + ": " + buf.message());
      }
    }
    if (!b.discard) {
      bool reused = false;
      lease.own = receive.recycled->acquire(e.len, reused);
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
  cur.view = view_valid_entry(cur.entry, std::span<const std::byte>(dest, dest ? len : 0), a.type);
  cur.storage = std::move(owned_lease);
  b.cur = std::move(owned);
  return std::span<std::byte>(dest, dest ? len : 0);
}

status consumer_state::entry_complete(session_blob& blob) {
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
  // The event takes the entry; an upload (device landing) holds it too.
  std::shared_ptr<received_entry> upload;
  if (b.device) upload = cur;
  ev.entry = std::move(cur);
  push(std::move(ev));
  if (b.device) {
    events.pending.back().upload = std::move(upload);
    events.pending.back().device = std::move(b.device);
  }
  return {};
}

result<bool> consumer_state::blob_complete(session_blob& blob, blob_index index,
                                           std::span<const std::byte> tail) {
  sink_blob& b = blob_of(blob);
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
      return false;
    }
    done->file = b.file;
  }
  done->index = std::move(index);
  auto ev = blob_event(event_kind::blob_complete, b);
  ev.blob = std::move(done);
  push(std::move(ev));
  ++stats.blobs_completed;
  return true;
}

void consumer_state::blob_abort(session_blob& b, std::error_code ec, std::string reason,
                                bool resend) {
  abort_blob(*this, blob_of(b), ec, std::move(reason), resend);
}

void consumer_state::blob_end(session_blob& b) {
  const std::uint64_t id = b.id;  // `b` dies with its node
  receive.blobs.erase(id);        // drops a partial entry, returning its credit
}

void consumer_state::closed(std::string_view reason) {
  // The stream ends once the reads still posted have landed (read_input).
  events.close_reason = std::string(reason);
}

void consumer_state::blob_in_group(session_blob& b, const blob_group& g) {
  blob_of(b).group = g;  // feature_blob_groups (docs/wire_features.md)
}

// ---- bookkeeping --------------------------------------------------------------

void consumer_state::push(event&& ev) {
  ready_event& r = events.pending.emplace_back();
  r.ev = std::move(ev);
  r.after_read = receive.reads_posted;
}

void consumer_state::lose_blob(std::uint64_t blob_id, std::error_code ec,
                               const std::string& reason) {
  // Its entries after the lost bytes, and its completion, are not true:
  // they go, and a completion becomes an abort where it stood.
  std::optional<std::size_t> first;
  std::uint64_t after_read = 0;
  std::optional<blob_group> group;
  bool ended_here = false;
  for (std::size_t i = 0; i < events.pending.size();) {
    const auto& r = events.pending[i];
    if (r.ev.blob_id != blob_id || r.ev.kind == event_kind::blob_aborted) {
      ++i;
      continue;
    }
    if (!first) first = i, after_read = r.after_read, group = r.ev.group;
    if (r.ev.kind == event_kind::blob_complete) {
      ended_here = true;
      --stats.blobs_completed;
    }
    events.pending.erase(i);
  }
  if (auto it = receive.blobs.find(blob_id); it != receive.blobs.end()) {
    abort_blob(*this, it->second, ec, reason);
  } else if (ended_here) {
    ready_event r;
    r.ev.kind = event_kind::blob_aborted;
    r.ev.blob_id = blob_id;
    r.ev.error = ec;
    r.ev.reason = reason_for(ec, reason);
    r.ev.group = group;
    r.after_read = after_read;
    events.pending.insert(*first, std::move(r));
    ++stats.blobs_aborted;
  }
}

consumer_state::~consumer_state() {
  // Entries still held can no longer report their release.
  if (credit.pool_member != 0) opt.pool->forget(credit.pool_member);
  if (receive.posted.empty()) return;
  t->close();
  try {
    receive.retire_buffers(*t);
  } catch (...) {  // out of memory to keep them: nothing better to do here
  }
}

bool tells_sender(std::error_code ec) noexcept {
  return ec == errc::protocol_violation || ec == errc::timed_out;
}

void consumer_state::close_with(std::string reason) {
  if (!acker.running || !t->is_open()) {
    t->close();
    return;
  }
  if (!session.refuse(std::move(reason))) return;
  ending.close_bound.emplace(ex, close_linger, [w = weak_from_this()] {
    if (auto s = w.lock()) s->t->close();
  });
}

void consumer_state::end(std::error_code ec, std::string reason) {
  if (events.ended) return;
  events.ended = true;
  const auto blob_ec = ec ? ec : make_error_code(errc::peer_closed);
  const std::string blob_reason =
      ec ? reason : std::string("sender closed the connection with the blob open");
  // In a resend session the sender keeps every blob it has not seen
  // delivered and sends it again on its next connection, unless it ended
  // the session itself (an orderly close).
  const bool resend = ec && session.session() != NO_SESSION;
  for (auto& [id, b] : receive.blobs) abort_blob(*this, b, blob_ec, blob_reason, resend);
  if (ec) receive.retire_buffers(*t);  // a read cut short may still be landing
  session.stop_acks();
  stop_clocks();
  if (tells_sender(ec)) close_with(reason);
  else t->close();
  receive.posted.clear();  // empty: next() lands or abandons every posted read first
  receive.blobs.clear();   // partial entries return their credit (no acks any more)
  if (credit.pool_member != 0) opt.pool->close(credit.pool_member);  // no more grants
  acker.cv.notify_all();
  events.final_event = event{};
  events.final_event.kind = event_kind::end_of_stream;
  events.final_event.error = ec;
  events.final_event.reason = reason_for(ec, std::move(reason));
}

}  // namespace blobpipe::detail

namespace blobpipe {

void mark_delivered(const received_entry& e) noexcept {
  if (e.storage) detail::lease_of(e.storage).delivered.store(true, std::memory_order_release);
}

}  // namespace blobpipe
