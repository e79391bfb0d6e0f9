// blobpipe/ucx.hpp — moved to blobpipe/transport/ucx.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/transport/ucx.hpp"
