// SipHash-2-4-128 (see row_digest.hpp): four 64-bit words of state, two
// rounds per 8-byte word, four to finish each 64-bit half.
#include "blobpipe/protocol/row_digest.hpp"

#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace blobpipe {
namespace {

constexpr std::uint64_t rotl(std::uint64_t x, int b) noexcept { return (x << b) | (x >> (64 - b)); }

inline void sip_round(std::uint64_t& v0, std::uint64_t& v1, std::uint64_t& v2,
                      std::uint64_t& v3) noexcept {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

/// `n` (<= 8) bytes at `p` as the low bytes of a little-endian word.
std::uint64_t load_le(const std::byte* p, std::size_t n) noexcept {
  std::uint64_t v = 0;
  if (n == 0) return v;  // (p may be null)
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, n);
  } else {
    for (std::size_t i = n; i-- > 0;) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  }
  return v;
}

std::uint64_t load_le64(const std::byte* p) noexcept { return load_le(p, 8); }

row_digest::key draw_key() {
  unsigned char raw[16];
  std::size_t have = 0;
  while (have < sizeof raw) {
    const ssize_t n = ::getrandom(raw + have, sizeof raw - have, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom for the row digest key");
    }
    have += static_cast<std::size_t>(n);
  }
  const auto* b = reinterpret_cast<const std::byte*>(raw);
  return {load_le64(b), load_le64(b + 8)};
}

}  // namespace

const row_digest::key& row_digest::process_key() {
  static const key k = draw_key();
  return k;
}

row_digest::row_digest(const key& k) noexcept
    : v0_(k[0] ^ 0x736f6d6570736575ull),
      // The 128-bit output variant starts v1 with 0xee folded in.
      v1_(k[1] ^ 0x646f72616e646f6dull ^ 0xeeull),
      v2_(k[0] ^ 0x6c7967656e657261ull),
      v3_(k[1] ^ 0x7465646279746573ull) {}

void row_digest::compress(std::uint64_t m) noexcept {
  v3_ ^= m;
  sip_round(v0_, v1_, v2_, v3_);
  sip_round(v0_, v1_, v2_, v3_);
  v0_ ^= m;
}

void row_digest::update(std::span<const std::byte> bytes) noexcept {
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  const unsigned have = static_cast<unsigned>(length_ & 7);
  length_ += n;
  if (have != 0) {
    // Top up the partial word first (rows arrive one at a time, about
    // 25 bytes each: most updates start inside a word).
    const std::size_t take = std::min<std::size_t>(8 - have, n);
    pending_ |= load_le(p, take) << (8 * have);
    p += take;
    n -= take;
    if (have + take < 8) return;
    compress(pending_);
    pending_ = 0;
  }
  for (; n >= 8; n -= 8, p += 8) compress(load_le64(p));
  pending_ = load_le(p, n);
}

row_digest::value row_digest::finish() noexcept {
  compress(pending_ | (length_ << 56));
  v2_ ^= 0xee;
  for (int i = 0; i < 4; ++i) sip_round(v0_, v1_, v2_, v3_);
  const std::uint64_t lo = v0_ ^ v1_ ^ v2_ ^ v3_;
  v1_ ^= 0xdd;
  for (int i = 0; i < 4; ++i) sip_round(v0_, v1_, v2_, v3_);
  return {lo, v0_ ^ v1_ ^ v2_ ^ v3_};
}

}  // namespace blobpipe
