// blobpipe.Consumer and its events: a C++ consumer read from Python threads.
//
// A coroutine on the io thread awaits consumer::next_batch() and appends
// every event to a queue (consumer_core::events); Python threads take the queue
// whole when theirs is empty and turn one event at a time into Python
// objects. The io thread therefore reads ahead of Python, bounded by the
// window: every entry queued holds its credit until the Python object
// made from it (and every value viewing its bytes) is gone.
//
// Waiting: a blocking __next__ waits on a condition variable, without the
// GIL, in slices that run signal handlers (runtime.hpp). asyncio waits on
// an eventfd instead (loop.add_reader): _arm() asks the io thread to write
// it at the next event, so no thread but the loop's touches Python.
#include <sys/eventfd.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <deque>

#include "entry.hpp"
#include "entry_ready.hpp"
#include "errors.hpp"
#include "received.hpp"
#include "state.hpp"
#include "stream.hpp"
#include "tags.hpp"

namespace blobpipe::python {

/// Bytes the queue toward Python may hold beyond the window
/// (event_bytes_beyond_window: aborts' reasons, completed blobs' index
/// rows) before the io thread stops reading until Python takes the queue.
/// Python holds at most twice this: the queue it took, and the one
/// filling behind it.
inline constexpr std::size_t max_queued_event_bytes = std::size_t{16} << 20;

struct consumer_core {
  explicit consumer_core(asio::any_io_executor e) : ex(e), room(std::move(e)) {}
  ~consumer_core() {
    for (const auto* fds : {&armed_fds, &fired_fds, &spare_fds})
      for (int fd : *fds) ::close(fd);
  }
  consumer_core(const consumer_core&) = delete;
  consumer_core& operator=(const consumer_core&) = delete;

  asio::any_io_executor ex;
  consumer c;  // io thread only

  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu:
  std::deque<event> events;
  bool loop_done = false;  // end_of_stream is queued
  bool closed = false;     // close() was called
  int waiting = 0;         // Python threads in cv waits
  bool wake_posted = false;  // consume_loop posted a wake_locked() not yet run
  // asyncio waiters: one eventfd each (_arm), written at the next event.
  // One per waiter, not one per consumer: several tasks or event loops may
  // wait on one Consumer, and a shared fd's wake-up reaches only the one
  // that reads it first. An fd goes armed -> fired (written) -> spare
  // (drained, reusable) only when its waiter gives it back (_disarm, after
  // loop.remove_reader), so no other waiter can get it while one still
  // watches it.
  std::vector<int> armed_fds, fired_fds, spare_fds;
  consumer_stats stats;    // as of the last stats() or the end
  std::uint32_t chunk_bytes = 0;
  std::uint64_t window_bytes = 0;
  // `events`' bytes beyond the window (max_queued_event_bytes), and whether
  // the io thread waits for Python to take them (then woken through room).
  std::size_t queued_beyond_window = 0;
  bool room_wanted = false;
  // Io thread only: the loop's wait for room, woken by cancel() (posted).
  asio::steady_timer room;

