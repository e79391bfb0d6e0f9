#include "encode.hpp"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstring>

#include "errors.hpp"
#include "state.hpp"

namespace blobpipe::python {
namespace {

py::object checked(PyObject* r) {
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

py::object get_attr(py::handle obj, const py::str& name) {
  return checked(PyObject_GetAttr(obj.ptr(), name.ptr()));
}

// A tensor's attribute (`t.m`) and method call (`t.m()`). For a plain
// torch.Tensor, torch.Tensor's own descriptor is called directly, which
// saves the lookup (a tenth of the per-tensor cost); a subclass goes
// through ordinary lookup, so its overrides still apply.
struct tensor_ref {
  py::object t;
  bool plain;  ///< type(t) is torch.Tensor

  py::object attr(const tensor_member& m) const {
    if (!plain) return get_attr(t, m.name);
    PyObject* d = m.descr.ptr();
    return checked(
        Py_TYPE(d)->tp_descr_get(d, t.ptr(), reinterpret_cast<PyObject*>(Py_TYPE(t.ptr()))));
  }
  py::object call(const tensor_member& m) const {
    PyObject* args[] = {nullptr, t.ptr()};
    if (plain) return checked(PyObject_Vectorcall(m.descr.ptr(), args + 1, 1, nullptr));
    args[0] = t.ptr();
    return checked(
        PyObject_VectorcallMethod(m.name.ptr(), args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  }
  /// Continues with `next` (a copy or resolved view of this tensor).
  void replace(py::object next) {
    plain = Py_TYPE(next.ptr()) == Py_TYPE(t.ptr()) && plain;
    t = std::move(next);
  }
};

bool truthy(const py::object& o) {
  const int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw py::error_already_set();
  return r != 0;
}

// A tuple (or sequence) of Python ints as a shape or strides vector.
shape_t int_vector(const py::object& seq) {
  py::tuple t = py::reinterpret_borrow<py::tuple>(seq);  // torch.Size is a tuple
  if (!PyTuple_Check(seq.ptr())) t = py::tuple(seq);
  shape_t out(static_cast<std::size_t>(PyTuple_GET_SIZE(t.ptr())));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i)));
    if (out[i] == -1 && PyErr_Occurred()) throw py::error_already_set();
  }
  return out;
}

encoded pickled(py::handle obj) {
  const module_state& s = state();
  py::object b = s.pickle_dumps(obj, s.pickle_protocol);
  char* data = nullptr;
  Py_ssize_t n = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &n) != 0) throw py::error_already_set();
  encoded e;
  e.v = value::pickle({reinterpret_cast<const std::byte*>(data), static_cast<std::size_t>(n)});
  e.keep = std::move(b);
  return e;
}

bool is_complex(const std::string& name) { return name.starts_with("complex"); }
bool may_be_negative_view(const std::string& name) {
  return name.starts_with("float") || name.starts_with("bfloat") || is_complex(name);
}

// quint4x2 / quint2x4 pack 2 or 4 values a byte, but torch reports an
// element size of 1, and the reference stores numel bytes read from the
// tensor's data: past the end of its storage. Here: the storage's packed
// bytes (int_repr(), C order), then zeros up to numel bytes, so the entry's
// length and its meaningful bytes are the reference's and nothing beyond
// the storage is read.
encoded packed_quantized(const py::object& t, encoded e) {
  py::object rep = t.attr("int_repr")().attr("contiguous")().attr("reshape")(-1).attr("numpy")();
  const auto numel = py::cast<std::int64_t>(t.attr("numel")());
  py::array_t<std::uint8_t> out(numel);
  auto* dst = static_cast<std::uint8_t*>(out.mutable_data());
  py::array_t<std::uint8_t> src = py::reinterpret_borrow<py::array_t<std::uint8_t>>(rep);
  const auto k = std::min<std::int64_t>(numel, src.size());
  std::memset(dst, 0, static_cast<std::size_t>(numel));
  if (k > 0) std::memcpy(dst, src.data(), static_cast<std::size_t>(k));
  e.v.data = reinterpret_cast<const std::byte*>(dst);
  e.keep = std::move(out);
  return e;
}

encoded tensor_value(py::handle obj, const torch_state& torch) {
  tensor_ref t{py::reinterpret_borrow<py::object>(obj),
               Py_TYPE(obj.ptr()) == reinterpret_cast<PyTypeObject*>(torch.tensor_type.ptr())};
  // The reference pickles nested and sparse COO tensors; other layouts
  // (sparse CSR, mkldnn) have no dense bytes to store. torch 1.13's nested
  // tensors say "strided" but have no shape: asked below, when shape fails.
  py::object layout = t.attr(torch.layout);
  if (layout.is(torch.sparse_coo)) return pickled(obj);
  if (!layout.is(torch.strided)) {
    if (truthy(t.attr(torch.is_nested))) return pickled(obj);
    // The reference fails in torch (is_contiguous): a RuntimeError there.
    raise(errc::invalid_argument,
          "a tensor with layout " + std::string(py::str(layout)) + " has no dense bytes to store",
          also_builtin::runtime_error);
  }
  py::object dt = t.attr(torch.dtype);
  const std::string* known = torch.name_of(dt.ptr());
  std::string name = known ? *known : std::string(py::str(dt));
  if (!truthy(t.attr(torch.is_cpu))) t.replace(t.call(torch.cpu));
  // A conjugate or negative view shares its base's memory and flips the
  // values lazily; its raw bytes are not its values.
  if (is_complex(name) && truthy(t.call(torch.is_conj))) t.replace(t.call(torch.resolve_conj));
  if (may_be_negative_view(name) && truthy(t.call(torch.is_neg)))
    t.replace(t.call(torch.resolve_neg));
  encoded e;
  e.v.kind = KIND_TENSOR;
  e.v.dtype = std::move(name);
  try {
    e.v.shape = int_vector(t.attr(torch.shape));
  } catch (py::error_already_set&) {
    if (truthy(t.attr(torch.is_nested))) return pickled(obj);
    throw;
  }
  if (e.v.dtype == "quint4x2" || e.v.dtype == "quint2x4") return packed_quantized(t.t, std::move(e));
  if (!truthy(t.call(torch.is_contiguous))) e.v.strides = int_vector(t.call(torch.stride));
  void* p = PyLong_AsVoidPtr(t.call(torch.data_ptr).ptr());
  if (p == nullptr && PyErr_Occurred()) throw py::error_already_set();
  e.v.data = static_cast<const std::byte*>(p);
  e.storage = t.call(torch.storage);
  e.keep = std::move(t.t);
  return e;
}

