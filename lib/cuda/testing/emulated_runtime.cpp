// The emulated CUDA runtime (lib/cuda/testing.hpp; test-only, //lib/cuda:emulator):
// a test double that keeps CUDA's rules.
//
// - Streams: each is a worker thread running its queue in order; a host
//   function runs on that thread after the work queued before it; after a
//   failed copy the stream runs nothing more and reports the error.
// - The legacy default stream: one more such stream. A stream made by
//   stream_create() is a blocking stream (cudaStreamCreate): its work waits
//   for the work queued on the legacy stream before it, and work queued on
//   the legacy stream (an emulated kernel, cudaMemcpy) waits for the work
//   queued on every blocking stream before it. memcpy_sync is cudaMemcpy
//   on the legacy stream, then cudaDeviceSynchronize.
// - Device memory cannot be read or written by the host: a device pointer
//   is an address range reserved with no access (PROT_NONE), so host code
//   that touches one faults here as it would on a GPU machine. Only the
//   emulator's copies (and emulated kernels, through kernel_view) reach the
//   bytes, which live in a separate host block.
// - Pinned host memory freed while a queued copy still reads or writes it
//   (CUDA does not promise that copy has finished) is counted as a use
//   after free (pinned_frees_under_copies) and freed only after that copy.
// - Copies can be held at a gate (hold_copies) and let through one at a
//   time, so a test decides when each copy runs and can count the copies
//   in flight at a given moment without any timing.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

/// hold_copies(): while holding, a copy starts only once fewer copies have
/// started than the test allowed.
struct copy_gate {
  std::mutex m;
  std::condition_variable cv;
  bool holding = false;
  std::uint64_t started = 0;
  std::uint64_t allowed = 0;

  void enter() {
    std::unique_lock l(m);
    cv.wait(l, [&] { return !holding || started < allowed; });
    ++started;
  }
  void hold(bool on) {
    {
      std::lock_guard l(m);
      holding = on;
      allowed = started;
    }
    cv.notify_all();
  }
  void release(std::size_t n) {
    {
      std::lock_guard l(m);
      allowed += n;
    }
    cv.notify_all();
  }
};

copy_gate gate;
std::atomic<std::size_t> copies_pending{0};  // memcpy_async issued, not finished

// ---- streams ------------------------------------------------------------

// Every emulated stream shares one lock and one condition: an operation may
// wait for operations of other streams (the legacy default stream's
// implicit synchronisation), and a count moving on any stream wakes them.
std::mutex streams_m;
std::condition_variable streams_cv;

struct stream_state;

/// "Operation `n` of `s` is done" (or `s` is gone: destroying a stream lets
/// its queued work finish first, as cudaStreamDestroy does).
struct dependency {
  std::weak_ptr<stream_state> s;
  std::uint64_t n = 0;
};

struct operation {
  std::function<std::string()> run;  // returns an error message, or ""
  std::vector<dependency> after;
};

struct stream_state {
  std::deque<operation> ops;
  std::uint64_t enqueued = 0;  // operations ever queued
  std::uint64_t done = 0;      // operations finished (run or dropped after an error)
  bool stop = false;
  std::string error;  // set once: the stream is then broken

  bool idle() const { return done == enqueued; }
};

bool satisfied(const std::vector<dependency>& after) {
  for (const auto& d : after)
    if (auto s = d.s.lock(); s && s->done < d.n) return false;
  return true;
}

/// A stream: its state and the worker thread running its queue.
class emulated_stream {
 public:
  emulated_stream() : state_(std::make_shared<stream_state>()), worker_([this] { run(); }) {}
  emulated_stream(const emulated_stream&) = delete;
  emulated_stream& operator=(const emulated_stream&) = delete;
  // As cudaStreamDestroy: work already queued still runs.
  ~emulated_stream() {
    {
      std::lock_guard l(streams_m);
      state_->stop = true;
    }
    streams_cv.notify_all();
    worker_.join();
  }

  const std::shared_ptr<stream_state>& state() const { return state_; }

  /// Queues `op` to run after `after`. REQUIRES: streams_m held.
  void enqueue_locked(std::function<std::string()> op, std::vector<dependency> after) {
    state_->ops.push_back({std::move(op), std::move(after)});
    ++state_->enqueued;
    streams_cv.notify_all();
  }

  result<bool> query() {
    std::lock_guard l(streams_m);
    if (!state_->error.empty()) return {errc::cuda_failure, state_->error};
    return state_->idle();
  }

