// blobpipe.Entry as a plain CPython type (entry.hpp says why and how).
#include "entry.hpp"

#include <structmember.h>

#include <array>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "buffer.hpp"
#include "errors.hpp"
#include "state.hpp"  // namespace py

namespace blobpipe::python {
namespace {

// Standard layout (offsetof of weakrefs for the type's members): the Entry
// lives in `storage`, placement-new'd when the object is made and
// destroyed by dealloc.
struct entry_pyobject {
  PyObject_HEAD
  PyObject* weakrefs;  // weakly referenceable, as pybind11's instances and the dataclass
  // Made by Entry.__new__(cls) without fields (copyreg's __newobj__ when
  // unpickling an Entry pickled by __getstate__/__setstate__, and
  // _LooseEntry._make): holds a placeholder that no blob index holds (off
  // 2**64-1) until __setstate__ fills it, once.
  bool bare;
  alignas(Entry) unsigned char storage[sizeof(Entry)];

  Entry& value() noexcept { return *std::launder(reinterpret_cast<Entry*>(storage)); }
};

static_assert(std::is_nothrow_move_constructible_v<Entry>);

// Owned by the module (its attribute), which outlives every instance.
PyTypeObject* entry_type = nullptr;

constexpr std::array<const char*, 6> field_names = {"key", "off", "len", "kind", "dtype", "shape"};

entry_pyobject* self_of(PyObject* o) { return reinterpret_cast<entry_pyobject*>(o); }
const Entry& value_of(PyObject* o) { return self_of(o)->value(); }

// The placeholder of a bare Entry: off 2**64-1 lies past any blob.
Entry placeholder() { return Entry{"", UINT64_MAX, 0, 'p', std::nullopt, std::nullopt}; }

// ---- the fields as Python objects, made on each read

PyObject* utf8_str(const std::string& s) {
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), nullptr);
}

py::object shape_or_none(const std::optional<shape_t>& s) {
  if (!s) return py::none();
  py::tuple t(s->size());
  for (std::size_t i = 0; i < s->size(); ++i)
    PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i),
                     steal_checked(PyLong_FromLongLong((*s)[i])).release().ptr());
  return t;
}

py::object field_key(const Entry& e) { return steal_checked(utf8_str(e.key)); }
py::object field_off(const Entry& e) { return steal_checked(PyLong_FromUnsignedLongLong(e.off)); }
py::object field_len(const Entry& e) { return steal_checked(PyLong_FromUnsignedLongLong(e.len)); }
py::object field_kind(const Entry& e) {
  return steal_checked(PyUnicode_FromStringAndSize(&e.kind, 1));
}
py::object field_dtype(const Entry& e) {
  return e.dtype ? steal_checked(utf8_str(*e.dtype)) : py::object(py::none());
}
py::object field_shape(const Entry& e) { return shape_or_none(e.shape); }

template <py::object (*Field)(const Entry&)>
PyObject* get_field(PyObject* self, void*) {
  return guarded([&] { return Field(value_of(self)); });
}

// (key, off, len, kind, dtype, shape): what the dataclass hashes, pickles.
py::tuple fields_tuple(const Entry& e) {
  return py::make_tuple(field_key(e), field_off(e), field_len(e), field_kind(e), field_dtype(e),
                        field_shape(e));
}

// ---- fields from Python objects

