// blobpipe._blobpipe: the extension module behind `import blobpipe`.
//
// One module for the whole package, one init_* per part, so the parts share
// the cached state (state.hpp) and the error mapping (errors.hpp): the
// codec (codec.cpp; its Entry type in entry.cpp) and streaming: Sender and Blob (sender.cpp), Consumer
// and its events (consumer.cpp, received.cpp), Listener and the factories
// behind connect/listen/loopback_pair (connect.cpp), and the C++ loop the
// benchmark compares with (stream_bench.cpp).
#include <pybind11/pybind11.h>

#include "blobpipe/version.hpp"
#include "codec.hpp"
#include "received.hpp"
#include "state.hpp"
#include "stream.hpp"

PYBIND11_MODULE(_blobpipe, m) {
  m.doc() = "blobpipe's C++ core: the NVDP blob codec and the streaming pipeline "
            "(see the blobpipe package).";
  m.attr("__version__") = blobpipe::version();
  blobpipe::python::init_state(m);
  blobpipe::python::init_runtime();
  blobpipe::python::init_codec(m);
  blobpipe::python::init_received(m);
  blobpipe::python::init_sender(m);
  blobpipe::python::init_consumer(m);
  blobpipe::python::init_connect(m);
  blobpipe::python::init_stream_bench(m);
}
