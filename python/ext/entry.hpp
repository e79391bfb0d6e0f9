// python/ext/entry.hpp — blobpipe.Entry, one row of a blob's index.
//
// A plain CPython type (PyType_FromSpec), not a pybind11 class: read_index,
// BlobPlan.entries, EntryReady.entry and Consumer's blob.entries make one
// per row, and a pybind11 instance costs a registration in pybind11's
// instance map besides the allocation (a third of read_index). The object
// holds the C++ blobpipe::Entry in place; its fields are made on each read,
// and C++ reads the value by entry_value (a pointer into the object).
//
//   py::object e = entry_object(std::move(row));      // a new blobpipe.Entry
//   if (const Entry* v = entry_value(obj)) use(*v);   // no lookup, no copy
//
// Python-visible behaviour (python/src/blobpipe/__init__.py adds the
// dataclass metadata, __signature__ and the frozen __setattr__): the
// reference's frozen dataclass Entry(key, off, len, kind, dtype, shape).
// Fields no blob index holds (a str offset, a list shape, ...) make a
// blobpipe._LooseEntry (a Python subclass keeping them as given), through
// blobpipe._LooseEntry._make.
//
// REQUIRES: the GIL, for every function here.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "blobpipe/format/entry.hpp"

namespace blobpipe::python {

/// Creates the Entry type and adds it (and _entry_fits) to `m`.
void init_entry(pybind11::module_& m);

/// A new blobpipe.Entry holding `e` (moved in). Keys and dtypes are not
/// checked: one that is not UTF-8 raises UnicodeDecodeError when read.
pybind11::object entry_object(Entry&& e);

/// The entries as a list of new Entry objects, moved from `entries`.
/// Raises FormatError malformed_index when a key or dtype is not UTF-8
/// (the reference's msgpack decoder refuses them too).
pybind11::list entry_list(std::vector<Entry>&& entries);

/// The C++ value of `o` when it is a blobpipe.Entry or a subclass, else
/// nullptr (no error set). A _LooseEntry's value is its placeholder or the
/// row its fields read as (codec.cpp's entry_arg tells them apart).
const Entry* entry_value(PyObject* o) noexcept;

/// True for blobpipe.Entry itself, not a subclass.
bool is_exact_entry(PyObject* o) noexcept;

/// The type object (borrowed; owned by the module).
PyTypeObject* entry_type_object() noexcept;

/// Strict UTF-8 as Python's decoder takes it (no overlongs, no surrogates,
/// nothing above U+10FFFF).
bool is_utf8(const std::string& s);

}  // namespace blobpipe::python
