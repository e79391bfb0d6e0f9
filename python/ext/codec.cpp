// The codec with the reference's names (nemo_rl.data_plane.nixl.blob_format):
// constants, Entry (its type: entry.cpp), BlobPlan, plan, write, write_tail,
// read_index, read_index_file, decode_entry, footer_is_valid, footer_tag.
// The classes and the fastcall functions (read_index, decode_entry,
// decode_entries, materialize) carry their docstrings here; the other
// functions are re-exported with theirs by python/src/blobpipe/__init__.py,
// and all are typed in _blobpipe.pyi.
#include "codec.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <msgpack.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <vector>

#include "blobpipe/format.hpp"
#include "buffer.hpp"
#include "decode.hpp"
#include "encode.hpp"
#include "entry.hpp"
#include "errors.hpp"
#include "file_source.hpp"
#include "state.hpp"
#include "storage_guard.hpp"
#include "runtime.hpp"
#include "sequences.hpp"
#include "tags.hpp"

namespace blobpipe::python {
namespace {

// A plan and the Python objects whose memory its values borrow.
struct py_plan {
  BlobPlan plan;
  std::vector<py::object> keep;
  std::vector<py::object> pins;  // numpy owners' weak references (encoded::pin)
  std::vector<storage_guard> guards;  // torch tensors' storages, checked by write()
  py::object keys_cache, entries_cache;  // built on first access
};

py_plan plan_values(py::handle keys, py::handle values, py::handle tag) {
  auto [ks, vs] = paired_sequences(keys, values);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(ks.ptr());
  const tag_t t = tag_from(tag);
  py_plan p;
  p.keep.reserve(static_cast<std::size_t>(n));
  layout_builder b;
  b.reserve(static_cast<std::size_t>(n));
  PyObject** k = PySequence_Fast_ITEMS(ks.ptr());
  PyObject** v = PySequence_Fast_ITEMS(vs.ptr());
  python_call encoding;  // torch and pickle may release the GIL (runtime.hpp)
  for (Py_ssize_t i = 0; i < n; ++i) {
    encoded e = encode_value(v[i]);
    const planned_entry* pe = unwrap(b.add(key_string(k[i]), std::move(e.v)));
    if (e.raw_nbytes && *e.raw_nbytes != pe->entry.len)
      raise(errc::invalid_argument,
            "RawEntry '" + pe->entry.key.substr(0, 64) + "' has " + std::to_string(*e.raw_nbytes) +
                " bytes; its dtype and shape need " + std::to_string(pe->entry.len));
    p.keep.push_back(std::move(e.keep));
    if (e.pin) p.pins.push_back(std::move(e.pin));
    if (e.storage) p.guards.push_back({std::move(e.storage), static_cast<std::size_t>(i)});
  }
  p.plan = unwrap(b.finish(t));
  return p;
}

// f(out's bytes). While it runs (the copy, without the GIL), numpy
// refuses to resize the array `out` is or views: resizing it would free
// the bytes being written.
template <class F>
void with_out_buffer(py::handle out, F&& f) {
  // The buffer first: a released memoryview is refused there (ValueError)
  // before numpy_pin reads its base, which is then gone.
  held_buffer b(out, true);
  const py::object pin = numpy_pin(out);
  f(b);
}

// BlobPlan.buffers and .keepalive as the reference defines them, in one
// call: (buffers, owners, missing). buffers[i] is a memoryview where the
// value's bytes are used in place (a C-contiguous CPU tensor, a
// C-contiguous numpy array of rank >= 1, a pickle's bytes), None where the
// reference copies or reshapes (blobpipe/_plan.py makes those: their
// indices are `missing`); owners[i] is the planned value's owner. The
// memoryview is 1-d, format "B", over a uint8 ndarray viewing the value's
// memory with the owner as its base, as the reference's .numpy() and
// .view(uint8) give.
py::tuple plan_buffers(const py_plan& p) {
  python_call building;  // numpy may run code that releases the GIL (runtime.hpp)
  const std::size_t n = p.plan.entries.size();
  py::list out(n), owners(n), missing;
  for (std::size_t i = 0; i < n; ++i) {
    const planned_entry& pe = p.plan.entries[i];
    const py::object& owner = p.keep[i];
    PyList_SET_ITEM(owners.ptr(), static_cast<Py_ssize_t>(i), py::object(owner).release().ptr());
    py::object item = py::none();
    if (pe.entry.kind == KIND_PICKLE) {
      PyObject* mv = PyMemoryView_FromObject(owner.ptr());
      if (mv == nullptr) throw py::error_already_set();
      item = py::reinterpret_steal<py::object>(mv);
    } else if (pe.contiguous && pe.entry.len > 0 && pe.entry.shape &&
               (pe.entry.kind == KIND_NDARRAY
                    // numpy.ascontiguousarray makes a 0-d array a 1-d copy
                    ? py::isinstance<py::array>(owner) && !pe.entry.shape->empty()
                    : !py::isinstance<py::array>(owner))) {
      // numpy's ndarray(shape=(len,), dtype=uint8, buffer=...) cannot take
      // a raw address: pybind11 makes the array with `owner` as its base.
      py::array bytes(py::dtype::of<std::uint8_t>(), {static_cast<py::ssize_t>(pe.entry.len)},
                      {py::ssize_t{1}}, pe.source.data, owner);
      PyObject* mv = PyMemoryView_FromObject(bytes.ptr());
      if (mv == nullptr) throw py::error_already_set();
      item = py::reinterpret_steal<py::object>(mv);
    } else {
      missing.append(i);
    }
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), item.release().ptr());
  }
  return py::make_tuple(std::move(out), std::move(owners), std::move(missing));
}

