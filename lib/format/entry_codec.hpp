// Packing and unpacking of an entry's fields, shared by the index rows
// (layout.cpp, index.cpp) and the per-entry meta map (entry.cpp).
#pragma once

#include <msgpack.hpp>

#include <string_view>

#include "blobpipe/format/entry.hpp"

namespace blobpipe::detail {

void pack_kind(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e);
void pack_dtype(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e);
/// Packs the shape array; a missing shape is nil, or [] with nil_as_empty.
void pack_shape(msgpack::packer<msgpack::sbuffer>& pk, const Entry& e, bool nil_as_empty);

/// Reads a shape array: at most max_dims dims, each a non-negative int.
/// Errors: malformed_index.
result<shape_t> read_shape(const msgpack::object& o, std::string_view where);

/// Reads kind (str of one char), dtype (str or nil) and shape (array or
/// nil) into `e`. Errors: malformed_index, unknown_kind.
result<void> read_kind_dtype_shape(const msgpack::object& kind, const msgpack::object& dt,
                                   const msgpack::object& shape, Entry& e,
                                   std::string_view where);

}  // namespace blobpipe::detail
