// blobpipe/transport.hpp — moved to blobpipe/transport/transport.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/transport/transport.hpp"
