#include "errors.hpp"

#include "state.hpp"

namespace blobpipe::python {

void raise(const error& e) {
  py::object exc = state().error_for(errc_name(e.code), e.message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void raise(errc c, std::string message) { raise(make_error(c, std::move(message))); }

}  // namespace blobpipe::python