  result<void> synchronize() {
    std::unique_lock l(streams_m);
    streams_cv.wait(l, [&] { return state_->idle(); });
    if (!state_->error.empty()) return {errc::cuda_failure, state_->error};
    return {};
  }

 private:
  void run() {
    std::unique_lock l(streams_m);
    for (;;) {
      streams_cv.wait(l, [&] {
        return (state_->stop && state_->ops.empty()) ||
               (!state_->ops.empty() && satisfied(state_->ops.front().after));
      });
      if (state_->ops.empty()) return;  // stop, and nothing left to run
      auto op = std::move(state_->ops.front());
      state_->ops.pop_front();
      const bool failed = !state_->error.empty();
      l.unlock();
      std::string err = failed ? std::string() : op.run();
      op = {};  // the operation's captures go before it counts as done
      l.lock();
      if (!err.empty() && state_->error.empty()) state_->error = std::move(err);
      ++state_->done;
      streams_cv.notify_all();
    }
  }

  std::shared_ptr<stream_state> state_;
  std::thread worker_;  // last: starts after the state it uses exists
};

// ---- the runtime ----------------------------------------------------------

class emulated_runtime_impl final : public runtime {
 public:
  ~emulated_runtime_impl() override {
    // Device blocks a test leaked: give the address space back.
    for (auto& [addr, b] : device_) {
      ::munmap(reinterpret_cast<void*>(addr), b.reserved);
      std::free(b.bytes);
    }
  }

  const char* name() const noexcept override { return "emulated"; }
  std::string version() const override {
    return "emulated CUDA (device memory the host cannot touch, worker-thread streams)";
  }
  result<int> device_count() override { return 1; }
  result<std::string> device_name(int device) override {
    if (device != 0)
      return {errc::invalid_argument, "CUDA device " + std::to_string(device) + " of 1"};
    return std::string("emulated device");
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
    if (find(device_, a) != device_.end()) {
      out.kind = pointer_info::type::device;
      out.device = 0;
    } else if (find(pinned_, a) != pinned_.end()) {
      out.kind = pointer_info::type::host;
    }
    return out;
  }

