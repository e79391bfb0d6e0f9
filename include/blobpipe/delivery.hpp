// blobpipe/delivery.hpp — moved to blobpipe/pipeline/delivery.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/pipeline/delivery.hpp"
