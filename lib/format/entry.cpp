#include "blobpipe/format/entry.hpp"

#include <msgpack.hpp>

#include "blobpipe/format/dtype.hpp"
#include "checked.hpp"
#include "entry_codec.hpp"
#include "msgpack_bounded.hpp"

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

result<shape_t> read_shape(const msgpack::object& o, std::string_view where) {
  if (o.type != msgpack::type::ARRAY)
    return make_error(errc::malformed_index, std::string(where) + ": shape is not an array");
  if (o.via.array.size > max_dims)
    return make_error(errc::malformed_index, std::string(where) + ": shape has " +
                                                 std::to_string(o.via.array.size) +
                                                 " dims (max 64)");
  shape_t shape;
  shape.reserve(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
    auto d = as_uint(o.via.array.ptr[i]);
    // Dims above 2^62 cannot describe real memory; refusing them keeps
    // int64 shape arithmetic exact.
    if (!d || *d > (std::uint64_t{1} << 62))
      return make_error(errc::malformed_index,
                        std::string(where) + ": shape dim is not a non-negative integer");
    shape.push_back(static_cast<std::int64_t>(*d));
  }
  return shape;
}

result<void> read_kind_dtype_shape(const msgpack::object& kind, const msgpack::object& dt,
                                   const msgpack::object& shape, Entry& e,
                                   std::string_view where) {
  auto k = as_str(kind);
  if (!k) return make_error(errc::malformed_index, std::string(where) + ": kind is not a str");
  if (k->size() != 1 || !is_known_kind((*k)[0]))
    return make_error(errc::unknown_kind,
                      std::string(where) + ": kind '" + std::string(k->substr(0, 16)) +
                          "' is not t, n or p");
  e.kind = (*k)[0];
  if (dt.type == msgpack::type::NIL) {
    e.dtype.reset();
  } else if (auto s = as_str(dt)) {
    e.dtype = std::string(*s);
  } else {
    return make_error(errc::malformed_index, std::string(where) + ": dtype is not a str or nil");
  }
  if (shape.type == msgpack::type::NIL) {
    e.shape.reset();
  } else {
    auto s = read_shape(shape, where);
    if (!s) return s.err();
    e.shape = std::move(*s);
  }
  return {};
}

}  // namespace detail

std::vector<std::byte> Entry::meta() const {
  msgpack::sbuffer buf;
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
  return {p, p + buf.size()};
}

result<Entry> Entry::from_meta(std::string key, std::span<const std::byte> m) {
  auto oh = detail::unpack_bounded(m, 3, "entry meta");
  if (!oh) return oh.err();
  const msgpack::object& o = oh->get();
  if (o.type != msgpack::type::MAP || o.via.map.size != 5)
    return make_error(errc::malformed_index, "entry meta is not a map of 5 fields");
  const msgpack::object* f[5] = {};  // o, n, k, d, s
  static constexpr std::string_view names = "onkds";
  for (std::uint32_t i = 0; i < 5; ++i) {
    const auto& kv = o.via.map.ptr[i];
    auto name = detail::as_str(kv.key);
    std::size_t slot = name && name->size() == 1 ? names.find((*name)[0]) : names.npos;
    if (slot == names.npos || f[slot])
      return make_error(errc::malformed_index, "entry meta has an unknown or repeated field");
    f[slot] = &kv.val;
  }
  Entry e;
  e.key = std::move(key);
  auto off = detail::as_uint(*f[0]);
  auto len = detail::as_uint(*f[1]);
  if (!off || !len)
    return make_error(errc::malformed_index, "entry meta: o and n must be non-negative integers");
  e.off = *off;
  e.len = *len;
  // Unlike an index row, the meta map always carries "s" as an array.
  if (f[4]->type != msgpack::type::ARRAY)
    return make_error(errc::malformed_index, "entry meta: s must be an array");
  if (auto r = detail::read_kind_dtype_shape(*f[2], *f[3], *f[4], e, "entry meta"); !r)
    return r.err();
  // The meta map spells "no shape" as []; a pickle has none.
  if (e.kind == KIND_PICKLE && e.shape && e.shape->empty()) e.shape.reset();
  return e;
}

result<void> validate_entry(const Entry& e, std::uint64_t data_end) {
  auto where = [&] { return "entry '" + e.key.substr(0, 64) + "'"; };
  if (!is_known_kind(e.kind))
    return make_error(errc::unknown_kind,
                      where() + ": kind '" + std::string(1, e.kind) + "' is not t, n or p");
  auto end = detail::checked_add(e.off, e.len);
  if (!end || *end > data_end)
    return make_error(errc::entry_out_of_range,
                      where() + ": bytes [" + std::to_string(e.off) + ", +" +
                          std::to_string(e.len) + ") run past the data region end " +
                          std::to_string(data_end));
  if (e.off % 64 != 0)
    return make_error(errc::entry_out_of_range,
                      where() + ": offset " + std::to_string(e.off) + " is not 64-byte aligned");
  if (e.kind == KIND_PICKLE) return {};
  // A tensor row with nil dtype means float32 (reference behaviour); an
  // ndarray row must name its dtype.
  result<dtype> dt = e.dtype ? parse_dtype(e.kind, *e.dtype)
                     : e.kind == KIND_TENSOR
                         ? parse_torch_dtype("float32")
                         : result<dtype>(errc::unknown_dtype, where() + ": ndarray row has no dtype");
  if (!dt) return dt.err();
  std::uint64_t bytes = dt->itemsize;
  if (e.shape) {
    for (std::int64_t d : *e.shape) {
      auto m = d < 0 ? std::nullopt : detail::checked_mul(bytes, static_cast<std::uint64_t>(d));
      if (!m)
        return make_error(errc::shape_mismatch, where() + ": shape overflows 64 bits");
      bytes = *m;
    }
    if (bytes != e.len)
      return make_error(errc::shape_mismatch,
                        where() + ": shape x itemsize is " + std::to_string(bytes) +
                            " bytes but len is " + std::to_string(e.len));
  } else if (dt->itemsize == 0 ? e.len != 0 : e.len % dt->itemsize != 0) {
    // No shape: read as 1-d, which needs a whole number of elements.
    return make_error(errc::shape_mismatch,
                      where() + ": len " + std::to_string(e.len) +
                          " is not a multiple of the item size");
  }
  return {};
}

}  // namespace blobpipe