void write_blob(const py_plan& p, py::handle out) {
  with_out_buffer(out, [&](const held_buffer& b) {
    // Checked with the GIL held, right before the copy (storage_guard.hpp).
    for (const storage_guard& g : p.guards) check_storage(g.storage, p.plan.entries[g.entry]);
    result<std::uint64_t> r = [&] {
      gil_released nogil;  // the copy touches no Python object
      return write(p.plan, b.writable_bytes());
    }();
    unwrap(std::move(r));
  });
}

void write_blob_tail(const py_plan& p, py::handle out) {
  with_out_buffer(out, [&](const held_buffer& b) { unwrap(write_tail(p.plan, b.writable_bytes())); });
}

// The built-in exception the reference's read_index raises on a blob whose
// index blobpipe finds malformed, judged from the index's msgpack as the
// reference unpacks it: `for k, o, n, kind, d, s in rows` then
// `tuple(s) if s is not None`, row by row. A row or index that is no
// iterable, or a shape that is none, is a TypeError there; a row that is
// not 6 items a ValueError (FormatError already is one); bytes msgspec
// cannot decode are msgspec's own error (none here).
also_builtin reference_index_error(std::span<const std::byte> index) {
  msgpack::object_handle oh;
  try {
    const auto n = index.size();
    oh = msgpack::unpack(reinterpret_cast<const char*>(index.data()), n, nullptr, nullptr,
                         msgpack::unpack_limit(n, n, n, n, n, 64));
  } catch (...) {
    return also_builtin::none;
  }
  using msgpack::type::object_type;
  auto iterable = [](const msgpack::object& o) {
    return o.type == object_type::ARRAY || o.type == object_type::MAP ||
           o.type == object_type::STR || o.type == object_type::BIN;
  };
  // Row `r` unpacked into six names, then tuple(shape): how it ends.
  enum class row { ok, value_error, type_error };
  auto row_outcome = [&](const msgpack::object& r) {
    const msgpack::object* shape = nullptr;
    switch (r.type) {
      case object_type::ARRAY:
        if (r.via.array.size != 6) return row::value_error;
        shape = &r.via.array.ptr[5];
        break;
      case object_type::MAP:
        if (r.via.map.size != 6) return row::value_error;
        shape = &r.via.map.ptr[5].key;
        break;
      case object_type::STR: {  // six 1-char strs, or a ValueError
        std::size_t chars = 0;
        for (std::uint32_t i = 0; i < r.via.str.size; ++i)
          chars += (static_cast<unsigned char>(r.via.str.ptr[i]) & 0xC0) != 0x80;
        return chars == 6 ? row::ok : row::value_error;
      }
      case object_type::BIN:  // six ints: tuple(int) fails
        return r.via.bin.size == 6 ? row::type_error : row::value_error;
      default: return row::type_error;  // cannot unpack a non-iterable
    }
    if (shape->type != object_type::NIL && !iterable(*shape)) return row::type_error;
    return row::ok;
  };
  const msgpack::object& root = oh.get();
  switch (root.type) {
    case object_type::ARRAY:
      for (std::uint32_t i = 0; i < root.via.array.size; ++i) {
        const row o = row_outcome(root.via.array.ptr[i]);
        if (o == row::type_error) return also_builtin::type_error;
        if (o == row::value_error) return also_builtin::none;  // the reference stops there
      }
      return also_builtin::none;
    case object_type::MAP:
    case object_type::STR: return also_builtin::none;  // unusual; left as FormatError
    case object_type::BIN:
      return root.via.bin.size > 0 ? also_builtin::type_error : also_builtin::none;
    default: return also_builtin::type_error;  // iterating a non-iterable
  }
}

