// blobpipe.EntryReady: a plain CPython type (PyType_FromSpec), not a
// pybind11 class: a consumer makes one per entry, and a pybind11 instance
// costs a registration in pybind11's instance map besides the allocation.
#include "entry_ready.hpp"

#include <structmember.h>

#include <new>

#include "entry.hpp"
#include "runtime.hpp"
#include "state.hpp"
#include "tags.hpp"

namespace blobpipe::python {
namespace {

struct entry_ready_object {
  PyObject_HEAD
  received_ref ref;  // placement-new'd by make_entry_ready
  bool allow_pickle;
  PyObject* value;   // made on first use, like entry and buffer
  PyObject* entry;
  PyObject* buffer;
};

// Owned by the module (its attribute), which outlives every instance.
PyTypeObject* entry_ready_type = nullptr;

entry_ready_object* self_of(PyObject* o) { return reinterpret_cast<entry_ready_object*>(o); }

void dealloc(PyObject* o) {
  entry_ready_object* self = self_of(o);
  if (self->value != nullptr) {
    // Freeing a torch tensor releases the GIL and takes it back in torch's
    // dealloc, where finalization would end this thread (runtime.hpp).
    python_call freeing;
    Py_CLEAR(self->value);
  }
  Py_CLEAR(self->entry);
  Py_CLEAR(self->buffer);
  self->ref.~received_ref();
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);  // heap types are referenced by their instances
}

// Runs `make` for a cached attribute, turning C++ exceptions into Python ones.
template <class Make>
PyObject* cached(PyObject*& slot, Make make) {
  if (slot == nullptr) {
    try {
      slot = make().release().ptr();
    } catch (py::error_already_set& e) {
      e.restore();
      return nullptr;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return nullptr;
    }
  }
  Py_INCREF(slot);
  return slot;
}

PyObject* get_value(PyObject* o, void*) {
  entry_ready_object* self = self_of(o);
  return cached(self->value, [&] { return received_value(self->ref, self->allow_pickle); });
}

PyObject* get_entry(PyObject* o, void*) {
  entry_ready_object* self = self_of(o);
  return cached(self->entry, [&] { return entry_object(Entry(self->ref.e->entry)); });
}

PyObject* get_buffer(PyObject* o, void*) {
  entry_ready_object* self = self_of(o);
  return cached(self->buffer, [&] { return received_buffer(self->ref); });
}

PyObject* get_tag(PyObject* o, void*) {
  const tag_t& t = self_of(o)->ref.e->tag;
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(t.data()),
                                   static_cast<Py_ssize_t>(t.size()));
}

PyObject* key_str(const Entry& e) {
  return PyUnicode_DecodeUTF8(e.key.data(), static_cast<Py_ssize_t>(e.key.size()),
                              "backslashreplace");
}

PyObject* get_key(PyObject* o, void*) { return key_str(self_of(o)->ref.e->entry); }

PyObject* get_blob_id(PyObject* o, void*) {
  return PyLong_FromUnsignedLongLong(self_of(o)->ref.e->blob_id);
}

PyObject* get_index(PyObject* o, void*) { return PyLong_FromSize_t(self_of(o)->ref.e->index); }

// `tag, entry, value = ev`
PyObject* iter(PyObject* o) {
  PyObject* t = PyTuple_New(3);
  if (t == nullptr) return nullptr;
  PyObject* items[3] = {get_tag(o, nullptr), get_entry(o, nullptr), get_value(o, nullptr)};
  for (int i = 0; i < 3; ++i) {
    if (items[i] == nullptr) {
      for (PyObject* p : items) Py_XDECREF(p);
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, i, items[i]);
  }
  PyObject* it = PyObject_GetIter(t);
  Py_DECREF(t);
  return it;
}

