// python/ext/file_source.hpp — a Python binary file object as a std::FILE*.
//
// read_index_file takes the reference's `f`: a path or an open binary file
// (anything with read(n) and seek(pos, whence): open(..., "rb"), BytesIO).
// A file object is wrapped in a glibc cookie stream whose reads and seeks
// call the object's own methods, so the one C++ reader (two reads: footer,
// then index) serves both. The file's position is left where the reader
// left it, as after any read.
//
// REQUIRES: the GIL is held for the stream's whole life (its callbacks
// call into Python).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdio>
#include <optional>

#include "blobpipe/format/index.hpp"

namespace blobpipe::python {

class python_file_stream {
 public:
  /// Raises OSError when glibc cannot make the stream.
  explicit python_file_stream(pybind11::handle file);

  std::FILE* get() const noexcept { return stream_.get(); }

  /// Re-raises the first exception a read() or seek() raised, if any: it
  /// says more than the io error the reader returned for it.
  void rethrow_pending();

 private:
  struct cookie {
    pybind11::handle file;
    std::optional<pybind11::error_already_set> error;
  };
  static ssize_t read(void* c, char* buf, size_t size);
  static int seek(void* c, off64_t* pos, int whence);

  cookie cookie_;
  file_ptr stream_;
};

}  // namespace blobpipe::python