py::list read_blob_index(py::handle blob) {
  const held_buffer b(blob, false);
  result<blob_index> r = [&] {
    gil_released nogil;
    return read_index(b.bytes());
  }();
  if (!r && r.err().code == errc::malformed_index) {
    auto f = read_footer(b.bytes());  // the index range was checked before parsing
    if (f && std::uint64_t{f->index_off} + f->index_len <= b.bytes().size())
      raise(r.err(), reference_index_error(b.bytes().subspan(f->index_off, f->index_len)));
  }
  return entry_list(std::move(unwrap(std::move(r)).entries));
}

py::list read_blob_index_file(py::handle f, std::uint64_t off, std::uint64_t nbytes) {
  const module_state& s = state();
  if (py::isinstance<py::str>(f) || py::isinstance<py::bytes>(f) ||
      py::isinstance(f, s.os_pathlike)) {
    const std::string path = py::cast<std::string>(s.os_fsencode(f));
    result<blob_index> r = [&] {
      gil_released nogil;
      return read_index_file(path, off, nbytes);
    }();
    return entry_list(std::move(unwrap(std::move(r)).entries));
  }
  if (!py::hasattr(f, "read") || !py::hasattr(f, "seek"))
    throw py::type_error(
        "read_index_file: f must be a path (str, bytes, os.PathLike) or a binary file object "
        "with read() and seek(), not " +
        std::string(py::str(py::type::handle_of(f).attr("__name__"))));
  python_file_stream stream(f);
  result<blob_index> r = read_index_file(stream.get(), off, nbytes);
  stream.rethrow_pending();
  return entry_list(std::move(unwrap(std::move(r)).entries));
}

// ---- the hot calls, as CPython fastcall functions: pybind11's dispatch
// (argument conversion, keyword matching) costs more than the work.

const Entry& entry_arg(PyObject* e, const char* fn) {
  // An Entry itself: its C++ value sits in the object (entry.hpp).
  if (is_exact_entry(e)) return *entry_value(e);
  const Entry* v = entry_value(e);
  if (v == nullptr)
    throw py::type_error(std::string(fn) + ": e must be a blobpipe.Entry, not " +
                         Py_TYPE(e)->tp_name);
  // An Entry made with fields no index holds (blobpipe._LooseEntry keeps
  // them in _fields, its native part a placeholder), unless they read as
  // one (numpy integers, a list shape: _index_row, its native part).
  if (PyObject_HasAttrString(e, "_fields") && !PyObject_HasAttrString(e, "_index_row"))
    raise(errc::invalid_argument, std::string(fn) + ": no blob index holds the row " +
                                      std::string(py::repr(e)).substr(0, 200));
  return *v;
}

