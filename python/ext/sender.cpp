// blobpipe.Sender and blobpipe.Blob: a C++ sender driven from Python threads.
//
// Python calls become commands in a queue that one coroutine on the io
// thread drains in order (open, emit, finish, abort, flush, shutdown,
// drop), co_awaiting the C++ sender for each. A Python call waits only for
// what it must: emit() returns once its command is queued, finish(),
// flush() and shutdown() once theirs has run.
//
// emit() without the network: the value is encoded on the calling thread
// (encode.hpp) and planned alone (layout_builder::add, so bad values raise
// there). An entry of at most the negotiated copy threshold
// (sender::inline_bytes()) is copied into the command (gathered if
// strided; into memory kept from earlier copies, copy_pools), so the
// caller may change the value at once, as the C++ sender copies it. So is a torch tensor whose memory torch may reallocate
// (storage_guard.hpp; with torch 1.13, every tensor): the background
// thread could not tell that its bytes were freed. A larger one is held:
// the command owns a reference to the
// Python object whose memory the C++ sender then sends in place, and
// hands it back (sender_core::released) once its C++ emit has completed;
// a Python thread drops it at its next call. Commands queued and not yet
// completed are counted in bytes; emit() waits while they exceed the
// queue limit (the consumer's window, at most default_queue_bytes, by
// default) — the only time it blocks, i.e. when the window is full and
// the background thread is behind by another window (or by the limit:
// a consumer's window is no bound on the sender's memory, it may grant
// 2^64 - 1 and read nothing). Once it blocks, it goes on when they are
// down to half the limit, so that a full queue wakes the Python thread once
// per half a queue rather than once per entry. emit_many and send_blob
// queue their entries in groups, one lock per group.
//
// Errors of a queued command cannot be raised by the emit() that queued
// it, so emit() refuses what it can know first (a bad value, a key longer
// than the consumer's max_key_bytes). An entry the C++ sender still
// refuses (a resend session reconnected to a consumer with a smaller key
// limit) aborts its blob, and the blob's next call raises the error; a
// broken connection makes every later call raise.
#include <asio/experimental/as_tuple.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/runtime/pools.hpp"
#include "encode.hpp"
#include "errors.hpp"
#include "sequences.hpp"
#include "state.hpp"
#include "storage_guard.hpp"
#include "stream.hpp"
#include "tags.hpp"

namespace blobpipe::python {
namespace {

enum class op { open, emit, finish, abort, flush, shutdown, drop };
struct send_command;

}  // namespace

/// One blob: its C++ writer (io thread only) and its state as Python sees
/// it (under sender_core::mu).
struct blob_slot {
  explicit blob_slot(const tag_t& t) : tag(t) {}
  const tag_t tag;
  blob_writer w;  // io thread only
  std::error_code failed;  // an entry could not be sent: the blob was aborted
  std::string why;
  bool ended = false;  // finish() or abort() was called
  // Under the GIL: the entries an emit_many or send_blob on this blob has
  // prepared and not yet queued (sender_handle::stage_entries). Any other
  // call that queues for the blob queues them first, so that a call made
  // meanwhile (from a value's __reduce__, or a thread that ran while the
  // encoding let the GIL go) comes after the entries prepared before it.
  std::vector<send_command>* staged = nullptr;
};

namespace {

/// Frees a copy's bytes: back to the small pool it came from, else through
/// `large` (a buffer_pool's block, or the heap).
struct copy_free {
  detail::block_pool* small = nullptr;
  detail::aligned_free large;
  void operator()(std::byte* p) const noexcept {
    if (small != nullptr) small->give_back(p);
    else large(p);
  }
};
using copy_bytes = std::unique_ptr<std::byte[], copy_free>;

/// Bytes for emit's copies, kept for reuse once the background thread has
/// sent them, so that a copy costs no allocation, no page faults and no
/// lock shared with the io thread (a block freed on another thread than
/// the one that allocated it takes the allocator's arena lock). A copy of
/// at most small_max bytes comes from the block_pool of its power-of-two
/// class (64 B to 64 KiB; each keeps at most class_kept_bytes), a larger
/// one from a buffer_pool (at most large_kept_bytes kept). Taken on Python
/// threads (under the GIL: one at a time, as block_pool::acquire needs),
/// given back on any thread. Must outlive every copy it gave.
class copy_pools {
 public:
  static constexpr std::uint64_t small_max = 64 << 10;
  static constexpr std::uint64_t class_kept_bytes = 1 << 20;
  static constexpr std::uint64_t large_kept_bytes = 32 << 20;

  copy_pools() : large_(std::make_shared<detail::buffer_pool>(large_kept_bytes)) {
    for (std::size_t c = 0; c < small_.size(); ++c) {
      const std::size_t bytes = std::size_t{64} << c;
      small_[c] = std::make_unique<detail::block_pool>(bytes, class_kept_bytes / bytes);
    }
  }

  /// `n` bytes, uninitialised. Throws std::bad_alloc.
  copy_bytes take(std::uint64_t n) {
    bool reused = false;
    if (n <= small_max) {
      detail::block_pool& pool = *small_[class_of(n)];
      auto* p = static_cast<std::byte*>(pool.acquire(reused));
      reused_ += reused;
      return copy_bytes(p, copy_free{&pool, {}});
    }
    detail::aligned_bytes block = large_->acquire(n, reused);
    if (!block) throw std::bad_alloc();
    reused_ += reused;
    detail::aligned_free owner = block.get_deleter();
    return copy_bytes(block.release(), copy_free{nullptr, std::move(owner)});
  }

  /// Copies that reused a kept block, since the Sender was made.
  std::uint64_t reused() const { return reused_; }
  /// Bytes kept for later copies now.
  std::uint64_t kept_bytes() const {
    std::uint64_t n = large_->kept_bytes();
    for (const auto& pool : small_) n += pool->kept() * pool->block_bytes();
    return n;
  }

 private:
  static std::size_t class_of(std::uint64_t n) {
    return n <= 64 ? 0 : static_cast<std::size_t>(std::bit_width(n - 1) - 6);
  }
  std::array<std::unique_ptr<detail::block_pool>, 11> small_;  // 64 B << 0..10
  std::shared_ptr<detail::buffer_pool> large_;
  std::uint64_t reused_ = 0;
};

struct send_command {
  op what = op::emit;
  std::shared_ptr<blob_slot> blob;
  std::string text;  // emit: the key; abort: the reason
  value v;           // emit
  copy_bytes copy;  // emit of a copied value: its bytes (v.data points here)
  py_ref keep;                  // emit of a held value: the object v.data points into
  std::uint64_t cost = 0;       // bytes counted against the queue limit
  std::shared_ptr<completion> done;  // finish, abort, flush, shutdown
};

// How long a Sender's `with` block left by an exception waits for the aborts
// of its open blobs to reach the transport before it closes.
constexpr std::chrono::seconds exit_flush_grace{5};

// The reason a blob is aborted with when a `with` block (the Blob's or the
// Sender's) is left by `exc`: its repr, which names its type.
std::string exit_reason(py::handle exc) {
  return "exception in the with block: " + std::string(py::repr(exc));
}

// How long leaving a `with` block by `exc` waits for its aborts to reach
// the transport: exit_flush_grace, but not at all for Ctrl-C, which the
// user means to act at once (the aborts still go if the transport takes
// them before the close; the consumer sees the blobs aborted either way).
std::chrono::milliseconds exit_grace(py::handle exc) {
  if (exc && PyErr_GivenExceptionMatches(exc.ptr(), PyExc_KeyboardInterrupt))
    return std::chrono::milliseconds{0};
  return exit_flush_grace;
}

// The queue limit when connect() names none: the consumer's window, but
// never more than this, bytes, whatever window the consumer grants. The
// consumer's default window, so a default pair behaves as before.
constexpr std::uint64_t default_queue_bytes = 64ull << 20;

// emit_many and send_blob queue their entries in groups of about this
// many bytes (their cost): one lock per group, and a blob much larger than
// a group is not copied whole before the background thread starts on it.
constexpr std::uint64_t group_bytes = 1ull << 20;

// Costs a queued entry beyond its bytes (bookkeeping; never zero, so that
// empty entries count too).
constexpr std::uint64_t command_overhead_bytes = 64;

bool ends_stream(std::error_code ec) {
  return ec == errc::closed || ec == errc::peer_closed || ec == errc::peer_failed ||
         ec == errc::protocol_violation || ec == errc::timed_out;
}

// A random uuid4 tag. Not lib/format's random_tag(): its generator is
// thread_local, so a forked child would repeat the tags its parent's
// thread draws next. This one reseeds in every child.
tag_t fresh_tag() {
  thread_local std::uint64_t seeded_in = ~std::uint64_t{0};
  thread_local std::mt19937_64 gen;
  if (seeded_in != fork_generation()) {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    gen.seed(seq);
    seeded_in = fork_generation();
  }
  tag_t t;
  for (std::size_t i = 0; i < TAG_SIZE; i += 8) {
    const std::uint64_t r = gen();
    std::memcpy(t.data() + i, &r, 8);
  }
  t[6] = (t[6] & std::byte{0x0F}) | std::byte{0x40};  // RFC 4122 version 4
  t[8] = (t[8] & std::byte{0x3F}) | std::byte{0x80};  // variant 10xx
  return t;
}

}  // namespace

struct sender_core {
  explicit sender_core(asio::any_io_executor e) : ex(std::move(e)) {}
  asio::any_io_executor ex;
  sender s;  // io thread only
  // Negotiated in the handshake, before any Python thread looks.
  std::uint32_t inline_bytes = 0, chunk_bytes = 0, max_key_bytes = 0, max_meta_bytes = 0;
  std::uint64_t features = 0;  // negotiated (feature_* bits)
  std::uint64_t window_bytes = 0;
  bool resend = false;  // a resend session (set before launch)

