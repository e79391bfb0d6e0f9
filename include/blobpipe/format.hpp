// blobpipe/format.hpp — the NVDP blob codec in one include.
//
// Layered as the reference is: footer (fixed tail), entry (index rows),
// dtype (element types), layout (plan / write / write_tail), index (read
// and decode), and a pickle writer for kind 'p' entries (pickle). The
// codec knows nothing of sockets or coroutines.
// Source: nemo_rl.data_plane.nixl.blob_format (v3), docs/wire.md.
#pragma once

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/index.hpp"
#include "blobpipe/format/layout.hpp"
#include "blobpipe/format/pickle.hpp"
