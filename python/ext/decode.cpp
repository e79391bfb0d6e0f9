#include "decode.hpp"

#include <string>
#include <unordered_map>

#include "errors.hpp"
#include "state.hpp"

namespace blobpipe::python {
namespace {

py::object checked(PyObject* r) {
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

py::tuple shape_tuple(const shape_t& shape) {
  py::tuple t(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i)
    PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(shape[i]));
  return t;
}

// numpy's name for a tensor dtype, or nullptr when numpy has none
// (bfloat16, complex32, float8_*, quantized). Torch and numpy spell the
// others alike.
const char* numpy_name(scalar_type t) {
  switch (t) {
    case scalar_type::bool_: return "bool";
    case scalar_type::int8: return "int8";
    case scalar_type::int16: return "int16";
    case scalar_type::int32: return "int32";
    case scalar_type::int64: return "int64";
    case scalar_type::uint8: return "uint8";
    case scalar_type::uint16: return "uint16";
    case scalar_type::uint32: return "uint32";
    case scalar_type::uint64: return "uint64";
    case scalar_type::float16: return "float16";
    case scalar_type::float32: return "float32";
    case scalar_type::float64: return "float64";
    case scalar_type::complex64: return "complex64";
    case scalar_type::complex128: return "complex128";
    default: return nullptr;
  }
}

// The numpy integer type of the same size that torch.from_numpy takes, for
// a torch dtype numpy lacks: the tensor is made of it and then viewed as
// the real dtype (bfloat16 from int16, complex32 from int32).
const char* stand_in_name(scalar_type t) {
  switch (t) {
    case scalar_type::bfloat16: return "int16";
    case scalar_type::complex32: return "int32";
    default: return nullptr;
  }
}

// torch.from_numpy takes these numpy dtypes (torch 1.13 has no uint16/32/64).
bool from_numpy_takes(scalar_type t) {
  switch (t) {
    case scalar_type::uint16:
    case scalar_type::uint32:
    case scalar_type::uint64: return false;
    default: return numpy_name(t) != nullptr;
  }
}

// How the values of one (kind, dtype) are built; looked up once per
// spelling (makers()), so a decode asks no dtype object of torch or numpy.
struct value_maker {
  char kind;
  std::string name;        // canonical dtype name (RawEntry's)
  std::size_t itemsize;
  py::object np_dtype;     // the numpy dtype the bytes are read as; none: RawEntry
  py::object torch_dtype;  // 't': the tensor's dtype; none: the numpy array is the value
  bool retype = false;     // 't': from_numpy gives a stand-in dtype; view as torch_dtype
};

py::object np_dtype_or_none(const char* name) {
  return name ? state().np_dtype(name) : py::object();
}

value_maker make_maker(char kind, const dtype& type) {
  value_maker m{kind, type.name, type.itemsize, {}, {}, false};
  if (kind == KIND_NDARRAY) {
    try {
      m.np_dtype = state().np_dtype(type.name);
    } catch (py::error_already_set& e) {
      // blobpipe reads the dtype string, but this numpy cannot build it.
      if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)) throw;
    }
    return m;
  }
  // Quantized dtypes have neither a numpy twin nor a stand-in below, so
  // their bytes come back raw (torch.frombuffer of one crashes torch 1.13,
  // which is what the reference's decode_entry does).
  const torch_state* torch = torch_for_decode();
  py::handle dt = torch ? torch->by_name(type.name) : py::handle();
  if (dt && from_numpy_takes(type.type)) {
    m.np_dtype = np_dtype_or_none(numpy_name(type.type));
    m.torch_dtype = py::reinterpret_borrow<py::object>(dt);
  } else if (dt && stand_in_name(type.type)) {
    m.np_dtype = np_dtype_or_none(stand_in_name(type.type));
    m.torch_dtype = py::reinterpret_borrow<py::object>(dt);
    m.retype = true;
  } else {
    m.np_dtype = np_dtype_or_none(numpy_name(type.type));  // numpy array, or RawEntry
  }
  return m;
}

// Bounded: a blob from a peer may spell many numpy dtypes; past the bound
// makers are built per call.
constexpr std::size_t max_makers = 256;