// The Entry the six fields make when a blob index could hold them: key a
// str, off and len ints in 0..2**64-1, kind one ASCII character, dtype None
// or a str, shape None or a tuple of ints in int64 (exact types, as the
// dataclass keeps a bool or a list as given; keys and dtypes that UTF-8
// can encode). nullopt when they do not (no error set).
std::optional<Entry> index_row(PyObject* const* f) {
  auto text = [](PyObject* o) -> std::optional<std::string> {
    if (!PyUnicode_CheckExact(o)) return std::nullopt;
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(o, &n);
    if (p == nullptr) {  // a lone surrogate
      PyErr_Clear();
      return std::nullopt;
    }
    return std::string(p, static_cast<std::size_t>(n));
  };
  auto u64 = [](PyObject* o) -> std::optional<std::uint64_t> {
    if (!PyLong_CheckExact(o)) return std::nullopt;
    const unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {  // < 0 or >= 2**64
      PyErr_Clear();
      return std::nullopt;
    }
    return v;
  };
  Entry e;
  auto key = text(f[0]);
  auto off = u64(f[1]);
  auto len = u64(f[2]);
  if (!key || !off || !len) return std::nullopt;
  if (!PyUnicode_CheckExact(f[3]) || PyUnicode_GET_LENGTH(f[3]) != 1 ||
      PyUnicode_READ_CHAR(f[3], 0) >= 0x80)
    return std::nullopt;
  e.key = std::move(*key);
  e.off = *off;
  e.len = *len;
  e.kind = static_cast<char>(PyUnicode_READ_CHAR(f[3], 0));
  if (f[4] != Py_None) {
    auto dtype = text(f[4]);
    if (!dtype) return std::nullopt;
    e.dtype = std::move(*dtype);
  }
  if (f[5] != Py_None) {
    if (!PyTuple_CheckExact(f[5])) return std::nullopt;
    shape_t s;
    const Py_ssize_t n = PyTuple_GET_SIZE(f[5]);
    s.reserve(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* d = PyTuple_GET_ITEM(f[5], i);
      if (!PyLong_CheckExact(d)) return std::nullopt;
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(d, &overflow);
      if (overflow != 0) return std::nullopt;
      s.push_back(v);
    }
    e.shape = std::move(s);
  }
  return e;
}

// "'a'", "'a' and 'b'", "'a', 'b', and 'c'": how Python lists missing arguments.
std::string name_list(const std::vector<const char*>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += names.size() > 2 ? ", " : " ";
    if (i > 0 && i + 1 == names.size()) s += "and ";
    s += "'" + std::string(names[i]) + "'";
  }
  return s;
}

// The six fields of Entry(*args, **kwargs), borrowed, with the TypeErrors
// of the dataclass's generated __init__ (in CPython's order: keywords,
// then too many positional arguments, then missing ones).
std::array<PyObject*, 6> fields_of(PyObject* args, PyObject* kwargs) {
  std::array<PyObject*, 6> f{};
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  for (Py_ssize_t i = 0; i < nargs && i < 6; ++i)
    f[static_cast<std::size_t>(i)] = PyTuple_GET_ITEM(args, i);
  if (kwargs != nullptr) {
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
      std::size_t k = 0;
      while (k < 6 && !(PyUnicode_Check(name) &&
                        PyUnicode_CompareWithASCIIString(name, field_names[k]) == 0))
        ++k;
      if (k == 6)
        throw py::type_error("Entry.__init__() got an unexpected keyword argument " +
                             std::string(py::repr(name)));
      if (f[k] != nullptr)
        throw py::type_error(std::string("Entry.__init__() got multiple values for argument '") +
                             field_names[k] + "'");
      f[k] = value;
    }
  }
  if (nargs > 6)
    throw py::type_error("Entry.__init__() takes 7 positional arguments but " +
                         std::to_string(nargs + 1) + " were given");
  std::vector<const char*> missing;
  for (std::size_t k = 0; k < 6; ++k)
    if (f[k] == nullptr) missing.push_back(field_names[k]);
  if (!missing.empty())
    throw py::type_error("Entry.__init__() missing " + std::to_string(missing.size()) +
                         " required positional argument" + (missing.size() > 1 ? "s" : "") +
                         ": " + name_list(missing));
  return f;
}

// ---- making objects

// A new instance of `type` (Entry or a subclass) holding `e`.
py::object make_object(PyTypeObject* type, Entry&& e, bool bare) {
  PyObject* o;
  if (type == entry_type) {
    // Entry itself has no GC and no __dict__: PyType_GenericAlloc's
    // zeroing and GC checks are not needed.
    o = static_cast<PyObject*>(PyObject_Malloc(static_cast<std::size_t>(entry_type->tp_basicsize)));
    if (o == nullptr) throw std::bad_alloc();
    PyObject_Init(o, entry_type);  // takes a reference to the heap type
  } else {
    o = type->tp_alloc(type, 0);
    if (o == nullptr) throw py::error_already_set();
  }
  entry_pyobject* self = self_of(o);
  new (self->storage) Entry(std::move(e));  // noexcept (static_assert above)
  self->weakrefs = nullptr;
  self->bare = bare;
  return py::reinterpret_steal<py::object>(o);
}

