// blobpipe/producer.hpp — moved to blobpipe/pipeline/producer.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/pipeline/producer.hpp"
