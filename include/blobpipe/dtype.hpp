// blobpipe/dtype.hpp — moved to blobpipe/format/dtype.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/format/dtype.hpp"
