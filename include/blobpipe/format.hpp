// blobpipe/format.hpp — the NVDP blob codec in one include.
//
// Layered as the reference is: footer (fixed tail), entry (index rows),
// dtype (element types), layout (plan / write / write_tail), index (read
// and decode). The codec knows nothing of sockets or coroutines.
// Source: nemo_rl.data_plane.nixl.blob_format (v3), docs/wire.md.
#pragma once

#include "blobpipe/dtype.hpp"
#include "blobpipe/entry.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/footer.hpp"
#include "blobpipe/index.hpp"
#include "blobpipe/layout.hpp"
