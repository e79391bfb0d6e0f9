// blobpipe/memory_kind.hpp — moved to blobpipe/format/memory_kind.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/format/memory_kind.hpp"