  /// Wakes whoever waits for events. REQUIRES: mu held.
  void wake_locked() {
    if (waiting > 0) cv.notify_all();
    for (int fd : armed_fds) {
      const std::uint64_t one = 1;
      // A full counter (never, at one write per arm) only loses a wake-up
      // the loop's next poll makes up for.
      [[maybe_unused]] auto n = ::write(fd, &one, sizeof one);
    }
    fired_fds.insert(fired_fds.end(), armed_fds.begin(), armed_fds.end());
    armed_fds.clear();
  }
};

namespace {

/// Events queued before the io thread wakes Python at once instead of
/// when it next waits for bytes (consume_loop), and the most one
/// next_batch() takes: the queue's bytes beyond the window
/// (max_queued_event_bytes) are checked at least this often.
constexpr std::size_t wake_batch_events = 64;

asio::awaitable<void> consume_loop(std::shared_ptr<consumer_core> c) {
  // The io thread's batch, reused from read to read (next_batch).
  std::vector<event> batch;
  for (;;) {
    batch.clear();
    co_await c->c.next_batch(batch, wake_batch_events);
    const bool end = batch.back().kind == event_kind::end_of_stream;
    std::unique_lock lk(c->mu);
    for (auto& ev : batch) {
      c->queued_beyond_window += event_bytes_beyond_window(ev);
      c->events.push_back(std::move(ev));
    }
    if (end) {
      c->loop_done = true;
      c->stats = c->c.stats();
      // The C++ consumer goes here, on its thread (stream.hpp: never
      // inside the io_context's destructor). Entries still held only
      // hold their bytes; their credit has nowhere to go.
      c->c = consumer{};
    }
    // Waking a Python thread per event cost more than the event (a futex
    // wake and a context switch each: perf put half the RL consumer's CPU
    // in the kernel's scheduler). A batch is what one read completed (at
    // most wake_batch_events of it), and the next call returns without
    // suspending while frames already read hold events, so a wake posted
    // here runs once this coroutine suspends to read more: Python is woken
    // once per read (or every wake_batch_events events, or at the end),
    // and takes the queue whole.
    const bool full = c->queued_beyond_window >= max_queued_event_bytes && !c->closed;
    if (end || full || c->events.size() >= wake_batch_events) {
      c->wake_locked();
    } else if (!c->wake_posted) {
      c->wake_posted = true;
      asio::post(c->ex, [c] {
        std::lock_guard lk2(c->mu);
        c->wake_posted = false;
        c->wake_locked();
      });
    }
    if (end) co_return;
    if (!full) continue;
    // Events that hold no credit (a flood of aborts, say) would grow the
    // queue without bound while Python is busy: read no more until Python
    // takes the queue (take_queue_locked) or closes.
    c->room_wanted = true;
    lk.unlock();
    c->room.expires_at(asio::steady_timer::time_point::max());
    co_await c->room.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
}

/// Python takes the io thread's queue whole into `into`, and lets the io
/// thread read on if it waited for room. REQUIRES: c.mu held.
void take_queue_locked(const std::shared_ptr<consumer_core>& c, std::deque<event>& into) {
  into.swap(c->events);
  c->queued_beyond_window = 0;
  if (std::exchange(c->room_wanted, false)) asio::post(c->ex, [c] { c->room.cancel(); });
}

void spawn_loop(const std::shared_ptr<consumer_core>& c) {
  asio::co_spawn(c->ex, consume_loop(c), [c](std::exception_ptr e) {
    if (!e) return;
    // Out of memory in the loop: end the stream rather than leave Python
    // waiting for events that will never come.
    event end;
    end.error = make_error_code(errc::closed);
    end.reason = "blobpipe's background thread failed";
    std::lock_guard lk(c->mu);
    c->events.push_back(std::move(end));
    c->loop_done = true;
    c->wake_locked();
  });
}

// ---- events as Python objects (EntryReady: entry_ready.cpp) ----

struct py_blob_complete {
  tag_t tag;
  std::uint64_t blob_id = 0;
  std::shared_ptr<const completed_blob> blob;
};

struct py_blob_aborted {
  tag_t tag;
  std::uint64_t blob_id = 0;
  std::string reason;
  std::string category;
  bool resend = false;
};

// ---- the Python side ----

class consumer_handle {
 public:
  consumer_handle(std::shared_ptr<io_runtime> rt, std::shared_ptr<consumer_core> core,
                  bool allow_pickle)
      : rt_(std::move(rt)),
        core_(std::move(core)),
        generation_(rt_->generation()),
        allow_pickle_(allow_pickle) {}

  ~consumer_handle() {
    if (generation_ != fork_generation()) {
      // Events hold entries whose release would post to the parent's
      // io_context (and its locks): leak them with the rest.
      auto keep = std::make_shared<std::deque<event>>(std::move(local_));
      leak_in_child(std::move(keep));
      leak_in_child(std::move(core_));
      leak_in_child(std::move(rt_));
      return;
    }
    try {
      close();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("blobpipe.Consumer.__del__");
    }
    local_.clear();
  }

  consumer_handle(const consumer_handle&) = delete;
  consumer_handle& operator=(const consumer_handle&) = delete;

  void check() const { check_not_forked(generation_, "Consumer"); }

  enum class got { event, empty, end };

  /// The next event as a Python object in `out`; `empty` only when not
  /// `block`ing and nothing has arrived.
  got pull(bool block, py::object& out) {
    check();
    for (;;) {
      if (!local_.empty()) {
        event ev = std::move(local_.front());
        local_.pop_front();
        if (ev.kind == event_kind::end_of_stream) {
          end(ev.error, escape(ev.reason));  // the peer's words: one line
          return got::end;
        }
        out = to_python(std::move(ev));
        return got::event;
      }
      if (ended_) return got::end;
      std::unique_lock lk(core_->mu);
      if (!core_->events.empty()) {
        take_queue_locked(core_, local_);
        continue;
      }
      if (core_->closed) {
        lk.unlock();
        end(make_error_code(errc::closed), "the Consumer is closed");
        return got::end;
      }
      if (!block) return got::empty;
      report_wait_locked();
      lk.unlock();
      // loop_done: another thread took the queue with the end in it; it
      // ends there, and this thread ends too (several may iterate).
      wait_counted(core_->mu, core_->cv, core_->waiting, [&] {
        return !core_->events.empty() || core_->closed || core_->loop_done;
      });
    }
  }

  /// After pull() gave `end`: raises the error that ended the stream, or
  /// `stop` (StopIteration, StopAsyncIteration) for an orderly end or one
  /// this side closed.
  [[noreturn]] void raise_end(PyObject* stop) const {
    if (end_ec_ && end_ec_ != errc::closed) raise_code(end_ec_, end_why_);
    PyErr_SetNone(stop);
    throw py::error_already_set();
  }

  /// Asks for a write to the eventfd at the next event (at once if one is
  /// here, or the stream ended). Returns the fd, for loop.add_reader.
  int arm() {
    check();
    std::lock_guard lk(core_->mu);
    int fd;
    if (!core_->spare_fds.empty()) {
      fd = core_->spare_fds.back();
      core_->spare_fds.pop_back();
    } else {
      fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
    }
    core_->armed_fds.push_back(fd);
    if (!core_->events.empty() || core_->closed || !local_.empty() || core_->loop_done)
      core_->wake_locked();
    else
      report_wait_locked();
    return fd;
  }

  /// The waiter of `fd` (from arm) no longer watches it: drained and kept
  /// for reuse. An fd that is not armed or fired here is left alone.
  void disarm(int fd) {
    std::lock_guard lk(core_->mu);
    for (auto* fds : {&core_->armed_fds, &core_->fired_fds}) {
      if (auto it = std::find(fds->begin(), fds->end(), fd); it != fds->end()) {
        fds->erase(it);
        std::uint64_t n = 0;
        [[maybe_unused]] auto r = ::read(fd, &n, sizeof n);
        core_->spare_fds.push_back(fd);
        return;
      }
    }
  }

  /// Closes now (see the Consumer docstring). Idempotent.
  void close() {
    // A forked child's copy: its background thread is the parent's, so
    // there is nothing to close here (the destructor leaks it, runtime.hpp).
    if (generation_ != fork_generation()) return;
    {
      std::unique_lock lk(core_->mu);
      if (!claim_close(lk, core_->cv, close_started_, user_released_)) return;
      core_->closed = true;
      core_->wake_locked();
      asio::post(core_->ex, [c = core_] {
        c->c.close();
        c->room.cancel();  // a loop waiting for room reads the end
      });
    }
    gil_released nogil;
    // The loop ends once the close has run, and destroys the C++
    // consumer. Its thread may be a Listener's, which goes on.
    wait_counted_nogil(core_->mu, core_->cv, core_->waiting, [&] { return core_->loop_done; });
    end_close(*rt_, core_->mu, core_->cv, user_released_);
  }

  py::dict stats() {
    check();
    consumer_stats s;
    std::shared_ptr<completion> done;
    {
      // Posted under the lock: see sender.cpp's stats().
      std::lock_guard lk(core_->mu);
      s = core_->stats;
      if (!core_->loop_done && !close_started_) {
        done = std::make_shared<completion>();
        asio::post(core_->ex, [c = core_, done] {
          const consumer_stats now = c->c.stats();
          {
            std::lock_guard lk(c->mu);
            // Once the stream ended, c->c is an empty consumer: keep the
            // figures the loop took at the end.
            if (!c->loop_done) c->stats = now;
          }
          done->set({});
        });
      }
    }
    if (done) {
      done->wait();
      std::lock_guard lk(core_->mu);
      s = core_->stats;
    }
    py::dict d;
    d["buffered_bytes"] = s.buffered_bytes;
    d["buffered_high_water"] = s.buffered_high_water;
    d["entries_received"] = s.entries_received;
    d["blobs_completed"] = s.blobs_completed;
    d["blobs_aborted"] = s.blobs_aborted;
    d["acks_sent"] = s.acks_sent;
    d["duplicates_dropped"] = s.duplicates_dropped;
    d["chunks_overlapped"] = s.chunks_overlapped;
    d["buffers_reused"] = s.buffers_reused;
    d["recycle_kept_bytes"] = s.recycle_kept_bytes;
    d["small_entries_reused"] = s.small_entries_reused;
    d["small_entry_kept_bytes"] = s.small_entry_kept_bytes;
    d["held_bytes"] = s.held_bytes;
    d["held_high_water"] = s.held_high_water;
    d["held_in_window_bytes"] = s.held_in_window_bytes;
    return d;
  }

  /// The application now waits with nothing queued: the io thread's
  /// consumer starts the held_timeout clock if the application holds what
  /// the sender may wait for (consumer_options::waits_reported). One post
  /// per wait, not per event. REQUIRES: core_->mu held.
  void report_wait_locked() {
    if (core_->loop_done || core_->closed) return;
    asio::post(core_->ex, [c = core_] { c->c.application_waits(); });
  }

  const consumer_core& core() const { return *core_; }
  int waiting() {
    std::lock_guard lk(core_->mu);
    return core_->waiting;
  }

 private:
  void end(std::error_code ec, std::string why) {
    ended_ = true;
    end_ec_ = ec;
    end_why_ = std::move(why);
    local_.clear();
  }

  py::object to_python(event ev) {
    switch (ev.kind) {
      case event_kind::entry_ready:
        // The application's now: the held allowance may take it at the
        // next wait (consumer_options::waits_reported).
        mark_delivered(*ev.entry);
        return make_entry_ready(received_ref(rt_, std::move(ev.entry)), allow_pickle_);
      case event_kind::blob_complete:
        return py::cast(py_blob_complete{ev.tag, ev.blob_id, std::move(ev.blob)});
      default:  // blob_aborted: end_of_stream is handled by pull()
        return py::cast(py_blob_aborted{ev.tag, ev.blob_id, std::move(ev.reason),
                                        errc_name(ev.error), ev.resend});
    }
  }

  std::shared_ptr<io_runtime> rt_;
  std::shared_ptr<consumer_core> core_;
  std::uint64_t generation_;
  bool allow_pickle_;
  std::deque<event> local_;  // taken from core_->events; GIL
  bool ended_ = false;
  std::error_code end_ec_;
  std::string end_why_;
  bool close_started_ = false;  // under core_->mu
  bool user_released_ = false;  // under core_->mu
};

struct py_consumer {
  std::shared_ptr<consumer_handle> h;
};


}  // namespace

std::shared_ptr<consumer_core> new_consumer_core(asio::any_io_executor ex) {
  return std::make_shared<consumer_core>(std::move(ex));
}

void close_consumer_core(consumer_core& core) noexcept { core.c.close(); }

asio::awaitable<std::pair<std::error_code, std::string>> start_consumer(
    std::shared_ptr<consumer_core> core, std::unique_ptr<transport> t, consumer_options opt) {
  auto [ec, c] = co_await consumer::start(std::move(t), std::move(opt));
  if (ec) co_return std::pair{ec, "handshake: " + ec.message() + " (" + errc_name(ec) + ")"};
  core->c = std::move(c);
  core->chunk_bytes = core->c.chunk_bytes();
  core->window_bytes = core->c.window_bytes();
  spawn_loop(core);
  co_return std::pair{std::error_code{}, std::string{}};
}

void launch_consumer(std::shared_ptr<consumer_core> core, std::unique_ptr<transport> t,
                     consumer_options opt, std::shared_ptr<completion> done) {
  auto ex = core->ex;
  auto start = [core, t = std::move(t), opt = std::move(opt),
                done]() mutable -> asio::awaitable<void> {
    auto [ec, why] = co_await start_consumer(core, std::move(t), std::move(opt));
    done->set(ec, std::move(why));
  };
  asio::co_spawn(ex, std::move(start), [done](std::exception_ptr e) {
    if (e) done->set(make_error_code(errc::closed), "blobpipe's background thread failed");
  });
}

py::object make_consumer(std::shared_ptr<io_runtime> rt, std::shared_ptr<consumer_core> core,
                         const consumer_settings& settings) {
  return py::cast(py_consumer{
      std::make_shared<consumer_handle>(std::move(rt), std::move(core), settings.allow_pickle)});
}

void init_consumer(py::module_& m) {
  init_entry_ready(m);

  py::class_<py_blob_complete>(m, "BlobComplete", R"(A blob whose tail arrived and checked out: every entry was yielded
before it, and its index and footer agree with them.

  tag:     the blob's 16-byte tag (bytes).
  blob_id: its id on this connection.
  nbytes:  the whole blob's size as written, bytes.
  entries: its index rows (list[Entry]), in order.)")
      .def_property_readonly("tag", [](const py_blob_complete& b) { return tag_bytes(b.tag); })
      .def_property_readonly("blob_id", [](const py_blob_complete& b) { return b.blob_id; })
      .def_property_readonly("nbytes", [](const py_blob_complete& b) { return b.blob->nbytes; })
      .def_property_readonly("entries",
                             [](const py_blob_complete& b) {
                               py::list l;
                               for (const Entry& e : b.blob->index.entries)
                                 l.append(entry_object(Entry(e)));
                               return l;
                             })
      .def("__repr__", [](const py_blob_complete& b) {
        return "BlobComplete(tag=" + tag_hex(b.tag) + ", entries=" +
               std::to_string(b.blob->index.entries.size()) +
               ", nbytes=" + std::to_string(b.blob->nbytes) + ")";
      });

  py::class_<py_blob_aborted>(m, "BlobAborted", R"(A blob that will not complete: BlobAborted(tag, reason).

  tag:      the blob's 16-byte tag (bytes).
  blob_id:  its id on this connection.
  reason:   one line: the producer's reason (Blob.abort), or what broke.
  category: "aborted" (the producer aborted it), or the connection's
            error: "peer_closed", "peer_failed", "protocol_violation",
            "closed" (this side closed), "timed_out".
  resend:   resend sessions only: True when just this attempt is void (the
            sender will send the blob again); drop its entries.)")
      .def_property_readonly("tag", [](const py_blob_aborted& b) { return tag_bytes(b.tag); })
      .def_property_readonly("blob_id", [](const py_blob_aborted& b) { return b.blob_id; })
      .def_property_readonly("reason", [](const py_blob_aborted& b) {
        return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
            b.reason.data(), static_cast<Py_ssize_t>(b.reason.size()), "backslashreplace"));
      })
      .def_property_readonly("category", [](const py_blob_aborted& b) { return b.category; })
      .def_property_readonly("resend", [](const py_blob_aborted& b) { return b.resend; })
      .def("__repr__", [](const py_blob_aborted& b) {
        // Python's repr of the reason (as .reason gives it): quotes chosen
        // so that a reason quoting a key reads as written, control
        // characters escaped so that a peer's reason cannot forge a line.
        py::object reason = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
            b.reason.data(), static_cast<Py_ssize_t>(b.reason.size()), "backslashreplace"));
        if (!reason) throw py::error_already_set();
        return "BlobAborted(tag=" + tag_hex(b.tag) + ", category=" + b.category +
               ", reason=" + std::string(py::repr(reason)) + ")";
      });

  m.attr("BlobAborted").attr("__match_args__") = py::make_tuple("tag", "reason");
  m.attr("BlobComplete").attr("__match_args__") = py::make_tuple("tag");

  py::class_<py_consumer>(m, "Consumer", R"(Receives blobs from one sender (Listener.accept, loopback_pair).

    with blobpipe.listen("tcp://127.0.0.1:0") as listener:
        print("port", listener.port)
        with listener.accept() as consumer:
            for ev in consumer:                  # or: async for ev in consumer
                if isinstance(ev, blobpipe.EntryReady):
                    train_on(ev.entry.key, ev.value)   # zero-copy view

Yields EntryReady as each entry's bytes arrive (before the blob's tail),
BlobComplete once a blob's tail checked out, BlobAborted for a blob that
will not complete, and ends (StopIteration / StopAsyncIteration) when the
sender shut down, or after close(). A connection that ends otherwise
raises its error after the BlobAborted events of its open blobs:
PeerClosedError (the sender went away without shutdown), PeerFailedError,
ProtocolViolationError, TimedOutError (stall_timeout, idle_timeout,
held_timeout).

