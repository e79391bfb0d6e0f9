#include "blobpipe/format/layout.hpp"

#include <cstring>

#include "checked.hpp"

namespace blobpipe {
namespace {

constexpr std::uint64_t v3_limit = std::uint64_t{1} << 32;  // u32 footer fields

std::string describe(const std::string& key) { return "value " + quote(key); }

// True when `strides` (elements) are C-contiguous for `shape`; dims of
// extent 1 may have any stride, as in torch's is_contiguous().
bool is_c_contiguous(const shape_t& shape, const std::vector<std::int64_t>& strides) {
  if (strides.empty()) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;  // empty: nothing to gather
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// Copies a strided value element by element in C order; the innermost
// dimension is copied as one run when it is unit-stride.
void gather(const planned_entry& pe, std::byte* out) {
  const shape_t& shape = pe.source.shape;
  const auto& strides = pe.source.strides;
  const std::size_t rank = shape.size();
  const std::size_t item = pe.itemsize;
  if (rank == 0) {
    std::memcpy(out, pe.source.data, item);
    return;
  }
  const std::int64_t inner = shape[rank - 1];
  const bool inner_run = strides[rank - 1] == 1;
  std::vector<std::int64_t> idx(rank, 0);
  for (;;) {
    std::int64_t base = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) base += idx[d] * strides[d];
    const std::byte* src = pe.source.data + base * static_cast<std::int64_t>(item);
    if (inner_run) {
      std::memcpy(out, src, static_cast<std::size_t>(inner) * item);
      out += inner * static_cast<std::int64_t>(item);
    } else {
      for (std::int64_t j = 0; j < inner; ++j, out += item)
        std::memcpy(out, src + j * strides[rank - 1] * static_cast<std::int64_t>(item), item);
    }
    // Odometer over all but the innermost dimension.
    std::size_t d = rank - 1;
    while (d-- > 0) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

// Plans `v` at `off` into `pe`, a default-constructed entry in the
// builder's vector: its index row (all but the key), item size and
// contiguity. `dt` is lookup_dtype(v.kind, v.dtype) or null. Reads `key`
// for messages only; on an error `pe` is partly filled and the caller
// discards it.
result<void> plan_into(planned_entry& pe, const std::string& key, const value& v,
                       const dtype* dt, std::uint64_t off) {
  pe.entry.off = off;
  pe.entry.kind = v.kind;
  if (v.kind == KIND_PICKLE) {
    pe.entry.len = v.nbytes;
    pe.itemsize = 1;
  } else if (v.kind == KIND_TENSOR || v.kind == KIND_NDARRAY) {
    if (!dt) dt = lookup_dtype(v.kind, v.dtype);
    if (!dt) return parse_dtype(v.kind, v.dtype).err();  // says why
    // Tensor rows carry torch's canonical name, as the reference writes it
    // (torch's names are at most 15 characters: no allocation).
    pe.entry.dtype.emplace(dt->name);
    pe.itemsize = dt->itemsize;
    if (!v.strides.empty() && v.strides.size() != v.shape.size())
      return make_error(errc::invalid_argument,
                        describe(key) + ": strides rank differs from shape rank");
    auto size = detail::checked_shape_size(v.shape, dt->itemsize);
    if (!size)
      return make_error(errc::invalid_argument,
                        describe(key) + ": negative dim or size overflow");
    pe.entry.len = size->nbytes;
    pe.entry.shape.emplace(v.shape);
    pe.contiguous = is_c_contiguous(v.shape, v.strides);
  } else {
    return make_error(errc::unknown_kind, describe(key) + ": kind " +
                                              quote(std::string_view(&v.kind, 1)) +
                                              " is not t, n or p");
  }
  if (pe.entry.len > 0 && v.data == nullptr)
    return make_error(errc::invalid_argument,
                      describe(key) + ": null data for a non-empty value");
  return {};
}

// Canonical msgpack as msgpack-cxx's packer writes it (the smallest
// encoding of each value; str, never bin), written straight into memory
// sized beforehand with row_bound(), so no byte is copied twice.
class canonical_writer {
 public:
  explicit canonical_writer(std::byte* at) noexcept : p_(at) {}
  std::byte* pos() const noexcept { return p_; }

  void nil() noexcept { byte(0xc0); }
  void array(std::uint32_t n) noexcept {
    if (n < 16) {
      byte(0x90 | n);
    } else if (n < 65536) {
      byte(0xdc);
      be(n, 2);
    } else {
      byte(0xdd);
      be(n, 4);
    }
  }
  void str(const char* s, std::uint32_t n) noexcept {
    if (n < 32) {
      byte(0xa0 | n);
    } else if (n < 256) {
      byte(0xd9);
      be(n, 1);
    } else if (n < 65536) {
      byte(0xda);
      be(n, 2);
    } else {
      byte(0xdb);
      be(n, 4);
    }
    if (n) std::memcpy(p_, s, n);
    p_ += n;
  }
  void uint(std::uint64_t v) noexcept {
    if (v < 128) {
      byte(static_cast<unsigned>(v));
    } else if (v < 256) {
      byte(0xcc);
      be(v, 1);
    } else if (v < 65536) {
      byte(0xcd);
      be(v, 2);
    } else if (v < (std::uint64_t{1} << 32)) {
      byte(0xce);
      be(v, 4);
    } else {
      byte(0xcf);
      be(v, 8);
    }
  }
  void sint(std::int64_t v) noexcept {
    if (v >= 0) return uint(static_cast<std::uint64_t>(v));
    const auto bits = static_cast<std::uint64_t>(v);
    if (v >= -32) {
      byte(static_cast<unsigned>(bits & 0xff));  // negative fixint
    } else if (v >= -128) {
      byte(0xd0);
      be(bits, 1);
    } else if (v >= -32768) {
      byte(0xd1);
      be(bits, 2);
    } else if (v >= -(std::int64_t{1} << 31)) {
      byte(0xd2);
      be(bits, 4);
    } else {
      byte(0xd3);
      be(bits, 8);
    }
  }

 private:
  void byte(unsigned b) noexcept { *p_++ = static_cast<std::byte>(b); }
  // The low `n` bytes of `v`, big-endian (msgpack's order).
  void be(std::uint64_t v, int n) noexcept {
    for (int i = n; i-- > 0;) *p_++ = static_cast<std::byte>(v >> (8 * i));
  }
  std::byte* p_;
};

// Most bytes write_row() writes for `e`: each field at its widest form.
std::size_t row_bound(const Entry& e) noexcept {
  return 1 + (5 + e.key.size()) + 9 + 9 + 2 + (e.dtype ? 5 + e.dtype->size() : 1) +
         (e.shape ? 5 + 9 * e.shape->size() : 1);
}

// One index row [key, off, len, kind, dtype, shape], as the reference
// encodes it. A missing dtype or shape is nil.
void write_row(canonical_writer& w, const Entry& e) noexcept {
  w.array(6);
  w.str(e.key.data(), static_cast<std::uint32_t>(e.key.size()));
  w.uint(e.off);
  w.uint(e.len);
  w.str(&e.kind, 1);
  if (e.dtype)
    w.str(e.dtype->data(), static_cast<std::uint32_t>(e.dtype->size()));
  else
    w.nil();
  if (e.shape) {
    w.array(static_cast<std::uint32_t>(e.shape->size()));
    for (const std::int64_t d : *e.shape) w.sint(d);
  } else {
    w.nil();
  }
}

// The index (msgpack array of rows) of `rows`, each row's Entry given by
// `entry_of`, in one pass into a buffer of `bound` bytes (at least the
// array header's 5 and each row's row_bound), cut to what was written. A
// template so that layout_builder encodes its planned entries without
// copying their rows first.
template <class Rows, class EntryOf>
std::vector<std::byte> encode_rows(const Rows& rows, EntryOf entry_of, std::size_t bound) {
  std::vector<std::byte> out(bound);
  canonical_writer w(out.data());
  w.array(static_cast<std::uint32_t>(std::size(rows)));
  for (const auto& row : rows) write_row(w, entry_of(row));
  out.resize(static_cast<std::size_t>(w.pos() - out.data()));
  return out;
}

}  // namespace

value value::tensor_bytes(std::span<const std::byte> bytes, std::string dtype, shape_t shape) {
  value v;
  v.kind = KIND_TENSOR;
  v.dtype = std::move(dtype);
  v.shape = std::move(shape);
  v.data = bytes.data();
  return v;
}

value value::ndarray_bytes(std::span<const std::byte> bytes, std::string dtype, shape_t shape) {
  value v = tensor_bytes(bytes, std::move(dtype), std::move(shape));
  v.kind = KIND_NDARRAY;
  return v;
}

value value::bools(const std::vector<bool>& b) {
  auto bytes = std::make_shared<std::vector<std::uint8_t>>(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) (*bytes)[i] = b[i] ? 1 : 0;
  value v = tensor(std::span<const std::uint8_t>(*bytes),
                   shape_t{static_cast<std::int64_t>(b.size())}, torch_dtype_of<bool>());
  v.owner = std::move(bytes);
  return v;
}

value value::pickle(std::span<const std::byte> bytes) {
  value v;
  v.kind = KIND_PICKLE;
  v.data = bytes.data();
  v.nbytes = bytes.size();
  return v;
}

result<const planned_entry*> layout_builder::add(std::string key, value v) {
  return add(std::move(key), std::move(v), nullptr);
}

result<const planned_entry*> layout_builder::add(std::string&& key, value&& v, const dtype* dt) {
  if (finished_) return make_error(errc::closed, "layout_builder: add after finish");
  // Planned where it will stay; a refusal takes it back.
  planned_entry& pe = entries_.emplace_back();
  if (auto planned = plan_into(pe, key, v, dt, cursor_); !planned) {
    entries_.pop_back();
    return planned.err();
  }
  auto end = detail::checked_add(pe.entry.off, pe.entry.len);
  if (!end || *end > v3_limit) {
    entries_.pop_back();
    return make_error(errc::too_large, describe(key) +
                                           ": data would pass 4 GiB, which the v3 footer "
                                           "cannot address");
  }
  pe.entry.key = std::move(key);
  pe.source = std::move(v);
  cursor_ = align_up(*end);
  index_bound_ += row_bound(pe.entry);
  return &pe;
}

result<BlobPlan> layout_builder::finish(const tag_t& tag) {
  if (finished_) return make_error(errc::closed, "layout_builder: finish called twice");
  finished_ = true;
  BlobPlan p;
  p.index = encode_rows(
      entries_, [](const planned_entry& pe) -> const Entry& { return pe.entry; }, index_bound_);
  if (cursor_ >= v3_limit || p.index.size() >= v3_limit)
    return make_error(errc::too_large, "index_off " + std::to_string(cursor_) + " or index_len " +
                                           std::to_string(p.index.size()) +
                                           " does not fit the v3 footer's 32-bit fields");
  p.entries = std::move(entries_);
  p.nbytes = cursor_ + p.index.size() + FOOTER_SIZE;
  p.tag = tag;
  return p;
}

std::vector<std::byte> encode_index(std::span<const Entry> entries) {
  std::size_t bound = 5;
  for (const Entry& e : entries) bound += row_bound(e);
  return encode_rows(entries, [](const Entry& e) -> const Entry& { return e; }, bound);
}

namespace detail {

std::size_t index_row_bound(const Entry& e) noexcept { return row_bound(e); }

std::size_t write_index_row(const Entry& e, std::span<std::byte> out) noexcept {
  canonical_writer w(out.data());
  write_row(w, e);
  return static_cast<std::size_t>(w.pos() - out.data());
}

}  // namespace detail

void append_index_row(const Entry& e, std::vector<std::byte>& out) {
  const std::size_t at = out.size();
  out.resize(at + row_bound(e));
  canonical_writer w(out.data() + at);
  write_row(w, e);
  out.resize(static_cast<std::size_t>(w.pos() - out.data()));
}

result<BlobPlan> plan(std::span<const std::string> keys, std::span<const value> values,
                      const tag_t& tag) {
  if (keys.size() != values.size())
    return make_error(errc::invalid_argument, std::to_string(keys.size()) + " keys for " +
                                                  std::to_string(values.size()) + " values");
  layout_builder b;
  b.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (auto r = b.add(keys[i], values[i]); !r) return r.err();
  return b.finish(tag);
}

result<BlobPlan> plan(std::initializer_list<std::string> keys,
                      std::initializer_list<value> values, const tag_t& tag) {
  return plan(std::span<const std::string>(keys.begin(), keys.size()),
              std::span<const value>(values.begin(), values.size()), tag);
}

result<void> write_entry(const planned_entry& pe, std::span<std::byte> out) {
  if (out.size() != pe.entry.len)
    return make_error(errc::buffer_too_small,
                      "entry " + quote(pe.entry.key) + " needs exactly " +
                          std::to_string(pe.entry.len) + " bytes, got " +
                          std::to_string(out.size()));
  if (pe.entry.len == 0) return {};
  // The format layer copies with the CPU; device bytes go through the
  // sender's staging path (docs/cuda.md).
  if (pe.source.memory == memory_kind::cuda_device)
    return make_error(errc::invalid_argument,
                      "entry " + quote(pe.entry.key) +
                          " is in CUDA device memory; write() reads host memory only");
  if (pe.contiguous)
    std::memcpy(out.data(), pe.source.data, out.size());
  else
    gather(pe, out.data());
  return {};
}

result<std::uint64_t> write(const BlobPlan& p, std::span<std::byte> out) {
  if (out.size() < p.nbytes)
    return make_error(errc::buffer_too_small, "blob needs " + std::to_string(p.nbytes) +
                                                  " bytes, buffer has " +
                                                  std::to_string(out.size()));
  std::uint64_t pos = 0;  // everything before pos is written
  for (const planned_entry& pe : p.entries) {
    std::memset(out.data() + pos, 0, pe.entry.off - pos);  // pad
    auto r = write_entry(pe, out.subspan(pe.entry.off, pe.entry.len));
    if (!r) return r.err();
    pos = pe.entry.off + pe.entry.len;
  }
  std::memset(out.data() + pos, 0, p.index_off() - pos);
  if (auto r = write_tail(p, out.subspan(p.index_off())); !r) return r.err();
  return p.nbytes;
}

result<std::uint64_t> write_tail(const BlobPlan& p, std::span<std::byte> out) {
  const std::uint64_t n = tail_size(p);
  if (out.size() < n)
    return make_error(errc::buffer_too_small, "tail needs " + std::to_string(n) +
                                                  " bytes, buffer has " +
                                                  std::to_string(out.size()));
  if (!p.index.empty()) std::memcpy(out.data(), p.index.data(), p.index.size());
  footer f;
  f.index_off = static_cast<std::uint32_t>(p.index_off());
  f.index_len = static_cast<std::uint32_t>(p.index.size());
  f.tag = p.tag;
  encode_footer(f, out.subspan(p.index.size(), FOOTER_SIZE));
  return n;
}

}  // namespace blobpipe
