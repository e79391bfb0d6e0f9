// Bounded msgpack scanning: the one place that checks untrusted msgpack
// bytes as a whole. msgpack-cxx's parser runs over them with a visitor that
// builds nothing: sizes are capped at the input length, nesting at a depth,
// and every msgpack failure becomes `malformed_index`. Readers then take
// the values they want with msgpack_reader.hpp, row by row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "blobpipe/errors.hpp"

namespace blobpipe::detail {

/// Checks that `bytes` hold exactly one well-formed msgpack value, with
/// array, map, str, bin and ext sizes capped at bytes.size() and containers
/// nested at most `max_depth` deep. Returns how many leading elements of the
/// outermost value are arrays of exactly `row_fields` elements (0 when it
/// is not an array): a count of rows the bytes have proven, safe to reserve.
/// Memory: constant (msgpack-cxx's parse stack, a few hundred bytes).
/// Errors: malformed_index (not msgpack, limits exceeded, trailing bytes).
result<std::uint32_t> scan_bounded(std::span<const std::byte> bytes, std::size_t max_depth,
                                   std::uint32_t row_fields, std::string_view what);

/// Checks that `prefix`, the first bytes of a value `total_bytes` long, can
/// still begin a table: one msgpack array whose elements are all arrays of
/// exactly `row_fields` elements, sizes capped at `total_bytes` and nesting
/// at `max_depth`. Bytes that merely end early are fine; anything else that
/// scan_bounded or a row-by-row reader would refuse in the whole value
/// fails here already, so a reader can fetch a large value in pieces and
/// stop at the first piece that proves it bad (a sparse file's run of
/// zeros is refused at its first byte, not after gigabytes are read).
/// Memory: constant. Errors: malformed_index.
result<void> scan_table_prefix(std::span<const std::byte> prefix, std::size_t total_bytes,
                               std::size_t max_depth, std::uint32_t row_fields,
                               std::string_view what);

}  // namespace blobpipe::detail
