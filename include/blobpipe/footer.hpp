// blobpipe/footer.hpp — moved to blobpipe/format/footer.hpp. This forwarding header
// keeps the old path working for one release; include the new one.
#pragma once

#include "blobpipe/format/footer.hpp"
