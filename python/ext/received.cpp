#include "received.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "decode.hpp"
#include "runtime.hpp"
#include "state.hpp"

namespace blobpipe::python {
namespace {

// ---- DLPack (the v0.x ABI torch 1.13 reads; dlpack/dlpack.h, which
// Debian does not package, declares the same layout) ----

struct DLDevice {
  std::int32_t device_type;  // kDLCPU = 1
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // elements
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

constexpr std::int32_t kDLCPU = 1;

// The DLPack type of a torch dtype, or none (uint16/32/64 and float8 are
// not in torch 1.13; bool is handled by the caller).
std::optional<DLDataType> dl_type(scalar_type t) {
  auto of = [](std::uint8_t code, std::uint8_t bits) { return DLDataType{code, bits, 1}; };
  switch (t) {
    case scalar_type::int8: return of(0, 8);
    case scalar_type::int16: return of(0, 16);
    case scalar_type::int32: return of(0, 32);
    case scalar_type::int64: return of(0, 64);
    case scalar_type::uint8: return of(1, 8);
    case scalar_type::bool_: return of(1, 8);  // as uint8, then viewed as bool
    case scalar_type::float16: return of(2, 16);
    case scalar_type::float32: return of(2, 32);
    case scalar_type::float64: return of(2, 64);
    case scalar_type::bfloat16: return of(4, 16);
    case scalar_type::complex64: return of(5, 64);
    case scalar_type::complex128: return of(5, 128);
    default: return std::nullopt;
  }
}

// What a DLPack tensor's deleter frees: the shape and strides it points
// at, and the entry.
struct dl_holder {
  explicit dl_holder(received_ref r) : ref(std::move(r)) {}
  DLManagedTensor m{};
  std::vector<std::int64_t> shape, strides;
  received_ref ref;
};

void dl_delete(DLManagedTensor* m) {
  // Runs where torch frees the tensor: any thread, GIL or not. Dropping
  // the ref touches no Python object.
  std::unique_ptr<dl_holder> h(static_cast<dl_holder*>(m->manager_ctx));
}

const char* const dltensor_name = "dltensor";

// A capsule torch never took (from_dlpack failed before renaming it
// "used_dltensor") still owns its tensor.
void capsule_free(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, dltensor_name)) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, dltensor_name));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

py::object dlpack_tensor(const torch_state& torch, const received_ref& ref, DLDataType type,
                         bool as_bool) {
  const entry_view& v = ref.e->view;
  auto h = std::make_unique<dl_holder>(ref);
  h->shape.assign(v.shape.begin(), v.shape.end());
  h->strides.resize(h->shape.size());
  std::int64_t stride = 1;
  for (std::size_t i = h->shape.size(); i-- > 0;) {
    h->strides[i] = stride;
    stride *= h->shape[i];
  }
  DLTensor& t = h->m.dl_tensor;
  // The bytes are this entry's own buffer (received.hpp), so the tensor
  // may be writable like one from torch.frombuffer of a bytearray.
  t.data = const_cast<std::byte*>(v.bytes.data());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(h->shape.size());
  t.dtype = type;
  t.shape = h->shape.data();
  t.strides = h->strides.data();
  t.byte_offset = 0;
  h->m.manager_ctx = h.get();
  h->m.deleter = &dl_delete;
  PyObject* cap = PyCapsule_New(&h->m, dltensor_name, &capsule_free);
  if (cap == nullptr) throw py::error_already_set();
  h.release();  // the capsule (then the tensor) owns it now
  py::object capsule = py::reinterpret_steal<py::object>(cap);
  py::object tensor = torch.from_dlpack(capsule);
  if (as_bool) tensor = tensor.attr(state().s_view)(torch.by_name("bool"));
  return tensor;
}

// Whether this torch has the dtype: torch_state::by_name, remembered per
// scalar_type (a search of torch's dtypes by name per entry otherwise).
bool torch_has(const torch_state& torch, const dtype& t) {
  enum : std::int8_t { unknown = 0, yes, no };
  static std::array<std::int8_t, 64> known{};
  static const torch_state* known_for = nullptr;
  if (known_for != &torch) {
    known.fill(unknown);
    known_for = &torch;
  }
  const auto i = static_cast<std::size_t>(t.type);
  if (i >= known.size()) return static_cast<bool>(torch.by_name(t.name));
  if (known[i] == unknown) known[i] = torch.by_name(t.name) ? yes : no;
  return known[i] == yes;
}

// The Python type holding a received_ref and exposing its bytes.
struct buffer_owner {
  received_ref ref;
};

}  // namespace

received_ref::~received_ref() {
  if (!rt) return;
  if (rt->generation() != fork_generation()) {
    leak_in_child(std::move(e));
    leak_in_child(std::move(rt));
    return;
  }
  if (e) rt->retire(std::move(e));
}

py::object received_buffer(received_ref ref) {
  return py::cast(buffer_owner{std::move(ref)});
}

py::object received_value(const received_ref& ref, bool allow_pickle) {
  python_call decoding;  // torch and pickle may release the GIL (runtime.hpp)
  const entry_view& v = ref.e->view;
  if (v.entry->kind == KIND_TENSOR && !v.bytes.empty()) {
    if (const torch_state* torch = torch_for_decode(); torch && torch->from_dlpack) {
      if (auto type = dl_type(v.type.type); type && torch_has(*torch, v.type))
        return dlpack_tensor(*torch, ref, *type, v.type.type == scalar_type::bool_);
    }
  }
  return decode_value(received_buffer(ref), v, allow_pickle);
}

void init_received(py::module_& m) {
  py::class_<buffer_owner>(m, "ReceivedBuffer", py::buffer_protocol(),
                           R"(The bytes of one received entry, in the consumer's receive buffer.

Exposes them through the buffer protocol (memoryview(b), numpy.frombuffer(b)):
one dimension of len(b) bytes, format "B", writable (the buffer is this
entry's alone). Holding it, or any value viewing it, keeps the bytes and
their window credit; the credit returns to the sender when the last such
object is freed, on whichever thread. EntryReady.buffer gives one.)")
      .def_buffer([](buffer_owner& b) {
        auto bytes = b.ref.e->view.bytes;
        // An empty entry may have no buffer at all; exporters need an address.
        static std::byte none[1];
        std::byte* p = bytes.empty() ? none : const_cast<std::byte*>(bytes.data());
        return py::buffer_info(p, 1, "B",
                               static_cast<py::ssize_t>(bytes.size()), false);
      })
      .def("__len__", [](const buffer_owner& b) { return b.ref.e->view.bytes.size(); })
      .def_property_readonly(
          "address",
          [](const buffer_owner& b) {
            return reinterpret_cast<std::uintptr_t>(b.ref.e->view.bytes.data());
          },
          "Address of the first byte (an int), for checks that values view this buffer.");
}

}  // namespace blobpipe::python
