// blobpipe/layout.hpp — moved to blobpipe/format/layout.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/format/layout.hpp"