// Arguments of a fastcall function (names..., *, allow_pickle=True): the
// named ones by position or keyword, allow_pickle by keyword only (when
// `takes_allow_pickle`). Fills `out` (borrowed) and returns allow_pickle.
template <std::size_t N>
bool parse_args(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, const char* fn,
                const std::array<const char*, N>& names, std::array<PyObject*, N>& out,
                bool takes_allow_pickle) {
  if (nargs > static_cast<Py_ssize_t>(N))
    throw py::type_error(std::string(fn) + "() takes " + std::to_string(N) +
                         " positional arguments but " + std::to_string(nargs) + " were given");
  out.fill(nullptr);
  for (Py_ssize_t i = 0; i < nargs; ++i) out[static_cast<std::size_t>(i)] = args[i];
  bool allow = true;
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    PyObject* value = args[nargs + i];
    if (takes_allow_pickle && PyUnicode_CompareWithASCIIString(name, "allow_pickle") == 0) {
      const int t = PyObject_IsTrue(value);
      if (t < 0) throw py::error_already_set();
      allow = t != 0;
      continue;
    }
    bool found = false;
    for (std::size_t k = 0; k < N && !found; ++k) {
      if (PyUnicode_CompareWithASCIIString(name, names[k]) != 0) continue;
      if (out[k] != nullptr)
        throw py::type_error(std::string(fn) + "() got multiple values for argument '" +
                             names[k] + "'");
      out[k] = value;
      found = true;
    }
    if (!found)
      throw py::type_error(std::string(fn) + "() got an unexpected keyword argument '" +
                           py::str(name).cast<std::string>() + "'");
  }
  for (std::size_t k = 0; k < N; ++k)
    if (out[k] == nullptr)
      throw py::type_error(std::string(fn) + "() missing required argument '" + names[k] + "'");
  return allow;
}

PyObject* decode_entry_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                            PyObject* kwnames) {
  return guarded([&] {
    std::array<PyObject*, 2> a;
    const bool allow = parse_args(args, nargs, kwnames, "decode_entry",
                                  std::array<const char*, 2>{"view", "e"}, a, true);
    const Entry& e = entry_arg(a[1], "decode_entry");
    held_buffer b(a[0], false);
    python_call decoding;  // torch and pickle may release the GIL (runtime.hpp)
    return decode_entry_bytes(a[0], b.bytes(), e, allow, -1);
  });
}

PyObject* read_index_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&] {
    std::array<PyObject*, 1> a;
    parse_args(args, nargs, kwnames, "read_index", std::array<const char*, 1>{"blob"}, a, false);
    return py::object(read_blob_index(a[0]));
  });
}

PyObject* decode_entries_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kwnames) {
  return guarded([&] {
    std::array<PyObject*, 2> a;
    const bool allow = parse_args(args, nargs, kwnames, "decode_entries",
                                  std::array<const char*, 2>{"blob", "entries"}, a, true);
    held_buffer b(a[0], false);
    py::object seq = py::reinterpret_steal<py::object>(
        PySequence_Fast(a[1], "decode_entries: entries must be a sequence of Entry"));
    if (!seq) throw py::error_already_set();
    // es points into the Entry objects: read from a copy of a list, which
    // the code a decode runs (an unpickle, another thread) may change.
    if (PyList_Check(seq.ptr())) {
      seq = py::reinterpret_steal<py::object>(PyList_AsTuple(seq.ptr()));
      if (!seq) throw py::error_already_set();
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    std::vector<const Entry*> es(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      const Entry& e = entry_arg(items[i], "decode_entries");
      // Where the bytes are, checked as the format library's decode_entry.
      if (e.off > b.bytes().size() || e.len > b.bytes().size() - e.off)
        unwrap(decode_entry(b.bytes(), e));  // raises entry_out_of_range
      es[static_cast<std::size_t>(i)] = &e;
    }
    py::list out(n);
    python_call decoding_all;  // torch and pickle may release the GIL (runtime.hpp)
    for (std::size_t i = 0; i < es.size();) {
      // A run of like entries (same kind, dtype and shape at a constant
      // stride, as plan() lays out a batch of samples) is one strided array,
      // split into its rows by numpy or torch in C: views as decode_entry
      // gives them, without a call per entry here.
      if (std::size_t k = decode_run(a[0], b.bytes(), es, i, out); k > 0) {
        i += k;
        continue;
      }
      const Entry& e = *es[i];
      py::object v = decode_entry_bytes(a[0], b.bytes().subspan(e.off, e.len), e, allow,
                                        static_cast<Py_ssize_t>(e.off));
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), v.release().ptr());
      ++i;
    }
    return py::object(std::move(out));
  });
}

