#include "storage_guard.hpp"

#include <cstdint>
#include <string>

#include "errors.hpp"
#include "state.hpp"

namespace blobpipe::python {
namespace {

py::object call_method(py::handle obj, const py::str& name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), name.ptr());
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

// The addresses [first, last) that writing `pe` reads, as integers.
struct byte_range {
  std::uintptr_t first = 0, last = 0;
};

byte_range bytes_read(const planned_entry& pe) {
  const auto base = reinterpret_cast<std::uintptr_t>(pe.source.data);
  if (pe.contiguous) return {base, base + static_cast<std::uintptr_t>(pe.entry.len)};
  // Strided: the elements lie between the sums of the negative and of the
  // positive (shape - 1) * stride terms (checked by the planner not to
  // overflow: the same products give the gather's offsets).
  std::int64_t low = 0, high = 0;
  for (std::size_t d = 0; d < pe.source.strides.size(); ++d) {
    const std::int64_t reach = (pe.source.shape[d] - 1) * pe.source.strides[d];
    (reach < 0 ? low : high) += reach;
  }
  const auto item = static_cast<std::int64_t>(pe.itemsize);
  return {static_cast<std::uintptr_t>(static_cast<std::int64_t>(base) + low * item),
          static_cast<std::uintptr_t>(static_cast<std::int64_t>(base) + (high + 1) * item)};
}

}  // namespace

void check_storage(py::handle storage, const planned_entry& pe) {
  if (pe.entry.len == 0) return;
  const module_state& s = state();
  void* p = PyLong_AsVoidPtr(call_method(storage, s.s_data_ptr).ptr());
  if (p == nullptr && PyErr_Occurred()) throw py::error_already_set();
  const unsigned long long n = PyLong_AsUnsignedLongLong(call_method(storage, s.s_nbytes).ptr());
  if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) throw py::error_already_set();
  const auto first = reinterpret_cast<std::uintptr_t>(p);
  const byte_range r = bytes_read(pe);
  if (p != nullptr && r.first >= first && r.last >= r.first && r.last - first <= n) return;
  raise(errc::invalid_argument,
        "tensor " + quote(pe.entry.key) +
            " changed after plan(): torch reallocated its bytes (resize_ to a larger size, "
            "or a resize of its storage), so they are not written; plan it again");
}

bool storage_resizable(py::handle storage) {
  const py::str& name = state().s_resizable;
  // torch 1.13 cannot say: any storage may be.
  if (!PyObject_HasAttr(storage.ptr(), name.ptr())) return true;
  const int r = PyObject_IsTrue(call_method(storage, name).ptr());
  if (r < 0) throw py::error_already_set();
  return r != 0;
}

}  // namespace blobpipe::python
