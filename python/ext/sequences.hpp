// python/ext/sequences.hpp — keys and values given as two sequences, as
// plan(keys, values) and Blob.emit_many take them.
//
//   auto [ks, vs] = paired_sequences(keys, values);   // a tuple each
//   PyObject** k = PySequence_Fast_ITEMS(ks.ptr());
//
// REQUIRES: the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

#include "errors.hpp"

namespace blobpipe::python {

/// Both as tuples, which hold a reference to each item for as long as the
/// caller keeps them (a tuple as it is; a list or other iterable copied
/// once, so that changes to it while the caller works are not seen). Raises TypeError ("keys must be a sequence") for
/// a non-iterable, FormatError invalid_argument when the lengths differ (the
/// reference's ValueError "keys and values differ in length").
inline std::pair<pybind11::object, pybind11::object> paired_sequences(pybind11::handle keys,
                                                                      pybind11::handle values) {
  namespace py = pybind11;
  auto fast = [](py::handle o, const char* what) {
    auto s = py::reinterpret_steal<py::object>(PySequence_Fast(o.ptr(), what));
    if (!s) throw py::error_already_set();
    // A list is the caller's own: code the callers run (a value's
    // __reduce__, a key's __str__, another thread while the GIL is
    // released) may change it, so its items are read from a copy.
    if (PyList_Check(s.ptr())) {
      s = py::reinterpret_steal<py::object>(PyList_AsTuple(s.ptr()));
      if (!s) throw py::error_already_set();
    }
    return s;
  };
  py::object ks = fast(keys, "keys must be a sequence");
  py::object vs = fast(values, "values must be a sequence");
  if (PySequence_Fast_GET_SIZE(ks.ptr()) != PySequence_Fast_GET_SIZE(vs.ptr()))
    raise(errc::invalid_argument, "keys and values differ in length");
  return {std::move(ks), std::move(vs)};
}

}  // namespace blobpipe::python
