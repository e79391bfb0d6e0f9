// python/ext/encode.hpp — Python values as blobpipe values (no copy).
//
// The reference's rules (encode_value in nemo_rl's blob_format), in order:
//   - a torch.Tensor that is neither nested nor sparse COO: kind 't',
//     dtype str(t.dtype) less "torch.", shape tuple(t.shape), bytes in C
//     order. A tensor off the CPU is copied to host first (t.cpu()); a
//     non-contiguous one is gathered from its strides by write() (the
//     reference copies it with .contiguous(); the bytes are the same).
//     Conjugate and negative views are resolved first so the bytes are the
//     values shown.
//   - a numpy.ndarray whose dtype is not object: kind 'n', dtype
//     `dtype.str` (any byte order), shape, bytes in C order.
//   - a blobpipe.RawEntry (what decode_entry gives for a dtype no library
//     here has): its kind, dtype and shape, its bytes as they are, so that
//     such an entry re-encodes unchanged. blobpipe's own type, which the
//     reference never sees.
//   - anything else: kind 'p', pickle.dumps(v, pickle.HIGHEST_PROTOCOL).
// The blobpipe::value borrows the memory of the object returned in `keep`
// (the tensor, its host copy, the array, or the pickle's bytes), which the
// caller must hold until the bytes are written. A tensor's bytes can be
// freed by torch even so (resize_, set_): a caller that reads them later
// holds `storage` too and checks it first (storage_guard.hpp).
//
// Errors: FormatError invalid_argument (a tensor layout with no dense bytes,
// e.g. sparse CSR; a structured dtype holding objects), and whatever the
// value's own methods raise (pickling an unpicklable object).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

#include "blobpipe/format/layout.hpp"

namespace blobpipe::python {

struct encoded {
  value v;
  pybind11::object keep;  ///< owner of v.data
  /// For a numpy array: a weak reference to the ndarray that owns v.data
  /// (its .base chain's owner). numpy's resize() refuses an array that has
  /// a weak reference, even with refcheck=False (which skips only the
  /// reference count), so while this is held the bytes cannot be freed
  /// under a later read. Hold it as long as v.data is read.
  pybind11::object pin;
  /// For a torch tensor: its storage, which v.data points into; hold it
  /// and check it before reading v.data later (storage_guard.hpp).
  pybind11::object storage;
  /// For a RawEntry: its bytes, which must be the length that dtype and
  /// shape give (the caller checks once the entry is planned).
  std::optional<std::uint64_t> raw_nbytes;
};

/// Describes `obj` as a value (see above). REQUIRES: the GIL.
encoded encode_value(pybind11::handle obj);

/// A weak reference to the numpy array that owns the bytes of `obj` (an
/// ndarray, or a memoryview of one): while it lives, numpy refuses to
/// resize that array, even with refcheck=False. None (an empty object)
/// for anything else. REQUIRES: the GIL; a memoryview `obj` exported
/// (held_buffer) while this runs, so that it is not released (a released
/// memoryview's base is freed memory).
pybind11::object numpy_pin(pybind11::handle obj);

/// The key as the reference writes it: str(key), UTF-8.
std::string key_string(pybind11::handle key);

}  // namespace blobpipe::python
