// Packing and reading of an entry's fields, shared by the index rows
// (layout.cpp, index.cpp) and the per-entry meta map (entry.cpp).
#pragma once

#include <msgpack.hpp>

#include <cstddef>
#include <string>

#include "blobpipe/format/entry.hpp"
#include "msgpack_reader.hpp"

namespace blobpipe::detail {

void pack_kind(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e);
void pack_dtype(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e);
/// Packs the shape array; a missing shape is nil, or [] with nil_as_empty.
void pack_shape(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e, bool nil_as_empty);

/// Where a field was read, for messages: "index row 7" or "entry meta".
/// Built only when a message is (the happy path formats nothing).
struct field_source {
  const char* what;               ///< "index row" or "entry meta"
  std::size_t row = SIZE_MAX;     ///< the row number, or SIZE_MAX for none
  std::string text() const;
};

/// Reads kind (str of one char), dtype (str or nil) and shape (array of at
/// most max_dims dims, each an int in [0, 2^62], or nil) into `e`, in that
/// order, each from its own reader (for an index row, the same reader
/// three times). A 'p' entry keeps no dtype or shape: the fields must still
/// have these types, and their values are ignored (docs/format.md).
/// Errors: malformed_index, unknown_kind.
result<void> read_kind_dtype_shape(msgpack_reader& kind, msgpack_reader& dt,
                                   msgpack_reader& shape, Entry& e, const field_source& at);

}  // namespace blobpipe::detail
