// blobpipe/loopback.hpp — moved to blobpipe/transport/loopback.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/transport/loopback.hpp"