// blobpipe._LooseEntry (python/src/blobpipe/__init__.py), looked up on the
// rare calls that need it.
py::object loose_class() { return py::module_::import("blobpipe").attr("_LooseEntry"); }

PyObject* entry_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  return guarded([&]() -> py::object {
    if (PyTuple_GET_SIZE(args) == 0 && (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0))
      return make_object(type, placeholder(), true);  // Entry() then fails in __init__
    std::array<PyObject*, 6> f = fields_of(args, kwargs);
    if (std::optional<Entry> row = index_row(f.data())) {
      // A row a blob index holds: an Entry, also from a _LooseEntry
      // (dataclasses.replace of one calls its class).
      const bool loose =
          type != entry_type && reinterpret_cast<PyObject*>(type) == loose_class().ptr();
      return make_object(loose ? entry_type : type, std::move(*row), false);
    }
    // Fields kept as given, as the dataclass does: a _LooseEntry.
    py::tuple fields(6);
    for (std::size_t k = 0; k < 6; ++k)
      PyTuple_SET_ITEM(fields.ptr(), static_cast<Py_ssize_t>(k),
                       py::reinterpret_borrow<py::object>(f[k]).release().ptr());
    return loose_class().attr("_make")(fields);
  });
}

// Fields were taken by __new__; Entry() alone is the dataclass's error.
int entry_init(PyObject*, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) == 0 && (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0)) {
    PyErr_SetString(PyExc_TypeError,
                    "Entry.__init__() missing 6 required positional arguments: 'key', 'off', "
                    "'len', 'kind', 'dtype', and 'shape'");
    return -1;
  }
  return 0;
}

void entry_dealloc(PyObject* o) {
  entry_pyobject* self = self_of(o);
  if (self->weakrefs != nullptr) PyObject_ClearWeakRefs(o);
  self->value().~Entry();
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);  // heap types are referenced by their instances
}

PyObject* entry_richcompare(PyObject* a, PyObject* b, int op) {
  // `a` is an Entry (this type's slot); the dataclass compares with its
  // own class only (a subclass's instance is not equal to an Entry's).
  if ((op != Py_EQ && op != Py_NE) || Py_TYPE(b) != Py_TYPE(a)) Py_RETURN_NOTIMPLEMENTED;
  const bool eq = value_of(a) == value_of(b);
  return PyBool_FromLong(eq == (op == Py_EQ));
}

Py_hash_t entry_hash(PyObject* o) {
  PyObject* t = guarded([&] { return py::object(fields_tuple(value_of(o))); });
  if (t == nullptr) return -1;
  const Py_hash_t h = PyObject_Hash(t);
  Py_DECREF(t);
  return h;
}

PyObject* entry_repr(PyObject* o) {
  return guarded([&] {
    py::tuple t = fields_tuple(value_of(o));
    // The class's qualified name, as the dataclass's repr (a subclass's own).
    const py::object name = steal_checked(PyType_GetQualName(Py_TYPE(o)));
    return steal_checked(PyUnicode_FromFormat(
        "%U(key=%R, off=%R, len=%R, kind=%R, dtype=%R, shape=%R)", name.ptr(), t[0].ptr(),
        t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(), t[5].ptr()));
  });
}

// ---- methods

py::dict entry_meta(const Entry& e) {
  py::dict d;
  d["o"] = field_off(e);
  d["n"] = field_len(e);
  d["k"] = field_kind(e);
  d["d"] = field_dtype(e);
  py::list s;
  if (e.shape)
    for (auto x : *e.shape) s.append(x);
  d["s"] = s;
  return d;
}

PyObject* meta_method(PyObject* self, PyObject*) {
  return guarded([&] { return py::object(entry_meta(value_of(self))); });
}

PyObject* meta_msgpack_method(PyObject* self, PyObject*) {
  return guarded([&] {
    auto m = value_of(self).meta();
    return py::object(py::bytes(reinterpret_cast<const char*>(m.data()), m.size()));
  });
}

PyObject* reduce_method(PyObject* self, PyObject*) {
  // Pickled (and copied) as the fields, made again by its class(*fields):
  // a subclass's instance stays one, as the dataclass's.
  return guarded([&] {
    return py::object(py::make_tuple(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(self))),
                                     fields_tuple(value_of(self))));
  });
}

