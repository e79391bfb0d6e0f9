// The consumer's frame handlers (docs/wire.md "Consumer"): every field of
// a frame is checked against the limits before it is used, entry bytes
// are read straight into their final buffer, and frames become events.
// consumer.cpp drives them from next().
#include <algorithm>
#include <array>
#include <iterator>

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
  ~entry_lease() {
    own.reset();  // back to the pool before the credit lets the next entry in
    // The consumer gone, there is no credit to give back, and `ex` may
    // name an io_context that is gone too (entries may outlive both).
    if (owner.expired()) return;
    if (running_in_this_thread(ex)) {
      if (auto s = owner.lock()) s->release(credit);
    } else {
      try {
        asio::post(ex, [owner = std::move(owner), n = credit] {
          if (auto s = owner.lock()) s->release(n);
        });
      } catch (...) {  // out of memory for the handler: the credit is lost
      }
    }
  }
};

/// Resend sessions: `b` reached its end for good (complete, or aborted by
/// either side); remember its tag and tell the sender to let it go.
void mark_delivered(consumer_state& s, const open_blob& b) {
  if (s.session == NO_SESSION || s.ack_stopped) return;
  s.log->record(s.session, b.tag);
  s.delivered_ids.push_back(b.id);
  s.ack_cv.notify_all();
}

/// Reads a small control payload (already bounded by the caller).
asio::awaitable<status> read_small(consumer_state& s, std::uint32_t len,
                                   std::vector<std::byte>& out) {
  out.resize(len);
  if (len == 0) co_return status{};
  if (auto ec = co_await s.t->receive_payload(out)) co_return error{ec, s.t->last_error()};
  co_return status{};
}

/// Waits for posted chunk payloads, oldest first, until at most `keep` are
/// in flight; the entries they complete become events.
asio::awaitable<status> settle(consumer_state& s, std::size_t keep) {
  while (s.posted.size() > keep) {
    if (auto r = co_await land_oldest(s); !r) co_return r;
  }
  co_return status{};
}

/// Window check for `n` new bytes: over the window only when nothing else is
/// buffered (one big entry goes alone).
status check_window(const consumer_state& s, std::uint64_t n, const char* what) {
  const std::uint64_t w = s.opt.window_bytes;
  const bool fits = s.stats.buffered_bytes <= w && n <= w - s.stats.buffered_bytes;
  if (fits || s.stats.buffered_bytes == 0) return {};
  return violation(std::string(what) + " of " + num(n) + " bytes overruns the window (" +
                   num(s.stats.buffered_bytes) + " of " + num(w) + " bytes buffered)");
}

event blob_event(event_kind k, const open_blob& b) {
  event ev;
  ev.kind = k;
  ev.blob_id = b.id;
  ev.tag = b.tag;
  return ev;
}

// event::reason is never empty when event::error is set: a producer's
// abort without words, or a failure without a message, says its code.
std::string reason_for(std::error_code ec, std::string reason) {
  return ec && reason.empty() ? ec.message() : reason;
}

void abort_blob(consumer_state& s, open_blob& b, std::error_code ec, std::string reason,
                bool resend = false) {
  if (!b.discard) {
    auto ev = blob_event(event_kind::blob_aborted, b);
    ev.error = ec;
    ev.reason = reason_for(ec, std::move(reason));
    ev.resend = resend;
    s.pending.push_back(std::move(ev));
    ++s.stats.blobs_aborted;
  }
  b.discard = true;
}

