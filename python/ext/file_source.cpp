#include "file_source.hpp"

#include <cerrno>
#include <cstring>

namespace py = pybind11;

namespace blobpipe::python {

python_file_stream::python_file_stream(py::handle file) : cookie_{file, std::nullopt} {
  cookie_io_functions_t io{};
  io.read = &python_file_stream::read;
  io.seek = &python_file_stream::seek;
  stream_.reset(fopencookie(&cookie_, "rb", io));
  if (!stream_) {
    PyErr_SetFromErrno(PyExc_OSError);
    throw py::error_already_set();
  }
  // Unbuffered: each fread becomes one read(n) of the bytes wanted, so
  // the footer read does not pull in a buffer's worth of the entries.
  std::setvbuf(stream_.get(), nullptr, _IONBF, 0);
}

ssize_t python_file_stream::read(void* c, char* buf, size_t size) {
  auto* k = static_cast<cookie*>(c);
  try {
    py::object got = k->file.attr("read")(size);
    char* data = nullptr;
    Py_ssize_t n = 0;
    if (PyBytes_AsStringAndSize(got.ptr(), &data, &n) != 0) {
      // A text-mode file returns str; say so instead of "not bytes".
      PyErr_Clear();
      PyErr_SetString(PyExc_TypeError, "read_index_file needs a file opened in binary mode");
      throw py::error_already_set();
    }
    if (static_cast<size_t>(n) > size) n = static_cast<Py_ssize_t>(size);
    std::memcpy(buf, data, static_cast<size_t>(n));
    return n;
  } catch (py::error_already_set& e) {
    if (!k->error) k->error = std::move(e);
    errno = EIO;
    return -1;
  } catch (...) {  // nothing may unwind through glibc's stdio
    errno = EIO;
    return -1;
  }
}

int python_file_stream::seek(void* c, off64_t* pos, int whence) {
  auto* k = static_cast<cookie*>(c);
  try {
    *pos = py::cast<off64_t>(k->file.attr("seek")(*pos, whence));
    return 0;
  } catch (py::error_already_set& e) {
    if (!k->error) k->error = std::move(e);
    errno = EIO;
    return -1;
  } catch (...) {  // seek() returned no int; nothing may unwind through stdio
    errno = EIO;
    return -1;
  }
}

void python_file_stream::rethrow_pending() {
  if (cookie_.error) {
    py::error_already_set e = std::move(*cookie_.error);
    cookie_.error.reset();
    throw e;
  }
}

}  // namespace blobpipe::python
