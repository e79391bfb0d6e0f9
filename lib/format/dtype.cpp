#include "blobpipe/format/dtype.hpp"

#include <array>
#include <bit>
#include <charconv>
#include <string>

namespace blobpipe {
namespace {

struct torch_row {
  std::string_view name;
  scalar_type type;
  std::size_t itemsize;
};

// The dtypes the reference writes, canonical names first.
constexpr std::array<torch_row, 25> torch_dtypes{{
    {"float32", scalar_type::float32, 4},
    {"float64", scalar_type::float64, 8},
    {"float16", scalar_type::float16, 2},
    {"bfloat16", scalar_type::bfloat16, 2},
    {"int8", scalar_type::int8, 1},
    {"uint8", scalar_type::uint8, 1},
    {"int16", scalar_type::int16, 2},
    {"int32", scalar_type::int32, 4},
    {"int64", scalar_type::int64, 8},
    {"bool", scalar_type::bool_, 1},
    {"complex64", scalar_type::complex64, 8},
    {"complex128", scalar_type::complex128, 16},
    {"float8_e4m3fn", scalar_type::float8_e4m3fn, 1},
    {"float8_e5m2", scalar_type::float8_e5m2, 1},
    {"float8_e4m3fnuz", scalar_type::float8_e4m3fnuz, 1},
    {"float8_e5m2fnuz", scalar_type::float8_e5m2fnuz, 1},
    {"uint16", scalar_type::uint16, 2},
    {"uint32", scalar_type::uint32, 4},
    {"uint64", scalar_type::uint64, 8},
    {"complex32", scalar_type::complex32, 4},
    // Quantized: torch's element_size(), which the reference's len follows
    // (numel x element_size; for the packed quint4x2/quint2x4 that is more
    // than their storage holds).
    {"quint8", scalar_type::quint8, 1},
    {"qint8", scalar_type::qint8, 1},
    {"qint32", scalar_type::qint32, 4},
    {"quint4x2", scalar_type::quint4x2, 1},
    {"quint2x4", scalar_type::quint2x4, 1},
}};

// Aliases torch accepts on read (torch.float is torch.float32, ...).
constexpr std::array<std::pair<std::string_view, std::string_view>, 9> torch_aliases{{
    {"float", "float32"},
    {"double", "float64"},
    {"half", "float16"},
    {"long", "int64"},
    {"int", "int32"},
    {"short", "int16"},
    {"cfloat", "complex64"},
    {"cdouble", "complex128"},
    {"chalf", "complex32"},
}};

error unknown(std::string_view what, std::string_view name) {
  // Names come from untrusted bytes: quote() caps and escapes them.
  return make_error(errc::unknown_dtype, std::string(what) + " " + quote(name));
}

bool is_datetime_unit(std::string_view u) {
  static constexpr std::array<std::string_view, 13> units{
      "Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"};
  // numpy allows a multiplier before the unit ("10ms").
  std::size_t i = 0;
  while (i < u.size() && u[i] >= '0' && u[i] <= '9') ++i;
  if (i > 9) return false;
  std::string_view base = u.substr(i);
  for (auto x : units)
    if (x == base) return true;
  return false;
}

}  // namespace

bool dtype::is_native_order() const noexcept {
  if (order == byte_order::not_applicable || itemsize <= 1) return true;
  return (order == byte_order::little) == (std::endian::native == std::endian::little);
}

std::string_view torch_name(scalar_type t) noexcept {
  for (const auto& r : torch_dtypes)
    if (r.type == t) return r.name;
  return {};
}

result<dtype> parse_torch_dtype(std::string_view name) {
  std::string_view n = name;
  if (n.starts_with("torch.")) n.remove_prefix(6);
  for (const auto& [alias, canonical] : torch_aliases)
    if (n == alias) n = canonical;
  for (const auto& r : torch_dtypes) {
    if (r.name == n) {
      dtype d;
      d.kind = KIND_TENSOR;
      d.name = std::string(r.name);
      d.type = r.type;
      d.itemsize = r.itemsize;
      d.order = std::endian::native == std::endian::little ? byte_order::little
                                                           : byte_order::big;
      if (r.itemsize == 1) d.order = byte_order::not_applicable;
      return d;
    }
  }
  return unknown("unknown torch dtype", name);
}

result<dtype> parse_numpy_dtype(std::string_view str) {
  // dtype.str is  <order><kind><size>[<unit>]  e.g. "<f4", "|S4", "<M8[ns]".
  if (str.size() < 3) return unknown("unknown numpy dtype", str);
  dtype d;
  d.kind = KIND_NDARRAY;
  d.name = std::string(str);
  switch (str[0]) {
    case '<': d.order = byte_order::little; break;
    case '>': d.order = byte_order::big; break;
    case '|': d.order = byte_order::not_applicable; break;
    case '=':
      d.order = std::endian::native == std::endian::little ? byte_order::little
                                                           : byte_order::big;
      break;
    default: return unknown("unknown numpy byte order in dtype", str);
  }
  const char kind = str[1];
  std::string_view rest = str.substr(2);
  std::string_view digits = rest;
  std::string_view unit;
  if (auto br = rest.find('['); br != std::string_view::npos) {
    if (kind != 'M' && kind != 'm') return unknown("unit on a non-datetime numpy dtype", str);
    if (rest.back() != ']') return unknown("unterminated unit in numpy dtype", str);
    digits = rest.substr(0, br);
    unit = rest.substr(br + 1, rest.size() - br - 2);
    if (!is_datetime_unit(unit)) return unknown("unknown datetime unit in numpy dtype", str);
  }
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc{} || end != digits.data() + digits.size() || digits.empty())
    return unknown("bad item size in numpy dtype", str);
  // Item sizes beyond 2^31 bytes are not real arrays; refuse before any
  // arithmetic multiplies them.
  constexpr std::uint64_t max_itemsize = std::uint64_t{1} << 31;
  if (n > max_itemsize) return unknown("item size too large in numpy dtype", str);

