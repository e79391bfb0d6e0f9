// python/ext/decode.hpp — one entry's bytes as a Python value, zero copy.
//
// Kind 't': a torch tensor viewing the bytes (torch.frombuffer(...).view(
// shape); an empty entry is torch.empty(shape)), as the reference returns.
// When torch is missing, or lacks the dtype (torch 1.13 has no float8 and
// no uint16/32/64), a numpy array of the same dtype where numpy has it, and
// otherwise a blobpipe.RawEntry (the bytes as a uint8 array, the dtype
// name and the shape): never an error, never a wrong dtype.
// Kind 'n': numpy.frombuffer(bytes, numpy.dtype(dtype)).reshape(shape); a
// dtype numpy cannot build here also gives a RawEntry.
// Kind 'p': pickle.loads(bytes), or with allow_pickle = false the bytes
// themselves (a bytes copy): unpickling runs code from the blob.
#pragma once

#include <pybind11/pybind11.h>

#include "blobpipe/format/index.hpp"

namespace blobpipe::python {

/// `owner` exposes exactly v.bytes through the buffer protocol; views
/// returned keep it alive. REQUIRES: the GIL; `v` came from view_entry or
/// decode_entry (validated).
pybind11::object decode_value(pybind11::handle owner, const entry_view& v, bool allow_pickle);

}  // namespace blobpipe::python