PyObject* materialize_fast(PyObject*, PyObject* const* fargs, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&] {
    std::array<PyObject*, 1> a;
    parse_args(fargs, nargs, kwnames, "materialize", std::array<const char*, 1>{"v"}, a, false);
    PyObject* v = a[0];
    const module_state& s = state();
    PyTypeObject* t = Py_TYPE(v);
    PyObject* args[] = {v};
    python_call copying;  // clone() and copy() may release the GIL (runtime.hpp)
    const torch_state* torch = torch_if_loaded();  // a tensor exists only once torch does
    if (torch && PyObject_TypeCheck(v, reinterpret_cast<PyTypeObject*>(torch->tensor_type.ptr())))
      return steal_checked(PyObject_VectorcallMethod(s.s_clone.ptr(), args,
                                                    1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
    if (PyObject_TypeCheck(v, reinterpret_cast<PyTypeObject*>(s.np_ndarray.ptr())) ||
        t == reinterpret_cast<PyTypeObject*>(s.raw_entry.ptr()))
      return steal_checked(PyObject_VectorcallMethod(s.s_copy.ptr(), args,
                                                    1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
    return py::reinterpret_borrow<py::object>(v);
  });
}

constexpr const char* decode_entry_doc = R"(decode_entry(view, e, *, allow_pickle=True)
--

Rebuilds an entry's value from its bytes; tensors and arrays are zero-copy
views of ``view`` (which they keep alive), as in the reference.

- kind ``t``: a ``torch.Tensor`` of ``e.dtype`` (any name torch has for
  it: ``float``, ``chalf``...) and ``e.shape`` (made with
  ``torch.from_numpy`` of a numpy view: the tensor ``torch.frombuffer``
  would give, at less cost; an empty entry gives ``torch.empty(shape)``).
  Without torch, or when torch lacks the dtype (torch 1.13 has no
  ``uint16/32/64`` or ``float8_*``), a ``numpy.ndarray`` of that dtype
  where numpy has it, else a ``RawEntry`` (``bfloat16``/``complex32``
  without torch; ``float8_*``); quantized dtypes (``quint8``, ``qint8``,
  ``qint32``, ``quint4x2``, ``quint2x4``) always give a ``RawEntry`` of
  their integers (the blob has no scale or zero point; the reference's
  ``torch.frombuffer`` crashes torch 1.13 on them). Never another dtype.
- kind ``n``: ``numpy.frombuffer(view, numpy.dtype(e.dtype))`` reshaped to
  ``e.shape`` (byte order as stored); a ``RawEntry`` if this numpy cannot
  build the dtype.
- kind ``p``: ``pickle.loads(view)``; with ``allow_pickle=False`` the
  pickle's ``bytes`` instead. Unpickling runs code chosen by whoever wrote
  the blob: pass ``allow_pickle=False`` for bytes from a peer you do not
  trust, and unpickle only what you decide to.

Args:
    view: exactly the entry's ``e.len`` bytes (e.g.
        ``memoryview(blob)[e.off : e.off + e.len]``), any C-contiguous buffer.
    e: the entry (a ``blobpipe.Entry``), from ``read_index`` or
        ``Entry.from_meta``.

Raises:
    FormatError: ``entry_out_of_range`` (``view`` is not ``e.len`` bytes),
        ``shape_mismatch``, ``unknown_kind``, ``unknown_dtype``. Where the
        reference raises a built-in error for the same input the error is
        also one: ``FormatRuntimeError`` for tensor bytes that are whole
        elements but not the shape's number (torch's ``view``),
        ``FormatTypeError`` for a numpy dtype string numpy cannot parse.
    BufferTypeError (a BufferError and a TypeError): ``view`` is not
        C-contiguous.
    TypeError: ``view`` has no buffer protocol, ``e`` is no ``Entry``.
    Whatever unpickling raises (kind ``p`` with ``allow_pickle``).

