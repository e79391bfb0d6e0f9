// blobpipe._blobpipe: the extension module behind `import blobpipe`.
//
// One module for the whole package, one init_* per part, so the parts share
// the cached state (state.hpp) and the error mapping (errors.hpp): today the
// codec (codec.cpp); the streaming classes (Sender, Consumer, connect,
// listen) are to join as their own init_streaming() in stream.cpp.
#include <pybind11/pybind11.h>

#include "codec.hpp"
#include "state.hpp"

PYBIND11_MODULE(_blobpipe, m) {
  m.doc() = "blobpipe's C++ core: the NVDP blob codec (see the blobpipe package).";
  blobpipe::python::init_state(m);
  blobpipe::python::init_codec(m);
}
