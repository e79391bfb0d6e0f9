// python/ext/entry_ready.hpp — blobpipe.EntryReady, one per received entry.
//
//   py::object ev = make_entry_ready(received_ref(rt, entry), allow_pickle);
//
// The event owns the entry (its bytes and window credit) through its
// received_ref; its value, Entry and buffer are made on first access and
// kept (received.hpp says what keeps the bytes alive after the event goes).
#pragma once

#include <pybind11/pybind11.h>

#include "received.hpp"

namespace blobpipe::python {

/// Creates the EntryReady type and adds it to `m`.
void init_entry_ready(pybind11::module_& m);

/// A new EntryReady. REQUIRES: the GIL; init_entry_ready ran.
pybind11::object make_entry_ready(received_ref ref, bool allow_pickle);

}  // namespace blobpipe::python
