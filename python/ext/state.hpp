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

/// torch, as found in this process.
struct torch_state {
  py::object tensor_type;  ///< torch.Tensor
  py::object strided;      ///< torch.strided (dense layout)
  py::object sparse_coo;   ///< torch.sparse_coo (the reference pickles these)
  py::object frombuffer;   ///< torch.frombuffer
  py::object empty;        ///< torch.empty
  /// Every torch.dtype, with str(dtype) less "torch." ("float32").
  std::vector<std::pair<py::object, std::string>> dtypes;

  /// The name the reference writes for a dtype object; nullptr when
  /// `dtype` is not a torch.dtype.
  const std::string* name_of(PyObject* dtype) const noexcept;
  /// The torch.dtype named `name` (canonical), or an empty handle.
  py::handle by_name(std::string_view name) const noexcept;
};

struct module_state {
  // Interned names of the tensor attributes and methods the encoder reads.
  py::str s_dtype, s_shape, s_stride, s_is_contiguous, s_data_ptr, s_is_cpu, s_cpu,
      s_is_nested, s_layout, s_is_conj, s_resolve_conj, s_is_neg, s_resolve_neg, s_view,
      s_reshape, s_str, s_hasobject;
  py::object pickle_dumps, pickle_loads, pickle_protocol;
  py::object np_frombuffer, np_dtype, np_ascontiguousarray, np_uint8;
  py::object os_pathlike, os_fsencode;
  py::object error_for;  ///< blobpipe._errors.error_for(category, message)
  py::object raw_entry;  ///< blobpipe._raw.RawEntry
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