  result<void*> malloc_device(std::size_t n) override {
    // cudaMalloc aligns to 256 bytes; a reserved range is page aligned.
    const std::size_t size = n == 0 ? 256 : (n + 255) / 256 * 256;
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t reserved = (size + page - 1) / page * page;
    void* addr = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    if (addr == MAP_FAILED) return {errc::cuda_failure, "cudaMalloc: out of memory (emulated)"};
    auto* bytes = static_cast<std::byte*>(std::aligned_alloc(256, size));
    if (bytes == nullptr) {
      ::munmap(addr, reserved);
      return {errc::cuda_failure, "cudaMalloc: out of memory (emulated)"};
    }
    std::lock_guard l(m_);
    device_[reinterpret_cast<std::uintptr_t>(addr)] = {size, reserved, bytes};
    return addr;
  }
  void free_device(void* p) noexcept override {
    if (p == nullptr) return;
    block b;
    {
      std::lock_guard l(m_);
      auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == device_.end()) return;
      b = it->second;
      device_.erase(it);
    }
    ::munmap(p, b.reserved);
    std::free(b.bytes);
  }
  result<void*> malloc_host(std::size_t n) override {
    const std::size_t size = n == 0 ? 256 : (n + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, size);
    if (p == nullptr) return {errc::cuda_failure, "cudaHostAlloc: out of memory (emulated)"};
    std::lock_guard l(m_);
    pinned_[reinterpret_cast<std::uintptr_t>(p)] = {size, 0, nullptr};
    return p;
  }
  void free_host(void* p) noexcept override {
    if (p == nullptr) return;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    {
      std::lock_guard l(m_);
      pinned_.erase(a);
      if (auto it = copies_using_.find(a); it != copies_using_.end()) {
        // A use after free unless CUDA happens to wait: counted, and freed
        // once the last copy that uses it is gone.
        ++frees_under_copies_;
        freed_under_copies_.insert(a);
        return;
      }
    }
    std::free(p);
  }

  result<void*> stream_create() override {
    auto s = std::make_shared<emulated_stream>();
    std::lock_guard l(streams_m);
    std::erase_if(blocking_, [](const auto& w) { return w.expired(); });
    blocking_.push_back(s->state());
    void* handle = s.get();
    streams_[handle] = std::move(s);
    return handle;
  }
  void stream_destroy(void* s) noexcept override {
    std::shared_ptr<emulated_stream> gone;
    {
      std::lock_guard l(streams_m);
      auto it = streams_.find(s);
      if (it == streams_.end()) return;
      gone = std::move(it->second);
      streams_.erase(it);
    }
    // Joins its worker once its queue is done (outside the lock it needs).
  }

  result<void> memcpy_async(void* dst, const void* src, std::size_t n, void* s) override {
    const bool fail = take_failure();
    // In flight until the operation is gone: run, or dropped by a failed
    // stream (the worker destroys it before it counts it done).
    ++copies_pending;
    std::vector<std::uintptr_t> pinned = mark_pinned_in_use({dst, src});
    std::shared_ptr<void> in_flight(nullptr, [this, pinned](void*) {
      --copies_pending;
      unmark_pinned_in_use(pinned);
    });
    enqueue(s, [this, dst, src, n, fail, in_flight]() -> std::string {
      gate.enter();
      if (fail) return injected_error;
      return copy(dst, src, n, "cudaMemcpyAsync");
    });
    return {};
  }

  result<void> launch_host_func(void* s, host_fn fn, void* user) override {
    enqueue(s, [fn, user]() -> std::string {
      fn(user);
      return {};
    });
    return {};
  }

  result<bool> stream_query(void* s) override { return as_stream(s).query(); }
  result<void> stream_synchronize(void* s) override { return as_stream(s).synchronize(); }

  result<void> memcpy_sync(void* dst, const void* src, std::size_t n) override {
    // cudaMemcpy: on the legacy default stream, so after the work queued
    // before it on every blocking stream; then cudaDeviceSynchronize.
    auto err = std::make_shared<std::string>();
    launch_on_legacy([this, dst, src, n, err] { *err = copy(dst, src, n, "cudaMemcpy"); });
    if (auto r = device_synchronize(); !r) return r;
    if (!err->empty()) return {errc::cuda_failure, *err};
    return {};
  }

  result<void> device_synchronize() override {
    std::unique_lock l(streams_m);
    streams_cv.wait(l, [&] {
      if (!legacy_.state()->idle()) return false;
      for (const auto& w : blocking_)
        if (auto s = w.lock(); s && !s->idle()) return false;
      return true;
    });
    return {};
  }

  /// testing::launch_on_default_stream: `fn` on the legacy stream, after
  /// the work queued before it on every blocking stream.
  void launch_on_legacy(std::function<void()> fn) {
    std::lock_guard l(streams_m);
    std::vector<dependency> after;
    for (const auto& w : blocking_)
      if (auto s = w.lock()) after.push_back({s, s->enqueued});
    legacy_.enqueue_locked(
        [fn = std::move(fn)]() -> std::string {
          fn();
          return {};
        },
        std::move(after));
  }

  /// Blocking streams whose next operation waits for the legacy stream.
  std::size_t waiting_for_legacy() {
    std::lock_guard l(streams_m);
    std::size_t n = 0;
    for (const auto& w : blocking_) {
      auto s = w.lock();
      if (!s || s->ops.empty()) continue;
      for (const auto& d : s->ops.front().after)
        if (auto dep = d.s.lock(); dep == legacy_.state() && dep->done < d.n) ++n;
    }
    return n;
  }

  std::span<std::byte> kernel_view(const void* p, std::size_t n) {
    std::lock_guard l(m_);
    auto* bytes = resolve(p, n);
    if (bytes == nullptr) return {};
    return {bytes, n};
  }

  std::size_t live_device() {
    std::lock_guard l(m_);
    return device_.size();
  }

  std::size_t frees_under_copies() {
    std::lock_guard l(m_);
    return frees_under_copies_;
  }

 private:
  struct block {
    std::size_t size = 0;      // bytes usable
    std::size_t reserved = 0;  // device: the no-access range reserved, bytes
    std::byte* bytes = nullptr;  // device: where its bytes really are
  };
  using table = std::map<std::uintptr_t, block>;  // start -> block

  static table::const_iterator find(const table& t, std::uintptr_t a) {
    auto it = t.upper_bound(a);
    if (it == t.begin()) return t.end();
    --it;
    return a < it->first + it->second.size ? it : t.end();
  }

  /// Where the bytes [p, p + n) are for the emulator: the block behind a
  /// device range, `p` itself for host memory; null for a range that
  /// starts in device memory and runs past its allocation. REQUIRES: m_.
  std::byte* resolve(const void* p, std::size_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = find(device_, a);
    if (it == device_.end()) return static_cast<std::byte*>(const_cast<void*>(p));
    const std::size_t off = a - it->first;
    if (n > it->second.size - off) return nullptr;
    return it->second.bytes + off;
  }

  /// The pinned blocks among `ends` (a copy's source and destination),
  /// each counted as used by one more queued copy.
  std::vector<std::uintptr_t> mark_pinned_in_use(std::initializer_list<const void*> ends) {
    std::vector<std::uintptr_t> used;
    std::lock_guard l(m_);
    for (const void* p : ends) {
      auto it = find(pinned_, reinterpret_cast<std::uintptr_t>(p));
      if (it == pinned_.end()) continue;
      ++copies_using_[it->first];
      used.push_back(it->first);
    }
    return used;
  }

  /// A copy is gone: a block freed under it goes once no copy uses it.
  void unmark_pinned_in_use(const std::vector<std::uintptr_t>& used) noexcept {
    std::lock_guard l(m_);
    for (auto a : used) {
      auto it = copies_using_.find(a);
      if (--it->second != 0) continue;
      copies_using_.erase(it);
      if (freed_under_copies_.erase(a) != 0) std::free(reinterpret_cast<void*>(a));
    }
  }

  /// A copy as the copy engine does it: device memory through its block.
  std::string copy(void* dst, const void* src, std::size_t n, const char* call) {
    std::byte* d = nullptr;
    const std::byte* s = nullptr;
    {
      std::lock_guard l(m_);
      d = resolve(dst, n);
      s = resolve(src, n);
    }
    if (d == nullptr || s == nullptr)
      return std::string(call) + ": an illegal memory access was encountered (emulated: a range "
                                 "past the end of a device allocation)";
    if (n > 0) std::memmove(d, s, n);
    return {};
  }

  emulated_stream& as_stream(void* s) { return *static_cast<emulated_stream*>(s); }

  void enqueue(void* s, std::function<std::string()> op) {
    // A blocking stream: after the legacy stream's work queued before it.
    std::lock_guard l(streams_m);
    as_stream(s).enqueue_locked(std::move(op), {{legacy_.state(), legacy_.state()->enqueued}});
  }

  std::mutex m_;  // the tables
  table device_;
  table pinned_;
  std::map<std::uintptr_t, std::size_t> copies_using_;  // pinned block -> queued copies
  std::set<std::uintptr_t> freed_under_copies_;          // freed, awaiting those copies
  std::size_t frees_under_copies_ = 0;
  // Streams: the legacy default stream, the blocking streams (weak: a
  // destroyed stream has finished its work), and the handles given out.
  std::vector<std::weak_ptr<stream_state>> blocking_;
  std::map<void*, std::shared_ptr<emulated_stream>> streams_;
  emulated_stream legacy_;  // last: its worker starts once the rest exists
  static thread_local int current_;
};

