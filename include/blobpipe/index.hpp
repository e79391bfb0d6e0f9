// blobpipe/index.hpp — moved to blobpipe/format/index.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/format/index.hpp"