  auto fixed = [&](std::initializer_list<std::pair<std::uint64_t, scalar_type>> sizes)
      -> result<dtype> {
    for (auto [size, type] : sizes) {
      if (n == size) {
        d.type = type;
        d.itemsize = size;
        return d;
      }
    }
    return unknown("unsupported item size in numpy dtype", str);
  };
  switch (kind) {
    case 'b': return fixed({{1, scalar_type::bool_}});
    case 'i':
      return fixed({{1, scalar_type::int8}, {2, scalar_type::int16},
                    {4, scalar_type::int32}, {8, scalar_type::int64}});
    case 'u':
      return fixed({{1, scalar_type::uint8}, {2, scalar_type::uint16},
                    {4, scalar_type::uint32}, {8, scalar_type::uint64}});
    case 'f':
      // 12 and 16: numpy's longdouble, as the platform that wrote it pads
      // C's long double (the reference stores whatever dtype.str says).
      return fixed({{2, scalar_type::float16}, {4, scalar_type::float32},
                    {8, scalar_type::float64}, {12, scalar_type::longdouble},
                    {16, scalar_type::longdouble}});
    case 'c':
      return fixed({{8, scalar_type::complex64}, {16, scalar_type::complex128},
                    {24, scalar_type::clongdouble}, {32, scalar_type::clongdouble}});
    case 'M':
    case 'm':
      d.unit = std::string(unit);
      return fixed({{8, kind == 'M' ? scalar_type::datetime : scalar_type::timedelta}});
    case 'S':
      d.type = scalar_type::bytes;
      d.itemsize = n;
      return d;
    case 'V':
      d.type = scalar_type::void_;
      d.itemsize = n;
      return d;
    case 'U':
      // numpy counts characters in 'U' (UCS-4): 4 bytes each.
      d.type = scalar_type::unicode;
      d.itemsize = n * 4;
      return d;
    default:
      return unknown("unknown numpy dtype kind in", str);
  }
}

namespace {

/// The torch table as dtypes, built once.
const std::array<dtype, torch_dtypes.size()>& torch_table() {
  static const auto table = [] {
    std::array<dtype, torch_dtypes.size()> t;
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = *parse_torch_dtype(torch_dtypes[i].name);
    return t;
  }();
  return table;
}

const dtype* lookup_torch(std::string_view n) {
  if (n.starts_with("torch.")) n.remove_prefix(6);
  // A stream carries a handful of dtypes, often one: the last canonical
  // name this thread found is tried before the table.
  thread_local const dtype* last = nullptr;
  if (last && last->name == n) return last;
  const auto& table = torch_table();
  for (std::size_t i = 0; i < table.size(); ++i)
    if (torch_dtypes[i].name == n) return last = &table[i];
  for (const auto& [alias, canonical] : torch_aliases)
    if (n == alias) return lookup_torch(canonical);
  return nullptr;
}

}  // namespace

const dtype* lookup_dtype(char kind, std::string_view name) {
  if (kind == KIND_TENSOR) return lookup_torch(name);
  if (kind != KIND_NDARRAY) return nullptr;
  // A stream carries a handful of numpy spellings: remember the last few.
  struct slot {
    std::string name;
    dtype type;
  };
  thread_local std::array<slot, 8> recent;
  thread_local std::size_t next = 0;
  for (auto& r : recent)
    if (!r.name.empty() && r.name == name) return &r.type;
  auto d = parse_numpy_dtype(name);
  if (!d) return nullptr;
  auto& r = recent[next++ % recent.size()];
  r.name = std::string(name);
  r.type = std::move(*d);
  return &r.type;
}

result<dtype> parse_dtype(char kind, std::string_view name) {
  if (kind == KIND_TENSOR) return parse_torch_dtype(name);
  if (kind == KIND_NDARRAY) return parse_numpy_dtype(name);
  return make_error(errc::unknown_kind,
                    "no dtype for entry kind " + quote(std::string_view(&kind, 1)));
}

}  // namespace blobpipe