asio::awaitable<status> on_blob_begin(consumer_state& s, const frame_header& h) {
  if (h.length != TAG_SIZE)
    co_return violation("blob_begin: payload of " + num(h.length) + " bytes, expected 16");
  if (h.blob_id <= s.last_blob_id)
    co_return violation("blob_begin: blob id " + num(h.blob_id) + " not above " +
                        num(s.last_blob_id));
  if (s.blobs.size() >= s.opt.max_open_blobs)
    co_return violation("blob_begin: more than max_open_blobs (" + num(s.opt.max_open_blobs) +
                        ") blobs open");
  std::array<std::byte, TAG_SIZE> tag;
  if (auto ec = co_await s.t->receive_payload(tag)) co_return error{ec, s.t->last_error()};
  s.last_blob_id = h.blob_id;
  open_blob& b = s.blobs[h.blob_id];
  b.id = h.blob_id;
  std::copy(tag.begin(), tag.end(), b.tag.begin());
  if (s.session != NO_SESSION && s.log->contains(s.session, b.tag)) {
    // Resent after a lost acknowledgement: delivered already. Its frames
    // are still checked and read, then dropped; the sender may let it go.
    b.duplicate = b.discard = true;
    ++s.stats.duplicates_dropped;
    s.delivered_ids.push_back(b.id);
    s.ack_cv.notify_all();
    co_return status{};
  }
  if (s.opt.assemble == assemble_mode::memory) {
    auto r = reserved_region::make(s.opt.max_blob_bytes);
    if (r) b.region = std::move(*r);
    else abort_blob(s, b, r.code(), r.message());
  } else if (s.opt.assemble == assemble_mode::file) {
    auto slot = s.opt.file_slot_for ? s.opt.file_slot_for(b.id, b.tag)
                                    : result<file_slot>(errc::invalid_argument,
                                                        "file sink: no file_slot_for");
    if (slot) b.file = *slot;
    else abort_blob(s, b, slot.code(), slot.message());
  }
  co_return status{};
}

/// Takes the blob's current entry out: all its bytes are received, or
/// posted (the next entry_begin may come before they land).
std::shared_ptr<received_entry> close_entry(open_blob& b) {
  b.device_keep.reset();
  b.dest = nullptr;
  b.received = 0;
  b.on_device = false;
  return std::move(b.cur);
}

/// An entry of `b` has all its bytes: make its view, sink it, yield it.
/// `on_device`: it landed in device memory at `device` (consumer_options
/// landing; null when empty).
status yield_entry(consumer_state& s, open_blob& b, std::shared_ptr<received_entry> cur,
                   bool on_device = false, std::byte* device = nullptr) {
  if (b.discard) return {};
  Entry at_zero = cur->entry;  // decode over the entry's own bytes
  at_zero.off = 0;
  auto bytes = cur->view.bytes;
  auto v = decode_entry(bytes, at_zero);
  if (!v) return violation("entry " + quote(cur->entry.key) + ": " + v.message());
  cur->view = std::move(*v);
  cur->view.entry = &cur->entry;
  if (on_device) {  // consumer_options::landing: every copy is done
    cur->memory = memory_kind::cuda_device;
    cur->device = cuda::device_view{&cur->entry, device, cur->entry.len, s.landing->device(),
                                    cur->view.type, cur->view.shape};
    cur->view.bytes = {};  // device memory: not for the CPU
    ++s.stats.device_entries;
  }
  if (b.file.fd >= 0 && s.opt.assemble == assemble_mode::file) {
    auto r = write_zeros_at(b.file.fd, b.file.offset + b.file_end, cur->entry.off - b.file_end);
    if (r) r = write_at(b.file.fd, b.file.offset + cur->entry.off, bytes);
    if (!r) {
      abort_blob(s, b, r.code(), r.message());
      return {};
    }
    b.file_end = cur->entry.off + cur->entry.len;
  }
  ++s.stats.entries_received;
  auto ev = blob_event(event_kind::entry_ready, b);
  ev.entry = std::move(cur);
  s.pending.push_back(std::move(ev));
  return {};
}

/// The blob's current entry has all its bytes, received in order: yield it.
status finish_entry(consumer_state& s, open_blob& b) {
  const bool on_device = b.on_device;
  std::byte* const device = b.dest;
  return yield_entry(s, b, close_entry(b), on_device, device);
}

