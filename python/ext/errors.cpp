#include "errors.hpp"

#include "state.hpp"

namespace blobpipe::python {

void raise(const error& e) {
  // A message may quote bytes from the blob (a key, a dtype) that are not
  // UTF-8; they show as escapes rather than failing to convert.
  auto message = py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
      e.message.data(), static_cast<Py_ssize_t>(e.message.size()), "backslashreplace"));
  if (!message) throw py::error_already_set();
  py::object exc = state().error_for(errc_name(e.code), message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void raise(errc c, std::string message) { raise(make_error(c, std::move(message))); }

}  // namespace blobpipe::python
