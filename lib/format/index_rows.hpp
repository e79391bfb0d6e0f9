// Checking one row and keeping its dtype, reading an index whose rows the
// caller has checked already, and writing one row into the caller's
// memory (internal; lib/protocol's push decoder). validate_row is defined
// in entry.cpp beside validate_entry, read_known_rows in index.cpp beside
// parse_index, the row writer in layout.cpp beside append_index_row.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "blobpipe/errors.hpp"
#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/entry.hpp"

namespace blobpipe::detail {

/// validate_entry, handing back the row's dtype: lookup_dtype's (the
/// torch table's, valid for the program's life; a numpy one until this
/// thread's next lookup_dtype), null for a 'p' row. `known`, when not
/// null, is taken as the row's dtype instead of a lookup by name: a row
/// read from a compact dtype code (format_dtype_of). Its shape is checked
/// against `known`'s item size all the same.
/// REQUIRES: known is null or is the dtype of e.kind and e.dtype.
/// Errors: as validate_entry.
[[nodiscard]] result<const dtype*> validate_row(const Entry& e, std::uint64_t data_end,
                                                const dtype* known);

/// The rows of an index (the msgpack bytes alone) known to be exactly
/// `rows` rows that passed validate_entry against the caller's data end:
/// the push decoder's tail, whose keyed digest matched the rows it had
/// announced and checked one by one. Reads them without parse_index's
/// first pass (the bounded scan of the whole index) and without
/// validating each row again. Safe on any bytes all the same: every read
/// is bounds-checked, and at most min(rows, index.size() / 7) rows (7
/// bytes: the smallest row) are reserved.
/// Bytes after the last row are not read (the caller has matched them).
/// Errors: malformed_index (not an array header of `rows`, or a row not of
/// six fields of the right types), too_large (the entries cannot be
/// allocated).
[[nodiscard]] result<std::vector<Entry>> read_known_rows(std::span<const std::byte> index,
                                                         std::size_t rows);

/// The most bytes write_index_row writes for row `e` (every field at its
/// widest msgpack form), bytes.
std::size_t index_row_bound(const Entry& e) noexcept;

/// Writes row `e` at the start of `out` in the canonical form
/// append_index_row writes, and returns the bytes written. Nothing else of
/// `out` is touched, so a scratch buffer sized once is not zeroed per row.
/// REQUIRES: out.size() >= index_row_bound(e).
std::size_t write_index_row(const Entry& e, std::span<std::byte> out) noexcept;

}  // namespace blobpipe::detail