asio::awaitable<status> on_entry_begin(std::shared_ptr<consumer_state> sp, const frame_header& h) {
  consumer_state& s = *sp;
  auto it = s.blobs.find(h.blob_id);
  if (it == s.blobs.end()) co_return violation("entry_begin for unknown blob " + num(h.blob_id));
  open_blob& b = it->second;
  if (b.cur) co_return violation("entry_begin before entry " + num(b.entries.size() - 1) +
                                 " of blob " + num(b.id) + " was complete");
  if (h.arg != b.entries.size())
    co_return violation("entry_begin: entry index " + num(h.arg) + ", expected " +
                        num(b.entries.size()));
  if (b.entries.size() >= s.opt.max_entries_per_blob)
    co_return violation("entry_begin: more than max_entries_per_blob entries");
  const std::uint64_t max_len = 4ull + s.opt.max_key_bytes + s.opt.max_meta_bytes;
  if (h.length < 5 || h.length > max_len)
    co_return violation("entry_begin: payload of " + num(h.length) + " bytes not in [5, " +
                        num(max_len) + "]");
  std::vector<std::byte> payload;
  if (auto r = co_await read_small(s, h.length, payload); !r) co_return r;
  auto eb = decode_entry_begin(payload, s.opt.max_key_bytes, s.opt.max_meta_bytes);
  if (!eb) co_return violation(eb.message());
  auto e = Entry::from_meta(std::string(eb->key), eb->meta);
  if (!e) co_return violation("entry_begin meta: " + e.message());
  if (auto r = validate_entry(*e, s.opt.max_blob_bytes); !r)
    co_return violation("entry " + quote(e->key) + ": " + r.message());
  if (e->off != b.data_end)
    co_return violation("entry " + quote(e->key) + ": offset " + num(e->off) + ", expected " +
                        num(b.data_end));
  if (e->len > s.opt.max_entry_bytes)
    co_return violation("entry " + quote(e->key) + ": " + num(e->len) +
                        " bytes exceed max_entry_bytes " + num(s.opt.max_entry_bytes));
  if (auto r = check_window(s, e->len, "entry"); !r) co_return r;

  auto lease = std::make_shared<entry_lease>();
  lease->owner = sp;
  // Untracked: a held entry must not keep the io_context's run() going.
  lease->ex = asio::prefer(s.ex, asio::execution::outstanding_work.untracked);
  std::byte* dest = nullptr;
  if (!b.discard && b.region) {
    dest = b.region->data() + e->off;  // validate_entry: off + len <= max_blob_bytes
    lease->region = b.region;
  } else if (!b.discard && s.landing && s.landing->selects(*e)) {
    // consumer_options::landing: the entry's home is device memory (docs/cuda.md).
    auto buf = s.landing->allocate(e->len);
    if (buf) {
      dest = (*buf)->data();
      lease->device = *buf;
      b.device_keep = *buf;
      b.on_device = true;
      b.device_gen = s.landing->generation();
    } else {
      abort_blob(s, b, buf.code(), "entry " + quote(e->key) + ": " + buf.message());
    }
  } else if (!b.discard) {
    bool reused = false;
    lease->own = s.recycled->acquire(e->len, reused);
    if (!lease->own) co_return status(errc::too_large, "cannot allocate " + num(e->len) + " bytes");
    if (reused) ++s.stats.buffers_reused;
    dest = lease->own.get();
  }
  s.reserve(e->len);
  lease->credit = e->len;
  auto cur = std::make_shared<received_entry>();
  cur->blob_id = b.id;
  cur->tag = b.tag;
  cur->index = b.entries.size();
  cur->entry = *e;
  cur->view.bytes = std::span<const std::byte>(dest, dest ? e->len : 0);
  cur->storage = std::move(lease);
  b.entries.push_back(std::move(*e));
  b.data_end = align_up(b.entries.back().off + b.entries.back().len);
  b.cur = std::move(cur);
  b.dest = dest;
  if (b.cur->entry.len == 0) {
    // Yielded at once, so after the entries still landing.
    if (auto r = co_await settle(s, 0); !r) co_return r;
    co_return finish_entry(s, b);
  }
  co_return status{};
}