  // Before the queue, whose commands hold its blocks: destroyed after it.
  copy_pools copies;  // taken under the GIL

  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu:
  std::deque<send_command> queue;
  bool draining = false;            // a drain coroutine runs or is posted
  std::uint64_t pending_bytes = 0;  // queued and running commands' cost
  // A Python thread that waited for queue room goes on once pending_bytes
  // is down to this (half the queue limit, set with it): it is woken once
  // per half a queue, not once per command.
  std::uint64_t resume_bytes = 0;
  std::vector<PyObject*> released;  // held values whose emit completed
  std::error_code failed;           // the stream ended with this error
  std::string why;
  // A blob ended by Sender.send_blob (no Python call waits for it) failed:
  // the next call on the Sender raises this, once.
  std::error_code deferred;
  std::string deferred_why;
  bool closed = false;  // close() or shutdown() was called
  bool writers_dropped = false;  // the io thread has emptied every blob_slot::w
  sender_stats final_stats;      // as the sender was closed
  int waiting = 0;      // Python threads in cv waits

  // Io thread only: every blob opened, so that closing can drop their
  // writers there (blob_slot::w must never be destroyed elsewhere while
  // the io thread runs).
  std::vector<std::weak_ptr<blob_slot>> slots;

  // launch_sender's start races this timer, which never expires by
  // itself: cancel_launch() cancels it, which ends the connect or the
  // handshake at once (io thread only after launch_sender).
  std::shared_ptr<asio::steady_timer> launch_cancel;

  void fail(std::error_code ec, const std::string& what) {
    std::lock_guard lk(mu);
    if (failed) return;
    failed = ec;
    why = what;
  }
};

namespace {

// ---- the io thread ----

/// What ended the connection, with the sender's reason when it has one
/// (its stall_timeout: the limit and its milliseconds).
std::string stream_text(const sender& s, std::error_code ec) {
  const std::string& reason = s.failure_reason();
  return "the connection to the consumer ended: " + (reason.empty() ? ec.message() : reason) +
         " (" + errc_name(ec) + ")";
}

asio::awaitable<std::error_code> run_one(sender_core& c, send_command& cmd, std::string& why) {
  std::error_code ec;
  blob_slot* b = cmd.blob.get();
  // b->failed and b->why are written only here, on the io thread (Python
  // threads read them under c.mu): this thread reads them without it.
  auto blob_failed = [&] {
    if (b->failed) why = b->why;
    return b->failed;
  };
  switch (cmd.what) {
    case op::open:
      b->w = c.s.open_blob(b->tag);
      if (c.slots.size() >= 64 && c.slots.size() == c.slots.capacity())
        std::erase_if(c.slots, [](const auto& w) { return w.expired(); });
      c.slots.push_back(cmd.blob);
      break;
    case op::emit: {
      if (blob_failed()) break;  // the blob was aborted: its later entries are dropped
      std::string key = cmd.text;
      ec = co_await b->w.emit(std::move(cmd.text), std::move(cmd.v));
      if (!ec) break;
      why = "emit " + quote(key) + ": " +
            (b->w.last_error().empty() ? ec.message() : escape(b->w.last_error()));
      {
        std::lock_guard lk(c.mu);
        b->failed = ec;
        b->why = why;
      }
      // A refused entry leaves the blob open in C++; Python's contract is
      // that the blob is then aborted, so the consumer never sees it
      // complete without the entry.
      if (!ends_stream(ec)) co_await b->w.abort(why);
      break;
    }
    case op::finish:
      if ((ec = blob_failed())) break;
      ec = co_await b->w.finish();
      break;
    case op::abort:
      if (blob_failed()) break;  // aborted already
      ec = co_await b->w.abort(std::move(cmd.text));
      break;
    case op::flush:
      ec = co_await c.s.flush();
      break;
    case op::shutdown:
      ec = co_await c.s.shutdown();
      break;
    case op::drop:
      // Aborted with a reason the user can act on (the C++ writer's own
      // would name blob_writer); a no-op once finished or aborted.
      (void)co_await b->w.abort("the Python Blob was dropped without finish() or abort()");
      b->w = blob_writer{};
      break;
  }
  // The stream's end (a resend session that gave up included: its last
  // attempt's code): the sender's reason, not the code's bare message.
  const bool ended = ends_stream(ec);
  if (ec && why.empty()) why = ended ? stream_text(c.s, ec) : ec.message();
  if (ended && cmd.what != op::shutdown) c.fail(ec, stream_text(c.s, ec));
  co_return ec;
}

/// Completed commands whose bookkeeping is not yet under sender_core::mu:
/// the io thread takes the lock once per group, not once per command.
struct completions {
  std::uint64_t cost = 0;
  std::vector<PyObject*> released;
  int count = 0;