// For pickles whose Entry was made by __new__ alone and then given its
// fields (pybind11's pickle protocol, which pickles of older blobpipe
// versions use), and for
// _LooseEntry._make: fills a bare Entry with a row a blob index holds.
PyObject* setstate_method(PyObject* self, PyObject* state) {
  return guarded([&]() -> py::object {
    entry_pyobject* s = self_of(self);
    if (!s->bare)
      throw py::type_error("Entry.__setstate__: the Entry already holds its fields (immutable)");
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 6)
      throw py::type_error("Entry.__setstate__: the state must be the six fields (a tuple)");
    std::optional<Entry> row = index_row(reinterpret_cast<PyTupleObject*>(state)->ob_item);
    if (!row)
      raise(errc::invalid_argument, "Entry.__setstate__: no blob index holds the row " +
                                        std::string(py::repr(state)).substr(0, 200));
    s->value() = std::move(*row);
    s->bare = false;
    return py::none();
  });
}

// The reference's from_meta: Entry(key, int(m["o"]), int(m["n"]), m["k"],
// m.get("d"), tuple(m.get("s") or ())), for a dict; msgpack bytes too.

std::optional<shape_t> shape_from(const py::object& s) {
  if (s.is_none()) return std::nullopt;
  shape_t out;
  for (py::handle d : s) {
    // operator.index first: its own error (not a TypeError or ValueError,
    // which are a malformed index) passes on as it is.
    if (PyIndex_Check(d.ptr()) && !PyLong_Check(d.ptr())) {
      const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(d.ptr()));
      if (!i) throw py::error_already_set();
      out.push_back(py::cast<std::int64_t>(i));
    } else {
      out.push_back(py::cast<std::int64_t>(d));
    }
  }
  return out;
}

char kind_from(const std::string& k) {
  if (k.size() != 1) raise(errc::unknown_kind, "kind '" + k.substr(0, 16) + "' is not t, n or p");
  return k[0];
}

Entry entry_from_meta_dict(std::string key, const py::dict& m) {
  for (const char* f : {"o", "n", "k"})
    if (!m.contains(f))  // the reference's m["o"] raises KeyError
      raise(errc::malformed_index, std::string("entry meta has no field '") + f + "'",
            also_builtin::key_error);
  Entry row;
  std::string kind;
  try {
    py::object d = m.contains("d") ? py::object(m["d"]) : py::object(py::none());
    py::object s = m.contains("s") ? py::object(m["s"]) : py::object(py::none());
    row.key = std::move(key);
    row.off = py::cast<std::uint64_t>(py::int_(m["o"]));
    row.len = py::cast<std::uint64_t>(py::int_(m["n"]));
    kind = py::cast<std::string>(m["k"]);
    if (!d.is_none()) row.dtype = py::cast<std::string>(d);
    row.shape = shape_from(py::bool_(s) ? s : py::tuple());
  } catch (py::cast_error& e) {
    raise(errc::malformed_index, std::string("entry meta: ") + e.what());
  } catch (py::error_already_set& e) {  // int() of something that is no number
    if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError)) throw;
    // int(None) is a TypeError, int("x") a ValueError, in the reference too.
    const bool type = e.matches(PyExc_TypeError);
    raise(errc::malformed_index, std::string("entry meta: ") + e.what(),
          type ? also_builtin::type_error : also_builtin::none);
  }
  row.kind = kind_from(kind);  // outside the try: unknown_kind is no int() failure
  return row;
}

Entry entry_from_meta(std::string key, py::handle m) {
  if (PyDict_Check(m.ptr()))
    return entry_from_meta_dict(std::move(key), py::reinterpret_borrow<py::dict>(m));
  held_buffer b(m, false);
  Entry e = unwrap(Entry::from_meta(std::move(key), b.bytes()));
  if (e.dtype && !is_utf8(*e.dtype))
    raise(errc::malformed_index, "entry meta: dtype is not valid UTF-8");
  // The reference's from_meta gives every entry a shape, () for a pickle.
  if (!e.shape) e.shape = shape_t{};
  return e;
}

