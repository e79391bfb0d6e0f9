// The codec with the reference's names (nemo_rl.data_plane.nixl.blob_format):
// constants, Entry, BlobPlan, plan, write, write_tail, read_index,
// read_index_file, decode_entry, footer_is_valid, footer_tag. The classes
// carry their docstrings here; the functions are re-exported with theirs by
// python/src/blobpipe/__init__.py, and typed in _blobpipe.pyi.
#include "codec.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "blobpipe/format.hpp"
#include "buffer.hpp"
#include "decode.hpp"
#include "encode.hpp"
#include "errors.hpp"
#include "file_source.hpp"
#include "state.hpp"
#include "storage_guard.hpp"
#include "tags.hpp"

namespace blobpipe::python {
namespace {

// A plan and the Python objects whose memory its values borrow.
struct py_plan {
  BlobPlan plan;
  std::vector<py::object> keep;
  std::vector<storage_guard> guards;  // torch tensors' storages, checked by write()
  py::object keys_cache, entries_cache;  // built on first access
};

py::object optional_str(const std::optional<std::string>& s) {
  return s ? py::object(py::str(*s)) : py::object(py::none());
}

py::object shape_or_none(const std::optional<shape_t>& s) {
  if (!s) return py::none();
  py::tuple t(s->size());
  for (std::size_t i = 0; i < s->size(); ++i) t[i] = py::int_((*s)[i]);
  return t;
}

std::optional<shape_t> shape_from(const py::object& s) {
  if (s.is_none()) return std::nullopt;
  shape_t out;
  for (py::handle d : s) out.push_back(py::cast<std::int64_t>(d));
  return out;
}

char kind_from(const std::string& k) {
  if (k.size() != 1) raise(errc::unknown_kind, "kind '" + k.substr(0, 16) + "' is not t, n or p");
  return k[0];
}

Entry make_entry(std::string key, std::uint64_t off, std::uint64_t len, const std::string& kind,
                 std::optional<std::string> dtype, const py::object& shape) {
  return Entry{std::move(key), off, len, kind_from(kind), std::move(dtype), shape_from(shape)};
}

bool is_utf8(const std::string& s) {
  PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  if (u == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(u);
  return true;
}

// Entry.from_meta(key, m) for the reference's dict: Entry(key, int(m["o"]),
// int(m["n"]), m["k"], m.get("d"), tuple(m.get("s") or ())).
Entry entry_from_meta_dict(std::string key, const py::dict& m) {
  for (const char* f : {"o", "n", "k"})
    if (!m.contains(f))
      raise(errc::malformed_index, std::string("entry meta has no field '") + f + "'");
  try {
    py::object d = m.contains("d") ? py::object(m["d"]) : py::object(py::none());
    py::object s = m.contains("s") ? py::object(m["s"]) : py::object(py::none());
    return make_entry(std::move(key), py::cast<std::uint64_t>(py::int_(m["o"])),
                      py::cast<std::uint64_t>(py::int_(m["n"])), py::cast<std::string>(m["k"]),
                      d.is_none() ? std::nullopt : std::optional(py::cast<std::string>(d)),
                      py::bool_(s) ? s : py::tuple());
  } catch (py::cast_error& e) {
    raise(errc::malformed_index, std::string("entry meta: ") + e.what());
  } catch (py::error_already_set& e) {  // int() of something that is no number
    if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError)) throw;
    raise(errc::malformed_index, std::string("entry meta: ") + e.what());
  }
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

py::dict entry_meta(const Entry& e) {
  py::dict d;
  d["o"] = e.off;
  d["n"] = e.len;
  d["k"] = std::string(1, e.kind);
  d["d"] = optional_str(e.dtype);
  py::list s;
  if (e.shape)
    for (auto x : *e.shape) s.append(x);
  d["s"] = s;
  return d;
}

py::tuple entry_fields(const Entry& e) {
  return py::make_tuple(e.key, e.off, e.len, std::string(1, e.kind), optional_str(e.dtype),
                        shape_or_none(e.shape));
}

std::string entry_repr(const Entry& e) {
  py::object dt = optional_str(e.dtype), sh = shape_or_none(e.shape);
  return "Entry(key=" + std::string(py::repr(py::str(e.key))) + ", off=" + std::to_string(e.off) +
         ", len=" + std::to_string(e.len) + ", kind='" + std::string(1, e.kind) +
         "', dtype=" + std::string(py::repr(dt)) + ", shape=" + std::string(py::repr(sh)) + ")";
}

// The entries as Python objects. A key or dtype read from a blob must be
// UTF-8 (msgpack str): the reference's msgpack decoder refuses others too.
py::list entry_list(const std::vector<Entry>& entries) {
  for (const Entry& e : entries)
    if (!is_utf8(e.key) || (e.dtype && !is_utf8(*e.dtype)))
      raise(errc::malformed_index, "an index row's key or dtype is not valid UTF-8");
  py::list out(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), py::cast(entries[i]).release().ptr());
  return out;
}

py_plan plan_values(py::handle keys, py::handle values, py::handle tag) {
  py::object ks =
      py::reinterpret_steal<py::object>(PySequence_Fast(keys.ptr(), "keys must be a sequence"));
  if (!ks) throw py::error_already_set();
  py::object vs =
      py::reinterpret_steal<py::object>(PySequence_Fast(values.ptr(), "values must be a sequence"));
  if (!vs) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(ks.ptr());
  if (n != PySequence_Fast_GET_SIZE(vs.ptr()))
    raise(errc::invalid_argument, "keys and values differ in length");
  const tag_t t = tag_from(tag);
  py_plan p;
  p.keep.reserve(static_cast<std::size_t>(n));
  layout_builder b;
  b.reserve(static_cast<std::size_t>(n));
  PyObject** k = PySequence_Fast_ITEMS(ks.ptr());
  PyObject** v = PySequence_Fast_ITEMS(vs.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    encoded e = encode_value(v[i]);
    const planned_entry* pe = unwrap(b.add(key_string(k[i]), std::move(e.v)));
    if (e.raw_nbytes && *e.raw_nbytes != pe->entry.len)
      raise(errc::invalid_argument,
            "RawEntry '" + pe->entry.key.substr(0, 64) + "' has " + std::to_string(*e.raw_nbytes) +
                " bytes; its dtype and shape need " + std::to_string(pe->entry.len));
    p.keep.push_back(std::move(e.keep));
    if (e.storage) p.guards.push_back({std::move(e.storage), static_cast<std::size_t>(i)});
  }
  p.plan = unwrap(b.finish(t));
  return p;
}

void write_blob(const py_plan& p, py::handle out) {
  held_buffer b(out, true);
  // Checked with the GIL held, right before the copy (storage_guard.hpp).
  for (const storage_guard& g : p.guards) check_storage(g.storage, p.plan.entries[g.entry]);
  result<std::uint64_t> r = [&] {
    py::gil_scoped_release nogil;  // the copy touches no Python object
    return write(p.plan, b.writable_bytes());
  }();
  unwrap(std::move(r));
}

void write_blob_tail(const py_plan& p, py::handle out) {
  held_buffer b(out, true);
  unwrap(write_tail(p.plan, b.writable_bytes()));
}

py::list read_blob_index(py::handle blob) {
  held_buffer b(blob, false);
  result<blob_index> r = [&] {
    py::gil_scoped_release nogil;
    return read_index(b.bytes());
  }();
  return entry_list(unwrap(std::move(r)).entries);
}

py::list read_blob_index_file(py::handle f, std::uint64_t off, std::uint64_t nbytes) {
  const module_state& s = state();
  if (py::isinstance<py::str>(f) || py::isinstance<py::bytes>(f) ||
      py::isinstance(f, s.os_pathlike)) {
    const std::string path = py::cast<std::string>(s.os_fsencode(f));
    result<blob_index> r = [&] {
      py::gil_scoped_release nogil;
      return read_index_file(path, off, nbytes);
    }();
    return entry_list(unwrap(std::move(r)).entries);
  }
  if (!py::hasattr(f, "read") || !py::hasattr(f, "seek"))
    throw py::type_error(
        "read_index_file: f must be a path (str, bytes, os.PathLike) or a binary file object "
        "with read() and seek(), not " +
        std::string(py::str(py::type::handle_of(f).attr("__name__"))));
  python_file_stream stream(f);
  result<blob_index> r = read_index_file(stream.get(), off, nbytes);
  stream.rethrow_pending();
  return entry_list(unwrap(std::move(r)).entries);
}

py::object decode_one(py::handle view, const Entry& e, bool allow_pickle) {
  held_buffer b(view, false);
  entry_view v = unwrap(view_entry(e, b.bytes()));
  return decode_value(view, v, allow_pickle);
}

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
  m.attr("KIND_TENSOR") = std::string(1, KIND_TENSOR);
  m.attr("KIND_NUMPY") = std::string(1, KIND_NDARRAY);
  m.attr("KIND_PICKLE") = std::string(1, KIND_PICKLE);

