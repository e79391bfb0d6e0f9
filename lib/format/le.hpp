// Little-endian loads and stores at unaligned addresses: the footer
// (lib/format) and frame headers (lib/transport) both use them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstring>

namespace blobpipe::detail {

template <class T>
T byteswap(T v) noexcept {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
  std::memcpy(&v, b, sizeof(T));
  return v;
}

template <class T>
T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  return v;
}

template <class T>
void store_le(std::byte* p, T v) noexcept {
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace blobpipe::detail