asio::awaitable<status> on_data(consumer_state& s, const frame_header& h) {
  auto it = s.blobs.find(h.blob_id);
  if (it == s.blobs.end()) co_return violation("data for unknown blob " + num(h.blob_id));
  open_blob& b = it->second;
  if (!b.cur) co_return violation("data for blob " + num(b.id) + " with no entry open");
  if (h.length == 0 || h.length > s.chunk_bytes)
    co_return violation("data: chunk of " + num(h.length) + " bytes not in [1, " +
                        num(s.chunk_bytes) + "]");
  const Entry& e = b.cur->entry;
  const std::uint64_t expect = e.off + b.received;
  if (h.arg != expect)
    co_return violation("data: offset " + num(h.arg) + " for entry " + quote(e.key) + " [" +
                        num(e.off) + ", " + num(e.off + e.len) + "), expected " + num(expect));
  if (h.length > e.len - b.received)
    co_return violation("data: chunk runs past the end of entry " + quote(e.key) + " (offset " +
                        num(h.arg) + " + " + num(h.length) + " > " + num(e.off + e.len) + ")");
  // A chunk landing in its entry's buffer: post it and go on to the next
  // frame while it arrives. The chunk that completes the entry carries it,
  // to be yielded once it lands (next_event, land_oldest).
  if (b.dest && !b.on_device && s.payload_window > 1) {
    if (!s.posted.empty()) ++s.stats.chunks_overlapped;
    posted_chunk c;
    c.blob_id = b.id;
    c.lands_in = b.cur->storage;
    c.receipt = s.t->post_payload(std::span(b.dest + b.received, h.length));
    b.received += h.length;
    if (b.received == e.len) c.completes = close_entry(b);
    s.posted.push_back(std::move(c));
    co_return co_await settle(s, s.payload_window - 1);
  }
  {
    auto r = co_await settle(s, 0);  // everything posted lands first
    if (!r) co_return r;
  }
  if (b.on_device && b.dest) {
    // consumer_options::landing: through a pinned slot, then copied to the device.
    auto r = co_await s.landing->receive(*s.t, b.device_keep, b.dest + b.received, h.length);
    if (!r && r.code() != errc::cuda_failure) co_return r;  // the connection failed
    b.received += h.length;
    if (r) ++s.stats.device_chunks;
    if (r && b.received == e.len) r = co_await s.landing->drain(b.device_gen);
    if (!r) {
      abort_blob(s, b, r.code(), "entry " + quote(e.key) + ": " + r.message());
      b.dest = nullptr;  // the rest of the blob is read and dropped
    }
    if (b.received == e.len) co_return finish_entry(s, b);
    co_return status{};
  }
  std::span<std::byte> dest;
  if (b.dest) {
    dest = std::span(b.dest + b.received, h.length);
  } else {
    s.scratch.resize(h.length);
    dest = s.scratch;
  }
  if (auto ec = co_await s.t->receive_payload(dest)) co_return error{ec, s.t->last_error()};
  b.received += h.length;
  if (b.received == e.len) co_return finish_entry(s, b);
  co_return status{};
}

/// Checks a tail against the blob: footer, then index rows vs entries seen.
status check_tail(const open_blob& b, std::span<const std::byte> tail, blob_index& out) {
  auto f = read_footer(tail);
  if (!f) return violation("tail: " + f.message());
  if (f->version != VERSION) return violation("tail: footer version " + num(f->version) + ", expected 3");
  if (f->index_off != b.data_end)
    return violation("tail: index_off " + num(f->index_off) + " but entries end at " +
                     num(b.data_end));
  if (std::uint64_t{f->index_len} + FOOTER_SIZE != tail.size())
    return violation("tail: index_len " + num(f->index_len) + " does not fill the " +
                     num(tail.size()) + "-byte tail");
  if (f->tag != b.tag) return violation("tail: footer tag differs from blob_begin's");
  auto rows = parse_index(tail.first(f->index_len), b.data_end);
  if (!rows) return violation("tail: " + rows.message());
  if (rows->size() != b.entries.size())
    return violation("tail: index has " + num(rows->size()) + " rows, " +
                     num(b.entries.size()) + " entries were sent");
  for (std::size_t i = 0; i < rows->size(); ++i)
    if (!((*rows)[i] == b.entries[i]))
      return violation("tail: index row " + num(i) + " (" + quote((*rows)[i].key) +
                       ") disagrees with the entry sent (" + quote(b.entries[i].key) + ")");
  out.foot = *f;
  out.entries = std::move(*rows);
  out.nbytes = b.data_end + tail.size();
  return {};
}

