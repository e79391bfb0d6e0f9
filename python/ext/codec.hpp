// python/ext/codec.hpp — the blob codec's Python API (blobpipe.plan, ...).
#pragma once

#include <pybind11/pybind11.h>

namespace blobpipe::python {

/// Adds constants, Entry, BlobPlan and the codec functions to `m`.
void init_codec(pybind11::module_& m);

}  // namespace blobpipe::python
