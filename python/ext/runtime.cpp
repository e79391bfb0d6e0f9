#include "runtime.hpp"

#include <pthread.h>
#include <unistd.h>

#include <asio/post.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdio>
#include <utility>

#include "state.hpp"

namespace blobpipe::python {
namespace {

std::atomic<std::uint64_t> generation{0};

// Exit (park_if_finalizing): set by the atexit hook, before the
// interpreter finalizes. `returning` counts threads between the check and
// holding the GIL again; the hook waits for it to be zero.
std::mutex exit_mu;
std::condition_variable exit_cv;
bool exiting = false;                 // under exit_mu
int returning = 0;                    // under exit_mu
std::thread::id finalizer;            // the thread that ran the hook
std::atomic<bool> exiting_flag{false};
// Threads inside a python_call (outermost only). With exiting_flag, a
// Dekker pair (both sequentially consistent): a thread entering either
// sees the flag and parks, or is counted before the hook looks.
std::atomic<int> in_calls{0};
thread_local int call_depth = 0;

[[noreturn]] void park_forever() noexcept;

bool must_park() noexcept {
  return (exiting_flag.load(std::memory_order_acquire) || _Py_IsFinalizing()) &&
         std::this_thread::get_id() != finalizer;
}

void on_exit_hook() {
  {
    std::lock_guard lk(exit_mu);
    exiting = true;
    finalizer = std::this_thread::get_id();
    exiting_flag.store(true);  // sequentially consistent: see in_calls
  }
  // Threads on their way back to the GIL get it (the interpreter is not
  // finalizing yet) and run on; any later return parks.
  py::gil_scoped_release nogil;
  std::unique_lock lk(exit_mu);
  const bool calls_done = exit_cv.wait_for(
      lk, exit_call_grace, [] { return in_calls.load() == 0 && returning == 0; });
  if (!calls_done) {
    std::fprintf(stderr,
                 "blobpipe: at exit, a thread was still encoding or decoding a value after %lld s "
                 "(a long pickle?); the interpreter finalizes without waiting for it\n",
                 static_cast<long long>(exit_call_grace.count()));
    exit_cv.wait(lk, [] { return returning == 0; });
  }
}

// Runs in the child right after fork(), before anything else there: only
// an atomic add (async-signal-safe).
void on_fork_child() noexcept { generation.fetch_add(1, std::memory_order_relaxed); }

double seconds_of(py::handle seconds, const char* name) {
  // A number (int, float, or anything with __float__ but str and bytes,
  // which float() would parse, and bool, which is no number of seconds):
  // else the caller passed the wrong thing.
  if (PyUnicode_Check(seconds.ptr()) || PyBytes_Check(seconds.ptr()) ||
      PyBool_Check(seconds.ptr()) ||
      !(PyFloat_Check(seconds.ptr()) || PyLong_Check(seconds.ptr()) ||
        PyObject_HasAttrString(seconds.ptr(), "__float__")))
    throw py::type_error(std::string(name) + " must be a number of seconds (int or float) or None, not " +
                         std::string(py::str(py::type::handle_of(seconds).attr("__name__"))));
  const double s = py::cast<double>(py::float_(py::reinterpret_borrow<py::object>(seconds)));
  if (!std::isfinite(s) || s < 0)
    throw py::value_error(std::string(name) + " must be a finite number of seconds >= 0, not " +
                          std::string(py::repr(seconds)));
  return s;
}

}  // namespace

std::uint64_t fork_generation() noexcept { return generation.load(std::memory_order_relaxed); }

void check_not_forked(std::uint64_t gen, const char* what) {
  if (gen == fork_generation()) return;
  const std::string msg = std::string("this ") + what +
                          " was made before os.fork() and its background thread did not "
                          "survive into the child (pid " +
                          std::to_string(::getpid()) + "): make a new one in the child";
  py::object exc = state().forked_error(msg);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void leak_in_child(std::shared_ptr<const void> p) noexcept {
  if (!p) return;
  // Deliberately never freed: see the file comment in runtime.hpp. One
  // small allocation per object a child drops (out of memory here ends the
  // process, as any failed allocation in a noexcept path does).
  (void)std::make_unique<std::shared_ptr<const void>>(std::move(p)).release();
}

void park_if_finalizing() noexcept {
  if (must_park()) park_forever();
}

gil_released::gil_released() : state_(PyEval_SaveThread()) {}

gil_released::~gil_released() {
  {
    std::lock_guard lk(exit_mu);
    if (!(exiting || _Py_IsFinalizing()) || std::this_thread::get_id() == finalizer) {
      ++returning;
    } else {
      state_ = nullptr;
    }
  }
  if (state_ == nullptr) park_forever();
  PyEval_RestoreThread(state_);
  std::lock_guard lk(exit_mu);
  if (--returning == 0 && exiting) exit_cv.notify_all();
}

namespace {

// A parked thread never leaves its python_call: it leaves the count here,
// so that the exit hook does not wait for it.
[[noreturn]] void park_forever() noexcept {
  if (call_depth > 0) {
    call_depth = 0;
    in_calls.fetch_sub(1);
    std::lock_guard lk(exit_mu);
    exit_cv.notify_all();
  }
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

python_call::python_call() {
  if (call_depth++ > 0) return;
  in_calls.fetch_add(1);
  if (!exiting_flag.load() || std::this_thread::get_id() == finalizer) return;
  // After the exit hook: park, the GIL released for the finalizing thread.
  PyEval_SaveThread();
  park_forever();
}

python_call::~python_call() {
  if (--call_depth > 0) return;
  if (in_calls.fetch_sub(1) == 1 && exiting_flag.load()) {
    std::lock_guard lk(exit_mu);  // the hook checks under it: no lost wake-up
    exit_cv.notify_all();
  }
}

io_runtime::io_runtime(private_tag)
    : work_(asio::make_work_guard(ctx_)), generation_(fork_generation()) {}

std::shared_ptr<io_runtime> io_runtime::start() {
  auto rt = std::make_shared<io_runtime>(private_tag{});
  rt->thread_ = std::thread([r = rt.get()] {
    // Named for top, perf and debuggers (at most 15 characters).
    ::pthread_setname_np(::pthread_self(), "blobpipe-io");
    // Coroutines report their own failures (stream.hpp); an exception
    // escaping a handler is a bug, but must not take the process down
    // with std::terminate while the application still runs.
    for (;;) {
      try {
        r->ctx_.run();
        break;
      } catch (...) {
      }
    }
    std::lock_guard lk(r->mu_);
    r->ran_out_ = true;
    r->ran_out_cv_.notify_all();
  });
  return rt;
}

bool io_runtime::add_user() {
  std::lock_guard lk(mu_);
  if (users_ == 0) return false;
  ++users_;
  return true;
}

void io_runtime::release_user() {
  {
    std::lock_guard lk(mu_);
    if (users_ == 0 || --users_ > 0) return;
  }
  stop();
}

void io_runtime::retire(std::shared_ptr<const void> p) noexcept {
  std::unique_lock lk(grave_mu_);
  if (stopped_) {
    lk.unlock();
    p.reset();
    return;
  }
  try {
    grave_.push_back(std::move(p));
    if (grave_posted_) return;
    asio::post(ctx_, [this] { bury(); });
    grave_posted_ = true;
  } catch (...) {  // out of memory: drop it here after all
    lk.unlock();
    p.reset();
  }
}

void io_runtime::bury() noexcept {
  std::vector<std::shared_ptr<const void>> dead;
  {
    std::lock_guard lk(grave_mu_);
    dead.swap(grave_);
    grave_posted_ = false;
  }
}

void io_runtime::set_stop_grace(std::chrono::milliseconds grace) {
  std::lock_guard lk(mu_);
  grace_ = std::max(grace_, grace);
}

void io_runtime::stop() noexcept {
  work_.reset();
  {
    std::unique_lock lk(mu_);
    ran_out_cv_.wait_for(lk, grace_, [&] { return ran_out_; });
  }
  ctx_.stop();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::vector<std::shared_ptr<const void>> dead;
  {
    std::lock_guard lk(grave_mu_);
    stopped_ = true;
    dead.swap(grave_);
  }
}

io_runtime::~io_runtime() { stop(); }

void release_user_nogil(io_runtime& rt) {
  gil_released nogil;
  rt.release_user();
}

std::optional<std::chrono::steady_clock::time_point> deadline_after(py::handle seconds) {
  if (seconds.is_none()) return std::nullopt;
  const double s = seconds_of(seconds, "timeout");
  const auto d = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(s, 1e9)));
  return std::chrono::steady_clock::now() + d;
}

std::chrono::milliseconds timeout_ms(py::handle seconds, const char* name) {
  if (seconds.is_none()) return std::chrono::milliseconds{0};
  const double s = seconds_of(seconds, name);
  // Up to a year, as the C++ examples bound their timeouts; a positive
  // value below a millisecond is one millisecond, not "no timeout".
  const double ms = std::ceil(std::min(s, 365.0 * 24 * 3600) * 1e3);
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

void init_runtime() {
  static std::once_flag once;
  std::call_once(once, [] { ::pthread_atfork(nullptr, nullptr, &on_fork_child); });
  py::module_::import("atexit").attr("register")(py::cpp_function(&on_exit_hook));
}

}  // namespace blobpipe::python
