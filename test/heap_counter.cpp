// test/heap_counter.cpp — see heap_counter.hpp.
#include "test/heap_counter.hpp"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace {

// Signed: a block allocated before counting began (the loader's) may be
// freed after; differences stay right.
std::atomic<std::int64_t> live{0};
std::atomic<std::int64_t> peak{0};
std::atomic<std::uint64_t> calls{0};
std::atomic<std::int64_t> limit{-1};

void note_alloc(std::size_t n) noexcept {
  calls.fetch_add(1, std::memory_order_relaxed);
  const auto size = static_cast<std::int64_t>(n);
  const std::int64_t now = live.fetch_add(size, std::memory_order_relaxed) + size;
  std::int64_t p = peak.load(std::memory_order_relaxed);
  while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

void note_free(std::size_t n) noexcept {
  live.fetch_sub(static_cast<std::int64_t>(n), std::memory_order_relaxed);
}

}  // namespace

namespace blobpipe::testing::detail {
std::int64_t heap_live() noexcept { return live.load(); }
void heap_reset_peak() noexcept { peak.store(live.load()); }
std::int64_t heap_peak() noexcept { return peak.load(); }
std::uint64_t heap_allocations() noexcept { return calls.load(); }
void heap_set_limit(std::int64_t live_bytes) noexcept { limit.store(live_bytes); }
}  // namespace blobpipe::testing::detail

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)

// The sanitizers' own allocator reports each allocation and free.
extern "C" {
int __sanitizer_install_malloc_and_free_hooks(void (*)(const volatile void*, std::size_t),
                                              void (*)(const volatile void*));
std::size_t __sanitizer_get_allocated_size(const volatile void*);
}

namespace {

void on_malloc(const volatile void*, std::size_t n) { note_alloc(n); }
void on_free(const volatile void* p) { note_free(__sanitizer_get_allocated_size(p)); }

const bool hooked = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0;

}  // namespace

bool blobpipe::testing::detail::heap_counting() noexcept { return hooked; }
bool blobpipe::testing::heap_limits() noexcept { return false; }

#else

// glibc's allocator under its other names; the definitions below take the
// public names for the whole process (operator new calls malloc).
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);
}

namespace {

void* counted(void* p) noexcept {
  if (p) note_alloc(malloc_usable_size(p));
  return p;
}

// False when `n` more bytes would pass the limit (with_heap_limit).
bool allowed(std::size_t n) noexcept {
  const std::int64_t cap = limit.load(std::memory_order_relaxed);
  if (cap < 0 || live.load(std::memory_order_relaxed) + static_cast<std::int64_t>(n) <= cap)
    return true;
  errno = ENOMEM;
  return false;
}

}  // namespace

extern "C" {
void* malloc(std::size_t n) { return allowed(n) ? counted(__libc_malloc(n)) : nullptr; }
void* calloc(std::size_t k, std::size_t n) {
  return allowed(k * n) ? counted(__libc_calloc(k, n)) : nullptr;
}
void* memalign(std::size_t a, std::size_t n) {
  return allowed(n) ? counted(__libc_memalign(a, n)) : nullptr;
}
void* aligned_alloc(std::size_t a, std::size_t n) { return memalign(a, n); }
void* valloc(std::size_t n) { return memalign(4096, n); }
int posix_memalign(void** out, std::size_t a, std::size_t n) {
  if (a % sizeof(void*) != 0 || (a & (a - 1)) != 0) return EINVAL;
  void* p = memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) {
  if (p) note_free(malloc_usable_size(p));
  __libc_free(p);
}
void* realloc(void* p, std::size_t n) {
  const std::size_t old = p ? malloc_usable_size(p) : 0;
  if (n > old && !allowed(n - old)) return nullptr;
  void* q = __libc_realloc(p, n);
  if (q || n == 0) note_free(old);  // the old block is gone
  return counted(q);
}
}  // extern "C"

bool blobpipe::testing::detail::heap_counting() noexcept { return true; }
bool blobpipe::testing::heap_limits() noexcept { return true; }

namespace {

// Built as a preload library (//test:heap_limit_preload), this file limits
// another program's heap: BLOBPIPE_TEST_HEAP_LIMIT=N makes allocations fail
// once N bytes are live (cli_hostile_test runs the CLI so).
const bool limit_from_environment = [] {
  if (const char* n = std::getenv("BLOBPIPE_TEST_HEAP_LIMIT"); n && *n)
    limit.store(std::strtoll(n, nullptr, 10));
  return true;
}();

}  // namespace

#endif
