// Every file agrees on how Asio allocates: a file that includes Asio before
// any libstdc++ header (as python/ext/consumer.cpp does, after C headers
// only) must make the choice a file that includes libstdc++ first makes.
// Asio 1.22 decides ASIO_HAS_STD_ALIGNED_ALLOC (aligned_new by
// std::aligned_alloc, aligned_delete by free) from libstdc++'s
// _GLIBCXX_HAVE_ALIGNED_ALLOC, defined only once a libstdc++ header was
// seen; without it aligned_new is operator new. Two files that disagreed
// gave Asio's recycled handler memory an operator new in one and a free()
// in the other (ASan's alloc-dealloc-mismatch, docs/reliability.md
// "Sanitizers"). bazel/third_party/asio.BUILD defines the macro for every
// file that depends on @asio.
#include <asio/detail/memory.hpp>  // first: nothing of libstdc++ before it

#ifdef ASIO_HAS_STD_ALIGNED_ALLOC
constexpr bool asio_first_uses_aligned_alloc = true;
#else
constexpr bool asio_first_uses_aligned_alloc = false;
#endif

#define BOOST_TEST_MODULE asio_config_test
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstdlib>

#ifdef _GLIBCXX_HAVE_ALIGNED_ALLOC
constexpr bool libstdcxx_first_uses_aligned_alloc = true;  // Asio's own rule
#else
constexpr bool libstdcxx_first_uses_aligned_alloc = false;
#endif

BOOST_AUTO_TEST_CASE(a_file_that_includes_asio_first_allocates_as_the_others_free) {
  BOOST_TEST(asio_first_uses_aligned_alloc == libstdcxx_first_uses_aligned_alloc,
             "ASIO_HAS_STD_ALIGNED_ALLOC is " << asio_first_uses_aligned_alloc
                 << " where Asio comes first and would be " << libstdcxx_first_uses_aligned_alloc
                 << " after a libstdc++ header: Asio's aligned_new and aligned_delete differ "
                    "between files (define it in bazel/third_party/asio.BUILD)");
  // And the pair works as one: what aligned_new gives, aligned_delete takes
  // (under ASan a mismatch here is a report).
  void* p = asio::aligned_new(64, 200);
  BOOST_TEST(p != nullptr);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(p) % 64 == 0u);
  asio::aligned_delete(p);
}
