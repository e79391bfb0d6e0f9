// python/ext/state.hpp — Python objects the extension looks up once.
//
// Interned attribute names, pickle/numpy callables and, once torch is in
// the process, torch's Tensor type and dtype objects. The state belongs to
// the module (a capsule attribute frees it when the module is torn down),
// so nothing Python-owned outlives the interpreter.
//
// torch stays optional: encoding never imports it (a tensor can only exist
// once its user has imported torch, so sys.modules is asked); decoding
// imports it on the first kind 't' entry, and without it falls back to
// numpy (python/src/blobpipe/__init__.py says how).
//
// REQUIRES: the GIL, for every function here.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace blobpipe::python {

namespace py = pybind11;

/// An attribute or method of torch.Tensor, looked up once.
struct tensor_member {
  py::str name;      ///< interned
  py::object descr;  ///< torch.Tensor's descriptor for it (a C getter or method)
};

/// torch, as found in this process.
struct torch_state {
  py::object tensor_type;  ///< torch.Tensor
  py::object strided;      ///< torch.strided (dense layout)
  py::object sparse_coo;   ///< torch.sparse_coo (the reference pickles these)
  py::object frombuffer;   ///< torch.frombuffer
  py::object empty;        ///< torch.empty
  py::object from_numpy;   ///< torch.from_numpy
  /// torch._C._from_dlpack (what torch.utils.dlpack.from_dlpack calls with a
  /// capsule); empty when this torch has none.
  py::object from_dlpack;
  // What the encoder reads from a tensor.
  tensor_member layout, is_nested, dtype, is_cpu, cpu, is_conj, resolve_conj, is_neg, resolve_neg,
      shape, is_contiguous, stride, data_ptr;
  /// The tensor's storage: untyped_storage() where torch has it (2.x),
  /// else _storage() (1.13), both a torch.UntypedStorage (storage_guard.hpp).
  tensor_member storage;
  /// Every torch.dtype, with str(dtype) less "torch." ("float32").
  std::vector<std::pair<py::object, std::string>> dtypes;

  /// The name the reference writes for a dtype object; nullptr when
  /// `dtype` is not a torch.dtype.
  const std::string* name_of(PyObject* dtype) const noexcept;
  /// The torch.dtype named `name` (canonical), or an empty handle.
  py::handle by_name(std::string_view name) const noexcept;
};

struct module_state {
  // Interned attribute names.
  py::str s_view, s_str, s_hasobject, s_reshape, s_clone, s_copy, s_unbind;
  py::tuple kw_dtype;  ///< ("dtype",): the keyword names of a vectorcall
  py::str s_data_ptr, s_nbytes, s_resizable;  ///< torch.UntypedStorage's (storage_guard.hpp)
  py::object pickle_dumps, pickle_loads, pickle_protocol;
  py::object np_frombuffer, np_dtype, np_ascontiguousarray, np_uint8, np_ndarray;
  /// numpy dtype objects seen by the encoder, with their `dtype.str`
  /// (numpy builds that string anew on each access, at a fifth of a
  /// microsecond; builtin dtypes are singletons, so identity finds them).
  /// Holding the object keeps its address from being reused. Bounded by
  /// max_dtype_strs; later dtypes are not cached.
  std::vector<std::pair<py::object, std::string>> dtype_strs;
  static constexpr std::size_t max_dtype_strs = 64;
  py::object os_pathlike, os_fsencode;
  py::object error_for;  ///< blobpipe._errors.error_for(category, message)
  py::object raw_entry;  ///< blobpipe._raw.RawEntry
  py::object forked_error;  ///< blobpipe._errors.ForkedError(message)
  py::object url_error;     ///< blobpipe._errors.URLError(message, category, part)
  /// blobpipe._stream._anext(consumer): the coroutine Consumer.__anext__ returns.
  py::object anext;
  std::optional<torch_state> torch;
  bool torch_import_failed = false;
};

/// Creates the state and hands its ownership to module `m`.
void init_state(py::module_& m);

/// The module's state. REQUIRES: init_state ran.
module_state& state();

/// torch if the process has imported it (no import here); else nullptr.
const torch_state* torch_if_loaded();

/// torch, imported on first use; nullptr when it cannot be imported
/// (ImportError, or sys.modules["torch"] is None). Other import failures
/// propagate.
const torch_state* torch_for_decode();

}  // namespace blobpipe::python