Source: decode_entry (Python reference).)";

constexpr const char* read_index_doc = R"(read_index(blob)
--

The entries of a whole blob held in memory, in index order.

Reads the footer (v3, or legacy v2) and the index, and checks every row
before returning (``docs/format.md``, "Validation order"): the entries
lie inside the data region, 64-byte aligned, with known kinds and
dtypes and ``prod(shape) * itemsize == len``. Entry bytes are not read.

Args:
    blob: the blob's bytes (any C-contiguous buffer: bytes, bytearray,
        memoryview, numpy array, mmap), ending with its footer.

Returns:
    A list of ``Entry``, one per index row.

Raises:
    FormatError: ``too_small``, ``bad_footer``, ``index_out_of_range``,
        ``malformed_index``, ``entry_out_of_range``, ``shape_mismatch``,
        ``unknown_kind``, ``unknown_dtype``. A ``malformed_index`` whose
        index, row or shape is no list, where the reference raises
        TypeError, is a ``FormatTypeError`` (also a TypeError).
    BufferTypeError (a BufferError and a TypeError): ``blob`` is not
        C-contiguous. TypeError: ``blob`` has no buffer protocol.

Source: read_index (Python reference).)";

constexpr const char* decode_entries_doc = R"(decode_entries(blob, entries, *, allow_pickle=True)
--

``[decode_entry(memoryview(blob)[e.off : e.off + e.len], e, allow_pickle=...)
for e in entries]`` in one call: the values of the entries of a whole blob
held in memory (any C-contiguous buffer), views of ``blob`` (kept alive by
them) where ``decode_entry`` gives views. One difference: the tensors of a
run of like entries (4 or more of one dtype and shape at a constant
stride) are rows of one tensor, so they share its storage, which spans the
whole run: ``torch.save``, pickling or sending one of them to another
process carries the run's bytes. ``materialize`` a value to keep it alone.

Args:
    blob: the whole blob (offsets in ``entries`` are from its start, bytes).
    entries: a sequence of ``Entry``, e.g. ``read_index(blob)``.

Raises:
    FormatError: ``entry_out_of_range`` for an entry that runs past
        ``blob``; otherwise as ``decode_entry``, for the first entry that
        fails (no list is returned then).
    BufferTypeError (a BufferError and a TypeError): ``blob`` is not
        C-contiguous.
    TypeError: ``blob`` has no buffer protocol; ``entries`` is not a
        sequence of ``Entry``.

blobpipe's own call (the reference has none).)";

constexpr const char* materialize_doc = R"(materialize(v)
--

A copy of a decoded value that no longer views the blob's buffer:
``clone()`` of a tensor, ``copy()`` of a numpy array or ``RawEntry``; other
values (unpickled objects, bytes) are already their own and are returned
as they are. torch and numpy release the GIL for large copies.

Source: materialize (Python reference).)";

PyMethodDef fast_methods[] = {
    {"read_index", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(read_index_fast)),
     METH_FASTCALL | METH_KEYWORDS, read_index_doc},
    {"decode_entry", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(decode_entry_fast)),
     METH_FASTCALL | METH_KEYWORDS, decode_entry_doc},
    {"decode_entries",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(decode_entries_fast)),
     METH_FASTCALL | METH_KEYWORDS, decode_entries_doc},
    {"materialize", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(materialize_fast)),
     METH_FASTCALL | METH_KEYWORDS, materialize_doc},
    {nullptr, nullptr, 0, nullptr}};

py::object tag_of(py::handle tail) {
  held_buffer b(tail, false);
  auto t = footer_tag(b.bytes());
  return t ? py::object(tag_bytes(*t)) : py::object(py::none());
}

}  // namespace

