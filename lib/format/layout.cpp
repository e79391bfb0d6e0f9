#include "blobpipe/format/layout.hpp"

#include <msgpack.hpp>

#include <cstring>

#include "checked.hpp"
#include "entry_codec.hpp"

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

// Plans one value at `off`: its index row, item size and contiguity.
result<planned_entry> plan_entry(std::string key, value v, std::uint64_t off) {
  planned_entry pe;
  pe.entry.key = std::move(key);
  pe.entry.off = off;
  pe.entry.kind = v.kind;
  if (v.kind == KIND_PICKLE) {
    pe.entry.len = v.nbytes;
    pe.itemsize = 1;
  } else if (v.kind == KIND_TENSOR || v.kind == KIND_NDARRAY) {
    const dtype* dt = lookup_dtype(v.kind, v.dtype);
    if (!dt) return parse_dtype(v.kind, v.dtype).err();  // says why
    // Tensor rows carry torch's canonical name, as the reference writes it.
    pe.entry.dtype = dt->name;
    pe.itemsize = dt->itemsize;
    if (!v.strides.empty() && v.strides.size() != v.shape.size())
      return make_error(errc::invalid_argument,
                        describe(pe.entry.key) + ": strides rank differs from shape rank");
    auto size = detail::checked_shape_size(v.shape, dt->itemsize);
    if (!size)
      return make_error(errc::invalid_argument,
                        describe(pe.entry.key) + ": negative dim or size overflow");
    pe.entry.len = size->nbytes;
    pe.entry.shape = v.shape;
    pe.contiguous = is_c_contiguous(v.shape, v.strides);
  } else {
    return make_error(errc::unknown_kind, describe(pe.entry.key) + ": kind " +
                                              quote(std::string_view(&v.kind, 1)) +
                                              " is not t, n or p");
  }
  if (pe.entry.len > 0 && v.data == nullptr)
    return make_error(errc::invalid_argument,
                      describe(pe.entry.key) + ": null data for a non-empty value");
  pe.source = std::move(v);
  return pe;
}

// One index row [key, off, len, kind, dtype, shape], as the reference
// encodes it: canonical smallest msgpack encodings, str (not bin) keys.
void pack_row(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e) {
  pk.pack_array(6);
  pk.pack_str(static_cast<std::uint32_t>(e.key.size()));
  pk.pack_str_body(e.key.data(), static_cast<std::uint32_t>(e.key.size()));
  pk.pack(e.off);
  pk.pack(e.len);
  detail::pack_kind(pk, e);
  detail::pack_dtype(pk, e);
  detail::pack_shape(pk, e, /*nil_as_empty=*/false);
}

// The index (msgpack array of rows) of `rows`, each row's Entry given by
// `entry_of`. A template so that layout_builder encodes its planned
// entries without copying their rows first.
template <class Rows, class EntryOf>
std::vector<std::byte> encode_rows(const Rows& rows, EntryOf entry_of) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(static_cast<std::uint32_t>(std::size(rows)));
  for (const auto& row : rows) pack_row(pk, entry_of(row));
  const auto* b = reinterpret_cast<const std::byte*>(buf.data());
  return {b, b + buf.size()};
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
  if (finished_) return make_error(errc::closed, "layout_builder: add after finish");
  auto pe = plan_entry(std::move(key), std::move(v), cursor_);
  if (!pe) return pe.err();
  auto end = detail::checked_add(pe->entry.off, pe->entry.len);
  if (!end || *end > v3_limit)
    return make_error(errc::too_large, describe(pe->entry.key) +
                                           ": data would pass 4 GiB, which the v3 footer "
                                           "cannot address");
  cursor_ = align_up(*end);
  entries_.push_back(std::move(*pe));
  return &entries_.back();
}

result<BlobPlan> layout_builder::finish(const tag_t& tag) {
  if (finished_) return make_error(errc::closed, "layout_builder: finish called twice");
  finished_ = true;
  BlobPlan p;
  p.index = encode_rows(entries_, [](const planned_entry& pe) -> const Entry& { return pe.entry; });
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
  return encode_rows(entries, [](const Entry& e) -> const Entry& { return e; });
}

void append_index_row(const Entry& e, std::vector<std::byte>& out) {
  // One packing buffer per thread, kept: no allocation per row once warm.
  thread_local msgpack::sbuffer buf;
  buf.clear();
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pack_row(pk, e);
  const auto* b = reinterpret_cast<const std::byte*>(buf.data());
  out.insert(out.end(), b, b + buf.size());
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