asio::awaitable<status> on_tail(consumer_state& s, const frame_header& h) {
  auto it = s.blobs.find(h.blob_id);
  if (it == s.blobs.end()) co_return violation("tail for unknown blob " + num(h.blob_id));
  open_blob& b = it->second;
  if (b.cur) co_return violation("tail before entry " + quote(b.cur->entry.key) + " was complete");
  if (h.length < FOOTER_SIZE + 1 || h.length > s.opt.max_tail_bytes)
    co_return violation("tail: " + num(h.length) + " bytes not in [33, " +
                        num(s.opt.max_tail_bytes) + "]");
  if (h.length > s.opt.max_blob_bytes || b.data_end > s.opt.max_blob_bytes - h.length)
    co_return violation("tail: blob would exceed max_blob_bytes");
  if (auto r = check_window(s, h.length, "tail"); !r) co_return r;
  s.reserve(h.length);
  std::vector<std::byte> own;
  std::span<std::byte> dest;
  if (b.region && !b.discard) {
    dest = std::span(b.region->data() + b.data_end, h.length);
  } else {
    own.resize(h.length);
    dest = own;
  }
  auto ec = co_await s.t->receive_payload(dest);
  s.release(h.length);  // checked below, then part of the result (or gone)
  if (ec) co_return error{ec, s.t->last_error()};
  if (b.discard) {
    if (!b.duplicate) mark_delivered(s, b);  // reported aborted already: final
    s.blobs.erase(it);
    co_return status{};
  }
  auto done = std::make_shared<completed_blob>();
  done->blob_id = b.id;
  if (auto r = check_tail(b, dest, done->index); !r) co_return r;
  if (s.session != NO_SESSION && s.log->contains(s.session, b.tag)) {
    // Another connection of the session delivered this tag while this
    // attempt was in flight (the sender resent it after losing that
    // connection). This attempt's entries were yielded: void them.
    abort_blob(s, b, make_error_code(errc::aborted),
               "delivered on another connection of the session", true);
    ++s.stats.duplicates_dropped;
    s.delivered_ids.push_back(b.id);
    s.ack_cv.notify_all();
    s.blobs.erase(it);
    co_return status{};
  }
  done->nbytes = done->index.nbytes;
  if (b.region) {
    done->bytes = std::span<const std::byte>(b.region->data(), done->nbytes);
    done->storage = b.region;
  }
  if (s.opt.assemble == assemble_mode::file) {
    auto r = write_zeros_at(b.file.fd, b.file.offset + b.file_end, b.data_end - b.file_end);
    if (r) r = write_at(b.file.fd, b.file.offset + b.data_end, dest);
    if (!r) {
      abort_blob(s, b, r.code(), r.message());
      s.blobs.erase(it);
      co_return status{};
    }
    done->file = b.file;
  }
  auto ev = blob_event(event_kind::blob_complete, b);
  ev.blob = std::move(done);
  s.pending.push_back(std::move(ev));
  ++s.stats.blobs_completed;
  mark_delivered(s, b);
  s.blobs.erase(it);
  co_return status{};
}

asio::awaitable<status> on_blob_abort(consumer_state& s, const frame_header& h) {
  auto it = s.blobs.find(h.blob_id);
  if (it == s.blobs.end()) co_return violation("blob_abort for unknown blob " + num(h.blob_id));
  if (h.length > max_reason_bytes) co_return violation("blob_abort: reason too long");
  std::vector<std::byte> reason;
  if (auto r = co_await read_small(s, h.length, reason); !r) co_return r;
  abort_blob(s, it->second, make_error_code(errc::aborted),
             std::string(reinterpret_cast<const char*>(reason.data()), reason.size()));
  if (!it->second.duplicate) mark_delivered(s, it->second);  // the producer's abort is final
  s.blobs.erase(it);  // drops a partial entry, returning its credit
  co_return status{};
}

}  // namespace

bool should_land(const consumer_state& s) noexcept {
  // Chunks that complete no entry have nothing to yield: they stay posted.
  auto last = std::find_if(s.posted.begin(), s.posted.end(),
                           [](const posted_chunk& c) { return c.completes != nullptr; });
  if (last == s.posted.end()) return false;
  if (!s.t->header_ready()) return true;
  return std::all_of(s.posted.begin(), std::next(last),
                     [](const posted_chunk& c) { return c.receipt.ready(); });
}

