// A strict msgpack cursor for the fixed shapes blobpipe reads: an index row
// [key, off, len, kind, dtype, shape] and the per-entry meta map. It reads
// one item at a time straight from the bytes: nothing is allocated, no
// object tree is built, and every length is checked against the bytes left
// before anything is read past it (a str's bytes must all be present; an
// array or map can claim no more elements than bytes remain).
//
//   msgpack_reader r(bytes);
//   auto n = r.array_header();   // nullopt: not an array, or truncated
//   auto key = r.str();          // nullopt: not a str, or truncated
//
// A failed read leaves the cursor where it was. Integers follow msgpack-cxx:
// any integer encoding of a value >= 0 (int8 0x05 too) reads as unsigned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>

namespace blobpipe::detail {

class msgpack_reader {
 public:
  explicit msgpack_reader(std::span<const std::byte> bytes) noexcept
      : p_(reinterpret_cast<const std::uint8_t*>(bytes.data())), end_(p_ + bytes.size()) {}

  /// Bytes not yet read.
  std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - p_); }
  bool at_end() const noexcept { return p_ == end_; }
  /// The unread bytes (to come back to a field later).
  std::span<const std::byte> rest() const noexcept {
    return {reinterpret_cast<const std::byte*>(p_), remaining()};
  }

  /// True when the next item is nil (it is not consumed).
  bool peek_nil() const noexcept { return p_ < end_ && *p_ == 0xc0; }
  /// True when the next item is an array header (it is not consumed).
  bool peek_array() const noexcept {
    return p_ < end_ && ((*p_ & 0xf0) == 0x90 || *p_ == 0xdc || *p_ == 0xdd);
  }

  bool nil() noexcept {
    if (!peek_nil()) return false;
    ++p_;
    return true;
  }

  /// A non-negative integer in any msgpack integer encoding.
  std::optional<std::uint64_t> uint() noexcept {
    if (p_ >= end_) return std::nullopt;
    const std::uint8_t t = *p_;
    if (t <= 0x7f) {
      ++p_;
      return t;
    }
    std::size_t n;
    bool is_signed;
    switch (t) {
      case 0xcc: n = 1; is_signed = false; break;
      case 0xcd: n = 2; is_signed = false; break;
      case 0xce: n = 4; is_signed = false; break;
      case 0xcf: n = 8; is_signed = false; break;
      case 0xd0: n = 1; is_signed = true; break;
      case 0xd1: n = 2; is_signed = true; break;
      case 0xd2: n = 4; is_signed = true; break;
      case 0xd3: n = 8; is_signed = true; break;
      default: return std::nullopt;
    }
    if (remaining() < 1 + n) return std::nullopt;
    const std::uint64_t v = big_endian(p_ + 1, n);
    // A signed encoding is non-negative when its top bit is clear.
    if (is_signed && (v >> (8 * n - 1)) != 0) return std::nullopt;
    p_ += 1 + n;
    return v;
  }

  /// A str (not bin), its bytes viewed in place.
  std::optional<std::string_view> str() noexcept {
    if (p_ >= end_) return std::nullopt;
    const std::uint8_t t = *p_;
    std::size_t head;
    std::uint64_t n;
    if ((t & 0xe0) == 0xa0) {
      head = 1;
      n = t & 0x1f;
    } else if (t >= 0xd9 && t <= 0xdb) {
      const std::size_t w = std::size_t{1} << (t - 0xd9);  // 1, 2, 4
      if (remaining() < 1 + w) return std::nullopt;
      head = 1 + w;
      n = big_endian(p_ + 1, w);
    } else {
      return std::nullopt;
    }
    if (remaining() - head < n) return std::nullopt;
    std::string_view s(reinterpret_cast<const char*>(p_ + head), static_cast<std::size_t>(n));
    p_ += head + n;
    return s;
  }

  /// An array header: the element count, at most the bytes that remain
  /// (each element takes at least one).
  std::optional<std::uint32_t> array_header() noexcept {
    return container_header(0x90, 0xdc, 1);
  }
  /// A map header: the pair count, at most half the bytes that remain.
  std::optional<std::uint32_t> map_header() noexcept { return container_header(0x80, 0xde, 2); }

  /// Skips one whole item, checking that it is well formed: every byte a
  /// type code, every length inside the bytes, containers nested at most
  /// `depth` deep (0: no container allowed). This is what msgpack-cxx's
  /// bounded unpack accepts. False (cursor unchanged) otherwise.
  bool skip(std::size_t depth) noexcept {
    const std::uint8_t* const start = p_;
    if (skip_one(depth)) return true;
    p_ = start;
    return false;
  }

 private:
  static std::uint64_t big_endian(const std::uint8_t* b, std::size_t n) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v = (v << 8) | b[i];
    return v;
  }

  // fix: the fixarray/fixmap base (0x90/0x80); wide: the 16-bit code
  // (0xdc/0xde, the 32-bit one follows it); per: bytes each element needs.
  std::optional<std::uint32_t> container_header(std::uint8_t fix, std::uint8_t wide,
                                                std::size_t per) noexcept {
    if (p_ >= end_) return std::nullopt;
    const std::uint8_t t = *p_;
    std::size_t head;
    std::uint64_t n;
    if ((t & 0xf0) == fix) {
      head = 1;
      n = t & 0x0f;
    } else if (t == wide || t == wide + 1) {
      const std::size_t w = t == wide ? 2 : 4;
      if (remaining() < 1 + w) return std::nullopt;
      head = 1 + w;
      n = big_endian(p_ + 1, w);
    } else {
      return std::nullopt;
    }
    if ((remaining() - head) / per < n) return std::nullopt;
    p_ += head;
    return static_cast<std::uint32_t>(n);
  }

  // Advances past `n` bytes when they are there.
  bool take(std::uint64_t n) noexcept {
    if (remaining() < n) return false;
    p_ += n;
    return true;
  }

  // Advances past a length-prefixed payload whose length is the next `w`
  // bytes, plus `extra` bytes (an ext's type byte).
  bool take_sized(std::size_t w, std::size_t extra) noexcept {
    if (remaining() < w) return false;
    const std::uint64_t n = big_endian(p_, w);
    p_ += w;
    return take(n + extra);
  }

  bool skip_one(std::size_t depth) noexcept {
    if (p_ >= end_) return false;
    const std::uint8_t t = *p_++;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return true;
    if ((t & 0xe0) == 0xa0) return take(t & 0x1f);           // fixstr
    if ((t & 0xf0) == 0x90 || (t & 0xf0) == 0x80 || t == 0xdc || t == 0xdd || t == 0xde ||
        t == 0xdf) {
      --p_;
      const bool is_map = (t & 0xf0) == 0x80 || t == 0xde || t == 0xdf;
      auto n = is_map ? map_header() : array_header();
      if (!n || depth == 0) return false;
      const std::uint64_t items = is_map ? std::uint64_t{*n} * 2 : *n;
      for (std::uint64_t i = 0; i < items; ++i)
        if (!skip_one(depth - 1)) return false;
      return true;
    }
    switch (t) {
      case 0xc4: return take_sized(1, 0);  // bin 8/16/32
      case 0xc5: return take_sized(2, 0);
      case 0xc6: return take_sized(4, 0);
      case 0xc7: return take_sized(1, 1);  // ext 8/16/32: length, type, data
      case 0xc8: return take_sized(2, 1);
      case 0xc9: return take_sized(4, 1);
      case 0xca: return take(4);           // float 32/64
      case 0xcb: return take(8);
      case 0xcc: case 0xd0: return take(1);  // (u)int 8/16/32/64
      case 0xcd: case 0xd1: return take(2);
      case 0xce: case 0xd2: return take(4);
      case 0xcf: case 0xd3: return take(8);
      case 0xd4: return take(2);           // fixext 1/2/4/8/16: type, data
      case 0xd5: return take(3);
      case 0xd6: return take(5);
      case 0xd7: return take(9);
      case 0xd8: return take(17);
      case 0xd9: return take_sized(1, 0);  // str 8/16/32
      case 0xda: return take_sized(2, 0);
      case 0xdb: return take_sized(4, 0);
      default: return false;               // 0xc1: never used
    }
  }

  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

}  // namespace blobpipe::detail