  /// At most this many commands wait for their bookkeeping: a Python
  /// thread waiting for queue room sees the room within a group.
  static constexpr int max_count = 16;
};

/// Whether a Python thread waiting for queue room may go on: the queue is
/// down to its resume mark, or the stream ended (the wait then raises).
/// REQUIRES: c.mu held.
bool resumes(const sender_core& c) {
  return c.pending_bytes <= c.resume_bytes || c.failed || c.closed;
}

/// Books the group in: the queue's cost, the held values to hand back; wakes
/// the Python threads waiting for room when they may go on. REQUIRES: c.mu
/// held.
void book_locked(sender_core& c, completions& g) {
  c.pending_bytes -= g.cost;
  c.released.insert(c.released.end(), g.released.begin(), g.released.end());
  g.cost = 0;
  g.count = 0;
  g.released.clear();
  if (c.waiting > 0 && resumes(c)) c.cv.notify_all();
}

/// `cmd` has run with `ec`: its cost and held value join the group, booked
/// at once when it failed, when a call waits for it, or when the group is
/// full; else at the end of the batch (drain).
void complete(sender_core& c, send_command& cmd, std::error_code ec, std::string why,
              completions& g) {
  g.cost += cmd.cost;
  if (cmd.keep) g.released.push_back(cmd.keep.release());
  ++g.count;
  if (ec || cmd.done || g.count >= completions::max_count) {
    std::lock_guard lk(c.mu);
    // A finish nobody waits for (send_blob): its error goes to the next call.
    if (ec && !cmd.done && cmd.what == op::finish && !ends_stream(ec) && !c.deferred) {
      c.deferred = ec;
      c.deferred_why = "an earlier send_blob (tag " + tag_hex(cmd.blob->tag) + ") failed: " + why;
    }
    book_locked(c, g);
  }
  if (cmd.done) cmd.done->set(ec, std::move(why));
}

asio::awaitable<void> drain(std::shared_ptr<sender_core> c) {
  std::deque<send_command> batch;
  completions done;
  for (;;) {
    {
      std::lock_guard lk(c->mu);
      book_locked(*c, done);
      if (c->queue.empty()) {
        c->draining = false;
        if (c->waiting > 0) c->cv.notify_all();  // close() waits for this
        co_return;
      }
      batch.swap(c->queue);
    }
    while (!batch.empty()) {
      std::string why;
      const std::error_code ec = co_await run_one(*c, batch.front(), why);
      complete(*c, batch.front(), ec, std::move(why), done);
      batch.pop_front();
    }
  }
}

/// Starts a drain coroutine on the io thread. Called from a Python thread,
/// so the coroutine is made there too, inside a posted handler.
void start_drain(const std::shared_ptr<sender_core>& c) {
  asio::post(c->ex, [c] {
    asio::co_spawn(c->ex, drain(c), [c](std::exception_ptr e) {
      if (!e) return;
      // Out of memory inside a command: nothing more can be sent. Wake the
      // Python threads rather than leave them waiting on a dead queue.
      c->fail(make_error_code(errc::closed), "blobpipe's background thread failed");
      std::lock_guard lk(c->mu);
      c->draining = false;
      c->cv.notify_all();
    });
  });
}

// ---- the Python side ----

/// Which errors a push raises: `all`, or `stream_only` (the Sender closed
/// or its connection failed), for send_blob's commands after its open,
/// whose blob's own asynchronous failure and earlier blobs' deferred
/// failures go to the next call (sender_handle::send_blob).
enum class checks { all, stream_only };

/// What a Sender's Python objects share: the runtime, the core, and the
/// Python-side bookkeeping. Lives on Python threads (its destructor runs
/// with the GIL).
class sender_handle {
 public:
  sender_handle(std::shared_ptr<io_runtime> rt, std::shared_ptr<sender_core> core,
                std::uint64_t queue_bytes)
      : rt_(std::move(rt)),
        core_(std::move(core)),
        generation_(rt_->generation()),
        queue_limit_(queue_bytes ? queue_bytes
                                 : std::clamp<std::uint64_t>(core_->window_bytes, 1,
                                                             default_queue_bytes)) {
    std::lock_guard lk(core_->mu);
    core_->resume_bytes = queue_limit_ / 2;
  }

  ~sender_handle() {
    if (generation_ != fork_generation()) {
      leak_in_child(std::move(core_));
      leak_in_child(std::move(rt_));
      return;
    }
    close_now();
    // The io thread has stopped: the queue (empty unless the stop grace
    // ran out) and the released values are ours now.
    drop_released();
    std::deque<send_command> rest;
    {
      std::lock_guard lk(core_->mu);
      rest.swap(core_->queue);
    }
    rest.clear();
    core_.reset();
    rt_.reset();
  }

  sender_handle(const sender_handle&) = delete;
  sender_handle& operator=(const sender_handle&) = delete;

  void check(const char* what) const { check_not_forked(generation_, what); }

  /// A blob's tag: bytes(tag) cut or padded to 16 bytes, or a random one.
  /// A resend session knows a blob by its tag, so there a tag that would be
  /// cut (two tags sharing their first 16 bytes would be one blob, the
  /// second dropped as a resend), or that is all zeros, is refused.
  tag_t blob_tag(py::handle tag) const {
    if (tag.is_none()) return fresh_tag();
    std::size_t given = 0;
    const tag_t t = tag_from(tag, &given);
    if (!core_->resend) return t;
    if (given > TAG_SIZE)
      throw py::value_error(
          "a resend session's blob tag is at most 16 bytes, this one is " + std::to_string(given) +
          ": the consumer knows a blob by its tag, and tags cut to 16 bytes could be one blob "
          "(the second dropped as a resend); give a shorter tag, or None for a random one");
    if (t == NO_TAG)
      throw py::value_error(
          "a resend session's blob needs a tag other than 16 zero bytes (NO_TAG): the consumer "
          "knows a blob by its tag; give a tag, or None for a random one");
    return t;
  }

  std::shared_ptr<blob_slot> open_blob(py::handle tag) {
    check("Sender");
    auto slot = std::make_shared<blob_slot>(blob_tag(tag));
    send_command cmd;
    cmd.what = op::open;
    cmd.blob = slot;
    push(std::move(cmd), nullptr);
    {
      std::lock_guard lk(core_->mu);
      if (open_.size() >= 64 && open_.size() == open_.capacity())
        std::erase_if(open_, [](const auto& w) {
          auto s = w.lock();
          return !s || s->ended;
        });
      open_.push_back(slot);
    }
    return slot;
  }

  /// The end of a `with` block left by an exception: every blob still
  /// open is aborted with `reason` (so the consumer yields BlobAborted,
  /// not only the end of the connection), what is queued is handed to the
  /// transport (for at most `grace`, exit_grace: a consumer that reads
  /// nothing cannot hold the exception up), then the Sender is closed.
  void abort_open_and_close(const std::string& reason, std::chrono::milliseconds grace) {
    std::vector<std::shared_ptr<blob_slot>> open;
    {
      std::lock_guard lk(core_->mu);
      for (const auto& w : open_)
        if (auto s = w.lock(); s && !s->ended && !s->failed) open.push_back(std::move(s));
      open_.clear();
    }
    try {
      for (auto& b : open) {
        send_command cmd;
        cmd.what = op::abort;
        cmd.blob = b;
        cmd.text = reason;
        push(std::move(cmd), b.get());
      }
      if (grace.count() > 0) {
        auto flushed = std::make_shared<completion>();
        send_command cmd;
        cmd.what = op::flush;
        cmd.done = flushed;
        push(std::move(cmd), nullptr);
        flushed->wait(std::chrono::steady_clock::now() + grace);
      }
    } catch (py::error_already_set& e) {
      // A failed connection or a closed Sender: closing is all that is
      // left. Ctrl-C while waiting still interrupts, once closed.
      close_now();
      if (e.matches(PyExc_KeyboardInterrupt)) throw;
      return;
    }
    close_now();
  }

  /// `copy` false: a torch tensor above inline_bytes is held and sent from
  /// its own memory, as a numpy array is (the caller's promise that torch
  /// will not reallocate it until finish() or flush() returns).
  /// `checks` as push's: send_blob's entries pass `stream_only`.
  void emit(const std::shared_ptr<blob_slot>& b, py::handle key, py::handle val,
            bool copy = true, checks what_raises = checks::all) {
    check("Blob");
    // Encoding calls torch (whose methods release the GIL and take it back
    // in a noexcept destructor), numpy and pickle; the waits below park at
    // exit and leave this count as they do (runtime.hpp).
    python_call encoding;
    send_command cmd = entry_command(b, key, val, copy);
    push({&cmd, 1}, b.get(), what_raises);
  }

