// The frame codec (docs/wire.md "Frame header", "Handshake", "entry_begin").
#include "blobpipe/protocol/wire.hpp"

#include <array>
#include <cstring>

#include "lib/format/le.hpp"

namespace blobpipe {

using detail::load_le;
using detail::store_le;

namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

error violation(std::string what) { return make_error(errc::protocol_violation, std::move(what)); }

/// Flags each frame type may carry.
std::uint8_t allowed_flags(frame_type t) noexcept {
  switch (t) {
    case frame_type::entry_begin:
      return frame_flag_inline | frame_flag_timestamp | frame_flag_compact;
    case frame_type::blob_begin: return frame_flag_group;
    case frame_type::ack: return frame_flag_credit_request;
    default: return 0;
  }
}

}  // namespace

const char* frame_type_name(frame_type t) noexcept {
  switch (t) {
    case frame_type::hello: return "hello";
    case frame_type::blob_begin: return "blob_begin";
    case frame_type::entry_begin: return "entry_begin";
    case frame_type::data: return "data";
    case frame_type::tail: return "tail";
    case frame_type::blob_abort: return "blob_abort";
    case frame_type::ack: return "ack";
    case frame_type::close: return "close";
  }
  return "unknown";
}

void encode_frame_header(const frame_header& h, std::span<std::byte> out) noexcept {
  std::byte* p = out.data();
  store_le<std::uint8_t>(p + 0, static_cast<std::uint8_t>(h.type));
  store_le<std::uint8_t>(p + 1, h.flags);
  store_le<std::uint16_t>(p + 2, 0);
  store_le<std::uint32_t>(p + 4, h.length);
  store_le<std::uint64_t>(p + 8, h.blob_id);
  store_le<std::uint64_t>(p + 16, h.arg);
}

result<frame_header> decode_frame_header(std::span<const std::byte> in,
                                         std::uint32_t max_frame_bytes) {
  if (in.size() < frame_header_size)
    return {errc::too_small, "frame header: " + num(in.size()) + " bytes, need 24"};
  const std::byte* p = in.data();
  const auto type = load_le<std::uint8_t>(p + 0);
  if (!is_known_frame_type(type))
    return violation("frame header: unknown frame type " + num(type));
  frame_header h;
  h.type = static_cast<frame_type>(type);
  h.flags = load_le<std::uint8_t>(p + 1);
  if ((h.flags & ~allowed_flags(h.type)) != 0)
    return violation(std::string("frame header: ") + frame_type_name(h.type) + " flags " +
                     num(h.flags) + " not known");
  if (load_le<std::uint16_t>(p + 2) != 0)
    return violation("frame header: non-zero reserved field");
  h.length = load_le<std::uint32_t>(p + 4);
  h.blob_id = load_le<std::uint64_t>(p + 8);
  h.arg = load_le<std::uint64_t>(p + 16);
  if (h.length > max_frame_bytes)
    return violation(std::string("frame header: ") + frame_type_name(h.type) + " length " +
                     num(h.length) + " exceeds max_frame_bytes " + num(max_frame_bytes));
  return h;
}

std::vector<std::byte> encode_hello(const hello& h) {
  std::size_t ext_bytes = 0;
  for (const auto& e : h.extensions) ext_bytes += 4 + e.value.size();
  std::vector<std::byte> out(hello_size + ext_bytes);
  std::byte* p = out.data();
  store_le<std::uint32_t>(p + 0, WIRE_MAGIC);
  store_le<std::uint16_t>(p + 4, h.version);
  store_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(h.role));
  store_le<std::uint32_t>(p + 8, h.max_chunk_bytes);
  store_le<std::uint32_t>(p + 12, h.max_key_bytes);
  store_le<std::uint64_t>(p + 16, h.window_bytes);
  store_le<std::uint32_t>(p + 24, h.max_meta_bytes);
  store_le<std::uint32_t>(p + 28, h.dedup_window);
  std::memcpy(p + 32, h.session.data(), h.session.size());
  store_le<std::uint64_t>(p + 48, h.features);
  store_le<std::uint32_t>(p + 56, h.inline_bytes);
  store_le<std::uint16_t>(p + 60, static_cast<std::uint16_t>(ext_bytes));
  store_le<std::uint16_t>(p + 62, 0);
  std::byte* x = p + hello_size;
  for (const auto& e : h.extensions) {
    store_le<std::uint16_t>(x, e.type);
    store_le<std::uint16_t>(x + 2, static_cast<std::uint16_t>(e.value.size()));
    if (!e.value.empty()) std::memcpy(x + 4, e.value.data(), e.value.size());
    x += 4 + e.value.size();
  }
  return out;
}

