// python/ext/received.hpp — a received entry's bytes as Python values, zero copy.
//
// A consumer yields each entry as a std::shared_ptr<const received_entry>:
// holding it keeps the entry's receive buffer and its window credit, and
// dropping the last copy returns the credit to the sender (the C++
// consumer posts it to its io thread from whichever thread drops it). A
// received_ref adds the io_runtime whose io_context that post goes to, so
// the context outlives every entry, wherever the entry is dropped.
//
// The values handed to Python own a received_ref:
//   - kind 't' with torch at hand and a dtype torch has: a torch tensor made
//     through DLPack (torch._C._from_dlpack), whose deleter drops the
//     received_ref (on any thread, without the GIL); torch 1.13 refuses
//     bool through DLPack, so bool tensors come as uint8 and are viewed as
//     bool. No Python object sits between the tensor and the bytes.
//   - everything else: decode_value (decode.hpp) over a ReceivedBuffer, a
//     small Python object that exposes the bytes (writable: they are this
//     entry's alone) through the buffer protocol and owns the received_ref.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "blobpipe/pipeline/consumer.hpp"
#include "runtime.hpp"

namespace blobpipe::python {

/// Keeps a received entry's bytes and the io_context its credit returns to.
struct received_ref {
  std::shared_ptr<io_runtime> rt;  // first: outlives `e`, whose release posts to it
  std::shared_ptr<const received_entry> e;

  received_ref() = default;
  received_ref(std::shared_ptr<io_runtime> r, std::shared_ptr<const received_entry> en)
      : rt(std::move(r)), e(std::move(en)) {}
  received_ref(const received_ref&) = default;
  received_ref(received_ref&&) = default;
  received_ref& operator=(const received_ref&) = delete;
  received_ref& operator=(received_ref&&) = delete;
  /// In a forked child, leaks both (runtime.hpp). No GIL needed.
  ~received_ref();
};

/// The ReceivedBuffer Python object for `ref` (read/write buffer of the
/// entry's len bytes, format "B").
pybind11::object received_buffer(received_ref ref);

/// The entry's value (see the file comment); allow_pickle as decode_value.
/// REQUIRES: the GIL; a host entry (not landed on a device).
pybind11::object received_value(const received_ref& ref, bool allow_pickle);

/// Adds ReceivedBuffer to `m`.
void init_received(pybind11::module_& m);

}  // namespace blobpipe::python