  /// The command that queues entry (`key`, `val`) of `b`, as emit()
  /// describes: encoded, planned alone and checked, copied or held. Raises
  /// as emit; queues nothing. REQUIRES: inside a python_call.
  send_command entry_command(const std::shared_ptr<blob_slot>& b, py::handle key, py::handle val,
                             bool copy) {
    send_command cmd;
    cmd.what = op::emit;
    cmd.blob = b;
    cmd.text = key_string(key);
    // Refused here, with the limit, rather than by the background thread,
    // which could only abort the blob and report it at the next call.
    if (core_->max_key_bytes > 0 && cmd.text.size() > core_->max_key_bytes)
      raise(errc::invalid_argument, "emit " + quote(cmd.text) + ": the key is " +
                                        std::to_string(cmd.text.size()) +
                                        " bytes, longer than the consumer's max_key_bytes (" +
                                        std::to_string(core_->max_key_bytes) + " bytes)");
    encoded e = encode_value(val);
    // Planned alone: refuses what the sender would (dtype, shape, size)
    // here, and gives the entry's length in bytes.
    layout_builder lb;
    const planned_entry* pe = unwrap(lb.add(cmd.text, e.v));
    const std::uint64_t len = pe->entry.len;
    check_meta(*pe);
    if (e.raw_nbytes && *e.raw_nbytes != len)
      raise(errc::invalid_argument, "RawEntry " + quote(cmd.text) + " has " +
                                        std::to_string(*e.raw_nbytes) +
                                        " bytes; its dtype and shape need " + std::to_string(len));
    // A tensor whose memory torch may reallocate (resize_) is copied too,
    // whatever its size: the background thread, which reads a held value
    // without the GIL, could not tell that its bytes were freed
    // (storage_guard.hpp).
    const bool small = len <= core_->inline_bytes;
    if (small || (copy && e.storage && storage_resizable(e.storage))) {
      // Copied now (as the C++ sender copies small ones), so the caller may
      // change the value as soon as emit returns.
      cmd.copy = core_->copies.take(len);
      if (len > 0) {
        const std::span<std::byte> to(cmd.copy.get(), len);
        result<void> copied = small ? write_entry(*pe, to) : [&] {
          gil_released nogil;  // a large copy touches no Python object
          return write_entry(*pe, to);
        }();
        unwrap(std::move(copied));
      }
      cmd.v = std::move(e.v);
      cmd.v.data = cmd.copy.get();
      cmd.v.strides.clear();
      if (cmd.v.kind == KIND_PICKLE) cmd.v.nbytes = len;
    } else {
      cmd.v = std::move(e.v);
      // The storage too, so that set_() on the tensor cannot free it; a
      // numpy array's pin, so that resize(refcheck=False) cannot.
      if (e.storage) cmd.keep = py_ref(py::make_tuple(std::move(e.keep), std::move(e.storage)));
      else if (e.pin) cmd.keep = py_ref(py::make_tuple(std::move(e.keep), std::move(e.pin)));
      else cmd.keep = py_ref(std::move(e.keep));
    }
    cmd.cost = len + cmd.text.size() + command_overhead_bytes;
    return cmd;
  }

  /// Refuses, as the C++ sender would on the io thread (where it could
  /// only abort the blob), an entry whose meta (index row) is longer than
  /// the consumer's max_meta_bytes, unless it goes in the compact form,
  /// which the C++ sender bounds by its own size (docs/wire.md "Compact
  /// entries"; compact_code). Encoded only when its bound could
  /// pass the limit: at most meta_fixed_bytes + the dtype's length + 9 per
  /// dimension (msgpack: a map of five fields, uint64s and strings). The
  /// entry was planned alone, at offset 0; in its blob the offset may take
  /// up to 8 bytes more, so an entry within 8 bytes of the limit can still
  /// be refused by the io thread (the blob aborted, the next call raising
  /// the same message).
  void check_meta(const planned_entry& pe) const {
    static constexpr std::size_t meta_fixed_bytes = 64;
    const Entry& en = pe.entry;
    const std::size_t rank = en.shape ? en.shape->size() : 0;
    const std::size_t bound = meta_fixed_bytes + (en.dtype ? en.dtype->size() : 0) + 9 * rank;
    if (core_->max_meta_bytes == 0 || bound <= core_->max_meta_bytes) return;
    if ((core_->features & feature_compact_entries) && compact_code(en, core_->max_meta_bytes))
      return;
    thread_local std::vector<std::byte> meta;
    meta.clear();
    en.append_meta(meta);
    if (meta.size() > core_->max_meta_bytes)
      raise(errc::invalid_argument,
            "emit " + quote(en.key) + ": the entry's meta (its index row) is " +
                std::to_string(meta.size()) + " bytes, longer than the consumer's max_meta_bytes (" +
                std::to_string(core_->max_meta_bytes) + " bytes); its shape has " +
                std::to_string(rank) + " dimensions");
  }

  /// emit() of each (keys[i], values[i]) in order: one call for many
  /// entries, queued in groups (one lock and at most one wake of the
  /// background thread per group). Raises as emit; the entries before the
  /// bad one stay emitted.
  void emit_many(const std::shared_ptr<blob_slot>& b, py::handle keys, py::handle values,
                 bool copy = true, checks what_raises = checks::all) {
    check("Blob");
    python_call encoding;
    std::vector<send_command> group;
    stage_entries(b, keys, values, copy, what_raises, group);
    push(group, b.get(), what_raises);
  }

  /// The commands of entries (keys[i], values[i]) of `b`, in order, into
  /// `group`; a group that reaches group_bytes is queued first. Raises as
  /// emit, naming the entry, once the entries before the bad one are
  /// queued. REQUIRES: inside a python_call.
  void stage_entries(const std::shared_ptr<blob_slot>& b, py::handle keys, py::handle values,
                     bool copy, checks what_raises, std::vector<send_command>& group) {
    auto [ks, vs] = paired_sequences(keys, values);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(ks.ptr());
    PyObject** k = PySequence_Fast_ITEMS(ks.ptr());
    PyObject** v = PySequence_Fast_ITEMS(vs.ptr());
    // An emit_many made from a value's __reduce__ inside another one: the
    // outer call's entries so far go first.
    push_staged(b.get(), what_raises);
    struct staging {
      blob_slot& b;
      std::vector<send_command>* outer;
      ~staging() { b.staged = outer; }
    } registered{*b, std::exchange(b->staged, &group)};
    // Queued from a vector of its own: a call that runs while this one
    // waits for room (the GIL released) may take what is staged.
    auto queue_group = [&] {
      std::vector<send_command> taken = std::exchange(group, {});
      push_now(taken, b.get(), what_raises);
    };
    std::uint64_t staged = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      try {
        group.push_back(entry_command(b, k[i], v[i], copy));
      } catch (py::builtin_exception& e) {
        e.set_error();  // pybind's TypeError/ValueError as a Python exception, to name it
        py::error_already_set raised;
        name_entry(raised, i, k[i]);
        queue_group();
        throw raised;
      } catch (py::error_already_set& e) {
        name_entry(e, i, k[i]);
        queue_group();
        throw;
      }
      staged += group.back().cost;
      if (staged >= group_bytes) {
        queue_group();
        staged = 0;
      }
    }
  }

  /// Prefixes the message of `e` (an Exception raised by emit of entry
  /// `i`, key `key`) with "emit_many: entry I (key 'KEY'): ", keeping its
  /// type and other arguments (a UnicodeError gets the name as a note).
  /// KeyboardInterrupt and the like pass as they are.
  static void name_entry(py::error_already_set& e, Py_ssize_t i, py::handle key) {
    if (!e.matches(PyExc_Exception)) return;
    try {
      // A UnicodeError's args are its fields (the encoding first), from
      // which its message is made: the entry is named in a note instead.
      if (e.matches(PyExc_UnicodeError))
        e.value().attr("add_note")(entry_name(i, key));
      else
        prefix_message(e.value(), entry_name(i, key) + ": ");
    } catch (py::error_already_set&) {
      // An exception whose args cannot be set keeps its own message.
    }
  }

  /// "emit_many: entry I (key 'KEY')"; a key UTF-8 cannot spell as repr() shows it.
  static std::string entry_name(Py_ssize_t i, py::handle key) {
    std::string k;
    if (PyUnicode_Check(key.ptr())) {
      Py_ssize_t size = 0;
      const char* utf8 = PyUnicode_AsUTF8AndSize(key.ptr(), &size);
      if (utf8 == nullptr) {
        PyErr_Clear();
        k = py::repr(key);
      } else {
        k = quote(std::string_view(utf8, static_cast<std::size_t>(size)));
      }
    } else {
      k = py::repr(key);
    }
    return "emit_many: entry " + std::to_string(i) + " (key " + k + ")";
  }