/// Whether `key` and meta `m` are what an index row holds as strings: the
/// key a str, and, for a dict, its kind a str and its dtype None or a str.
bool meta_strings_fit(PyObject* key, PyObject* m) {
  if (!PyUnicode_CheckExact(key)) return false;
  if (!PyDict_Check(m)) return true;
  PyObject* k = PyDict_GetItemString(m, "k");  // borrowed; absent: refused below
  PyObject* d = PyDict_GetItemString(m, "d");
  return (k == nullptr || PyUnicode_CheckExact(k)) &&
         (d == nullptr || d == Py_None || PyUnicode_CheckExact(d));
}

PyObject* from_meta_method(PyObject*, PyObject* args, PyObject* kwargs) {
  return guarded([&] {
    static const char* names[] = {"key", "m", nullptr};
    PyObject *key, *m;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:from_meta", const_cast<char**>(names), &key,
                                     &m))
      throw py::error_already_set();
    if (!meta_strings_fit(key, m) && !PyObject_CheckBuffer(m)) {
      // Fields no index holds (a bytes key, a bytes kind): kept as given,
      // as the reference's from_meta does, by Entry(...) (a _LooseEntry).
      py::handle meta(m);
      py::object s = meta.attr("get")("s");
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(entry_type))(
          py::handle(key), py::int_(meta["o"]), py::int_(meta["n"]), meta["k"],
          meta.attr("get")("d"), py::tuple(py::bool_(s) ? s : py::tuple()));
    }
    if (!PyUnicode_CheckExact(key))  // with a meta's msgpack bytes (no reference form)
      throw py::type_error(std::string("from_meta: key must be a str, not ") +
                           Py_TYPE(key)->tp_name);
    return entry_object(entry_from_meta(py::cast<std::string>(key), m));
  });
}

PyObject* entry_fits(PyObject*, PyObject* args) {
  std::array<PyObject*, 6> f{};
  if (!PyArg_UnpackTuple(args, "_entry_fits", 6, 6, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]))
    return nullptr;
  return guarded([&] { return py::object(py::bool_(index_row(f.data()).has_value())); });
}

PyGetSetDef getset[] = {
    {"key", get_field<field_key>, nullptr, "The entry's name (str).", nullptr},
    {"off", get_field<field_off>, nullptr,
     "Offset of its bytes from the blob's start, bytes (int, a multiple of ALIGN).", nullptr},
    {"len", get_field<field_len>, nullptr, "Length of its bytes, bytes (int).", nullptr},
    {"kind", get_field<field_kind>, nullptr,
     "'t' (torch tensor), 'n' (numpy array) or 'p' (pickle).", nullptr},
    {"dtype", get_field<field_dtype>, nullptr,
     "torch's name ('float32') for 't', numpy's dtype.str ('<f4') for 'n', None for 'p'.",
     nullptr},
    {"shape", get_field<field_shape>, nullptr,
     "Elements per dimension (tuple of int), None for 'p'.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef methods[] = {
    {"meta", meta_method, METH_NOARGS,
     "meta()\n--\n\nThe location map {'o': off, 'n': len, 'k': kind, 'd': dtype, 's': "
     "list(shape or ())},\nas the reference returns it (a dict)."},
    {"meta_msgpack", meta_msgpack_method, METH_NOARGS,
     "meta_msgpack()\n--\n\nmeta() as msgpack bytes, as blobpipe's C++ library and the reference "
     "encode it."},
    {"from_meta", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(from_meta_method)),
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "from_meta(key, m)\n--\n\nThe entry named `key` of a meta map `m`: a dict as meta() returns, "
     "or its\nmsgpack bytes. As the reference, shape is tuple(m['s'] or ()): () for a pickle.\n"
     "A key, kind or dtype no index holds (bytes, say) is kept as given, as the reference\n"
     "keeps it.\nRaises FormatError: malformed_index (a field missing or of the wrong type),\n"
     "unknown_kind; TypeError for msgpack bytes with a key that is not a str."},
    {"__reduce__", reduce_method, METH_NOARGS, "(Entry, the six fields): pickled as the fields."},
    {"__setstate__", setstate_method, METH_O,
     "Fills an Entry made by Entry.__new__(Entry) alone (pickles of that protocol) with the six "
     "fields.\nRaises TypeError on an Entry that holds its fields; FormatError "
     "invalid_argument for fields no blob index holds."},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(entry_pyobject, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

const char* const doc = R"(One row of a blob's index: Entry(key, off, len, kind, dtype, shape).

Immutable, hashable and picklable, like the reference's frozen dataclass:
assigning or deleting an attribute raises dataclasses.FrozenInstanceError.
As the dataclass, it takes any value for any field; fields no blob index
holds (key not a str, off or len not an int in 0..2**64-1, kind not one
ASCII character, dtype not None or a str, shape not None or a tuple of
ints) are kept as given, and decode_entry refuses that Entry (FormatError
invalid_argument).
  key:   the entry's name (str).
  off:   offset of its bytes from the blob's start, bytes (a multiple of ALIGN).
  len:   length of its bytes, bytes.
  kind:  "t" (torch tensor), "n" (numpy array) or "p" (pickle).
  dtype: torch's name ("float32") for "t", numpy's dtype.str ("<f4") for
         "n", None for "p" (a "t" row without dtype is float32).
  shape: elements per dimension (a tuple), None for "p".
Raises TypeError for missing, repeated or unknown arguments, as the
dataclass's __init__.
Source: Entry (Python reference); blobpipe/format/entry.hpp.)";

PyType_Slot slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&entry_new)},
    {Py_tp_init, reinterpret_cast<void*>(&entry_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&entry_dealloc)},
    {Py_tp_richcompare, reinterpret_cast<void*>(&entry_richcompare)},
    {Py_tp_hash, reinterpret_cast<void*>(&entry_hash)},
    {Py_tp_repr, reinterpret_cast<void*>(&entry_repr)},
    {Py_tp_getset, getset},
    {Py_tp_methods, methods},
    {Py_tp_members, members},
    {Py_tp_doc, const_cast<char*>(doc)},
    {0, nullptr},
};

