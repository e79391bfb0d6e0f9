// python/ext/stream.hpp — what the streaming classes share.
//
// sender.cpp (Sender, Blob), consumer.cpp (Consumer and its events),
// connect.cpp (connect, listen, Listener, the in-process pair) and
// stream_bench.cpp. Each C++ object of the pipeline lives on an
// io_runtime's thread (runtime.hpp); Python threads reach it through the
// structures here, which never need the GIL on the io thread.
#pragma once

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/pipeline/consumer.hpp"
#include "blobpipe/pipeline/producer.hpp"
#include "runtime.hpp"

namespace blobpipe::python {

namespace py = pybind11;

/// The outcome of one operation run on an io thread, waited for by a
/// Python thread.
class completion {
 public:
  /// Any thread, no GIL. The first call wins: false for a later one.
  bool set(std::error_code ec, std::string message = {});
  /// Waits (wait_interruptibly) until set; false when `deadline` passed
  /// first. REQUIRES: the GIL.
  bool wait(std::optional<std::chrono::steady_clock::time_point> deadline = {});
  /// Waits until set, uninterruptibly. REQUIRES: not holding the GIL.
  void wait_nogil();
  /// After wait(): raises the error, if any, as its StreamError subclass
  /// with the message, prefixed by `what` ("connect to tcp://...: ").
  void raise_if_failed(const std::string& what = {}) const;
  std::error_code code() const;
  /// The message set with the error (empty when none was given).
  std::string message() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::error_code ec_;
  std::string message_;
};

/// Raises the blobpipe exception for `ec` (StreamError subclasses for the
/// transport codes): `message`, or the code's own text when empty.
[[noreturn]] void raise_code(std::error_code ec, const std::string& message);

/// An owned reference to a Python object that a command carries through
/// the io thread untouched: released (to be dropped later with the GIL) or
/// dropped on a Python thread. REQUIRES: the GIL when a non-empty one is
/// destroyed.
class py_ref {
 public:
  py_ref() = default;
  explicit py_ref(pybind11::object o) noexcept : p_(o.release().ptr()) {}
  py_ref(py_ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  py_ref& operator=(py_ref&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~py_ref() { Py_XDECREF(p_); }
  /// Gives up the reference (the caller drops it later, with the GIL).
  PyObject* release() noexcept { return std::exchange(p_, nullptr); }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  PyObject* p_ = nullptr;
};

/// Sender options from keyword arguments (connect(), loopback_pair()):
/// chunk_bytes, inline_bytes, max_queued_bytes, queue_bytes, stall_timeout,
/// resend, unacked_bytes, max_attempts, retry_delay, max_retry_delay.
/// Raises TypeError (an unknown name), ValueError (a value out of range).
struct sender_settings {
  sender_options opt;
  bool resend = false;
  /// Bytes handed to the background thread and not yet sent beyond which
  /// emit() waits, 1 to max_queue_bytes; 0: the consumer's window, at most
  /// max_queue_bytes (sender.cpp).
  std::uint64_t queue_bytes = 0;
};

/// The most a Sender queues for its background thread, bytes, whatever
/// connect() is given or the consumer grants: copies of small entries
/// pile up there against a consumer that grants much and reads nothing.
inline constexpr std::uint64_t max_queue_bytes = 64ull << 20;
sender_settings sender_settings_from(const pybind11::dict& kw);

/// Consumer options from keyword arguments (listen(), loopback_pair()):
/// the consumer_options fields by name (window_bytes, max_chunk_bytes,
/// inline_bytes, max_key_bytes, max_meta_bytes, max_entry_bytes,
/// max_tail_bytes, max_blob_bytes, max_open_blobs, max_entries_per_blob,
/// payload_window, recycle_bytes, held_bytes; stall_timeout, idle_timeout
/// and held_timeout in seconds) and allow_pickle; waits_reported is always
/// set (consumer.cpp reports the iteration's waits). Raises TypeError,
/// ValueError.
struct consumer_settings {
  consumer_options opt;
  bool allow_pickle = true;
};
consumer_settings consumer_settings_from(const pybind11::dict& kw);

// ---- sender.cpp ----

/// What a Sender shares with its io thread (opaque outside sender.cpp).
struct sender_core;
std::shared_ptr<sender_core> new_sender_core(asio::any_io_executor ex);

/// Runs sender::start on the core's thread: over `t`; else (t null) over
/// what `connect` gives, or as a resend session over `connect` when
/// `resend`. `done` is set when the handshake ends. Thread-safe.
void launch_sender(std::shared_ptr<sender_core> core, std::unique_ptr<transport> t,
                   connect_fn connect, bool resend, sender_options opt,
                   std::shared_ptr<completion> done);

/// Ends a launch_sender's connect and handshake now, if still running:
/// its `done` is set with `closed` ("interrupted"). Thread-safe, no GIL.
void cancel_launch(const std::shared_ptr<sender_core>& core);

/// The Sender object for a started core. Takes over one user of `rt`.
/// REQUIRES: the GIL; `done` of launch_sender set without error.
pybind11::object make_sender(std::shared_ptr<io_runtime> rt, std::shared_ptr<sender_core> core,
                             const sender_settings& settings);

// ---- consumer.cpp ----

/// What a Consumer shares with its io thread (opaque outside consumer.cpp).
struct consumer_core;
std::shared_ptr<consumer_core> new_consumer_core(asio::any_io_executor ex);

/// Runs consumer::start on the core's thread over `t`, then the loop that
/// queues its events; `done` is set when the handshake ends. Thread-safe.
void launch_consumer(std::shared_ptr<consumer_core> core, std::unique_ptr<transport> t,
                     consumer_options opt, std::shared_ptr<completion> done);

/// As launch_consumer, run inside a coroutine already on the core's thread
/// (Listener.accept); returns the handshake's error and message.
asio::awaitable<std::pair<std::error_code, std::string>> start_consumer(
    std::shared_ptr<consumer_core> core, std::unique_ptr<transport> t, consumer_options opt);

/// Closes the core's C++ consumer (a started one that no Consumer object
/// took). REQUIRES: on the core's thread.
void close_consumer_core(consumer_core& core) noexcept;

/// The Consumer object for a started core. Takes over one user of `rt`.
/// REQUIRES: the GIL; the handshake succeeded.
pybind11::object make_consumer(std::shared_ptr<io_runtime> rt,
                               std::shared_ptr<consumer_core> core,
                               const consumer_settings& settings);

/// Whether this call is the one to close an object (Sender.close,
/// Consumer.close): true for the first, which marks `started`. A later
/// call returns false, after waiting (GIL released) until the first one
/// has set `done` and notified `cv`, so that no close() returns before the
/// object is closed. REQUIRES: the GIL; `lk` locks the mutex that guards
/// `started` and `done` (on false it may have been released).
inline bool claim_close(std::unique_lock<std::mutex>& lk, std::condition_variable& cv,
                        bool& started, const bool& done) {
  if (!started) {
    started = true;
    return true;
  }
  if (done) return false;
  std::mutex& mu = *lk.mutex();
  lk.unlock();
  gil_released nogil;  // another thread is closing: wait for it
  std::unique_lock l(mu);
  cv.wait(l, [&] { return done; });
  return false;
}

/// Ends the close that claim_close gave this caller: releases the
/// object's user of `rt` (its thread stops when that was the last) and
/// sets `done`, waking the close() calls waiting in claim_close.
/// REQUIRES: the GIL released; `mu` guards `done` and is not held.
inline void end_close(io_runtime& rt, std::mutex& mu, std::condition_variable& cv, bool& done) {
  rt.release_user();
  std::lock_guard lk(mu);
  done = true;
  cv.notify_all();
}

/// Releases one user of `rt` when it goes, unless dismissed: the factories'
/// guard while a handshake may still fail or be interrupted. REQUIRES: the
/// GIL.
class user_guard {
 public:
  explicit user_guard(std::shared_ptr<io_runtime> rt) : rt_(std::move(rt)) {}
  user_guard(const user_guard&) = delete;
  user_guard& operator=(const user_guard&) = delete;
  ~user_guard() {
    if (rt_) release_user_nogil(*rt_);
  }
  void dismiss() noexcept { rt_.reset(); }

 private:
  std::shared_ptr<io_runtime> rt_;
};

void init_sender(pybind11::module_& m);
void init_consumer(pybind11::module_& m);
void init_connect(pybind11::module_& m);
void init_stream_bench(pybind11::module_& m);

}  // namespace blobpipe::python