  static void prefix_message(py::object value, const std::string& prefix) {
    py::tuple args = value.attr("args");
    py::list out;
    out.append(py::str(prefix + (args.size() > 0 ? std::string(py::str(args[0])) : std::string())));
    for (std::size_t j = 1; j < args.size(); ++j) out.append(args[j]);
    value.attr("args") = py::tuple(out);
  }

  /// A whole blob in one call, finished without waiting: open_blob(tag),
  /// emit_many, then the finish queued behind the entries. Returns the tag.
  /// Raises, before queueing anything, an earlier blob's deferred failure.
  /// Then only what is decided here raises (a value or key refused by
  /// emit's checks, the Sender closed, the connection failed), the blob
  /// aborted. A failure the background thread meets for this blob (the
  /// consumer's limits refusing an entry), or for an earlier one, while
  /// this call runs or later, never raises here, whatever the timing: the
  /// blob's remaining entries are dropped, its finish fails, and that
  /// failure is raised once by the next call on the Sender.
  py::bytes send_blob(py::handle keys, py::handle values, py::handle tag, bool copy = true) {
    auto [ks, vs] = paired_sequences(keys, values);
    std::shared_ptr<blob_slot> b = open_blob(tag);
    try {
      python_call encoding;
      // The entries and the finish in one group when they fit in one.
      std::vector<send_command> group;
      stage_entries(b, ks, vs, copy, checks::stream_only, group);
      send_command& fin = group.emplace_back();
      fin.what = op::finish;
      fin.blob = b;
      push(group, b.get(), checks::stream_only);
    } catch (py::error_already_set& e) {
      abort_on_exit(b, "send_blob: " + std::string(py::str(e.value())), exit_grace(e.value()));
      drop_blob(std::move(b));
      throw;
    }
    py::bytes t = tag_bytes(b->tag);
    drop_blob(std::move(b));
    return t;
  }

  /// finish (or abort, with `reason`) of `b`, and waits for it.
  void end_blob(const std::shared_ptr<blob_slot>& b, op what, std::string reason) {
    check("Blob");
    if (what == op::abort) {
      std::lock_guard lk(core_->mu);
      if (b->failed && !core_->failed) return;  // aborted already, with the entry's error
    }
    send_command cmd;
    cmd.what = what;
    cmd.blob = b;
    cmd.text = std::move(reason);
    run_and_wait(std::move(cmd), b.get(), "");
  }

  /// An exception left the Blob's with block: queues the abort and waits
  /// for it at most `grace`, exit_grace (the entries ahead of it may wait for
  /// window space a consumer that is not reading never gives; the abort
  /// then goes when they do, or with close()). Raises nothing: the block's
  /// own exception matters more.
  void abort_on_exit(const std::shared_ptr<blob_slot>& b, std::string reason,
                     std::chrono::milliseconds grace) {
    if (generation_ != fork_generation()) return;
    {
      std::lock_guard lk(core_->mu);
      if (b->ended || (b->failed && !core_->failed)) return;
    }
    auto done = std::make_shared<completion>();
    send_command cmd;
    cmd.what = op::abort;
    cmd.blob = b;
    cmd.text = std::move(reason);
    cmd.done = done;
    try {
      push(std::move(cmd), b.get());
    } catch (py::error_already_set&) {
      return;  // closed or failed: the consumer sees the blob aborted anyway
    }
    if (grace.count() > 0) done->wait(std::chrono::steady_clock::now() + grace);
    drop_released();
  }

  /// The Python Blob is gone: its writer is dropped on the io thread (which
  /// aborts the blob if it is still open), behind the commands that may
  /// still use it. Once closing has emptied every writer, `b` may go here.
  void drop_blob(std::shared_ptr<blob_slot> b) {
    if (generation_ != fork_generation()) {
      leak_in_child(std::move(b));
      return;
    }
    send_command cmd;
    cmd.what = op::drop;
    cmd.blob = std::move(b);
    std::unique_lock lk(core_->mu);
    if (core_->writers_dropped) return;
    enqueue_locked(lk, std::move(cmd));
  }

  void flush() {
    check("Sender");
    send_command cmd;
    cmd.what = op::flush;
    run_and_wait(std::move(cmd), nullptr, "flush: ");
  }

  void shutdown() {
    check("Sender");
    {
      std::lock_guard lk(core_->mu);
      if (core_->closed) return;  // closed (or shut down) already
    }
    send_command cmd;
    cmd.what = op::shutdown;
    try {
      run_and_wait(std::move(cmd), nullptr, "shutdown: ");
    } catch (...) {
      close_now();
      throw;
    }
    close_now();
  }

  /// Closes now: pending calls end with ClosedError (blobs in flight are
  /// reported aborted by the consumer), the background thread stops.
  /// Without the GIL while it waits; the io thread never needs it.
  void close_now() {
    // A forked child's copy: its background thread is the parent's, so
    // there is nothing to close here (the destructor leaks it, runtime.hpp).
    if (generation_ != fork_generation()) return;
    {
      std::unique_lock lk(core_->mu);
      if (!claim_close(lk, core_->cv, close_started_, user_released_)) {
        // Closed by another call, which may not have dropped the held
        // values yet: they are all in `released` once it has closed.
        if (lk.owns_lock()) lk.unlock();
        drop_released();  // a waiting close() returns with them released too
        return;
      }
      core_->closed = true;
      core_->cv.notify_all();
      asio::post(core_->ex, [c = core_] { c->s.close(); });
    }
    {
      gil_released nogil;
      close_without_gil();
    }
    // 4. Values the io thread let go of (held until sent) go now, with
    //    the GIL, not when the Sender is collected.
    drop_released();  // held values: released before close() returns
  }

  /// close_now's waits, the GIL released.
  void close_without_gil() {
    // 1. The drain coroutine finishes what is queued: every command fails
    //    at once with `closed`.
    wait_counted_nogil(core_->mu, core_->cv, core_->waiting, [&] { return !core_->draining; });
    // 2. The pipeline's objects go on the io thread, while it runs.
    auto dropped = std::make_shared<completion>();
    asio::post(core_->ex, [c = core_, dropped] {
      for (const auto& w : c->slots)
        if (auto slot = w.lock()) slot->w = blob_writer{};
      c->slots.clear();
      const sender_stats final_stats = c->s.stats();
      c->s = sender{};
      {
        std::lock_guard lk(c->mu);
        c->final_stats = final_stats;
        c->writers_dropped = true;
      }
      dropped->set({});
    });
    dropped->wait_nogil();
    // 3. The thread winds down and stops.
    end_close(*rt_, core_->mu, core_->cv, user_released_);
  }

  py::dict stats() {
    check("Sender");
    auto done = std::make_shared<completion>();
    auto out = std::make_shared<py_stats>();
    bool posted = false;
    {
      // Posted under the lock, so that a close() that starts later posts
      // its work after this, which the thread then runs before it stops.
      std::lock_guard lk(core_->mu);
      if (!close_started_) {
        posted = true;
        asio::post(core_->ex, [c = core_, out, done] {
          out->s = c->s.stats();
          out->in_flight = c->s.in_flight_bytes();
          out->unacked = c->s.unacked_bytes();
          done->set({});
        });
      }
    }
    if (posted) {
      done->wait();
      last_ = *out;
    } else {
      std::lock_guard lk(core_->mu);
      if (core_->writers_dropped) last_ = {core_->final_stats, 0, 0};
    }
    const sender_stats& s = last_.s;
    py::dict d;
    d["entries_sent"] = s.entries_sent;
    d["data_frames_sent"] = s.data_frames_sent;
    d["bytes_sent"] = s.bytes_sent;
    d["credit_waits"] = s.credit_waits;
    d["gathered_entries"] = s.gathered_entries;
    d["reconnects"] = s.reconnects;
    d["blobs_resent"] = s.blobs_resent;
    d["blobs_delivered"] = s.blobs_delivered;
    d["budget_waits"] = s.budget_waits;
    d["in_flight_bytes"] = last_.in_flight;
    d["unacked_bytes"] = last_.unacked;
    std::lock_guard lk(core_->mu);
    d["queued_bytes"] = core_->pending_bytes;
    d["queue_waits"] = queue_waits_;
    d["copies_reused"] = core_->copies.reused();
    d["copy_bytes_kept"] = core_->copies.kept_bytes();
    return d;
  }

