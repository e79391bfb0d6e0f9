// Bounded msgpack parsing: the one place that turns untrusted msgpack bytes
// into objects. Limits scale with the input size so a declared length can
// never make msgpack-cxx allocate more than the bytes present justify, and
// every msgpack exception becomes `malformed_index`.
#pragma once

#include <msgpack.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "blobpipe/errors.hpp"

namespace blobpipe::detail {

/// Unpacks exactly one msgpack object spanning all of `bytes`, with array,
/// map, str and bin sizes capped at bytes.size() and nesting at `max_depth`.
/// Errors: malformed_index (not msgpack, limits exceeded, trailing bytes).
result<msgpack::object_handle> unpack_bounded(std::span<const std::byte> bytes,
                                              std::size_t max_depth,
                                              std::string_view what);

/// Typed field readers over an unpacked object; nullopt on a type mismatch.
std::optional<std::uint64_t> as_uint(const msgpack::object& o) noexcept;
std::optional<std::string_view> as_str(const msgpack::object& o) noexcept;

}  // namespace blobpipe::detail
