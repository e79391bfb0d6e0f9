// python/ext/storage_guard.hpp — a torch tensor's bytes, checked before they
// are read later than the tensor was looked at.
//
// plan() records where a tensor's bytes are; write() reads them later. numpy
// refuses to resize an array while anyone holds it, but torch does not:
// t.resize_() to a larger size reallocates the tensor's storage (its old
// bytes are freed at once) and t.set_() points the tensor at another
// storage (the old one is freed with its last reference). Reading the
// recorded address after either is a use after free (a SIGSEGV, or another
// allocation's bytes in the blob). So a reader that comes later
//   - holds the storage object (torch.UntypedStorage), so that set_() or
//     dropping the tensor cannot free it, and
//   - checks, before it reads, that the storage still holds the recorded
//     bytes (check_storage), raising FormatError instead of reading freed
//     memory.
// Between the check and the read nothing can run but the reader (write()
// checks with the GIL held and copies right after; another thread that
// resizes the tensor during the copy is not defended against).
//
// The sender cannot check on its background thread (it never takes the
// GIL): an entry it would send from the tensor's own memory is copied
// instead when torch may reallocate that memory (storage_resizable).
//
//   for (const auto& g : plan.guards) check_storage(g.storage, plan.entries[g.entry]);
//
// REQUIRES: the GIL, for every function here.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

#include "blobpipe/format/layout.hpp"

namespace blobpipe::python {

/// A tensor's storage and the planned entry whose bytes lie in it.
struct storage_guard {
  pybind11::object storage;  ///< torch.UntypedStorage
  std::size_t entry = 0;     ///< index into BlobPlan::entries
};

/// Raises FormatError invalid_argument, naming the key, unless every byte
/// `pe` reads (pe.source.data with its shape and strides) still lies in
/// `storage`'s memory (data_ptr() .. data_ptr() + nbytes()). An entry of no
/// bytes always passes.
void check_storage(pybind11::handle storage, const planned_entry& pe);

/// storage.resizable(): whether torch may reallocate its memory (false for
/// storages over memory torch does not own: torch.from_numpy,
/// torch.frombuffer). Always true with torch 1.13 (Debian 12's), whose
/// storages do not tell.
bool storage_resizable(pybind11::handle storage);

}  // namespace blobpipe::python