  const sender_core& core() const { return *core_; }
  std::uint64_t queue_limit() const { return queue_limit_; }
  int waiting() {
    std::lock_guard lk(core_->mu);
    return core_->waiting;
  }

 private:
  struct py_stats {
    sender_stats s;
    std::uint64_t in_flight = 0, unacked = 0;
  };

  /// Raises the error that keeps `b` (or the sender) from taking commands;
  /// with `stream_only`, not a deferred failure nor `b`'s own (they stay
  /// for the next call, and `b`'s commands are dropped by the io thread).
  /// REQUIRES: core_->mu held by the caller (released before raising).
  void check_open_locked(std::unique_lock<std::mutex>& lk, const blob_slot* b,
                         checks what_raises = checks::all) {
    const bool all = what_raises == checks::all;
    std::error_code ec;
    std::string why;
    if (core_->failed) {
      ec = core_->failed;
      why = core_->why;
    } else if (core_->closed) {
      ec = errc::closed;
      why = "the Sender is closed";
    } else if (all && core_->deferred) {
      ec = std::exchange(core_->deferred, {});
      why = std::move(core_->deferred_why);
    } else if (all && b && b->failed) {
      ec = b->failed;
      why = b->why;
    } else if (b && b->ended) {
      ec = errc::closed;
      why = "the blob was finished or aborted already";
    }
    if (!ec) return;
    lk.unlock();
    raise_code(ec, why);
  }

  /// Queues `cmd`, first waiting for room if it is an entry. Raises as
  /// check_open_locked(`what_raises`), before and after waiting.
  void push(send_command cmd, blob_slot* b, checks what_raises = checks::all) {
    push({&cmd, 1}, b, what_raises);
  }

  /// Queues `cmds` in order under one lock (after what another call has
  /// staged for `b`: blob_slot::staged), each entry first waiting for
  /// room: while the queued commands' cost would pass the queue limit, until
  /// it is down to sender_core::resume_bytes. The background thread is
  /// started (woken) at most once, or before a wait. Raises as
  /// check_open_locked(`what_raises`), before and after a wait; the commands
  /// queued before a raise stay queued.
  void push(std::span<send_command> cmds, blob_slot* b, checks what_raises = checks::all) {
    push_staged(b, what_raises);
    push_now(cmds, b, what_raises);
  }

  /// Queues the entries another call has prepared for `b` and not queued
  /// yet (blob_slot::staged), as push. REQUIRES: the GIL.
  void push_staged(blob_slot* b, checks what_raises) {
    if (b == nullptr || b->staged == nullptr || b->staged->empty()) return;
    std::vector<send_command> taken = std::exchange(*b->staged, {});
    push_now(taken, b, what_raises);
  }

  /// push, without first queueing what is staged for `b`.
  void push_now(std::span<send_command> cmds, blob_slot* b, checks what_raises) {
    if (cmds.empty()) return;
    std::vector<PyObject*> drop;
    // A drain owed to commands queued here, started when the lock is let go
    // (by a wait, a raise or the end).
    struct owed_drain {
      const std::shared_ptr<sender_core>& core;
      bool owed = false;
      void start() {
        if (std::exchange(owed, false)) start_drain(core);
      }
      ~owed_drain() { start(); }
    } drain{core_};
    std::unique_lock lk(core_->mu);
    drop.swap(core_->released);
    check_open_locked(lk, b, what_raises);
    for (send_command& cmd : cmds) {
      const std::uint64_t cost = cmd.cost;
      if (cost > 0 && core_->pending_bytes > 0 && core_->pending_bytes + cost > queue_limit_) {
        ++queue_waits_;
        lk.unlock();
        drain.start();
        drop_now(drop);
        wait_counted(core_->mu, core_->cv, core_->waiting, [&] {
          return resumes(*core_) &&
                 (core_->pending_bytes == 0 || core_->pending_bytes + cost <= queue_limit_ ||
                  core_->closed || core_->failed);
        });
        lk.lock();
        check_open_locked(lk, b, what_raises);
      }
      if (cmd.what == op::finish || cmd.what == op::abort) b->ended = true;
      core_->pending_bytes += cost;
      core_->queue.push_back(std::move(cmd));
      if (!core_->draining) drain.owed = core_->draining = true;
    }
    lk.unlock();
    drain.start();
    drop_now(drop);
  }

  /// Appends `cmd` and makes sure a drain coroutine will run it.
  /// REQUIRES: `lk` holds core_->mu; it may be released.
  void enqueue_locked(std::unique_lock<std::mutex>& lk, send_command cmd) {
    core_->queue.push_back(std::move(cmd));
    if (core_->draining) return;
    core_->draining = true;
    lk.unlock();
    start_drain(core_);
  }

  /// Queues `cmd` and waits until it has run; raises its error.
  void run_and_wait(send_command cmd, blob_slot* b, const std::string& what) {
    auto done = std::make_shared<completion>();
    cmd.done = done;
    push(std::move(cmd), b);
    // Woken by the command itself, which close() makes fail at once.
    done->wait();
    drop_released();
    done->raise_if_failed(what);
    // A send_blob's failure that the command waited behind.
    std::unique_lock lk(core_->mu);
    if (core_->deferred) check_open_locked(lk, nullptr);
  }

  void drop_released() {
    std::vector<PyObject*> drop;
    {
      std::lock_guard lk(core_->mu);
      drop.swap(core_->released);
    }
    drop_now(drop);
  }

  static void drop_now(std::vector<PyObject*>& objs) {
    if (objs.empty()) return;
    // A held value's last reference: a torch tensor's dealloc releases the
    // GIL and takes it back in a noexcept frame, and a numpy array's base
    // may run Python code (runtime.hpp).
    python_call freeing_held;
    for (PyObject* o : objs) Py_DECREF(o);
    objs.clear();
  }

  std::shared_ptr<io_runtime> rt_;
  std::shared_ptr<sender_core> core_;
  std::uint64_t generation_;
  std::uint64_t queue_limit_;
  bool close_started_ = false;  // under core_->mu
  bool user_released_ = false;  // under core_->mu
  std::uint64_t queue_waits_ = 0;
  py_stats last_;
  // Blobs opened and maybe not ended yet (under core_->mu), for
  // abort_open_and_close.
  std::vector<std::weak_ptr<blob_slot>> open_;
};

// The Python classes: thin owners of a handle.

struct py_sender {
  std::shared_ptr<sender_handle> h;
};

struct py_blob {
  std::shared_ptr<sender_handle> h;
  std::shared_ptr<blob_slot> slot;
  ~py_blob() {
    if (h && slot) h->drop_blob(std::move(slot));
  }
  py_blob(std::shared_ptr<sender_handle> hh, std::shared_ptr<blob_slot> s)
      : h(std::move(hh)), slot(std::move(s)) {}
  py_blob(py_blob&&) = default;
};

}  // namespace

void cancel_launch(const std::shared_ptr<sender_core>& core) {
  asio::post(core->ex, [c = core] {
    if (c->launch_cancel) c->launch_cancel->cancel();
  });
}

std::shared_ptr<sender_core> new_sender_core(asio::any_io_executor ex) {
  return std::make_shared<sender_core>(std::move(ex));
}

