#include "decode.hpp"

#include "state.hpp"

namespace blobpipe::python {
namespace {

py::tuple shape_tuple(const shape_t& shape) {
  py::tuple t(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i)
    PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(shape[i]));
  return t;
}

// numpy's name for a tensor dtype, or nullptr when numpy has none
// (bfloat16, float8_*). Torch and numpy spell the others alike.
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

py::object raw_entry(py::handle owner, const entry_view& v, const py::tuple& shape) {
  const module_state& s = state();
  py::object data = s.np_frombuffer(owner, s.np_uint8);
  return s.raw_entry(std::string(1, v.entry->kind), v.type.name, shape, data);
}

py::object numpy_view(py::handle owner, const py::object& dtype, const py::tuple& shape) {
  return state().np_frombuffer(owner, dtype).attr("reshape")(shape);
}

py::object decode_tensor(py::handle owner, const entry_view& v) {
  const module_state& s = state();
  py::tuple shape = shape_tuple(v.shape);
  if (const torch_state* torch = torch_for_decode()) {
    if (py::handle dt = torch->by_name(v.type.name)) {
      if (v.bytes.empty()) return torch->empty(shape, py::arg("dtype") = dt);
      return torch->frombuffer(owner, py::arg("dtype") = dt).attr(s.s_view)(shape);
    }
  }
  if (const char* np_name = numpy_name(v.type.type))
    return numpy_view(owner, s.np_dtype(np_name), shape);
  return raw_entry(owner, v, shape);
}

py::object decode_ndarray(py::handle owner, const entry_view& v) {
  py::tuple shape = shape_tuple(v.shape);
  try {
    return numpy_view(owner, state().np_dtype(v.type.name), shape);
  } catch (py::error_already_set& e) {
    // blobpipe reads the dtype string, but this numpy cannot build it or
    // an array of it (an item size of 0, say).
    if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)) throw;
    return raw_entry(owner, v, shape);
  }
}

}  // namespace

py::object decode_value(py::handle owner, const entry_view& v, bool allow_pickle) {
  switch (v.entry->kind) {
    case KIND_TENSOR: return decode_tensor(owner, v);
    case KIND_NDARRAY: return decode_ndarray(owner, v);
    default:  // KIND_PICKLE: the only other kind view_entry lets through
      if (allow_pickle) return state().pickle_loads(owner);
      return py::bytes(reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size());
  }
}

}  // namespace blobpipe::python