// numpy's dtype.str, through module_state::dtype_strs.
std::string dtype_str(const py::dtype& dt) {
  module_state& s = state();
  for (const auto& [d, str] : s.dtype_strs)
    if (d.is(dt)) return str;
  std::string str = py::cast<std::string>(get_attr(dt, s.s_str));
  if (s.dtype_strs.size() < module_state::max_dtype_strs) s.dtype_strs.emplace_back(dt, str);
  return str;
}

encoded array_value(const py::array& a) {
  const module_state& s = state();
  py::dtype dt = a.dtype();
  if (dt.kind() == 'O') return pickled(a);
  if (dt.kind() == 'V' && truthy(get_attr(dt, s.s_hasobject)))
    raise(errc::invalid_argument, "a structured dtype holding Python objects has no raw bytes",
          also_builtin::type_error);  // the reference's ndarray.view(uint8) raises TypeError
  encoded e;
  e.v.kind = KIND_NDARRAY;
  e.v.dtype = dtype_str(dt);
  const auto rank = static_cast<std::size_t>(a.ndim());
  e.v.shape.assign(a.shape(), a.shape() + rank);
  py::array src = a;
  if (!(a.flags() & py::array::c_style)) {
    // Element strides when every byte stride is a whole number of items
    // (negative ones included); otherwise (a field of a record array) a
    // contiguous copy, as the reference makes.
    const auto item = static_cast<py::ssize_t>(dt.itemsize());
    bool whole = item > 0;
    for (std::size_t d = 0; d < rank && whole; ++d) whole = a.strides()[d] % item == 0;
    if (whole) {
      for (std::size_t d = 0; d < rank; ++d) e.v.strides.push_back(a.strides()[d] / item);
    } else {
      src = py::reinterpret_steal<py::array>(s.np_ascontiguousarray(a).release());
    }
  }
  e.v.data = static_cast<const std::byte*>(src.data());
  e.pin = numpy_pin(src);
  e.keep = std::move(src);
  return e;
}

encoded raw_value(py::handle raw) {
  const module_state& s = state();
  const auto kind = py::cast<std::string>(raw.attr("kind"));
  // frombuffer: a uint8 view that holds the data's buffer, so a bytearray
  // under it cannot be resized before write().
  py::array bytes = s.np_frombuffer(raw.attr("data"), s.np_uint8);
  encoded e;
  e.v.kind = kind.size() == 1 ? kind[0] : '?';
  e.v.dtype = py::cast<std::string>(raw.attr("dtype"));
  e.v.shape = int_vector(raw.attr("shape"));
  e.v.data = static_cast<const std::byte*>(bytes.data());
  e.v.nbytes = static_cast<std::uint64_t>(bytes.nbytes());
  e.raw_nbytes = e.v.nbytes;
  e.keep = std::move(bytes);
  return e;
}

}  // namespace

py::object numpy_pin(py::handle obj) {
  // Holding an array keeps its memory only against numpy's reference-count
  // check: a.resize(..., refcheck=False) on the array that owns the bytes
  // reallocates them anyway. A weak reference to that owner makes numpy
  // refuse the resize.
  py::handle owner = obj;
  if (PyMemoryView_Check(owner.ptr())) owner = PyMemoryView_GET_BASE(owner.ptr());
  if (!owner || !py::isinstance<py::array>(owner)) return {};
  for (int hops = 0; owner && hops < 64; ++hops) {
    const auto arr = py::reinterpret_borrow<py::array>(owner);
    if (arr.owndata()) break;
    py::handle base = arr.base();
    owner = base && py::isinstance<py::array>(base) ? base : py::handle();
  }
  if (owner && py::reinterpret_borrow<py::array>(owner).owndata()) return py::weakref(owner);
  return {};
}

encoded encode_value(py::handle obj) {
  if (const torch_state* torch = torch_if_loaded()) {
    // A C-level subtype check: torch.Tensor's metaclass has no
    // __instancecheck__, and the generic isinstance() costs a method call.
    if (PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(torch->tensor_type.ptr())))
      return tensor_value(obj, *torch);
  }
  if (py::isinstance<py::array>(obj)) return array_value(py::reinterpret_borrow<py::array>(obj));
  if (Py_TYPE(obj.ptr()) == reinterpret_cast<PyTypeObject*>(state().raw_entry.ptr()))
    return raw_value(obj);
  return pickled(obj);
}

std::string key_string(py::handle key) {
  py::object s = py::reinterpret_borrow<py::object>(key);
  if (!PyUnicode_Check(key.ptr())) s = py::str(key);
  Py_ssize_t n = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (utf8 == nullptr) throw py::error_already_set();
  return {utf8, static_cast<std::size_t>(n)};
}

}  // namespace blobpipe::python
