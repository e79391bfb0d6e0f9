// test/ucx_frame_fixture.hpp — scaffolding for the message-level UCX test
// (ucx_transport_test.cpp): pipeline_fixture.hpp's runner, gate, yield_n
// and BLOBPIPE_CO_CHECK, the UCX configurations and pairs of ucx_links.hpp,
// and failing a case whose transport UCX did not select (ucx_links.hpp's
// BLOBPIPE_SKIP_UNLESS_OFFERED skips one this machine cannot offer).
#pragma once

#include <string>

#include "test/pipeline_fixture.hpp"
#include "test/ucx_links.hpp"

/// Fails the test case when UCX did not select the configuration's
/// transport for `t` (a pointer to one end of its pair).
#define BLOBPIPE_REQUIRE_SELECTED(link, t)                    \
  do {                                                        \
    std::string why_;                                         \
    BOOST_TEST_REQUIRE(selected((link), *(t), why_), why_);   \
  } while (0)