asio::awaitable<result<void>> land_oldest(consumer_state& s) {
  // Waited for where it is listed: should this wait be cut off (the
  // io_context destroyed with it), ~consumer_state still finds the chunk's
  // buffer (lands_in) to retire.
  const std::error_code ec = co_await s.posted.front().receipt.wait();
  auto c = std::move(s.posted.front());
  s.posted.pop_front();
  if (ec) {
    // A fetch cut short may still land (UCX): the transport keeps its
    // buffer, whichever chunk of its entry it was. Entries go out oldest
    // first, so none behind it does.
    s.t->retire(std::move(c.lands_in));
    s.fetch_lost = true;
    co_return error{ec, s.t->last_error()};
  }
  if (!c.completes || s.fetch_lost) co_return status{};
  // Blobs end (tail, abort, end()) only with nothing posted.
  auto it = s.blobs.find(c.blob_id);
  if (it == s.blobs.end()) co_return status{};
  co_return yield_entry(s, it->second, std::move(c.completes));
}

asio::awaitable<void> abandon_posted(consumer_state& s) {
  if (s.posted.empty()) co_return;
  s.t->close();
  while (!s.posted.empty()) (void)co_await land_oldest(s);
}

asio::awaitable<result<void>> on_frame(std::shared_ptr<consumer_state> sp, const frame_header& h) {
  consumer_state& s = *sp;
  // Frames that may end entries or blobs wait for the posted chunks to
  // land first, so events keep the frames' order. An entry_begin need not
  // (its entry is yielded after those before it), unless it may end the
  // blob: a device buffer it cannot get aborts the blob at once.
  const bool may_overlap = h.type == frame_type::data ||
                           (h.type == frame_type::entry_begin && !s.landing);
  if (!may_overlap) {
    auto r = co_await settle(s, 0);
    if (!r) co_return r;
  }
  switch (h.type) {
    case frame_type::blob_begin: co_return co_await on_blob_begin(s, h);
    case frame_type::entry_begin: co_return co_await on_entry_begin(sp, h);
    case frame_type::data: co_return co_await on_data(s, h);
    case frame_type::tail: co_return co_await on_tail(s, h);
    case frame_type::blob_abort: co_return co_await on_blob_abort(s, h);
    case frame_type::close: {
      if (h.length > max_reason_bytes) co_return violation("close: reason too long");
      std::vector<std::byte> reason;
      if (auto r = co_await read_small(s, h.length, reason); !r) co_return r;
      s.end(std::error_code{}, std::string(reinterpret_cast<const char*>(reason.data()),
                                           reason.size()));
      co_return status{};
    }
    case frame_type::hello:
    case frame_type::ack:
      break;
  }
  co_return violation(std::string("unexpected ") + frame_type_name(h.type) + " frame from sender");
}

consumer_state::~consumer_state() {
  if (posted.empty()) return;
  t->close();
  try {
    retire_receive_buffers();
  } catch (...) {  // out of memory to keep them: nothing better to do here
  }
}

void consumer_state::retire_receive_buffers() {
  for (auto& c : posted) t->retire(c.lands_in);
  for (auto& [id, b] : blobs) {
    if (b.cur) t->retire(b.cur->storage);
    t->retire(b.region);
  }
}

void consumer_state::reserve(std::uint64_t n) noexcept {
  stats.buffered_bytes += n;
  stats.buffered_high_water = std::max(stats.buffered_high_water, stats.buffered_bytes);
}

void consumer_state::release(std::uint64_t n) noexcept {
  stats.buffered_bytes -= n;
  if (ack_stopped || n == 0) return;
  pending_ack += n;
  ack_cv.notify_all();
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
  if (ec) retire_receive_buffers();  // a receive cut short may still be landing
  ack_stopped = true;
  dog.stop();
  t->close();
  posted.clear();  // empty: next() lands or abandons every posted chunk first
  blobs.clear();  // partial entries return their credit (no acks any more)
  ack_cv.notify_all();
  final_event = event{};
  final_event.kind = event_kind::end_of_stream;
  final_event.error = ec;
  final_event.reason = reason_for(ec, std::move(reason));
}

}  // namespace blobpipe::detail