A background thread reads ahead of the iteration as far as the window
allows (window_bytes): every entry not yet freed holds its share (one
entry larger than the window is admitted alone, when nothing else is held). Values
you have been given and still hold (the previous event of a loop, a batch
being gathered) leave the window for the held allowance (held_bytes,
default: as much as window_bytes), so the sender goes on. Hold more than both and wait, and
the iteration raises TimedOutError after held_timeout (default 30 s),
naming the window, the bytes held and held_bytes, rather than wait for
an entry the sender has no credit to send.
Several threads (or one task) may iterate: each event goes to one of
them, and all end at the end of the stream. Ctrl-C interrupts a blocking
wait; close() from another thread ends it.)")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](py_consumer& c) {
             py::object out;
             if (c.h->pull(true, out) == consumer_handle::got::end) c.h->raise_end(PyExc_StopIteration);
             return out;
           })
      .def("__aiter__", [](py::object self) { return self; })
      .def("__anext__",
           [](py::object self) {
             module_state& s = state();
             if (!s.anext) s.anext = py::module_::import("blobpipe._stream").attr("_anext");
             return s.anext(self);
           })
      .def("_poll",
           [](py_consumer& c) -> py::object {
             py::object out;
             switch (c.h->pull(false, out)) {
               case consumer_handle::got::event: return out;
               case consumer_handle::got::empty: return py::none();
               default: c.h->raise_end(PyExc_StopAsyncIteration);
             }
           },
           "The next event, None when none has arrived; StopAsyncIteration at the end.")
      .def("_arm", [](py_consumer& c) { return c.h->arm(); },
           "The eventfd to await (asyncio); written at the next event.")
      .def("_disarm", [](py_consumer& c, int fd) { c.h->disarm(fd); })
      .def("close", [](py_consumer& c) { c.h->close(); },
           R"(Closes now: a blocked iteration in another thread wakes and ends (events
already queued are yielded first, then it stops, as at the end of the
stream: StopIteration, so a loop that must tell the two apart checks a
flag of its own that it set before close()); the sender sees
PeerClosedError. Values already received stay valid. Idempotent.)")
      .def("stats", [](py_consumer& c) { return c.h->stats(); },
           R"(Counters (a dict of ints): buffered_bytes (window credit held now,
bytes), buffered_high_water, entries_received, blobs_completed,
blobs_aborted, acks_sent, duplicates_dropped (resend sessions),
chunks_overlapped, buffers_reused, recycle_kept_bytes,
small_entries_reused, small_entry_kept_bytes (blocks of entries of up to
256 bytes kept for reuse), held_bytes (credit of values you hold outside the window now, bytes: held_bytes option),
held_high_water, held_in_window_bytes (credit of values you hold inside
the window, once the allowance is full). After the stream ended, the
figures at its end.)")
      .def_property_readonly("chunk_bytes", [](const py_consumer& c) { return c.h->core().chunk_bytes; },
                             "Negotiated largest data frame payload, bytes.")
      .def_property_readonly("window_bytes", [](const py_consumer& c) { return c.h->core().window_bytes; },
                             "This consumer's window, bytes.")
      .def_property_readonly("_waiting", [](py_consumer& c) { return c.h->waiting(); },
                             "Python threads blocked in this Consumer now (for tests).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_consumer& c, py::handle, py::handle, py::handle) {
        c.h->close();
        return false;
      });
}

}  // namespace blobpipe::python
