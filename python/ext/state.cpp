#include "state.hpp"

#include <memory>

namespace blobpipe::python {
namespace {

// Not an owner: the module's capsule owns the state (init_state).
module_state* current = nullptr;

py::str intern(const char* name) {
  return py::reinterpret_steal<py::str>(PyUnicode_InternFromString(name));
}

tensor_member member(py::handle tensor_type, const char* name) {
  tensor_member m{intern(name), {}};
  m.descr = tensor_type.attr(m.name);  // on the class: the descriptor itself
  return m;
}

torch_state load_torch(py::handle torch) {
  torch_state t;
  t.tensor_type = torch.attr("Tensor");
  for (auto [m, name] : {std::pair{&t.layout, "layout"},
                         {&t.is_nested, "is_nested"},
                         {&t.dtype, "dtype"},
                         {&t.is_cpu, "is_cpu"},
                         {&t.cpu, "cpu"},
                         {&t.is_conj, "is_conj"},
                         {&t.resolve_conj, "resolve_conj"},
                         {&t.is_neg, "is_neg"},
                         {&t.resolve_neg, "resolve_neg"},
                         {&t.shape, "shape"},
                         {&t.is_contiguous, "is_contiguous"},
                         {&t.stride, "stride"},
                         {&t.data_ptr, "data_ptr"}})
    *m = member(t.tensor_type, name);
  t.storage = member(t.tensor_type,
                     py::hasattr(t.tensor_type, "untyped_storage") ? "untyped_storage" : "_storage");
  t.strided = torch.attr("strided");
  t.sparse_coo = torch.attr("sparse_coo");
  t.frombuffer = torch.attr("frombuffer");
  t.empty = torch.attr("empty");
  t.from_numpy = torch.attr("from_numpy");
  if (py::object c = torch.attr("_C"); py::hasattr(c, "_from_dlpack")) t.from_dlpack = c.attr("_from_dlpack");
  py::handle dtype_type = torch.attr("dtype");
  for (py::handle name : py::reinterpret_steal<py::list>(PyObject_Dir(torch.ptr()))) {
    py::object v = torch.attr(name);
    if (!py::isinstance(v, dtype_type)) continue;
    bool seen = false;  // aliases (half, float, ...) are the same object
    for (const auto& d : t.dtypes) seen = seen || d.first.is(v);
    if (seen) continue;
    std::string s = py::str(v);
    constexpr std::string_view prefix = "torch.";
    if (s.starts_with(prefix)) s.erase(0, prefix.size());
    t.dtypes.emplace_back(std::move(v), std::move(s));
  }
  return t;
}

}  // namespace

const std::string* torch_state::name_of(PyObject* dtype) const noexcept {
  for (const auto& d : dtypes)
    if (d.first.ptr() == dtype) return &d.second;
  return nullptr;
}

py::handle torch_state::by_name(std::string_view name) const noexcept {
  for (const auto& d : dtypes)
    if (d.second == name) return d.first;
  return {};
}

void init_state(py::module_& m) {
  auto s = std::make_unique<module_state>();
  s->s_view = intern("view");
  s->s_str = intern("str");
  s->s_hasobject = intern("hasobject");
  s->s_reshape = intern("reshape");
  s->s_clone = intern("clone");
  s->s_copy = intern("copy");
  s->s_unbind = intern("unbind");
  s->kw_dtype = py::make_tuple(intern("dtype"));
  s->s_data_ptr = intern("data_ptr");
  s->s_nbytes = intern("nbytes");
  s->s_resizable = intern("resizable");
  py::module_ pickle = py::module_::import("pickle");
  s->pickle_dumps = pickle.attr("dumps");
  s->pickle_loads = pickle.attr("loads");
  s->pickle_protocol = pickle.attr("HIGHEST_PROTOCOL");
  py::module_ np = py::module_::import("numpy");
  s->np_frombuffer = np.attr("frombuffer");
  s->np_dtype = np.attr("dtype");
  s->np_ascontiguousarray = np.attr("ascontiguousarray");
  s->np_uint8 = np.attr("uint8");
  s->np_ndarray = np.attr("ndarray");
  py::module_ os = py::module_::import("os");
  s->os_pathlike = os.attr("PathLike");
  s->os_fsencode = os.attr("fsencode");
  s->error_for = py::module_::import("blobpipe._errors").attr("error_for");
  s->raw_entry = py::module_::import("blobpipe._raw").attr("RawEntry");
  s->forked_error = py::module_::import("blobpipe._errors").attr("ForkedError");
  s->url_error = py::module_::import("blobpipe._errors").attr("URLError");
  current = s.get();
  // The capsule's destructor runs when the module is torn down, with the
  // GIL held, and frees the state (and its references) then.
  m.add_object("_state", py::capsule(s.release(), [](void* p) {
                 std::unique_ptr<module_state>(static_cast<module_state*>(p));
                 current = nullptr;
               }));
}

module_state& state() { return *current; }

const torch_state* torch_if_loaded() {
  module_state& s = state();
  if (s.torch) return &*s.torch;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr || torch == Py_None) return nullptr;
  // A module still being imported has no Tensor yet; ask again next time.
  if (!PyObject_HasAttrString(torch, "frombuffer")) return nullptr;
  s.torch = load_torch(torch);
  return &*s.torch;
}

const torch_state* torch_for_decode() {
  module_state& s = state();
  if (const torch_state* t = torch_if_loaded()) return t;
  if (s.torch_import_failed) return nullptr;
  try {
    s.torch = load_torch(py::module_::import("torch"));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    s.torch_import_failed = true;
    return nullptr;
  }
  return &*s.torch;
}

}  // namespace blobpipe::python