  py::class_<Entry>(m, "Entry",
                    R"(One row of a blob's index: Entry(key, off, len, kind, dtype, shape).

Immutable, hashable and picklable, like the reference's frozen dataclass.
  key:   the entry's name (str).
  off:   offset of its bytes from the blob's start, bytes (a multiple of ALIGN).
  len:   length of its bytes, bytes.
  kind:  "t" (torch tensor), "n" (numpy array) or "p" (pickle).
  dtype: torch's name ("float32") for "t", numpy's dtype.str ("<f4") for
         "n", None for "p" (a "t" row without dtype is float32).
  shape: elements per dimension (a tuple), None for "p".
Source: Entry (Python reference); blobpipe/format/entry.hpp.)")
      .def(py::init(&make_entry), py::arg("key"), py::arg("off"), py::arg("len"), py::arg("kind"),
           py::arg("dtype"), py::arg("shape"))
      .def_property_readonly("key", [](const Entry& e) { return e.key; })
      .def_property_readonly("off", [](const Entry& e) { return e.off; })
      .def_property_readonly("len", [](const Entry& e) { return e.len; })
      .def_property_readonly("kind", [](const Entry& e) { return std::string(1, e.kind); })
      .def_property_readonly("dtype", [](const Entry& e) { return optional_str(e.dtype); })
      .def_property_readonly("shape", [](const Entry& e) { return shape_or_none(e.shape); })
      .def("meta", &entry_meta,
           "The location map {'o': off, 'n': len, 'k': kind, 'd': dtype, 's': list(shape or ())},\n"
           "as the reference returns it (a dict).")
      .def(
          "meta_msgpack",
          [](const Entry& e) {
            auto m = e.meta();
            return py::bytes(reinterpret_cast<const char*>(m.data()), m.size());
          },
          "meta() as msgpack bytes, as blobpipe's C++ library and the reference encode it.")
      .def_static(
          "from_meta", &entry_from_meta, py::arg("key"), py::arg("m"),
          "The entry named `key` of a meta map `m`: a dict as meta() returns, or its\n"
          "msgpack bytes. As the reference, shape is tuple(m['s'] or ()): () for a pickle.\n"
          "Raises FormatError: malformed_index (a field missing or of the wrong type),\n"
          "unknown_kind.")
      .def("__eq__", [](const Entry& a, const Entry& b) { return a == b; })
      .def("__eq__",
           [](const Entry&, py::handle) {
             return py::reinterpret_borrow<py::object>(Py_NotImplemented);
           })
      .def("__hash__", [](const Entry& e) { return py::hash(entry_fields(e)); })
      .def("__repr__", &entry_repr)
      .def(py::pickle([](const Entry& e) { return entry_fields(e); },
                      [](const py::tuple& t) {
                        return make_entry(
                            py::cast<std::string>(t[0]), py::cast<std::uint64_t>(t[1]),
                            py::cast<std::uint64_t>(t[2]), py::cast<std::string>(t[3]),
                            py::cast<std::optional<std::string>>(t[4]),
                            py::reinterpret_borrow<py::object>(t[5]));
                      }));