result<hello> decode_hello(std::span<const std::byte> payload) {
  // Magic and version come before the size check: a version-2 peer (whose
  // hello is 48 bytes) is then told so by name, not by a size mismatch.
  if (payload.size() < 8)
    return violation("hello: " + num(payload.size()) + " bytes, expected at least 64");
  const std::byte* p = payload.data();
  if (load_le<std::uint32_t>(p) != WIRE_MAGIC)
    return violation("hello: bad magic (not a blobpipe peer)");
  hello h;
  h.version = load_le<std::uint16_t>(p + 4);
  if (h.version != WIRE_VERSION)
    return violation("hello: unsupported wire version " + num(h.version) +
                     " (this side speaks " + num(WIRE_VERSION) + ")");
  if (payload.size() < hello_size || payload.size() > max_hello_bytes)
    return violation("hello: " + num(payload.size()) + " bytes, expected 64 to 4096");
  const auto role = load_le<std::uint16_t>(p + 6);
  if (role != static_cast<std::uint16_t>(wire_role::sender) &&
      role != static_cast<std::uint16_t>(wire_role::consumer))
    return violation("hello: unknown role " + num(role));
  h.role = static_cast<wire_role>(role);
  h.max_chunk_bytes = load_le<std::uint32_t>(p + 8);
  h.max_key_bytes = load_le<std::uint32_t>(p + 12);
  h.window_bytes = load_le<std::uint64_t>(p + 16);
  h.max_meta_bytes = load_le<std::uint32_t>(p + 24);
  h.dedup_window = load_le<std::uint32_t>(p + 28);
  std::memcpy(h.session.data(), p + 32, h.session.size());
  h.features = load_le<std::uint64_t>(p + 48);
  h.inline_bytes = load_le<std::uint32_t>(p + 56);
  const std::size_t ext_bytes = load_le<std::uint16_t>(p + 60);
  if (load_le<std::uint16_t>(p + 62) != 0) return violation("hello: non-zero reserved field");
  if (hello_size + ext_bytes != payload.size())
    return violation("hello: " + num(ext_bytes) + " extension bytes announced, " +
                     num(payload.size() - hello_size) + " present");
  if (h.max_chunk_bytes < min_chunk_bytes)
    return violation("hello: max_chunk_bytes " + num(h.max_chunk_bytes) + " below 64");
  if (h.inline_bytes > max_inline_bytes)
    return violation("hello: inline_bytes " + num(h.inline_bytes) + " above " +
                     num(max_inline_bytes));
  for (std::size_t at = hello_size; at < payload.size();) {
    if (payload.size() - at < 4) return violation("hello: truncated extension header");
    hello_extension e;
    e.type = load_le<std::uint16_t>(p + at);
    const std::size_t len = load_le<std::uint16_t>(p + at + 2);
    if (len > payload.size() - at - 4) return violation("hello: extension runs past the hello");
    e.value.assign(p + at + 4, p + at + 4 + len);
    h.extensions.push_back(std::move(e));
    at += 4 + len;
  }
  return h;
}

hello_extension max_entry_bytes_extension(std::uint64_t max_entry_bytes) {
  hello_extension e{.type = hello_ext_max_entry_bytes,
                    .value = std::vector<std::byte>(hello_ext_max_entry_bytes_size)};
  store_le<std::uint64_t>(e.value.data(), max_entry_bytes);
  return e;
}

result<std::optional<std::uint64_t>> read_max_entry_bytes(const hello& h) {
  for (const auto& e : h.extensions) {
    if (e.type != hello_ext_max_entry_bytes) continue;
    if (e.value.size() != hello_ext_max_entry_bytes_size)
      return violation("hello: the max_entry_bytes extension (type 1) has " +
                       num(e.value.size()) + " bytes, expected " +
                       num(hello_ext_max_entry_bytes_size));
    return std::optional<std::uint64_t>(load_le<std::uint64_t>(e.value.data()));
  }
  return std::optional<std::uint64_t>{};
}

void encode_timestamp(std::uint64_t ns, std::span<std::byte> out) noexcept {
  store_le<std::uint64_t>(out.data(), ns);
}

std::uint64_t decode_timestamp(std::span<const std::byte> in) noexcept {
  return load_le<std::uint64_t>(in.data());
}

