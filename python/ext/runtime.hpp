// python/ext/runtime.hpp — the background thread of the streaming classes,
// waiting without the GIL, and what a fork leaves behind.
//
// Every Sender, Consumer and Listener runs Asio on a thread of its own: an
// io_runtime, one io_context run by one std::thread (a Listener's thread
// also runs the Consumers it accepts). Python threads never run the
// io_context, and the io thread never touches a Python object nor takes
// the GIL: the two sides meet in mutex-guarded queues (stream.hpp), so no
// call into C++ holds the GIL while it waits, and the io thread cannot
// deadlock on it.
//
//   auto rt = io_runtime::start();                    // the thread runs
//   asio::co_spawn(rt->executor(), work(), detached);
//   wait_interruptibly(mu, cv, [&] { return done; });   // GIL released
//
// Fork: a child has none of the parent's threads, and a mutex one of them
// held at the fork stays locked there forever. fork_generation() changes in
// every child (pthread_atfork), so an object made before the fork knows it
// is in a child: its methods raise ForkedError, and what it owns is never
// destroyed there (leak_in_child), since destroying it could wait for a
// thread that is gone or on a lock that will never be released.
//
// REQUIRES: the GIL for every function here, except where noted.
#pragma once

#include <pybind11/pybind11.h>

#include <asio/any_io_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace blobpipe::python {

/// Changes in every child process right after fork(); read without the GIL.
std::uint64_t fork_generation() noexcept;

/// Raises ForkedError naming `what` ("Sender") when `generation` (the
/// fork_generation() its object was made in) is not this process's.
void check_not_forked(std::uint64_t generation, const char* what);

/// Keeps `p` from ever being destroyed (a forked child's copy of a parent's
/// object; see the file comment). No GIL needed.
void leak_in_child(std::shared_ptr<const void> p) noexcept;

/// One io_context and the thread that runs it.
///
/// Two kinds of owner: users (a Sender, Consumer or Listener that is open)
/// need the thread; the last user's release_user() stops it. Holders of a
/// shared_ptr (those users, and every received entry: its window credit is
/// posted to this io_context when it is dropped) need only the io_context,
/// which lives until the last of them goes.
///
/// Stopping lets the io_context run out of work first (its closed
/// connections finish their coroutines), for up to the stop grace: the
/// pipeline's objects must be destroyed on the io thread or after the
/// thread ended, never inside the io_context's destructor, where its
/// services are half torn down. Only work still pending after the grace
/// (a bug, or UCX lingering) is cut off.
class io_runtime {
  struct private_tag {};

 public:
  /// Use start().
  explicit io_runtime(private_tag);

  /// Starts the thread, with one user (the caller). Throws
  /// std::system_error when it cannot.
  static std::shared_ptr<io_runtime> start();

  /// Adds a user. False when the thread has stopped already (no user left).
  bool add_user();
  /// Removes a user; the last one waits for the io_context to run out of
  /// work (at most the stop grace), stops it and joins the thread.
  /// REQUIRES: one call per add_user() or start(); not on the io thread;
  /// not holding the GIL (see release_user_nogil).
  void release_user();

  /// Stops the thread if a user forgot to, then destroys the io_context and
  /// the handlers it still holds. REQUIRES: not called on the io thread
  /// (no handler owns its runtime), not in a forked child (owners leak
  /// their runtime there). No GIL needed (the io thread never takes it).
  ~io_runtime();

  io_runtime(const io_runtime&) = delete;
  io_runtime& operator=(const io_runtime&) = delete;

  asio::any_io_executor executor() { return ctx_.get_executor(); }

  /// Drops `p` on the io thread: received entries go there, so that their
  /// window credit returns without a post each (the consumer posts from
  /// any other thread) and their memory is freed by the thread that
  /// allocated it. One post per batch. Once the thread has stopped, `p` is
  /// dropped here. Thread-safe; no GIL needed.
  void retire(std::shared_ptr<const void> p) noexcept;

  /// Raises the stop grace (default default_stop_grace) to `grace`. UCX
  /// needs more: a closing listener stays bound until 2 s pass without
  /// connection requests (blobpipe/transport/ucx.hpp). Thread-safe.
  void set_stop_grace(std::chrono::milliseconds grace);

  /// How long stopping waits for the io_context to run out of work.
  static constexpr std::chrono::milliseconds default_stop_grace{5000};
  /// The fork generation this runtime's thread belongs to.
  std::uint64_t generation() const noexcept { return generation_; }

 private:
  asio::io_context ctx_{1};  // one thread runs it; others only post to it
  void stop() noexcept;
  void bury() noexcept;

  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  std::uint64_t generation_;
  std::mutex mu_;
  std::condition_variable ran_out_cv_;
  int users_ = 1;
  bool ran_out_ = false;  // run() returned: no work left
  std::chrono::milliseconds grace_ = default_stop_grace;
  // retire(): what waits to be dropped on the io thread.
  std::mutex grave_mu_;
  std::vector<std::shared_ptr<const void>> grave_;
  bool grave_posted_ = false;
  bool stopped_ = false;  // under grave_mu_
};

/// rt->release_user() with the GIL released, so that other Python threads
/// run while the thread winds down. REQUIRES: the GIL.
void release_user_nogil(io_runtime& rt);

/// How long a waiting Python thread sleeps before it takes the GIL back
/// to run signal handlers (Ctrl-C), at most.
inline constexpr std::chrono::milliseconds signal_slice{50};

