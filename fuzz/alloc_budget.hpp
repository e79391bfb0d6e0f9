// fuzz/alloc_budget.hpp — fails a fuzz input whose parser holds more live
// heap than its stated budget: `per_input_byte` times the input's size plus
// `constant_bytes` (docs/reliability.md "Fuzzing").
//
// libFuzzer's -malloc_limit_mb caps single allocations only, and -rss_limit_mb
// the whole process: an input that makes a parser build 24 bytes of objects
// per byte it reads passes both while its inputs stay small, and only a
// long run with big inputs (or a production trainer) finds out. Counting
// instead: the sanitizer's malloc and free hooks (every fuzz build has ASan,
// and its allocator serves malloc and operator new alike) keep the bytes
// live now; a budget scope remembers the count when it opens and fails the
// input at the first allocation that takes the count past the budget, with
// that allocation's stack (libFuzzer then saves the input as a crash).
//
//   extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
//     blobpipe::fuzz::alloc_budget b("read_index", size, {.per_input_byte = 8});
//     auto idx = blobpipe::read_index(...);   // what it holds counts until b ends
//     ...
//   }
//
// Bytes freed before the scope ends still count at their peak: the budget
// bounds what the parser holds at once, not what it returns. Allocations
// the harness itself makes inside the scope count too, so open the scope
// around the call under test (or after the harness's own copies).
// BLOBPIPE_FUZZ_BUDGET_REPORT=1 prints each scope's peak (to size budgets).
// REQUIRES: one scope at a time; a build with ASan (fuzz/BUILD.bazel).
#pragma once

#include <sanitizer/allocator_interface.h>
#include <sanitizer/common_interface_defs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace blobpipe::fuzz {

/// What one input may make the code under test hold at once: bytes.
struct budget {
  std::size_t per_input_byte = 0;  ///< bytes of heap per input byte
  std::size_t constant_bytes = 64 << 10;
};

namespace detail {

// Signed: frees of blocks allocated before the hooks were installed make
// the count dip below zero, which a scope's difference absorbs.
inline std::atomic<std::int64_t> live_bytes{0};
inline std::atomic<std::int64_t> limit_bytes{-1};  // live count that fails; -1: no scope open
inline std::atomic<bool> reported{false};
inline const char* scope_what = "";
inline std::size_t scope_input = 0;
inline std::int64_t scope_base = 0;
inline std::atomic<std::int64_t> scope_peak{0};

inline void fail(std::int64_t now) {
  if (reported.exchange(true)) return;
  const std::int64_t base = scope_base;
  std::fprintf(stderr,
               "==alloc_budget== %s holds %lld bytes live for an input of %zu bytes: over its "
               "budget of %lld bytes\n",
               scope_what, static_cast<long long>(now - base), scope_input,
               static_cast<long long>(limit_bytes.load() - base));
  __sanitizer_print_stack_trace();
  std::abort();  // libFuzzer saves the input (-handle_abrt=1)
}

inline void on_malloc(const volatile void*, std::size_t n) {
  const std::int64_t now = live_bytes.fetch_add(static_cast<std::int64_t>(n)) + std::int64_t(n);
  const std::int64_t limit = limit_bytes.load(std::memory_order_relaxed);
  if (limit < 0) return;
  std::int64_t p = scope_peak.load(std::memory_order_relaxed);
  while (now > p && !scope_peak.compare_exchange_weak(p, now)) {
  }
  if (now > limit) fail(now);
}

inline void on_free(const volatile void* p) {
  if (p == nullptr || !__sanitizer_get_ownership(p)) return;
  live_bytes.fetch_sub(static_cast<std::int64_t>(__sanitizer_get_allocated_size(p)));
}

inline const bool hooks_installed =
    __sanitizer_install_malloc_and_free_hooks(&on_malloc, &on_free) != 0;

}  // namespace detail

/// Fails the input (abort, with the offending allocation's stack) the moment
/// the live heap exceeds, by more than `b` allows for `input_bytes`, what it
/// was when the scope opened.
class alloc_budget {
 public:
  alloc_budget(const char* what, std::size_t input_bytes, budget b) {
    if (!detail::hooks_installed) {
      std::fprintf(stderr,
                   "==alloc_budget== no sanitizer malloc hooks: build with --config=fuzz\n");
      std::abort();
    }
    detail::scope_what = what;
    detail::scope_input = input_bytes;
    detail::scope_base = detail::live_bytes.load();
    detail::scope_peak = detail::scope_base;
    detail::limit_bytes = detail::scope_base + static_cast<std::int64_t>(limit(input_bytes, b));
  }
  alloc_budget(const alloc_budget&) = delete;
  alloc_budget& operator=(const alloc_budget&) = delete;
  ~alloc_budget() {
    detail::limit_bytes = -1;
    if (std::getenv("BLOBPIPE_FUZZ_BUDGET_REPORT") != nullptr)
      std::fprintf(stderr, "==alloc_budget== %s: peak %lld bytes for an input of %zu bytes\n",
                   detail::scope_what, static_cast<long long>(peak_bytes()),
                   detail::scope_input);
  }

  /// The most bytes held at once since the scope opened.
  std::int64_t peak_bytes() const { return detail::scope_peak.load() - detail::scope_base; }

 private:
  static std::size_t limit(std::size_t input_bytes, budget b) {
    // Saturating: a budget is never smaller for being huge.
    std::size_t prod = 0;
    if (__builtin_mul_overflow(input_bytes, b.per_input_byte, &prod)) return SIZE_MAX / 4;
    return prod > SIZE_MAX / 4 - b.constant_bytes ? SIZE_MAX / 4 : prod + b.constant_bytes;
  }
};

}  // namespace blobpipe::fuzz
