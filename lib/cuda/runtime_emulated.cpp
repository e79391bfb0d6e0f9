// The emulated CUDA runtime (lib/cuda/testing.hpp): a test double that
// keeps CUDA's ordering rules. A stream is a worker thread running its
// queue in order; a host function runs on that thread after the work
// queued before it; after a failed copy the stream runs nothing more and
// reports the error. "Device" memory is host memory recorded in a table,
// so cudaPointerGetAttributes can tell it apart.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lib/cuda/runtime.hpp"
#include "lib/cuda/testing.hpp"

namespace blobpipe::cuda::detail {
namespace {

constexpr const char* injected_error =
    "cudaMemcpyAsync: an illegal memory access was encountered (emulated "
    "cudaErrorIllegalAddress)";

std::atomic<long> copies_until_failure{-1};

/// True when this copy is the one fail_copy_after() picked.
bool take_failure() noexcept {
  long n = copies_until_failure.load();
  while (n >= 0) {
    if (copies_until_failure.compare_exchange_weak(n, n == 0 ? -1 : n - 1)) return n == 0;
  }
  return false;
}

class emulated_stream {
 public:
  emulated_stream() : worker_([this] { run(); }) {}
  emulated_stream(const emulated_stream&) = delete;
  emulated_stream& operator=(const emulated_stream&) = delete;
  // As cudaStreamDestroy: work already queued still runs.
  ~emulated_stream() {
    {
      std::lock_guard l(m_);
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }

  /// `op` returns an error message, or "" on success.
  void enqueue(std::function<std::string()> op) {
    {
      std::lock_guard l(m_);
      ops_.push_back(std::move(op));
    }
    work_cv_.notify_all();
  }

  result<bool> query() {
    std::lock_guard l(m_);
    if (!error_.empty()) return {errc::cuda_failure, error_};
    return ops_.empty() && !busy_;
  }

  result<void> synchronize() {
    std::unique_lock l(m_);
    idle_cv_.wait(l, [&] { return ops_.empty() && !busy_; });
    if (!error_.empty()) return {errc::cuda_failure, error_};
    return {};
  }

 private:
  void run() {
    std::unique_lock l(m_);
    for (;;) {
      work_cv_.wait(l, [&] { return stop_ || !ops_.empty(); });
      if (ops_.empty()) return;  // stop_, and nothing left to run
      auto op = std::move(ops_.front());
      ops_.pop_front();
      busy_ = true;
      const bool failed = !error_.empty();
      l.unlock();
      std::string err = failed ? std::string() : op();
      l.lock();
      busy_ = false;
      if (!err.empty() && error_.empty()) error_ = std::move(err);
      if (ops_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<std::string()>> ops_;
  bool busy_ = false;
  bool stop_ = false;
  std::string error_;  // set once: the stream is then broken
  std::thread worker_;  // last: starts after the members it uses exist
};

class emulated_runtime_impl final : public runtime {
 public:
  const char* name() const noexcept override { return "emulated"; }
  std::string version() const override { return "emulated CUDA (host memory, worker threads)"; }
  result<int> device_count() override { return 1; }
  result<std::string> device_name(int device) override {
    if (device != 0) return {errc::invalid_argument, "CUDA device " + std::to_string(device) + " of 1"};
    return std::string("emulated device (host memory)");
  }
  result<int> get_device() override { return current_; }
  result<void> set_device(int device) override {
    if (device != 0)
      return {errc::cuda_failure, "cudaSetDevice: invalid device ordinal (emulated)"};
    current_ = device;
    return {};
  }

  result<pointer_info> pointer_attributes(const void* p) override {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard l(m_);
    pointer_info out;
    if (inside(device_, a)) {
      out.kind = pointer_info::type::device;
      out.device = 0;
    } else if (inside(pinned_, a)) {
      out.kind = pointer_info::type::host;
    }
    return out;
  }

  result<void*> malloc_device(std::size_t n) override { return allocate(device_, n); }
  void free_device(void* p) noexcept override { release(device_, p); }
  result<void*> malloc_host(std::size_t n) override { return allocate(pinned_, n); }
  void free_host(void* p) noexcept override { release(pinned_, p); }

  result<void*> stream_create() override {
    auto s = std::make_unique<emulated_stream>();
    return static_cast<void*>(s.release());  // owned by the caller's stream handle
  }
  void stream_destroy(void* s) noexcept override {
    std::unique_ptr<emulated_stream>(static_cast<emulated_stream*>(s));
  }

  result<void> memcpy_async(void* dst, const void* src, std::size_t n, void* s) override {
    const bool fail = take_failure();
    static_cast<emulated_stream*>(s)->enqueue([dst, src, n, fail]() -> std::string {
      if (fail) return injected_error;
      std::memcpy(dst, src, n);
      return {};
    });
    return {};
  }

  result<void> launch_host_func(void* s, host_fn fn, void* user) override {
    static_cast<emulated_stream*>(s)->enqueue([fn, user]() -> std::string {
      fn(user);
      return {};
    });
    return {};
  }

  result<bool> stream_query(void* s) override { return static_cast<emulated_stream*>(s)->query(); }
  result<void> stream_synchronize(void* s) override {
    return static_cast<emulated_stream*>(s)->synchronize();
  }
  result<void> memcpy_sync(void* dst, const void* src, std::size_t n) override {
    std::memcpy(dst, src, n);
    return {};
  }
  result<void> device_synchronize() override { return {}; }

  std::size_t live_device() {
    std::lock_guard l(m_);
    return device_.size();
  }

 private:
  using table = std::map<std::uintptr_t, std::size_t>;  // start -> bytes

  static bool inside(const table& t, std::uintptr_t a) {
    auto it = t.upper_bound(a);
    if (it == t.begin()) return false;
    --it;
    return a < it->first + it->second;
  }

  result<void*> allocate(table& t, std::size_t n) {
    const std::size_t size = (n + 255) / 256 * 256;  // cudaMalloc aligns to 256
    void* p = std::aligned_alloc(256, size == 0 ? 256 : size);
    if (p == nullptr) return {errc::cuda_failure, "cudaMalloc: out of memory (emulated)"};
    std::lock_guard l(m_);
    t[reinterpret_cast<std::uintptr_t>(p)] = size == 0 ? 256 : size;
    return p;
  }

  void release(table& t, void* p) noexcept {
    if (p == nullptr) return;
    {
      std::lock_guard l(m_);
      t.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    std::free(p);
  }

  std::mutex m_;
  table device_;
  table pinned_;
  static thread_local int current_;
};

thread_local int emulated_runtime_impl::current_ = 0;

emulated_runtime_impl& the_emulator() noexcept {
  static emulated_runtime_impl r;
  return r;
}

}  // namespace

runtime& emulated_runtime() noexcept { return the_emulator(); }

}  // namespace blobpipe::cuda::detail

namespace blobpipe::cuda::testing {

void use_emulated_runtime(bool on) noexcept {
  detail::set_active(on ? detail::emulated_runtime() : detail::cuda_runtime());
}

bool using_emulated_runtime() noexcept {
  return &detail::active() == &detail::emulated_runtime();
}

void fail_copy_after(long n) noexcept { detail::copies_until_failure.store(n < 0 ? -1 : n); }

std::size_t live_device_allocations() noexcept { return detail::the_emulator().live_device(); }

}  // namespace blobpipe::cuda::testing
