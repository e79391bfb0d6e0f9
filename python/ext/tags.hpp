// python/ext/tags.hpp — blob tags between Python bytes and tag_t.
//
//   tag_t t = tag_from(py_obj);     // bytes(obj)[:16].ljust(16, b"\0")
//   py::bytes b = tag_bytes(t);     // 16 bytes
//
// REQUIRES: the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "blobpipe/format/footer.hpp"

namespace blobpipe::python {

inline pybind11::bytes tag_bytes(const tag_t& t) {
  return pybind11::bytes(reinterpret_cast<const char*>(t.data()), t.size());
}

/// The reference's bytes(tag)[:16].ljust(16, b"\0"): any bytes-like object
/// (and whatever else bytes() accepts), cut or zero-padded to 16 bytes;
/// `given_bytes`, when not null, gets bytes(tag)'s length before the cut.
/// An integer n (without __bytes__) is bytes(n), n zero bytes: the zero
/// tag, with n as the length given, and nothing allocated for it.
/// Raises what bytes(tag) raises: a TypeError (a str, a float) naming the
/// tag and the type given, ValueError for a negative count, OverflowError
/// for a count above sys.maxsize.
inline tag_t tag_from(pybind11::handle tag, std::size_t* given_bytes = nullptr) {
  namespace py = pybind11;
  // bytes() tries __bytes__ first, then an integer as a count; an object
  // whose __index__ raises TypeError (a numpy array of several bytes) goes
  // on to the buffer protocol, as in bytes().
  if (!PyBytes_Check(tag.ptr()) && !PyUnicode_Check(tag.ptr()) && PyIndex_Check(tag.ptr()) &&
      !py::hasattr(py::type::handle_of(tag), "__bytes__")) {
    const Py_ssize_t count = PyNumber_AsSsize_t(tag.ptr(), PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
      PyErr_Clear();
    } else if (count < 0) {
      throw py::value_error("tag: bytes() of a negative count (" + std::to_string(count) + ")");
    } else {
      if (given_bytes != nullptr) *given_bytes = static_cast<std::size_t>(count);
      return NO_TAG;
    }
  }
  py::object b = py::reinterpret_borrow<py::object>(tag);
  if (!PyBytes_Check(tag.ptr())) {
    try {
      b = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyBytes_Type))(tag);
    } catch (py::error_already_set& e) {
      if (!e.type().is(pybind11::handle(PyExc_TypeError))) throw;  // a subclass is the caller's
      throw py::type_error("tag: expected bytes or a bytes-like object (its first 16 bytes are "
                           "the tag), not " + std::string(Py_TYPE(tag.ptr())->tp_name) + " (" +
                           std::string(py::str(e.value())) + ")");
    }
  }
  const auto given = static_cast<std::size_t>(PyBytes_GET_SIZE(b.ptr()));
  if (given_bytes != nullptr) *given_bytes = given;
  const auto n = std::min<std::size_t>(given, TAG_SIZE);
  tag_t t = NO_TAG;
  std::memcpy(t.data(), PyBytes_AS_STRING(b.ptr()), n);
  return t;
}

}  // namespace blobpipe::python
