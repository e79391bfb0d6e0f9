// Overflow-checked arithmetic for numbers read from untrusted bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

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

/// `first` times each of `dims` in turn, or nullopt when a dim is negative
/// or the running product overflows 64 bits. Multiplying in order is what
/// numpy and torch do: [0, 2^62, 2^62] is 0, [2^62, 2^62, 0] overflows.
inline std::optional<std::uint64_t> checked_product(std::span<const std::int64_t> dims,
                                                    std::uint64_t first) noexcept {
  std::uint64_t n = first;
  for (std::int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

/// Elements and bytes of a shape of `itemsize`-byte elements, each as a
/// running product; nullopt when either overflows. The elements are checked
/// on their own, whatever the item size: with itemsize 0 (numpy |V0) the
/// bytes are 0 for any shape, and numel() must still be exact.
struct shape_size {
  std::uint64_t numel;
  std::uint64_t nbytes;
};
inline std::optional<shape_size> checked_shape_size(std::span<const std::int64_t> dims,
                                                    std::uint64_t itemsize) noexcept {
  auto numel = checked_product(dims, 1);
  auto nbytes = checked_product(dims, itemsize);
  if (!numel || !nbytes) return std::nullopt;
  return shape_size{*numel, *nbytes};
}

}  // namespace blobpipe::detail
