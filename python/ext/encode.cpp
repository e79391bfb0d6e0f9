#include "encode.hpp"

#include <pybind11/numpy.h>

#include "errors.hpp"
#include "state.hpp"

namespace blobpipe::python {
namespace {

// Calls `obj.name()` with no arguments; a new reference.
py::object call_method(py::handle obj, const py::str& name) {
  PyObject* args[] = {obj.ptr()};
  PyObject* r = PyObject_VectorcallMethod(name.ptr(), args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                          nullptr);
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

py::object get_attr(py::handle obj, const py::str& name) {
  PyObject* r = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

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
  return {value::pickle({reinterpret_cast<const std::byte*>(data), static_cast<std::size_t>(n)}),
          std::move(b)};
}

bool is_complex(const std::string& name) { return name.starts_with("complex"); }
bool may_be_negative_view(const std::string& name) {
  return name.starts_with("float") || name.starts_with("bfloat") || is_complex(name);
}

encoded tensor_value(py::handle obj, const torch_state& torch) {
  const module_state& s = state();
  py::object t = py::reinterpret_borrow<py::object>(obj);
  // The reference pickles nested and sparse COO tensors; other layouts
  // (sparse CSR, mkldnn) have no dense bytes to store.
  py::object layout = get_attr(t, s.s_layout);
  if (layout.is(torch.sparse_coo) || truthy(get_attr(t, s.s_is_nested))) return pickled(obj);
  if (!layout.is(torch.strided))
    raise(errc::invalid_argument,
          "a tensor with layout " + std::string(py::str(layout)) + " has no dense bytes to store");
  py::object dt = get_attr(t, s.s_dtype);
  const std::string* known = torch.name_of(dt.ptr());
  std::string name = known ? *known : std::string(py::str(dt));
  if (!truthy(get_attr(t, s.s_is_cpu))) t = call_method(t, s.s_cpu);
  // A conjugate or negative view shares its base's memory and flips the
  // values lazily; its raw bytes are not its values.
  if (is_complex(name) && truthy(call_method(t, s.s_is_conj))) t = call_method(t, s.s_resolve_conj);
  if (may_be_negative_view(name) && truthy(call_method(t, s.s_is_neg)))
    t = call_method(t, s.s_resolve_neg);
  encoded e;
  e.v.kind = KIND_TENSOR;
  e.v.dtype = std::move(name);
  e.v.shape = int_vector(get_attr(t, s.s_shape));
  if (!truthy(call_method(t, s.s_is_contiguous)))
    e.v.strides = int_vector(call_method(t, s.s_stride));
  void* p = PyLong_AsVoidPtr(call_method(t, s.s_data_ptr).ptr());
  if (p == nullptr && PyErr_Occurred()) throw py::error_already_set();
  e.v.data = static_cast<const std::byte*>(p);
  e.keep = std::move(t);
  return e;
}

encoded array_value(const py::array& a) {
  const module_state& s = state();
  py::dtype dt = a.dtype();
  if (dt.kind() == 'O') return pickled(a);
  if (dt.kind() == 'V' && truthy(get_attr(dt, s.s_hasobject)))
    raise(errc::invalid_argument, "a structured dtype holding Python objects has no raw bytes");
  encoded e;
  e.v.kind = KIND_NDARRAY;
  e.v.dtype = py::cast<std::string>(get_attr(dt, s.s_str));
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
  e.keep = std::move(src);
  return e;
}

}  // namespace

encoded encode_value(py::handle obj) {
  if (const torch_state* torch = torch_if_loaded()) {
    const int is_tensor = PyObject_IsInstance(obj.ptr(), torch->tensor_type.ptr());
    if (is_tensor < 0) throw py::error_already_set();
    if (is_tensor) return tensor_value(obj, *torch);
  }
  if (py::isinstance<py::array>(obj)) return array_value(py::reinterpret_borrow<py::array>(obj));
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
