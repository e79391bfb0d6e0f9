// python/ext/errors.hpp — blobpipe errors as Python exceptions.
//
// Every blobpipe::error raised into Python becomes an instance of the class
// blobpipe._errors maps its category to (FormatError for the format codes,
// FileError for io, ...), carrying `.category` ("bad_footer") and the
// one-line message. The classes live in Python so that they can inherit
// from ValueError/OSError and pickle; C++ only asks for an instance.
//
//   auto idx = unwrap(blobpipe::read_index(bytes));   // raises FormatError
//
// REQUIRES: the GIL is held by the caller of raise() and unwrap().
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "blobpipe/errors.hpp"

namespace blobpipe::python {

/// The built-in exception the reference raises for the same input, which
/// the FormatError raised must also be (blobpipe._errors.FormatTypeError,
/// FormatKeyError, FormatRuntimeError).
enum class also_builtin { none, type_error, key_error, runtime_error };

/// Sets the Python exception for `e` and throws pybind11's
/// error_already_set, which pybind11 turns back into that exception.
[[noreturn]] void raise(const error& e, also_builtin also = also_builtin::none);
[[noreturn]] void raise(errc c, std::string message, also_builtin also = also_builtin::none);

/// The value of `r`, or raise(r.err()).
template <class T>
T unwrap(result<T>&& r) {
  if (!r) raise(r.err());
  return std::move(*r);
}
inline void unwrap(result<void>&& r) {
  if (!r) raise(r.err());
}

/// Runs `f` (returning a pybind11 object) for a C slot or a fastcall
/// function: its object, new reference; or nullptr with the Python error
/// a C++ exception stands for set (error_already_set restored, cast_error
/// as TypeError, bad_alloc as MemoryError, others as RuntimeError).
template <class F>
PyObject* guarded(F&& f) noexcept {
  namespace py = pybind11;
  try {
    return f().release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::cast_error& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

/// A new reference from the C API as an object; nullptr (the call failed,
/// its error set) throws error_already_set.
inline pybind11::object steal_checked(PyObject* o) {
  if (o == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(o);
}

}  // namespace blobpipe::python