void encode_blob_group(const blob_group& g, std::span<std::byte> out) noexcept {
  store_le<std::uint64_t>(out.data(), g.id);
  store_le<std::uint32_t>(out.data() + 8, g.size);
  store_le<std::uint32_t>(out.data() + 12, 0);
}

result<blob_group> decode_blob_group(std::span<const std::byte> in) {
  if (in.size() != blob_group_bytes)
    return violation("blob_begin: group of " + num(in.size()) + " bytes, expected 16");
  blob_group g;
  g.id = load_le<std::uint64_t>(in.data());
  g.size = load_le<std::uint32_t>(in.data() + 8);
  if (g.size == 0) return violation("blob_begin: group " + num(g.id) + " of size 0");
  if (load_le<std::uint32_t>(in.data() + 12) != 0)
    return violation("blob_begin: group with a non-zero reserved field");
  return g;
}

void encode_entry_begin_prefix(std::string_view key, std::span<const std::byte> meta,
                               std::span<std::byte> out) noexcept {
  std::byte* p = out.data();
  store_le<std::uint32_t>(p, static_cast<std::uint32_t>(key.size()));
  store_le<std::uint32_t>(p + 4, static_cast<std::uint32_t>(meta.size()));
  if (!key.empty()) std::memcpy(p + 8, key.data(), key.size());
  if (!meta.empty()) std::memcpy(p + 8 + key.size(), meta.data(), meta.size());
}

std::vector<std::byte> encode_entry_begin(std::string_view key, std::span<const std::byte> meta,
                                          std::span<const std::byte> inline_bytes) {
  const std::size_t prefix = entry_begin_prefix_bytes(key.size(), meta.size());
  std::vector<std::byte> out(prefix + inline_bytes.size());
  encode_entry_begin_prefix(key, meta, out);
  if (!inline_bytes.empty()) std::memcpy(out.data() + prefix, inline_bytes.data(), inline_bytes.size());
  return out;
}

result<entry_begin_view> decode_entry_begin(std::span<const std::byte> payload, bool has_inline,
                                            std::uint32_t max_key_bytes,
                                            std::uint32_t max_meta_bytes) {
  if (payload.size() < 8) return violation("entry_begin: payload shorter than its lengths");
  const std::uint64_t key_len = load_le<std::uint32_t>(payload.data());
  const std::uint64_t meta_len = load_le<std::uint32_t>(payload.data() + 4);
  if (key_len > max_key_bytes)
    return violation("entry_begin: key length " + num(key_len) + " exceeds max_key_bytes " +
                     num(max_key_bytes));
  if (meta_len == 0 || meta_len > max_meta_bytes)
    return violation("entry_begin: meta size " + num(meta_len) + " not in [1, " +
                     num(max_meta_bytes) + "]");
  // Both lengths are below 2^32, so the sum cannot overflow 64 bits.
  const std::uint64_t prefix = 8 + key_len + meta_len;
  if (prefix > payload.size()) return violation("entry_begin: key and meta run past the payload");
  if (!has_inline && prefix != payload.size())
    return violation("entry_begin: " + num(payload.size() - prefix) +
                     " bytes after the meta of an entry that is not inline");
  entry_begin_view v;
  v.key = std::string_view(reinterpret_cast<const char*>(payload.data() + 8), key_len);
  v.meta = payload.subspan(8 + key_len, meta_len);
  v.inline_bytes = payload.subspan(prefix);
  return v;
}

// ---- the compact entry_begin ------------------------------------------------