void launch_sender(std::shared_ptr<sender_core> core, std::unique_ptr<transport> t,
                   connect_fn connect, bool resend, sender_options opt,
                   std::shared_ptr<completion> done) {
  auto ex = core->ex;
  core->resend = resend;
  core->launch_cancel =
      std::make_shared<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
  auto body = [core, t = std::move(t), connect = std::move(connect), resend,
                opt = std::move(opt), done]() mutable -> asio::awaitable<void> {
    if (!t && !resend) {
      // The TCP connect is bounded by handshake_timeout too: a listener
      // whose backlog is full leaves it waiting for the kernel's SYN
      // retries (over two minutes). The connect runs with a cancellation
      // slot of its own, which the deadline (lib/runtime) and this
      // coroutine's own cancellation (Ctrl-C in connect()) both reach.
      const auto here = co_await asio::this_coro::executor;
      asio::cancellation_signal connecting;
      const detail::deadline bound(here, opt.handshake_timeout, [&connecting] {
        connecting.emit(asio::cancellation_type::terminal);
      });
      asio::cancellation_slot caller = (co_await asio::this_coro::cancellation_state).slot();
      if (caller.is_connected())
        caller.assign([&connecting](asio::cancellation_type type) { connecting.emit(type); });
      auto [thrown, connected] = co_await asio::co_spawn(
          here, connect(),
          asio::bind_cancellation_slot(connecting.slot(),
                                       asio::experimental::as_tuple(asio::use_awaitable)));
      if (caller.is_connected()) caller.clear();
      if (bound.expired()) {
        done->set(make_error_code(errc::timed_out),
                  "cannot connect: " + bound.reason("no connection", "handshake_timeout") +
                      "; is the listener's backlog full?");
        co_return;
      }
      if (thrown) std::rethrow_exception(thrown);
      auto [ec, tr] = std::move(connected);
      if (ec) {
        // The URL was checked and its host resolved (check_connect_url):
        // peer_failed is a refused or unreachable address.
        done->set(ec, "cannot connect: " + ec.message() + " (" + errc_name(ec) + ")" +
                          (ec == errc::peer_failed ? "; is a consumer listening there?" : ""));
        co_return;
      }
      t = std::move(tr);
    }
    // Two statements, not `t ? co_await a : co_await b`: GCC 12 mishandles
    // co_await inside a conditional (lib/pipeline/send_queue.cpp says so too).
    // The limits that can end the handshake with timed_out: the first to
    // pass is the one to name.
    const auto handshake_ms = opt.handshake_timeout.count();
    const auto stall_ms = opt.stall_timeout.count();
    std::tuple<std::error_code, sender> started;
    if (t) {
      started = co_await sender::start(std::move(t), std::move(opt));
    } else {
      started = co_await sender::start(std::move(connect), std::move(opt));
    }
    auto& [ec, s] = started;
    if (!ec) {
      core->s = std::move(s);
      core->inline_bytes = core->s.inline_bytes();
      core->max_key_bytes = core->s.max_key_bytes();
      core->max_meta_bytes = core->s.max_meta_bytes();
      core->features = core->s.features();
      core->chunk_bytes = core->s.chunk_bytes();
      core->window_bytes = core->s.window_bytes();
    }
    std::string why;
    if (ec == errc::timed_out && !resend) {
      // Connected, and no hello back: a listener answers only from accept().
      const bool stall = stall_ms > 0 && (handshake_ms == 0 || stall_ms < handshake_ms);
      why = "handshake: no answer within " +
            (stall ? "stall_timeout (" + std::to_string(stall_ms)
                   : "handshake_timeout (" + std::to_string(handshake_ms)) +
            " ms); is the consumer's application accepting (Listener.accept(), a server)?";
    } else if (ec) {
      // The failed sender says why when it knows more than the code (a
      // bad hello's field, a resend session's attempts and max_attempts).
      const std::string& told = s.failure_reason();
      why = "handshake: " + (told.empty() ? ec.message() : told) + " (" + errc_name(ec) + ")";
    }
    done->set(ec, why);
  };
  // The connect and handshake race cancel_launch (Ctrl-C in connect()):
  // the timer's wait completing cancels them (their awaits honour
  // cancellation, as stall_timeout needs), so the io thread runs out of
  // work at once instead of after the runtime's stop grace.
  auto start = [body = std::move(body), core, done]() mutable -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    const auto cancel = core->launch_cancel;
    co_await (asio::co_spawn(co_await asio::this_coro::executor, std::move(body),
                             asio::use_awaitable) ||
              cancel->async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
    core->launch_cancel.reset();  // the timer goes with this frame, on the io thread
    done->set(make_error_code(errc::closed), "interrupted");  // when `body` lost the race
  };
  asio::co_spawn(ex, std::move(start), [done](std::exception_ptr e) {
    if (e) done->set(make_error_code(errc::closed), "blobpipe's background thread failed");
  });
}

py::object make_sender(std::shared_ptr<io_runtime> rt, std::shared_ptr<sender_core> core,
                       const sender_settings& settings) {
  return py::cast(
      py_sender{std::make_shared<sender_handle>(std::move(rt), std::move(core), settings.queue_bytes)});
}