// REQUIRES: kind is 't' or 'n'.
const value_maker* maker_for(char kind, std::string_view name, value_maker& scratch) {
  // Holds Python objects: leaked with the process rather than freed after
  // the interpreter (a function-local static's destructor would run then).
  static auto* cache = new std::unordered_map<std::string, value_maker>();
  std::string key(1, kind);
  key += name;
  if (auto it = cache->find(key); it != cache->end()) return &it->second;
  const dtype* type = lookup_dtype(kind, name);
  if (type == nullptr) return nullptr;
  value_maker m = make_maker(kind, *type);
  if (cache->size() >= max_makers) {
    scratch = std::move(m);
    return &scratch;
  }
  return &cache->emplace(std::move(key), std::move(m)).first->second;
}

// The most dims a numpy array has (NPY_MAXDIMS in numpy 1.x).
constexpr std::size_t max_numpy_dims = 32;

// prod(shape) * itemsize == len, without overflow; negative dims fail.
bool shape_fits(const shape_t& shape, std::size_t itemsize, std::uint64_t len) {
  unsigned __int128 n = itemsize;
  for (std::int64_t d : shape) {
    if (d < 0) return false;
    n *= static_cast<std::uint64_t>(d);
    if (n > UINT64_MAX) return false;
  }
  return n == len;
}

py::object raw_entry(py::handle owner, char kind, const std::string& name, const py::tuple& shape) {
  const module_state& s = state();
  py::object data = s.np_frombuffer(owner, s.np_uint8);
  return s.raw_entry(std::string(1, kind), name, shape, data);
}