namespace {

// The fixed table of docs/wire.md "Compact entries". Codes are wire
// values: never renumbered; a new dtype takes a reserved code.
constexpr std::array<compact_dtype, 50> compact_dtypes{{
    {1, 't', "float32"},
    {2, 't', "float64"},
    {3, 't', "float16"},
    {4, 't', "bfloat16"},
    {5, 't', "int8"},
    {6, 't', "uint8"},
    {7, 't', "int16"},
    {8, 't', "int32"},
    {9, 't', "int64"},
    {10, 't', "bool"},
    {11, 't', "complex64"},
    {12, 't', "complex128"},
    {13, 't', "float8_e4m3fn"},
    {14, 't', "float8_e5m2"},
    {15, 't', "float8_e4m3fnuz"},
    {16, 't', "float8_e5m2fnuz"},
    {17, 't', "uint16"},
    {18, 't', "uint32"},
    {19, 't', "uint64"},
    {20, 't', "complex32"},
    {21, 't', "quint8"},
    {22, 't', "qint8"},
    {23, 't', "qint32"},
    {24, 't', "quint4x2"},
    {25, 't', "quint2x4"},
    {64, 'n', "|b1"},
    {65, 'n', "|i1"},
    {66, 'n', "|u1"},
    {67, 'n', "<i2"},
    {68, 'n', "<i4"},
    {69, 'n', "<i8"},
    {70, 'n', "<u2"},
    {71, 'n', "<u4"},
    {72, 'n', "<u8"},
    {73, 'n', "<f2"},
    {74, 'n', "<f4"},
    {75, 'n', "<f8"},
    {76, 'n', "<c8"},
    {77, 'n', "<c16"},
    {78, 'n', ">i2"},
    {79, 'n', ">i4"},
    {80, 'n', ">i8"},
    {81, 'n', ">u2"},
    {82, 'n', ">u4"},
    {83, 'n', ">u8"},
    {84, 'n', ">f2"},
    {85, 'n', ">f4"},
    {86, 'n', ">f8"},
    {87, 'n', ">c8"},
    {88, 'n', ">c16"},
}};
constexpr std::size_t compact_torch_count = 25;
constexpr std::uint8_t compact_numpy_first = 64;

// compact_dtype_code runs for every entry a sender frames: a perfect
// hash of the rows (their kind, length and four of their characters;
// constants found by search) gives the one row a name can be, checked with
// one comparison, instead of a scan of the table.
constexpr std::size_t compact_slots = 128;

/// REQUIRES: n.size() >= 2.
constexpr std::size_t compact_slot(char kind, std::string_view n) noexcept {
  std::uint64_t h = n.size() * 276u + static_cast<unsigned char>(kind);
  for (char c : {n.front(), n[(n.size() + 1) / 2], n[n.size() - 2], n.back()})
    h = h * 131u + static_cast<unsigned char>(c);
  return static_cast<std::size_t>((h ^ (h >> 15)) % compact_slots);
}

// Slot -> 1 + the row's place in compact_dtypes; 0: no row. Built at
// compile time; two rows in one slot would not compile.
constexpr auto compact_index = [] {
  std::array<std::uint8_t, compact_slots> t{};
  for (std::size_t i = 0; i < compact_dtypes.size(); ++i) {
    const std::size_t s = compact_slot(compact_dtypes[i].kind, compact_dtypes[i].name);
    if (t[s] != 0) throw "compact_slot: two dtypes share a slot";
    t[s] = static_cast<std::uint8_t>(i + 1);
  }
  return t;
}();

/// a == b for names of at most a few bytes, compared in place (a call to
/// memcmp would cost more than the rest of the lookup).
constexpr bool same_name(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace

const compact_dtype* compact_dtype_of(std::uint8_t code) noexcept {
  if (code >= 1 && code <= compact_torch_count) return &compact_dtypes[code - 1];
  if (code >= compact_numpy_first && code < compact_numpy_first + (compact_dtypes.size() - compact_torch_count))
    return &compact_dtypes[compact_torch_count + (code - compact_numpy_first)];
  return nullptr;
}

const dtype& format_dtype_of(const compact_dtype& d) {
  // Every row parses (wire_features_test checks each against parse_dtype).
  static const auto parsed = [] {
    std::array<dtype, compact_dtypes.size()> t;
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = *parse_dtype(compact_dtypes[i].kind, compact_dtypes[i].name);
    return t;
  }();
  const std::size_t at = d.code <= compact_torch_count
                            ? d.code - 1u
                            : compact_torch_count + (d.code - compact_numpy_first);
  return parsed[at];
}

std::uint8_t compact_dtype_code(char kind, std::string_view name) noexcept {
  if (name.size() < 2) return 0;  // every name in the table has 3 or more
  const std::uint8_t i = compact_index[compact_slot(kind, name)];
  if (i == 0) return 0;
  const compact_dtype& d = compact_dtypes[i - 1];
  return d.kind == kind && same_name(d.name, name) ? d.code : 0;
}

std::int64_t compact_entry_view::dim(std::size_t i) const noexcept {
  return load_le<std::int64_t>(dims.data() + 8 * i);
}

void encode_compact_entry_begin_prefix(std::string_view key, char kind, std::uint8_t code,
                                       std::uint64_t len, std::span<const std::int64_t> dims,
                                       std::span<std::byte> out) noexcept {
  std::byte* p = out.data();
  store_le<std::uint32_t>(p, static_cast<std::uint32_t>(key.size()));
  store_le<std::uint8_t>(p + 4, static_cast<std::uint8_t>(kind));
  store_le<std::uint8_t>(p + 5, code);
  store_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(dims.size()));
  store_le<std::uint64_t>(p + 8, len);
  p += compact_fixed_bytes;
  for (std::int64_t d : dims) {
    store_le<std::int64_t>(p, d);
    p += 8;
  }
  if (!key.empty()) std::memcpy(p, key.data(), key.size());
}

std::vector<std::byte> encode_compact_entry_begin(std::string_view key, char kind,
                                                  std::uint8_t code, std::uint64_t len,
                                                  std::span<const std::int64_t> dims,
                                                  std::span<const std::byte> inline_bytes) {
  const std::size_t prefix = compact_entry_begin_prefix_bytes(key.size(), dims.size());
  std::vector<std::byte> out(prefix + inline_bytes.size());
  encode_compact_entry_begin_prefix(key, kind, code, len, dims, out);
  if (!inline_bytes.empty())
    std::memcpy(out.data() + prefix, inline_bytes.data(), inline_bytes.size());
  return out;
}

result<compact_entry_view> decode_compact_entry_begin(std::span<const std::byte> payload,
                                                      bool has_inline,
                                                      std::uint32_t max_key_bytes,
                                                      std::uint32_t max_meta_bytes) {
  if (payload.size() < compact_fixed_bytes)
    return violation("entry_begin: compact payload of " + num(payload.size()) +
                     " bytes, shorter than its 16 fixed bytes");
  const std::byte* p = payload.data();
  const std::uint64_t key_len = load_le<std::uint32_t>(p);
  if (key_len > max_key_bytes)
    return violation("entry_begin: compact key_len " + num(key_len) + " exceeds max_key_bytes " +
                     num(max_key_bytes));
  compact_entry_view v;
  const auto kind = load_le<std::uint8_t>(p + 4);
  if (kind != 't' && kind != 'n' && kind != 'p')
    return violation("entry_begin: compact kind " + num(kind) + " is not t, n or p");
  v.kind = static_cast<char>(kind);
  const auto code = load_le<std::uint8_t>(p + 5);
  v.dtype = compact_dtype_of(code);
  if (code != 0 && !v.dtype)
    return violation("entry_begin: compact dtype code " + num(code) + " is reserved");
  v.ndim = load_le<std::uint16_t>(p + 6);
  if (v.kind == 'p' ? (code != 0 || v.ndim != 0) : (!v.dtype || v.dtype->kind != v.kind))
    return violation("entry_begin: compact dtype code " + num(code) + " with " +
                     num(v.ndim) + " dims does not fit kind " + std::string(1, v.kind) +
                     " (a pickle has code 0 and no dims; t and n a code of their kind)");
  if (!compact_dims_fit(v.ndim, max_meta_bytes))
    return violation("entry_begin: compact ndim " + num(v.ndim) + " over the bound (at most " +
                     num(compact_max_dims) + ", and 12 + 8 x ndim <= max_meta_bytes " +
                     num(max_meta_bytes) + ")");
  v.len = load_le<std::uint64_t>(p + 8);
  // key_len < 2^32 and ndim < 2^16: the sum cannot overflow 64 bits.
  const std::uint64_t prefix = compact_fixed_bytes + 8 * std::uint64_t{v.ndim} + key_len;
  if (prefix > payload.size())
    return violation("entry_begin: compact dims and key run past the payload");
  if (!has_inline && payload.size() != prefix)
    return violation("entry_begin: " + num(payload.size() - prefix) +
                     " bytes after the key of an entry that is not inline");
  v.dims = payload.subspan(compact_fixed_bytes, 8 * std::size_t{v.ndim});
  // As an index row's dims: above 2^62 no shape describes real memory.
  for (std::size_t i = 0; i < v.ndim; ++i) {
    const std::int64_t d = v.dim(i);
    if (d < 0 || d > (std::int64_t{1} << 62))
      return violation("entry_begin: compact dim " + num(i) + " is " + std::to_string(d) +
                       ", not in [0, 2^62]");
  }
  v.key = std::string_view(reinterpret_cast<const char*>(payload.data() + prefix - key_len),
                           key_len);
  v.inline_bytes = payload.subspan(prefix);
  return v;
}

}  // namespace blobpipe
