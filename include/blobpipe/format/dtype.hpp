// blobpipe/format/dtype.hpp — the element types an entry can carry.
//
// A `t` (tensor) row names its dtype as torch does without the "torch."
// prefix ("float32", "bfloat16"); an `n` (ndarray) row carries numpy's
// `dtype.str` ("<f4", ">i8", "|b1", "<U3", "<M8[ns]", "|V8"); a `p` row has
// no dtype. `parse_dtype` turns either spelling into a `dtype` with an item
// size in bytes, which is all the format needs to check `len`.
//
//   auto dt = blobpipe::parse_dtype('t', "half");   // canonical "float16", 2 bytes
//   auto nd = blobpipe::parse_dtype('n', ">i8");    // int64, big endian, 8 bytes
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "blobpipe/errors.hpp"

namespace blobpipe {

/// Entry kinds, as the index row's `kind` field spells them.
inline constexpr char KIND_TENSOR = 't';   ///< torch tensor, torch dtype name
inline constexpr char KIND_NDARRAY = 'n';  ///< numpy array, numpy dtype.str
inline constexpr char KIND_PICKLE = 'p';   ///< pickled object, opaque bytes

/// True for 't', 'n' and 'p'.
constexpr bool is_known_kind(char k) noexcept {
  return k == KIND_TENSOR || k == KIND_NDARRAY || k == KIND_PICKLE;
}

/// What one element is, independent of how the kind spells it.
enum class scalar_type {
  bool_,
  int8, int16, int32, int64,
  uint8, uint16, uint32, uint64,
  float16, bfloat16, float32, float64,
  float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz,
  complex64, complex128,
  complex32,  ///< torch.complex32 (chalf): two float16
  /// torch's quantized types: the stored integers only (the reference
  /// writes their storage bytes; scale and zero point are not in the blob).
  quint8, qint8, qint32, quint4x2, quint2x4,
  bytes,      ///< numpy 'S': fixed-size byte strings
  unicode,    ///< numpy 'U': fixed-size UCS-4 strings
  datetime,   ///< numpy 'M': int64 ticks of `unit`
  timedelta,  ///< numpy 'm': int64 ticks of `unit`
  void_,      ///< numpy 'V': raw records (structured dtypes arrive as |Vn)
  /// numpy 'f' of 12 or 16 bytes and 'c' of 24 or 32: the writer's C long
  /// double (x86: 80-bit extended, padded), as numpy's longdouble and
  /// clongdouble; carried as bytes, no numeric value here.
  longdouble, clongdouble,
};

/// Byte order of multi-byte elements.
enum class byte_order { little, big, not_applicable };

/// A parsed dtype.
struct dtype {
  char kind = KIND_TENSOR;      ///< 't' or 'n'
  std::string name;             ///< canonical spelling for `kind` ("float32", "<f4")
  scalar_type type = scalar_type::float32;
  std::size_t itemsize = 4;     ///< bytes per element (numpy <U3 is 12)
  byte_order order = byte_order::little;
  std::string unit;             ///< datetime/timedelta unit ("ns", "s"), else empty

  /// True when elements are stored in this machine's byte order (or are
  /// single bytes), so they can be read in place.
  bool is_native_order() const noexcept;

  friend bool operator==(const dtype&, const dtype&) = default;
};

/// Parses a torch dtype name: the 25 names the reference writes (float32,
/// float64, float16, bfloat16, int8, uint8, int16, int32, int64, bool,
/// complex64, complex128, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz,
/// float8_e5m2fnuz, uint16, uint32, uint64, complex32, and the quantized
/// quint8, qint8, qint32, quint4x2, quint2x4 with item sizes 1, 1, 4, 1, 1
/// as torch reports them) and the aliases torch accepts (float, double,
/// half, long, int, short, cfloat, cdouble, chalf). An optional
/// "torch." prefix is ignored. `name` is set to the canonical spelling.
/// Errors: unknown_dtype. Source: the reference writes `str(tensor.dtype)`
/// without its "torch." prefix.
[[nodiscard]] result<dtype> parse_torch_dtype(std::string_view name);

/// Parses numpy's `dtype.str`: byte order ('<', '>', '|', '='), kind
/// (b i u f c S U V M m), item size in bytes (characters for 'U'; 'f' 2, 4,
/// 8, 12 or 16 and 'c' 8, 16, 24 or 32, the larger ones long double), and for
/// M/m an optional unit in brackets ("[ns]"). Object arrays ('O') cannot be
/// carried as raw bytes and are refused. '=' is read as this machine's
/// order. Errors: unknown_dtype. Source: numpy `dtype.str`.
[[nodiscard]] result<dtype> parse_numpy_dtype(std::string_view str);

/// The dtype `parse_dtype(kind, name)` would return, or null when it would
/// fail (ask parse_dtype for the error). No allocation on the hot path:
/// torch dtypes come from a fixed table, numpy ones from a small
/// per-thread cache of recent spellings. The pointer stays valid until the
/// calling thread's next lookup_dtype (torch ones for the program's life).
const dtype* lookup_dtype(char kind, std::string_view name);

/// Dispatches on `kind`: 't' -> parse_torch_dtype, 'n' -> parse_numpy_dtype.
/// Errors: unknown_kind (kind not 't'/'n'), unknown_dtype.
[[nodiscard]] result<dtype> parse_dtype(char kind, std::string_view name);

/// The torch name of a scalar type ("float32"), or "" when torch has none.
std::string_view torch_name(scalar_type t) noexcept;

}  // namespace blobpipe
