// blobpipe/protocol/row_digest.hpp: the keyed digest of announced index
// rows is SipHash-2-4 with a 128-bit output, the same function as
// OpenSSL's SIPHASH MAC with size 16, fed in any chunking, under a
// per-process random key.
#define BOOST_TEST_MODULE row_digest_test
#include <boost/test/unit_test.hpp>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "blobpipe/protocol/row_digest.hpp"

using blobpipe::row_digest;

namespace {

std::array<unsigned char, 16> key_bytes(const row_digest::key& k) {
  std::array<unsigned char, 16> out{};
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 8; ++i) out[8 * h + i] = static_cast<unsigned char>(k[h] >> (8 * i));
  return out;
}

std::array<unsigned char, 16> value_bytes(const row_digest::value& v) {
  return key_bytes(v);  // the same layout: two little-endian words, low first
}

/// OpenSSL's SipHash-2-4 with a 16-byte output over `msg`.
std::array<unsigned char, 16> openssl_siphash128(const row_digest::key& k,
                                                 const std::vector<std::byte>& msg) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "SIPHASH", nullptr);
  BOOST_TEST_REQUIRE(mac != nullptr);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  BOOST_TEST_REQUIRE(ctx != nullptr);
  std::size_t size = 16;
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size),
                               OSSL_PARAM_construct_end()};
  const auto kb = key_bytes(k);
  BOOST_TEST_REQUIRE(EVP_MAC_init(ctx, kb.data(), kb.size(), params) == 1);
  BOOST_TEST_REQUIRE(
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(msg.data()), msg.size()) == 1);
  std::array<unsigned char, 16> out{};
  std::size_t n = 0;
  BOOST_TEST_REQUIRE(EVP_MAC_final(ctx, out.data(), &n, out.size()) == 1);
  BOOST_TEST_REQUIRE(n == 16u);
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(digest_of_the_reference_vector) {
  // The first 128-bit vector of SipHash's reference code: key 00..0f,
  // empty message.
  const row_digest::key k{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  row_digest d(k);
  const std::array<unsigned char, 16> want{0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6,
                                           0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93};
  BOOST_TEST((value_bytes(d.finish()) == want));
}

BOOST_AUTO_TEST_CASE(digest_is_openssls_siphash128_in_any_chunking) {
  std::mt19937_64 rng(27);
  for (std::size_t len = 0; len <= 300; len += (len < 40 ? 1 : 13)) {
    const row_digest::key k{rng(), rng()};
    std::vector<std::byte> msg(len);
    for (auto& b : msg) b = std::byte(rng());
    const auto want = openssl_siphash128(k, msg);
    BOOST_TEST_CONTEXT("length " << len) {
      row_digest whole(k);
      whole.update(msg);
      BOOST_TEST((value_bytes(whole.finish()) == want));
      // Pieces of 0 to 11 bytes: partial words carried across updates.
      row_digest pieces(k);
      for (std::size_t at = 0; at < len;) {
        const std::size_t n = std::min<std::size_t>(rng() % 12, len - at);
        pieces.update(std::span(msg).subspan(at, n));
        at += n;
      }
      BOOST_TEST((value_bytes(pieces.finish()) == want));
    }
  }
}

BOOST_AUTO_TEST_CASE(digest_depends_on_the_key_and_on_every_byte) {
  const row_digest::key k{1, 2};
  std::vector<std::byte> msg(37, std::byte{5});
  row_digest a(k);
  a.update(msg);
  const auto base = a.finish();
  row_digest other_key({1, 3});
  other_key.update(msg);
  BOOST_TEST((other_key.finish() != base));
  msg[36] = std::byte{6};
  row_digest other_byte(k);
  other_byte.update(msg);
  BOOST_TEST((other_byte.finish() != base));
}

BOOST_AUTO_TEST_CASE(process_key_is_drawn_once_and_is_not_a_constant) {
  const auto& k = row_digest::process_key();
  BOOST_TEST(&row_digest::process_key() == &k);
  // 128 random bits are never all zero, nor the halves equal, in practice
  // (2^-64): a key left at a constant would be.
  BOOST_TEST((k != row_digest::key{0, 0}));
  BOOST_TEST(k[0] != k[1]);
}