void init_sender(py::module_& m) {
  py::class_<py_sender>(m, "Sender", R"(Streams blobs to one consumer (blobpipe.connect, loopback_pair).

    with blobpipe.connect("tcp://127.0.0.1:5555") as s:
        with s.open_blob(b"sample-0") as blob:
            blob.emit("ids", torch.arange(6))
            blob.emit("meta", {"idx": 0})      # finished at the end of the block
    # shutdown() at the end of the block: everything sent and read; left
    # by an exception, every blob still open is aborted (the consumer
    # yields BlobAborted naming the exception), then the Sender closes

Values are encoded as the codec's plan() does (torch tensors kind "t",
numpy arrays "n", anything else pickled, RawEntry as it is). A background
thread runs the C++ sender; emit() does not wait for the network (see
Blob.emit), finish(), flush() and shutdown() do. Calls may come from any
thread; calls on one blob are sent in call order, and entries of all blobs
in the order their emit() calls returned.

Negotiated in the handshake (bytes): chunk_bytes (largest data frame),
inline_bytes (entries up to this are copied by emit), window_bytes (the
consumer's window: the most bytes in flight).

Errors (StreamError subclasses): ClosedError after close(), PeerClosedError
(the consumer went away; the message gives its close reason when it sent
one, e.g. an entry over its limits), PeerFailedError (reset, I/O error),
ProtocolViolationError (bytes that break docs/wire.md, or a consumer's
hello the session cannot go on with: in a resend session, limits below an
entry it keeps to send again), TimedOutError (stall_timeout). Once the connection
has failed, every call raises its error; a resend session (connect(...,
resend=True)) reconnects instead, and raises once max_attempts connection
attempts in a row delivered nothing while a blob was kept (the message
names max_attempts and the last cause).)")
      .def("open_blob",
           [](py_sender& s, py::handle tag) { return py_blob(s.h, s.h->open_blob(tag)); },
           py::arg("tag") = py::none(),
           R"(Opens a blob with `tag`: any bytes-like object cut or zero-padded to 16
bytes; None (the default) gives a random uuid4 tag. In a resend session
(connect(..., resend=True)) the consumer knows a blob by this tag: two
blobs with equal tags are one blob to it, and the second is dropped as a
resend; keep tags unique there. So a resend session refuses, with
ValueError, a tag longer than 16 bytes (two such tags could be cut to one)
and one of 16 zero bytes (NO_TAG). Nothing is sent until its first emit,
finish or abort. Raises ClosedError, or the connection's error.)")
      .def("send_blob",
           [](py_sender& s, py::handle keys, py::handle values, py::handle tag, bool copy) {
             return s.h->send_blob(keys, values, tag, copy);
           },
           py::arg("keys"), py::arg("values"), py::arg("tag") = py::none(), py::kw_only(),
           py::arg("copy") = true,
           R"(Streams a whole blob in one call: open_blob(tag), emit of each
(keys[i], values[i]) in order, and a finish that is queued, not waited
for. The RL worker's call: one per sample. Returns the blob's 16-byte tag.
`tag` as open_blob's (a resend session refuses a tag longer than 16 bytes
or all zeros, with ValueError).

Each value is taken as Blob.emit takes it (copied or held; copy=False
as Blob.emit's). Blocks only
while the queue is full, as emit. Raises, before queueing anything, the
deferred failure of an earlier send_blob (below). Then raises only what
is decided in this call: as emit for a value or key refused here (the
blob is then aborted, nothing of it completes), ValueError (FormatError
invalid_argument) when keys and values differ in length, ClosedError or
the connection's error. A failure the background thread meets for this
blob (the consumer's limits refusing an entry, such as its meta longer
than max_meta_bytes at its offset) never raises from this call, whether
met before or after it returned: the blob is aborted (its later entries
dropped, the consumer sees BlobAborted) and the failure is raised, once,
by the next call on this Sender: send_blob, open_blob, flush() or
shutdown().)")
      .def("flush", [](py_sender& s) { s.h->flush(); },
           R"(Waits until every entry, tail and abort queued so far has been handed to
the transport (not: read by the consumer). Interrupted by Ctrl-C. Raises
the connection's error (StreamError).)")
      .def("shutdown", [](py_sender& s) { s.h->shutdown(); },
           R"(Orderly close: sends what is queued, says goodbye, and waits until the
consumer has read everything and closed its end; blobs still open are
reported aborted by the consumer. Resend session: first waits until every
ended blob was delivered. Then the Sender is closed. Raises the
connection's error (StreamError); the Sender is closed either way.)")
      .def("close", [](py_sender& s) { s.h->close_now(); },
           R"(Closes now: calls waiting in other threads raise ClosedError, blobs in
flight are reported aborted by the consumer, held values are released,
the background thread stops. Idempotent; never raises for the connection.)")
      .def("stats", [](py_sender& s) { return s.h->stats(); },
           R"(Counters (a dict of ints): entries_sent, data_frames_sent, bytes_sent
(entry and tail bytes), credit_waits (times the sender waited for the
consumer's window), gathered_entries, reconnects, blobs_resent,
blobs_delivered, budget_waits (resend sessions), in_flight_bytes (credit
held now), unacked_bytes (resend: bytes kept until delivered),
queued_bytes (entries emitted and not yet handed to the C++ sender),
queue_waits (times emit() blocked on a full queue; once blocked, it goes on
when the queue is half empty), copies_reused (copies emit made into memory
kept from earlier copies) and copy_bytes_kept (bytes kept for later copies:
at most 1 MiB per power-of-two size class up to 64 KiB, and 32 MiB above).
After close() the last figures read.)")
      .def_property_readonly("chunk_bytes", [](const py_sender& s) { return s.h->core().chunk_bytes; },
                             "Negotiated largest data frame payload, bytes.")
      .def_property_readonly("inline_bytes", [](const py_sender& s) { return s.h->core().inline_bytes; },
                             "Negotiated copy threshold, bytes: emit copies entries up to this.")
      .def_property_readonly("window_bytes", [](const py_sender& s) { return s.h->core().window_bytes; },
                             "The consumer's window, bytes.")
      .def_property_readonly("max_key_bytes", [](const py_sender& s) { return s.h->core().max_key_bytes; },
                             "The consumer's key limit, bytes: emit refuses longer keys (UTF-8).")
      .def_property_readonly("max_meta_bytes", [](const py_sender& s) { return s.h->core().max_meta_bytes; },
                             "The consumer's limit on an entry's meta (its index row: offset,\n"
                             "length, kind, dtype, shape in msgpack; 12 + 8 per dimension in the\n"
                             "compact form), bytes: emit refuses an entry whose meta is longer in\n"
                             "the form it would travel in (a shape of many dimensions).")
      .def_property_readonly("queue_bytes", [](const py_sender& s) { return s.h->queue_limit(); },
                             "emit() blocks while more than this many bytes are queued, bytes\n"
                             "(connect()'s queue_bytes; by default the consumer's window, at most\n"
                             "64 MiB whatever window it grants).")
      .def_property_readonly("_waiting", [](py_sender& s) { return s.h->waiting(); },
                             "Python threads blocked in this Sender now (for tests).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](py_sender& s, py::handle type, py::handle value, py::handle) {
             if (type.is_none()) {
               s.h->shutdown();
             } else {
               s.h->abort_open_and_close(exit_reason(value), exit_grace(value));
             }
             return false;
           });

  py::class_<py_blob>(m, "Blob", R"(One blob being streamed (Sender.open_blob).

    blob = sender.open_blob()
    blob.emit("0@input_ids", torch.tensor(ids))
    blob.emit("0@reward", torch.tensor(0.5))
    blob.finish()

As a context manager it finishes at the end of the block, or aborts with
"exception in the with block: " and the exception's repr when one is
raised, waiting up to 5 s for the abort to be queued behind the entries
(not at all for KeyboardInterrupt: Ctrl-C acts at once). Dropping an open
blob aborts it.)")
      .def("emit",
           [](py_blob& b, py::handle key, py::handle v, bool copy) {
             b.h->emit(b.slot, key, v, copy);
           },
           py::arg("key"), py::arg("value"), py::kw_only(), py::arg("copy") = true,
           R"(Adds entry `key` (str(key)) with `value` to the blob.

Returns without waiting for the network: an entry of at most inline_bytes
bytes is copied first (the value may change at once), and so is a torch
tensor whose bytes torch may reallocate (resize_; with torch 1.13 every
tensor: its storage cannot say); a larger numpy array, pickle or RawEntry
is held and sent from its own memory by the background thread (do not
change it until finish() or flush() returns; it is released by a later
call on the sender). copy=False (keyword) holds a larger torch tensor too,
zero-copy, as pyzmq's copy=False: the caller promises that torch does not
reallocate its bytes (resize_ to a larger size, set_ or a resize of its
storage) until finish() or flush() returns, as it would free the bytes
the background thread reads. Blocks only while the queue is full (queue_bytes, by default
the consumer's window, at most 64 MiB), i.e. when the consumer holds a
window's worth and another is queued: Ctrl-C interrupts the wait, close()
ends it, and so does the Sender's stall_timeout when the consumer reads
nothing (TimedOutError).

Raises FormatError for a value the codec refuses (invalid_argument,
unknown_dtype, too_large) or a key longer than the consumer's
max_key_bytes, or an entry whose meta (index row) is longer than its
max_meta_bytes in the form it would travel in (invalid_argument, the message naming the key and the limit
in bytes; Sender.max_key_bytes, Sender.max_meta_bytes) — nothing is sent and the blob stays usable; ClosedError (the blob
was finished or aborted, or the sender closed); the connection's error; or
the error of an earlier entry of this blob that could not be sent (the
consumer refused it, e.g. a key longer than its max_key_bytes), after
which the blob is aborted.)")
      .def("emit_many",
           [](py_blob& b, py::handle keys, py::handle values, bool copy) {
             b.h->emit_many(b.slot, keys, values, copy);
           },
           py::arg("keys"), py::arg("values"), py::kw_only(), py::arg("copy") = true,
           R"(emit(keys[i], values[i], copy=copy) for each i, in order, in one call (two
sequences of equal length, as plan() takes them). Raises as emit, and
ValueError (FormatError invalid_argument) when the lengths differ (nothing
is emitted then); the entries before a refused one stay emitted. A call
on this blob made while it runs (from a value's __reduce__, or another
thread) comes after the entries before the one being encoded.)")
      .def("finish", [](py_blob& b) { b.h->end_blob(b.slot, op::finish, {}); },
           R"(Ends the blob (index and footer) and waits until its tail is queued
behind its entries; every value it held has then been handed to the
transport. Raises as emit, and TooLarge (FormatError too_large) when the
v3 footer cannot address the blob.)")
      .def("abort", [](py_blob& b, std::string reason) { b.h->end_blob(b.slot, op::abort, std::move(reason)); },
           py::arg("reason") = "",
           R"(Abandons the blob; the consumer reports BlobAborted(reason) (reason cut
to 4 KiB). Waits until the abort is queued. No-op if an entry had failed
(the blob is aborted already). Raises ClosedError when finished or aborted
before, or the connection's error.)")
      .def_property_readonly("tag", [](const py_blob& b) { return tag_bytes(b.slot->tag); },
                             "The blob's 16-byte tag.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_blob& b, py::handle type, py::handle value, py::handle) {
        if (type.is_none()) {
          b.h->end_blob(b.slot, op::finish, {});
          return false;
        }
        b.h->abort_on_exit(b.slot, exit_reason(value), exit_grace(value));
        return false;
      });
}

}  // namespace blobpipe::python
