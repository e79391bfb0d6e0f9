// blobpipe/consumer.hpp — moved to blobpipe/pipeline/consumer.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/pipeline/consumer.hpp"
