// python/ext/decode.hpp — one entry's bytes as a Python value, zero copy.
//
// Kind 't': a torch tensor viewing the bytes, as the reference returns
// (torch.frombuffer(...).view(shape) there; here torch.from_numpy of a
// numpy view, which is the same tensor at a fifth of the cost; an empty
// entry is torch.empty(shape)). When torch is missing, or lacks the dtype
// (torch 1.13 has no float8 and no uint16/32/64), a numpy array of the same
// dtype where numpy has it, and otherwise a blobpipe.RawEntry (the bytes as
// a uint8 array, the dtype name and the shape): never an error, never a
// wrong dtype. Quantized dtypes (quint8, qint8, qint32, quint4x2, quint2x4)
// always come back as a RawEntry: their scale and zero point are not in the
// blob, and torch.frombuffer of them crashes torch 1.13.
// Kind 'n': numpy.frombuffer(bytes, numpy.dtype(dtype)).reshape(shape); a
// dtype numpy cannot build here also gives a RawEntry.
// Kind 'p': pickle.loads(bytes), or with allow_pickle = false the bytes
// themselves (a bytes copy): unpickling runs code from the blob.
//
// The dtype objects for each (kind, dtype) spelling are looked up once and
// kept for the process (at most 256 spellings; later ones per call).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <span>
#include <vector>

#include "blobpipe/format/index.hpp"

namespace blobpipe::python {

/// `owner` exposes exactly v.bytes through the buffer protocol; views
/// returned keep it alive. REQUIRES: the GIL; `v` came from view_entry or
/// decode_entry (validated).
pybind11::object decode_value(pybind11::handle owner, const entry_view& v, bool allow_pickle);

/// Decodes entry `e` whose bytes are `bytes`, held by `owner`: exactly them
/// when `offset` < 0, else the bytes at `offset` of `owner`'s buffer (views
/// returned keep `owner` alive). Validates as view_entry does and raises its
/// FormatError (entry_out_of_range when bytes.size() != e.len,
/// shape_mismatch, unknown_kind, unknown_dtype). REQUIRES: the GIL.
pybind11::object decode_entry_bytes(pybind11::handle owner, std::span<const std::byte> bytes,
                                    const Entry& e, bool allow_pickle, Py_ssize_t offset);

/// Decodes the run of like entries that starts at es[i] (at least
/// min_run_entries of them: same kind 't' or 'n', dtype, shape of rank >= 1
/// and length, at offsets a constant stride apart, valid) into out[i...],
/// as one strided array split into rows: the same values decode_entry_bytes
/// gives (views of `owner`, whose buffer is `blob`). Returns how many it
/// decoded, 0 when es[i] starts no such run. REQUIRES: the GIL; every entry
/// lies inside `blob`.
std::size_t decode_run(pybind11::handle owner, std::span<const std::byte> blob,
                       const std::vector<const Entry*>& es, std::size_t i, pybind11::list& out);

/// Runs shorter than this are decoded entry by entry.
inline constexpr std::size_t min_run_entries = 4;

}  // namespace blobpipe::python