void init_codec(py::module_& m) {
  m.attr("ALIGN") = ALIGN;
  m.attr("MAGIC") = MAGIC;
  m.attr("VERSION") = VERSION;
  m.attr("FOOTER_SIZE") = FOOTER_SIZE;
  m.attr("FOOTER_V2_SIZE") = FOOTER_V2_SIZE;
  m.attr("NO_TAG") = tag_bytes(NO_TAG);
  // A caller's plan's footer (_plan.py) takes its tag as plan() does.
  m.def("_tag_bytes", [](py::handle tag) { return tag_bytes(tag_from(tag)); }, py::arg("tag"));
  m.attr("KIND_TENSOR") = std::string(1, KIND_TENSOR);
  m.attr("KIND_NUMPY") = std::string(1, KIND_NDARRAY);
  m.attr("KIND_PICKLE") = std::string(1, KIND_PICKLE);

  init_entry(m);

  py::class_<py_plan>(m, "_NativePlan",
                      R"(A blob's layout, made by plan(); write() fills a buffer from it.

It holds the planned values (or their host copies and pickles) until it is
dropped, so that write() can copy them later.
  keys:        the keys, str(key) each (list[str]).
  entries:     the index rows (list[Entry]).
  index_bytes: the msgpack index (bytes).
  nbytes:      size of the whole blob, bytes.
  tag:         the 16-byte tag (bytes).
  index_off:   offset of the index from the blob's start, bytes
               (nbytes - FOOTER_SIZE - len(index_bytes)).
Source: BlobPlan (Python reference); blobpipe/format/layout.hpp.)")
      .def_property_readonly("keys",
                             [](py_plan& p) {
                               if (!p.keys_cache) {
                                 py::list l;
                                 for (const auto& pe : p.plan.entries)
                                   l.append(py::str(pe.entry.key));
                                 p.keys_cache = l;
                               }
                               return p.keys_cache;
                             })
      .def_property_readonly("entries",
                             [](py_plan& p) {
                               if (!p.entries_cache) {
                                 std::vector<Entry> rows;
                                 rows.reserve(p.plan.entries.size());
                                 for (const auto& pe : p.plan.entries) rows.push_back(pe.entry);
                                 p.entries_cache = entry_list(std::move(rows));
                               }
                               return p.entries_cache;
                             })
      .def_property_readonly("index_bytes",
                             [](const py_plan& p) {
                               return py::bytes(reinterpret_cast<const char*>(p.plan.index.data()),
                                                p.plan.index.size());
                             })
      .def_property_readonly("nbytes", [](const py_plan& p) { return p.plan.nbytes; })
      .def_property_readonly("tag", [](const py_plan& p) { return tag_bytes(p.plan.tag); })
      .def_property_readonly("index_off", [](const py_plan& p) { return p.plan.index_off(); })
      .def("__len__", [](const py_plan& p) { return p.plan.entries.size(); })
      .def("_buffers", &plan_buffers)
      .def("__repr__", [](const py_plan& p) {
        return "BlobPlan(" + std::to_string(p.plan.entries.size()) +
               " entries, nbytes=" + std::to_string(p.plan.nbytes) +
               ", tag=" + tag_hex(p.plan.tag) + ")";
      });

  m.def("plan", &plan_values, py::arg("keys"), py::arg("values"),
        py::arg("tag") = tag_bytes(NO_TAG));
  m.def("write", &write_blob, py::arg("p"), py::arg("out"));
  m.def("write_tail", &write_blob_tail, py::arg("p"), py::arg("out"));
  m.def("read_index_file", &read_blob_index_file, py::arg("f"), py::arg("off") = 0,
        py::arg("nbytes") = 0);
  for (PyMethodDef* d = fast_methods; d->ml_name != nullptr; ++d) {
    py::object f = py::reinterpret_steal<py::object>(PyCFunction_NewEx(d, nullptr, m.attr("__name__").ptr()));
    if (!f) throw py::error_already_set();
    m.attr(d->ml_name) = f;
  }
  m.def(
      "footer_is_valid",
      [](py::handle tail) {
        held_buffer b(tail, false);
        return footer_is_valid(b.bytes());
      },
      py::arg("blob_tail"));
  m.def("footer_tag", &tag_of, py::arg("tail"));
  m.def(
      "_entries",
      [](py::handle raw) {
        held_buffer b(raw, false);
        return entry_list(unwrap(parse_index(b.bytes(), UINT64_MAX)));
      },
      py::arg("raw"));
}

}  // namespace blobpipe::python