PyObject* repr(PyObject* o) {
  const received_entry& e = *self_of(o)->ref.e;
  PyObject* key = key_str(e.entry);
  if (key == nullptr) return nullptr;
  PyObject* r = PyUnicode_FromFormat("EntryReady(tag=%s, key=%R, kind='%c', len=%llu)",
                                     tag_hex(e.tag).c_str(), key, e.entry.kind,
                                     static_cast<unsigned long long>(e.entry.len));
  Py_DECREF(key);
  return r;
}

PyGetSetDef getset[] = {
    {"tag", get_tag, nullptr, "The blob's 16-byte tag (bytes).", nullptr},
    {"entry", get_entry, nullptr,
     "The entry's index row (Entry: key, off from the blob's start and len in bytes, kind, "
     "dtype, shape in elements).",
     nullptr},
    {"value", get_value, nullptr,
     "The value, a zero-copy view of the receive buffer (made on first use): a torch.Tensor "
     "for kind 't' (numpy.ndarray or RawEntry where torch lacks the dtype, as decode_entry), "
     "numpy.ndarray for 'n', the unpickled object for 'p' (bytes with allow_pickle=False).",
     nullptr},
    {"buffer", get_buffer, nullptr,
     "The receive buffer holding the entry's len bytes (a ReceivedBuffer).", nullptr},
    {"key", get_key, nullptr, "entry.key, without making the Entry (str).", nullptr},
    {"blob_id", get_blob_id, nullptr, "The blob's id on this connection (int).", nullptr},
    {"index", get_index, nullptr, "The entry's position in its blob (int).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

const char* const doc =
    R"(An entry whose bytes have all arrived: EntryReady(tag, entry, value).

  tag:    the blob's 16-byte tag (bytes).
  entry:  its index row (Entry: key, off from the blob's start and len in
          bytes, kind, dtype, shape in elements).
  value:  the value, a zero-copy view of the receive buffer: a torch.Tensor
          for kind "t" (numpy.ndarray or RawEntry where torch lacks the
          dtype, as decode_entry), numpy.ndarray for "n", the unpickled
          object for "p" (bytes with allow_pickle=False). Made on first use.
  buffer: the receive buffer (ReceivedBuffer), entry.len bytes.
  key, blob_id, index: entry.key; the blob's id on this connection; the
          entry's position in the blob.
Holding the event, its value or its buffer keeps the bytes and their share
of the consumer's window; the credit returns to the sender when all are
freed (on any thread). Unpacks as `tag, entry, value = ev`, and matches as
`case EntryReady(tag, entry, value)`. Made by Consumer only.)";

PyType_Slot slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(&dealloc)},
    {Py_tp_getset, getset},
    {Py_tp_iter, reinterpret_cast<void*>(&iter)},
    {Py_tp_repr, reinterpret_cast<void*>(&repr)},
    {Py_tp_doc, const_cast<char*>(doc)},
    {0, nullptr},
};

PyType_Spec spec = {
    "blobpipe._blobpipe.EntryReady",
    static_cast<int>(sizeof(entry_ready_object)),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    slots,
};

}  // namespace

void init_entry_ready(py::module_& m) {
  auto type = py::reinterpret_steal<py::object>(PyType_FromSpec(&spec));
  if (!type) throw py::error_already_set();
  type.attr("__match_args__") = py::make_tuple("tag", "entry", "value");
  entry_ready_type = reinterpret_cast<PyTypeObject*>(type.ptr());
  m.add_object("EntryReady", type);
}

py::object make_entry_ready(received_ref ref, bool allow_pickle) {
  PyObject* o = entry_ready_type->tp_alloc(entry_ready_type, 0);
  if (o == nullptr) throw py::error_already_set();
  entry_ready_object* self = self_of(o);
  new (&self->ref) received_ref(std::move(ref));
  self->allow_pickle = allow_pickle;
  self->value = self->entry = self->buffer = nullptr;
  return py::reinterpret_steal<py::object>(o);
}

}  // namespace blobpipe::python
