// Overflow-checked arithmetic for numbers read from untrusted bytes.
#pragma once

#include <cstdint>
#include <optional>

namespace blobpipe::detail {

/// a + b, or nullopt on overflow.
inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a * b, or nullopt on overflow.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace blobpipe::detail
