// test/heap_counter.hpp — counts the heap a piece of code uses (a counting
// allocator, not RSS): every malloc-family allocation of the process,
// operator new and msgpack-cxx's zone included.
//
//   auto use = blobpipe::testing::measure_heap([&] { (void)bp::parse_index(idx, end); });
//   BOOST_TEST(use.peak_bytes <= 19 * idx.size() + 4096);
//
// In a plain build it interposes malloc, calloc, realloc, free and the
// aligned allocators over glibc's (__libc_malloc, ...), and can also make
// them fail past a budget (with_heap_limit), to test what an allocation
// failure does; under ASan or TSan, whose runtimes own malloc, it installs
// the sanitizers' malloc and free hooks instead, and counts only. Bytes are the allocator's usable sizes (at least what was
// asked for). Link it into a test with `deps = [":heap_counter"]` (it is
// alwayslink: the interposers must be in the binary), or preload it into a
// program (//test:heap_limit_preload, LD_PRELOAD) and set
// BLOBPIPE_TEST_HEAP_LIMIT=N to make its allocations fail once N bytes of
// heap are live.
#pragma once

#include <cstddef>
#include <cstdint>

namespace blobpipe::testing {

/// The heap `fn` used above what was live when it started.
struct heap_use {
  std::size_t peak_bytes = 0;      ///< highest live bytes above the start
  std::uint64_t allocations = 0;   ///< allocation calls (realloc counts one)
};

namespace detail {
std::int64_t heap_live() noexcept;
void heap_reset_peak() noexcept;
std::int64_t heap_peak() noexcept;
std::uint64_t heap_allocations() noexcept;
/// False when this build cannot count (then measure_heap reports zeros).
bool heap_counting() noexcept;
/// Live bytes above which allocations fail; -1 for none.
void heap_set_limit(std::int64_t live_bytes) noexcept;
}  // namespace detail

/// Whether this build counts the heap.
inline bool heap_counting() noexcept { return detail::heap_counting(); }

/// Whether this build can fail allocations on purpose (plain builds only:
/// under ASan or TSan the sanitizer's allocator cannot be refused).
bool heap_limits() noexcept;

/// Runs `fn` with every allocation that would take the live heap more than
/// `bytes` above its level at the start failing (malloc returns null, so
/// operator new throws std::bad_alloc). REQUIRES: heap_limits().
template <class F>
void with_heap_limit(std::size_t bytes, F&& fn) {
  struct lift {
    ~lift() { detail::heap_set_limit(-1); }
  } on_exit;
  detail::heap_set_limit(detail::heap_live() + static_cast<std::int64_t>(bytes));
  fn();
}

/// Runs `fn` and reports its heap use. Not for threads that allocate
/// meanwhile (their bytes count too).
template <class F>
heap_use measure_heap(F&& fn) {
  const std::int64_t base = detail::heap_live();
  const std::uint64_t calls = detail::heap_allocations();
  detail::heap_reset_peak();
  fn();
  const std::int64_t peak = detail::heap_peak();
  return {peak > base ? static_cast<std::size_t>(peak - base) : 0,
          detail::heap_allocations() - calls};
}

}  // namespace blobpipe::testing