  py::class_<py_plan>(m, "BlobPlan",
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
                                 p.entries_cache = entry_list(rows);
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
      .def("__repr__", [](const py_plan& p) {
        return "BlobPlan(" + std::to_string(p.plan.entries.size()) +
               " entries, nbytes=" + std::to_string(p.plan.nbytes) +
               ", tag=" + tag_hex(p.plan.tag) + ")";
      });

  m.def("plan", &plan_values, py::arg("keys"), py::arg("values"),
        py::arg("tag") = tag_bytes(NO_TAG));
  m.def("write", &write_blob, py::arg("p"), py::arg("out"));
  m.def("write_tail", &write_blob_tail, py::arg("p"), py::arg("out"));
  m.def("read_index", &read_blob_index, py::arg("blob"));
  m.def("read_index_file", &read_blob_index_file, py::arg("f"), py::arg("off") = 0,
        py::arg("nbytes") = 0);
  m.def("decode_entry", &decode_one, py::arg("view"), py::arg("e"), py::kw_only(),
        py::arg("allow_pickle") = true);
  m.def(
      "footer_is_valid",
      [](py::handle tail) {
        held_buffer b(tail, false);
        return footer_is_valid(b.bytes());
      },
      py::arg("tail"));
  m.def("footer_tag", &tag_of, py::arg("tail"));
}

}  // namespace blobpipe::python
