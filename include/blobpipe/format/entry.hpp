// blobpipe/format/entry.hpp — one row of a blob's index.
//
// The index is a msgpack array with one row per entry,
//   [key, off, len, kind, dtype, shape]
// key: str; off, len: bytes from blob start; kind: "t" | "n" | "p";
// dtype: str, or nil (pickles; a tensor row with nil means float32);
// shape: array of element counts, or nil (pickles).
// `Entry::meta()` is the per-entry msgpack map the reference sends beside
// each entry: {"o": off, "n": len, "k": kind, "d": dtype|nil, "s": shape}
// with "s" = [] when there is no shape.
// Source: Entry, Entry.meta, Entry.from_meta (Python reference).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "blobpipe/errors.hpp"

namespace blobpipe {

/// Dims a shape_t holds inside itself; a shape with more keeps them in one
/// heap block (8 bytes per dim).
inline constexpr std::size_t shape_inline_dims = 4;

/// Shape in elements, outermost dimension first.
///
/// A `boost::container::small_vector<std::int64_t, 4>` (Boost's headers,
/// Debian's libboost-dev): up to shape_inline_dims dims inline, so the
/// meta parse, a received entry, its view and the tail's index rows hold
/// a shape without a heap block. It offers what callers use of a
/// `std::vector<std::int64_t>`: size, empty, data, begin/end, operator[],
/// front/back, push_back, emplace_back, assign, resize, reserve, clear,
/// ==, brace initialisation ({2, 3}) and a (size) constructor; it
/// converts implicitly from and to `std::vector<std::int64_t>` (a copy)
/// and to `std::span<const std::int64_t>`, and compares equal to a vector
/// of the same dims. Unlike a std::vector, its capacity() and iterator
/// types differ, and a `std::vector<std::int64_t>&` cannot bind to it
/// (take the shape by const reference, as a span, or convert).
// GCC 12 reports a false -Wstringop-overread ("reading between 33 and
// 2^63 bytes from a region of size 32") wherever a shape_t moved from its
// inline dims is inlined: it cannot see that inline dims number at most
// shape_inline_dims. Quiet for the class's own members only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overread"
class shape_t : public boost::container::small_vector<std::int64_t, shape_inline_dims> {
  using base = boost::container::small_vector<std::int64_t, shape_inline_dims>;

 public:
  using base::base;
  shape_t() = default;
  shape_t(const std::vector<std::int64_t>& dims) : base(dims.begin(), dims.end()) {}
  operator std::vector<std::int64_t>() const { return {begin(), end()}; }
  operator std::span<const std::int64_t>() const noexcept { return {data(), size()}; }
  friend bool operator==(const shape_t& a, const shape_t& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const shape_t& a, const std::vector<std::int64_t>& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
};
#pragma GCC diagnostic pop

struct Entry {
  std::string key;                   ///< UTF-8, may be empty
  std::uint64_t off = 0;             ///< bytes from blob start, multiple of ALIGN
  std::uint64_t len = 0;             ///< bytes
  char kind = 't';                   ///< 't', 'n' or 'p'
  std::optional<std::string> dtype;  ///< nil for pickles
  std::optional<shape_t> shape;      ///< elements per dim; nil for pickles

  /// The msgpack map {o, n, k, d, s} for this entry (keys in that order).
  std::vector<std::byte> meta() const;
  /// Appends meta() to `out` (no allocation but `out`'s growth).
  void append_meta(std::vector<std::byte>& out) const;

  /// Parses a meta map produced by `meta()`; the key travels separately.
  /// Bounded: at most `max_dims` dims, nesting depth 3 counting the map.
  /// Reads the bytes in place: allocates nothing beyond the Entry's own
  /// dtype and shape (the key is moved in). A 'p' meta keeps no dtype or
  /// shape (docs/format.md).
  /// Errors: malformed_index (not a map of the right field types),
  /// unknown_kind, too_large (allocation failed). Dtypes and lengths are
  /// checked by `validate_entry`.
  [[nodiscard]] static result<Entry> from_meta(std::string key,
                                               std::span<const std::byte> m);

  friend bool operator==(const Entry&, const Entry&) = default;
};

/// Most dims a shape may have (torch's limit is 64).
inline constexpr std::size_t max_dims = 64;

/// Checks one row against the data region [0, data_end): known kind and
/// dtype, `off + len <= data_end` without overflow, and for 't'/'n' rows
/// prod(shape) x itemsize == len (overflow-checked).
/// Errors: unknown_kind, unknown_dtype, entry_out_of_range, shape_mismatch.
[[nodiscard]] result<void> validate_entry(const Entry& e, std::uint64_t data_end);

}  // namespace blobpipe