// The value of `count` items at byte `offset` of `owner` (count < 0: all of
// it, offset 0). REQUIRES: those bytes are the entry's, checked.
py::object make_value(const value_maker& m, py::handle owner, std::uint64_t len, Py_ssize_t count,
                      Py_ssize_t offset, const shape_t& dims) {
  const module_state& s = state();
  py::tuple shape = shape_tuple(dims);
  if (m.kind == KIND_TENSOR && m.torch_dtype && len == 0) {
    // As the reference: torch.frombuffer refuses an empty buffer.
    PyObject* args[] = {nullptr, shape.ptr(), m.torch_dtype.ptr()};
    return checked(PyObject_Vectorcall(s.torch->empty.ptr(), args + 1,
                                       1 | PY_VECTORCALL_ARGUMENTS_OFFSET, s.kw_dtype.ptr()));
  }
  auto slice = [&] {  // an owner of exactly the entry's bytes
    if (count < 0) return py::reinterpret_borrow<py::object>(owner);
    py::object mv = checked(PyMemoryView_FromObject(owner.ptr()));
    return checked(PySequence_GetSlice(mv.ptr(), offset, offset + static_cast<Py_ssize_t>(len)));
  };
  if (!m.np_dtype) return raw_entry(slice(), m.kind, m.name, shape);
  // A numpy array has at most 32 dims (NPY_MAXDIMS), a tensor more: one
  // with more is made flat and reshaped by torch (as the streaming path
  // and the reference's torch.frombuffer(...).reshape do).
  const bool torch_reshapes = m.torch_dtype && dims.size() > max_numpy_dims;
  py::object arr;
  try {
    py::object c = py::int_(count), o = py::int_(offset);
    PyObject* args[] = {owner.ptr(), m.np_dtype.ptr(), c.ptr(), o.ptr()};
    py::object flat = checked(PyObject_Vectorcall(s.np_frombuffer.ptr(), args, count < 0 ? 2 : 4, nullptr));
    PyObject* rargs[] = {flat.ptr(), shape.ptr()};
    // A 1-d tensor's array is frombuffer's as it is: torch.from_numpy makes
    // the same tensor of it as of its reshape (a numpy array keeps the
    // reference's reshape, whose base is the flat array).
    const bool flat_is_shaped = m.torch_dtype && dims.size() == 1 &&
                                PyObject_Length(flat.ptr()) == static_cast<Py_ssize_t>(dims[0]);
    arr = torch_reshapes || flat_is_shaped
              ? flat
              : checked(PyObject_VectorcallMethod(s.s_reshape.ptr(), rargs,
                                                  2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  } catch (py::error_already_set& e) {
    // A numpy dtype this numpy can name but not make arrays of (an item
    // size of 0, say): the bytes come back raw.
    if (m.kind != KIND_NDARRAY || (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)))
      throw;
    return raw_entry(slice(), m.kind, m.name, shape);
  }
  if (!m.torch_dtype) return arr;
  // torch.from_numpy shares the array's memory (and holds it, so the owner
  // stays alive); it costs a fifth of torch.frombuffer's time.
  PyObject* fargs[] = {arr.ptr()};
  py::object t = checked(PyObject_Vectorcall(s.torch->from_numpy.ptr(), fargs, 1, nullptr));
  if (m.retype) {
    PyObject* vargs[] = {t.ptr(), m.torch_dtype.ptr()};
    t = checked(PyObject_VectorcallMethod(s.s_view.ptr(), vargs,
                                          2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  }
  if (!torch_reshapes) return t;
  PyObject* targs[] = {t.ptr(), shape.ptr()};
  return checked(PyObject_VectorcallMethod(s.s_reshape.ptr(), targs,
                                           2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
}

const shape_t& dims_of(const Entry& e, const value_maker& m, shape_t& scratch) {
  if (e.shape) return *e.shape;
  scratch = {static_cast<std::int64_t>(m.itemsize ? e.len / m.itemsize : 0)};
  return scratch;
}

}  // namespace

py::object decode_value(py::handle owner, const entry_view& v, bool allow_pickle) {
  if (v.entry->kind == KIND_PICKLE) {
    if (allow_pickle) return state().pickle_loads(owner);
    return py::bytes(reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size());
  }
  value_maker scratch;
  const value_maker* m = maker_for(v.entry->kind, v.type.name, scratch);
  if (m == nullptr) raise(errc::unknown_dtype, "unknown dtype " + v.type.name);
  return make_value(*m, owner, v.bytes.size(), -1, 0, v.shape);
}

py::object decode_entry_bytes(py::handle owner, std::span<const std::byte> bytes, const Entry& e,
                              bool allow_pickle, Py_ssize_t offset) {
  const bool whole = offset < 0;
  if (e.kind == KIND_PICKLE && bytes.size() == e.len) {
    const module_state& s = state();
    if (!allow_pickle) return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    py::object view = whole ? py::reinterpret_borrow<py::object>(owner)
                            : checked(PyMemoryView_FromMemory(
                                  const_cast<char*>(reinterpret_cast<const char*>(bytes.data())),
                                  static_cast<Py_ssize_t>(bytes.size()), PyBUF_READ));
    PyObject* args[] = {view.ptr()};
    return checked(PyObject_Vectorcall(s.pickle_loads.ptr(), args, 1, nullptr));
  }
  value_maker scratch;
  const value_maker* m = nullptr;
  if (bytes.size() == e.len && (e.kind == KIND_TENSOR || (e.kind == KIND_NDARRAY && e.dtype)))
    m = maker_for(e.kind, e.dtype ? std::string_view(*e.dtype) : "float32", scratch);
  if (m == nullptr || !(e.shape ? shape_fits(*e.shape, m->itemsize, e.len)
                                : (m->itemsize ? e.len % m->itemsize == 0 : e.len == 0))) {
    // Not a valid entry: the format library says why.
    result<entry_view> v = view_entry(e, bytes);
    if (v) raise(errc::shape_mismatch, "entry " + e.key.substr(0, 64) + " cannot be decoded");
    also_builtin also = also_builtin::none;
    if (e.kind == KIND_NDARRAY && v.err().code == errc::unknown_dtype) {
      also = also_builtin::type_error;  // numpy.dtype(name) raises TypeError
    } else if (e.kind == KIND_TENSOR && v.err().code == errc::shape_mismatch && m != nullptr &&
               e.len != 0 && m->itemsize != 0 && e.len % m->itemsize == 0) {
      also = also_builtin::runtime_error;  // whole elements: Tensor.view(shape) raises
    } else if (e.kind == KIND_TENSOR && v.err().code == errc::entry_out_of_range &&
               !bytes.empty()) {
      value_maker t_scratch;
      const value_maker* t = maker_for(e.kind, e.dtype ? std::string_view(*e.dtype) : "float32",
                                       t_scratch);
      if (t != nullptr && t->itemsize != 0 && bytes.size() % t->itemsize == 0)
        also = also_builtin::runtime_error;  // a view of whole elements, too many or too few
    }
    raise(v.err(), also);
  }
  shape_t dims_scratch;
  const shape_t& dims = dims_of(e, *m, dims_scratch);
  const Py_ssize_t count =
      whole ? -1 : static_cast<Py_ssize_t>(m->itemsize ? e.len / m->itemsize : 0);
  return make_value(*m, owner, e.len, count, whole ? 0 : offset, dims);
}

std::size_t decode_run(py::handle owner, std::span<const std::byte> blob,
                       const std::vector<const Entry*>& es, std::size_t i, py::list& out) {
  const Entry& first = *es[i];
  if (i + min_run_entries > es.size() || first.len == 0 || !first.shape || first.shape->empty() ||
      (first.kind != KIND_TENSOR && first.kind != KIND_NDARRAY) || !first.dtype)
    return 0;
  const Entry& second = *es[i + 1];
  if (second.off <= first.off) return 0;
  const std::uint64_t stride = second.off - first.off;
  auto like = [&](const Entry& e, std::uint64_t off) {
    return e.off == off && e.len == first.len && e.kind == first.kind && e.dtype == first.dtype &&
           e.shape == first.shape;
  };
  std::size_t k = 1;
  while (i + k < es.size() && like(*es[i + k], first.off + k * stride)) ++k;
  if (k < min_run_entries) return 0;
  value_maker scratch;
  const value_maker* m = maker_for(first.kind, *first.dtype, scratch);
  if (m == nullptr || !m->np_dtype || m->itemsize == 0 || stride % m->itemsize != 0 ||
      stride < first.len || !shape_fits(*first.shape, m->itemsize, first.len) ||
      first.off + (k - 1) * stride + first.len > blob.size())
    return 0;  // entry by entry: raises what is wrong, or gives a RawEntry
  const module_state& s = state();
  // numpy.ndarray(shape=(k, *shape), dtype, buffer=owner, offset, strides):
  // row r is the entry at first.off + r * stride, C-contiguous within.
  const shape_t& dims = *first.shape;
  py::tuple shape(dims.size() + 1), strides(dims.size() + 1);
  PyTuple_SET_ITEM(shape.ptr(), 0, PyLong_FromSize_t(k));
  PyTuple_SET_ITEM(strides.ptr(), 0, PyLong_FromUnsignedLongLong(stride));
  std::int64_t inner = static_cast<std::int64_t>(m->itemsize);
  for (std::size_t d = dims.size(); d-- > 0;) {
    PyTuple_SET_ITEM(shape.ptr(), static_cast<Py_ssize_t>(d + 1), PyLong_FromLongLong(dims[d]));
    PyTuple_SET_ITEM(strides.ptr(), static_cast<Py_ssize_t>(d + 1), PyLong_FromLongLong(inner));
    inner *= dims[d];
  }
  py::object offset = py::int_(first.off);
  PyObject* args[] = {shape.ptr(), m->np_dtype.ptr(), owner.ptr(), offset.ptr(), strides.ptr()};
  py::object rows = checked(PyObject_Vectorcall(s.np_ndarray.ptr(), args, 5, nullptr));
  py::object parts;
  if (m->torch_dtype) {
    PyObject* fargs[] = {rows.ptr()};
    py::object t = checked(PyObject_Vectorcall(s.torch->from_numpy.ptr(), fargs, 1, nullptr));
    if (m->retype) {
      PyObject* vargs[] = {t.ptr(), m->torch_dtype.ptr()};
      t = checked(PyObject_VectorcallMethod(s.s_view.ptr(), vargs,
                                            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
    }
    PyObject* uargs[] = {t.ptr()};
    parts = checked(PyObject_VectorcallMethod(s.s_unbind.ptr(), uargs,
                                              1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  } else {
    parts = checked(PySequence_Tuple(rows.ptr()));  // the rows, as views
  }
  if (!PyTuple_Check(parts.ptr()) || PyTuple_GET_SIZE(parts.ptr()) != static_cast<Py_ssize_t>(k))
    throw py::value_error("decode_entries: a run split into the wrong number of rows");
  for (std::size_t r = 0; r < k; ++r) {
    PyObject* v = PyTuple_GET_ITEM(parts.ptr(), static_cast<Py_ssize_t>(r));
    Py_INCREF(v);
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i + r), v);
  }
  return k;
}

}  // namespace blobpipe::python
