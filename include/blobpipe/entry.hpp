// blobpipe/entry.hpp — moved to blobpipe/format/entry.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/format/entry.hpp"
