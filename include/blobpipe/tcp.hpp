// blobpipe/tcp.hpp — moved to blobpipe/transport/tcp.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/transport/tcp.hpp"
