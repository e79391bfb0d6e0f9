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

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blobpipe/errors.hpp"

namespace blobpipe {

/// Shape in elements, outermost dimension first.
using shape_t = std::vector<std::int64_t>;

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
