// test/ucx_frame_fixture.hpp — scaffolding for the message-level UCX test
// (ucx_transport_test.cpp): pipeline_fixture.hpp's runner, gate, yield_n
// and BLOBPIPE_CO_CHECK, the UCX configurations and pairs of ucx_links.hpp,
// and skipping a case whose configuration UCX did not select here.
#pragma once

#include <string>

#include "test/pipeline_fixture.hpp"
#include "test/ucx_links.hpp"

/// Skips the rest of a test case (with the reason) when UCX did not select
/// the configuration's transport here (`link` a ucx_link, `t` a pointer to
/// one end of its pair).
#define BLOBPIPE_REQUIRE_SELECTED(link, t)                           \
  do {                                                               \
    std::string why_;                                                \
    if (!selected((link), *(t), why_)) {                             \
      BOOST_TEST_MESSAGE("skipped " << (link).name << ": " << why_); \
      return;                                                        \
    }                                                                \
  } while (0)