thread_local int emulated_runtime_impl::current_ = 0;

emulated_runtime_impl& the_emulator() noexcept {
  static emulated_runtime_impl r;
  return r;
}

}  // namespace
}  // namespace blobpipe::cuda::detail

namespace blobpipe::cuda::testing {

void use_emulated_runtime(bool on) noexcept {
  detail::set_active(on ? static_cast<detail::runtime&>(detail::the_emulator())
                        : detail::cuda_runtime());
}

bool using_emulated_runtime() noexcept { return &detail::active() == &detail::the_emulator(); }

void fail_copy_after(long n) noexcept { detail::copies_until_failure.store(n < 0 ? -1 : n); }

std::size_t live_device_allocations() noexcept { return detail::the_emulator().live_device(); }

void hold_copies(bool on) noexcept { detail::gate.hold(on); }

void release_copies(std::size_t n) noexcept { detail::gate.release(n); }

std::size_t copies_in_flight() noexcept { return detail::copies_pending.load(); }

std::size_t pinned_frees_under_copies() noexcept {
  return detail::the_emulator().frees_under_copies();
}

void launch_on_default_stream(std::function<void()> kernel) {
  detail::the_emulator().launch_on_legacy(std::move(kernel));
}

std::span<std::byte> kernel_view(const void* device_ptr, std::size_t n) {
  return detail::the_emulator().kernel_view(device_ptr, n);
}

std::size_t streams_waiting_for_default_stream() noexcept {
  return detail::the_emulator().waiting_for_legacy();
}

}  // namespace blobpipe::cuda::testing
