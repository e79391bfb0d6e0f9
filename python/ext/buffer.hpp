// python/ext/buffer.hpp — a held Python buffer (PEP 3118) as a byte span.
//
// Anything with the buffer protocol will do: bytes, bytearray, memoryview,
// a numpy array of any dtype, mmap. The bytes must be C-contiguous (as the
// reference's memoryview.cast("B") requires); the span covers all of them
// (len in bytes, whatever the item type). The buffer is released when the
// holder goes, so the exporter (a bytearray, say) cannot be resized while
// the span is in use, including while the GIL is released.
//
//   held_buffer out(obj, /*writable=*/true);   // TypeError/BufferTypeError if not
//   std::span<std::byte> s = out.writable_bytes();
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <span>

namespace blobpipe::python {

class held_buffer {
 public:
  /// Raises (error_already_set) blobpipe.BufferTypeError (a BufferError
  /// and a TypeError, what the reference raises for either: README
  /// "Python") with the exporter's message when the object exports a
  /// buffer that is not C-contiguous or, with `writable`, is read-only
  /// (numpy's ValueError for those included); else what
  /// PyObject_GetBuffer raised (TypeError for an object without the
  /// protocol, ValueError for a released memoryview).
  held_buffer(pybind11::handle obj, bool writable) {
    const int flags = writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) == 0) return;
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError))
      throw pybind11::error_already_set();
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    // The layout was the reason only if a buffer of any layout is there.
    Py_buffer probe{};
    if (PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_FULL_RO) != 0) {
      PyErr_Clear();
      PyErr_Restore(type, value, trace);
      throw pybind11::error_already_set();
    }
    PyBuffer_Release(&probe);
    PyErr_NormalizeException(&type, &value, &trace);
    PyObject* message = value != nullptr ? PyObject_Str(value) : nullptr;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
    if (message == nullptr) throw pybind11::error_already_set();
    const pybind11::object message_owner = pybind11::reinterpret_steal<pybind11::object>(message);
    const pybind11::object cls =
        pybind11::module_::import("blobpipe._errors").attr("BufferTypeError");
    PyErr_SetObject(cls.ptr(), message);
    throw pybind11::error_already_set();
  }
  held_buffer(const held_buffer&) = delete;
  held_buffer& operator=(const held_buffer&) = delete;
  ~held_buffer() { PyBuffer_Release(&view_); }

  /// The bytes, view_.len of them.
  std::span<const std::byte> bytes() const noexcept {
    return {static_cast<const std::byte*>(view_.buf), static_cast<std::size_t>(view_.len)};
  }
  /// REQUIRES: constructed with writable = true.
  std::span<std::byte> writable_bytes() const noexcept {
    return {static_cast<std::byte*>(view_.buf), static_cast<std::size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

}  // namespace blobpipe::python
