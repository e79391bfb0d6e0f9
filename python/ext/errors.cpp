#include "errors.hpp"

#include "state.hpp"

namespace blobpipe::python {

void raise(const error& e, also_builtin also) {
  // A message may quote bytes from the blob (a key, a dtype) that are not
  // UTF-8; they show as escapes rather than failing to convert.
  auto message = py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
      e.message.data(), static_cast<Py_ssize_t>(e.message.size()), "backslashreplace"));
  if (!message) throw py::error_already_set();
  static constexpr const char* names[] = {nullptr, "TypeError", "KeyError", "RuntimeError"};
  const char* builtin = names[static_cast<int>(also)];
  py::object exc = builtin ? state().error_for(errc_name(e.code), message, builtin)
                           : state().error_for(errc_name(e.code), message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void raise(errc c, std::string message, also_builtin also) {
  raise(make_error(c, std::move(message)), also);
}

}  // namespace blobpipe::python