PyType_Spec spec = {
    "blobpipe._blobpipe.Entry",
    static_cast<int>(sizeof(entry_pyobject)),
    0,
    // BASETYPE: blobpipe._LooseEntry is a Python subclass.
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    slots,
};

PyMethodDef module_functions[] = {
    {"_entry_fits", entry_fits, METH_VARARGS,
     "_entry_fits(key, off, len, kind, dtype, shape)\n--\n\nWhether a blob index can hold the "
     "row: the fields a native Entry keeps (bool)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool is_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    std::size_t n;
    unsigned lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (static_cast<std::size_t>(end - p) <= n) return false;
    if (p[1] < lo || p[1] > hi) return false;
    for (std::size_t i = 2; i <= n; ++i)
      if (p[i] < 0x80 || p[i] > 0xBF) return false;
    p += n + 1;
  }
  return true;
}

py::object entry_object(Entry&& e) { return make_object(entry_type, std::move(e), false); }

py::list entry_list(std::vector<Entry>&& entries) {
  for (const Entry& e : entries)
    if (!is_utf8(e.key) || (e.dtype && !is_utf8(*e.dtype)))
      raise(errc::malformed_index, "an index row's key or dtype is not valid UTF-8");
  py::list out(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i)  // moved: no string copies
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i),
                    entry_object(std::move(entries[i])).release().ptr());
  return out;
}

const Entry* entry_value(PyObject* o) noexcept {
  if (Py_TYPE(o) == entry_type || PyObject_TypeCheck(o, entry_type)) return &value_of(o);
  return nullptr;
}

bool is_exact_entry(PyObject* o) noexcept { return Py_TYPE(o) == entry_type; }

PyTypeObject* entry_type_object() noexcept { return entry_type; }

void init_entry(py::module_& m) {
  auto type = py::reinterpret_steal<py::object>(PyType_FromSpec(&spec));
  if (!type) throw py::error_already_set();
  entry_type = reinterpret_cast<PyTypeObject*>(type.ptr());
  m.add_object("Entry", type);
  for (PyMethodDef* d = module_functions; d->ml_name != nullptr; ++d) {
    py::object f = steal_checked(PyCFunction_NewEx(d, nullptr, m.attr("__name__").ptr()));
    m.attr(d->ml_name) = f;
  }
}

}  // namespace blobpipe::python
