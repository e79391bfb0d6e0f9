// Little-endian loads and stores for frame fields at unaligned addresses.
// (lib/format keeps its own copy private; the layers share no internals.)
#pragma once

#include <bit>
#include <cstddef>
#include <cstring>

namespace blobpipe::wire_detail {

template <class T>
T byteswap_if_big(T v) noexcept {
  if constexpr (std::endian::native == std::endian::big) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
    std::memcpy(&v, b, sizeof(T));
  }
  return v;
}

template <class T>
T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return byteswap_if_big(v);
}

template <class T>
void store_le(std::byte* p, T v) noexcept {
  v = byteswap_if_big(v);
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace blobpipe::wire_detail