/// Called without the GIL by a thread about to take it back. Once the
/// interpreter is finalizing, a thread that takes the GIL is ended with
/// pthread_exit, whose forced unwind through a noexcept destructor
/// (pybind11's gil_scoped_release) aborts the process ("terminate called
/// without an active exception"), and through any other frame of ours
/// would drop Python objects without the GIL. So a daemon thread coming
/// back from a wait or a copy in blobpipe once the interpreter exits (in
/// accept(), an iteration, a blocked or busy emit, finish, flush) sleeps
/// here instead, until the process ends. The thread that finalizes (it
/// runs the atexit hook, init_runtime) never parks.
void park_if_finalizing() noexcept;

/// Releases the GIL for its lifetime, as pybind11's gil_scoped_release,
/// but takes it back through park_if_finalizing and a gate the exit hook
/// waits on: a thread is never inside PyEval_RestoreThread when
/// finalization starts, so Python never ends it there (see
/// park_if_finalizing). Use it for every wait and long copy without the
/// GIL. REQUIRES: the GIL.
class gil_released {
 public:
  gil_released();
  ~gil_released();
  gil_released(const gil_released&) = delete;
  gil_released& operator=(const gil_released&) = delete;

 private:
  PyThreadState* state_;
};

/// Marks, on a Python thread holding the GIL, a call into code that may
/// release the GIL and take it back on its own: torch's tensor methods do
/// it in pybind11's gil_scoped_release, whose destructor is noexcept, so a
/// thread that finalization ends there (pthread_exit's forced unwind)
/// aborts the process; numpy's copies and pickling's Python code release
/// it too. Every encode and decode of a value runs inside one. The exit
/// hook waits (without the GIL, at most exit_call_grace) until no thread
/// is inside one, and a thread that would enter one after the hook ran
/// parks instead (releasing the GIL), so no thread is in such code when
/// the interpreter finalizes. A thread that parks inside one (a wait
/// through gil_released) leaves it as it parks. Two atomic operations; a
/// nested one costs nothing. REQUIRES: the GIL; every wait inside goes
/// through gil_released (an uninterruptible one would hold the exit up for
/// exit_call_grace).
class python_call {
 public:
  python_call();
  ~python_call();
  python_call(const python_call&) = delete;
  python_call& operator=(const python_call&) = delete;
};

/// How long the exit hook waits for threads inside a python_call (a long
/// pickle); past it the interpreter finalizes anyway and the hook says so
/// on stderr.
inline constexpr std::chrono::seconds exit_call_grace{10};

/// Waits until `done()` holds, with the GIL released. `done` is called
/// with `mu` locked. Every signal_slice the GIL is taken back (with `mu`
/// unlocked) and PyErr_CheckSignals runs: a handler that raises
/// (KeyboardInterrupt) ends the wait by throwing error_already_set.
/// With `deadline`, returns false when it passes first; true otherwise.
/// The notifier must notify `cv` under `mu` (or after changing the state
/// under it). REQUIRES: the GIL, `mu` not held.
template <class Done>
bool wait_interruptibly(std::mutex& mu, std::condition_variable& cv, Done done,
                        std::optional<std::chrono::steady_clock::time_point> deadline = {}) {
  for (;;) {
    bool ok = false, expired = false;
    {
      gil_released nogil;
      {
        std::unique_lock lk(mu);
        auto until = std::chrono::steady_clock::now() + signal_slice;
        if (deadline && *deadline < until) until = *deadline;
        ok = cv.wait_until(lk, until, done);
        expired = !ok && deadline && std::chrono::steady_clock::now() >= *deadline;
      }  // `mu` is released before the GIL is taken back: never hold both waiting
    }
    if (ok) return true;
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    if (expired) return false;
  }
}

/// wait_interruptibly, with the caller counted in `waiting` (guarded by
/// `mu`) while it waits, so that notifiers may skip notify_all when nobody
/// waits. REQUIRES: as wait_interruptibly.
template <class Done>
bool wait_counted(std::mutex& mu, std::condition_variable& cv, int& waiting, Done done,
                  std::optional<std::chrono::steady_clock::time_point> deadline = {}) {
  {
    std::lock_guard lk(mu);
    ++waiting;
  }
  struct unwait {
    std::mutex& mu;
    int& waiting;
    ~unwait() {
      std::lock_guard lk(mu);
      --waiting;
    }
  } guard{mu, waiting};
  return wait_interruptibly(mu, cv, done, deadline);
}

/// As wait_counted, uninterruptibly and without a deadline: a close()
/// waiting for the io thread to finish what it must. REQUIRES: the GIL
/// released, `mu` not held.
template <class Done>
void wait_counted_nogil(std::mutex& mu, std::condition_variable& cv, int& waiting, Done done) {
  std::unique_lock lk(mu);
  ++waiting;
  cv.wait(lk, done);
  --waiting;
}

/// Seconds (a Python float or int, or None) as a deadline from now; None
/// gives none. Raises ValueError for a negative or non-finite value.
std::optional<std::chrono::steady_clock::time_point> deadline_after(pybind11::handle seconds);

/// Seconds as milliseconds for a C++ timeout option (None or 0: none).
/// Raises ValueError for a negative or non-finite value.
std::chrono::milliseconds timeout_ms(pybind11::handle seconds, const char* name);

/// Registers the fork handler and the exit hook (atexit: from then on
/// threads coming back to Python from blobpipe park, and the hook waits,
/// without the GIL, until none is on its way back). Called once by the
/// module's init. REQUIRES: the GIL.
void init_runtime();

}  // namespace blobpipe::python
