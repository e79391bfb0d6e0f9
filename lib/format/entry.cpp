#include "blobpipe/format/entry.hpp"

#include <msgpack.hpp>

#include <new>

#include "blobpipe/format/dtype.hpp"
#include "checked.hpp"
#include "entry_codec.hpp"
#include "index_rows.hpp"

namespace blobpipe {
namespace detail {

void pack_kind(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e) {
  const char kind[1] = {e.kind};
  pk.pack_str(1);
  pk.pack_str_body(kind, 1);
}

void pack_dtype(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e) {
  if (!e.dtype) {
    pk.pack_nil();
    return;
  }
  pk.pack_str(static_cast<std::uint32_t>(e.dtype->size()));
  pk.pack_str_body(e.dtype->data(), static_cast<std::uint32_t>(e.dtype->size()));
}

void pack_shape(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e, bool nil_as_empty) {
  if (e.shape) {
    pk.pack_array(static_cast<std::uint32_t>(e.shape->size()));
    for (std::int64_t d : *e.shape) pk.pack(d);
  } else if (nil_as_empty) {
    pk.pack_array(0);
  } else {
    pk.pack_nil();
  }
}

std::string field_source::text() const {
  return row == SIZE_MAX ? std::string(what) : std::string(what) + " " + std::to_string(row);
}

namespace {

// Reads a shape array: at most max_dims dims, each an int in [0, 2^62].
// The dims go into `out`, or nowhere when it is null (a pickle's shape is
// checked, then ignored).
result<void> read_shape(msgpack_reader& r, shape_t* out, const field_source& at) {
  auto n = r.array_header();
  if (!n) return make_error(errc::malformed_index, at.text() + ": shape is not an array");
  if (*n > max_dims)
    return make_error(errc::malformed_index,
                      at.text() + ": shape has " + std::to_string(*n) + " dims (max 64)");
  if (out) out->reserve(*n);  // at most max_dims
  for (std::uint32_t i = 0; i < *n; ++i) {
    auto d = r.uint();
    // Dims above 2^62 cannot describe real memory; refusing them keeps
    // int64 shape arithmetic exact.
    if (!d || *d > (std::uint64_t{1} << 62))
      return make_error(errc::malformed_index,
                        at.text() + ": shape dim is not a non-negative integer");
    if (out) out->push_back(static_cast<std::int64_t>(*d));
  }
  return {};
}

}  // namespace

result<void> read_kind_dtype_shape(msgpack_reader& kind, msgpack_reader& dt,
                                   msgpack_reader& shape, Entry& e, const field_source& at) {
  auto k = kind.str();
  if (!k) return make_error(errc::malformed_index, at.text() + ": kind is not a str");
  if (k->size() != 1 || !is_known_kind((*k)[0]))
    return make_error(errc::unknown_kind,
                      at.text() + ": kind " + quote(*k, 16) + " is not t, n or p");
  e.kind = (*k)[0];
  // A pickle is opaque bytes: the reference's decode_entry never looks at
  // its dtype or shape, and never writes either, so we drop them.
  const bool keep = e.kind != KIND_PICKLE;
  e.dtype.reset();
  if (!dt.nil()) {
    auto s = dt.str();
    if (!s) return make_error(errc::malformed_index, at.text() + ": dtype is not a str or nil");
    if (keep) e.dtype.emplace(*s);
  }
  e.shape.reset();
  if (shape.nil()) return {};
  if (!keep) return read_shape(shape, nullptr, at);  // checked, then dropped
  e.shape.emplace();
  return read_shape(shape, &*e.shape, at);
}

}  // namespace detail

std::vector<std::byte> Entry::meta() const {
  std::vector<std::byte> out;
  append_meta(out);
  return out;
}

void Entry::append_meta(std::vector<std::byte>& out) const {
  // One packing buffer per thread, kept: no allocation per entry once warm.
  thread_local msgpack::sbuffer buf;
  buf.clear();
  msgpack::packer<msgpack::sbuffer> pk(buf);
  auto field = [&pk](const char* name) {
    pk.pack_str(1);
    pk.pack_str_body(name, 1);
  };
  pk.pack_map(5);
  field("o");
  pk.pack(off);
  field("n");
  pk.pack(len);
  field("k");
  detail::pack_kind(pk, *this);
  field("d");
  detail::pack_dtype(pk, *this);
  field("s");
  // The meta map spells a missing shape as [] (the reference's convention).
  detail::pack_shape(pk, *this, /*nil_as_empty=*/true);
  const auto* p = reinterpret_cast<const std::byte*>(buf.data());
  out.insert(out.end(), p, p + buf.size());
}

namespace {

result<Entry> read_meta(std::string key, std::span<const std::byte> m) {
  auto malformed = [](const char* why) {
    return make_error(errc::malformed_index, std::string("entry meta") + why);
  };
  // Pass 1, over the bytes as they are: a map of five fields named o, n,
  // k, d, s, each value well-formed msgpack (nested at most three deep
  // counting the map, as before), nothing after it. Each field's bytes are
  // kept to read in pass 2.
  detail::msgpack_reader r(m);
  auto pairs = r.map_header();
  if (!pairs || *pairs != 5) return malformed(" is not a map of 5 fields");
  static constexpr std::string_view names = "onkds";
  std::span<const std::byte> field[5] = {};  // o, n, k, d, s: the value onward
  for (std::uint32_t i = 0; i < 5; ++i) {
    auto name = r.str();
    const std::size_t slot = name && name->size() == 1 ? names.find((*name)[0]) : names.npos;
    if (slot == names.npos || !field[slot].empty())
      return malformed(" has an unknown or repeated field");
    field[slot] = r.rest();
    if (!r.skip(2)) return malformed(": not valid msgpack");
  }
  if (!r.at_end()) return malformed(": trailing bytes after the map");

  // Pass 2, field by field, in the order the checks have always run.
  Entry e;
  e.key = std::move(key);
  detail::msgpack_reader o(field[0]), n(field[1]), k(field[2]), d(field[3]), s(field[4]);
  auto off = o.uint();
  auto len = n.uint();
  if (!off || !len) return malformed(": o and n must be non-negative integers");
  e.off = *off;
  e.len = *len;
  // Unlike an index row, the meta map always carries "s" as an array
  // ([] when there is no shape).
  if (!s.peek_array()) return malformed(": s must be an array");
  if (auto r2 = detail::read_kind_dtype_shape(k, d, s, e, {"entry meta"}); !r2) return r2.err();
  return e;
}

}  // namespace

result<Entry> Entry::from_meta(std::string key, std::span<const std::byte> m) {
  try {
    return read_meta(std::move(key), m);
  } catch (const std::bad_alloc&) {  // the dtype and shape (at most 64 dims)
    return allocation_error("out of memory for an entry meta", m.size());
  }
}

result<void> validate_entry(const Entry& e, std::uint64_t data_end) {
  auto r = detail::validate_row(e, data_end, nullptr);
  if (!r) return r.err();
  return {};
}

namespace detail {

result<const dtype*> validate_row(const Entry& e, std::uint64_t data_end, const dtype* known) {
  auto where = [&] { return "entry " + quote(e.key); };
  if (!is_known_kind(e.kind))
    return make_error(errc::unknown_kind, where() + ": kind " +
                                              quote(std::string_view(&e.kind, 1)) +
                                              " is not t, n or p");
  auto end = detail::checked_add(e.off, e.len);
  if (!end || *end > data_end)
    return make_error(errc::entry_out_of_range,
                      where() + ": bytes [" + std::to_string(e.off) + ", +" +
                          std::to_string(e.len) + ") run past the data region end " +
                          std::to_string(data_end));
  if (e.off % 64 != 0)
    return make_error(errc::entry_out_of_range,
                      where() + ": offset " + std::to_string(e.off) + " is not 64-byte aligned");
  if (e.kind == KIND_PICKLE) return nullptr;
  // A tensor row with nil dtype means float32 (reference behaviour); an
  // ndarray row must name its dtype.
  if (!e.dtype && e.kind != KIND_TENSOR)
    return make_error(errc::unknown_dtype, where() + ": ndarray row has no dtype");
  const dtype* dt =
      known ? known : lookup_dtype(e.kind, e.dtype ? std::string_view(*e.dtype) : "float32");
  if (!dt) return parse_dtype(e.kind, *e.dtype).err();  // says why
  if (e.shape) {
    auto size = detail::checked_shape_size(*e.shape, dt->itemsize);
    if (!size)
      return make_error(errc::shape_mismatch,
                        where() + ": shape is negative or overflows 64 bits");
    if (size->nbytes != e.len)
      return make_error(errc::shape_mismatch,
                        where() + ": shape x itemsize is " + std::to_string(size->nbytes) +
                            " bytes but len is " + std::to_string(e.len));
  } else if (dt->itemsize == 0 ? e.len != 0 : e.len % dt->itemsize != 0) {
    // No shape: read as 1-d, which needs a whole number of elements.
    return make_error(errc::shape_mismatch,
                      where() + ": len " + std::to_string(e.len) +
                          " is not a multiple of the item size");
  }
  return dt;
}

}  // namespace detail

}  // namespace blobpipe
