// blobpipe/wire.hpp — moved to blobpipe/protocol/wire.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/protocol/wire.hpp"
