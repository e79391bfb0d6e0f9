// blobpipe/protocol/row_digest.hpp: the keyed digest of announced index
// rows is keyed BLAKE2b with a 128-bit output: libsodium's one-shot
// crypto_generichash with the same key over the same bytes, however the
// bytes were fed (whole, byte by byte, random chunkings), under a
// per-process random key.
#define BOOST_TEST_MODULE row_digest_test
#include <boost/test/unit_test.hpp>

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "blobpipe/protocol/row_digest.hpp"

using blobpipe::row_digest;

namespace {

row_digest::key random_key(std::mt19937_64& rng) {
  row_digest::key k;
  for (auto& b : k) b = std::byte(rng());
  return k;
}

/// libsodium's one-shot keyed BLAKE2b with a 16-byte output over `msg`.
row_digest::value sodium_digest(const row_digest::key& k, const std::vector<std::byte>& msg) {
  row_digest::value out{};
  BOOST_TEST_REQUIRE(crypto_generichash(reinterpret_cast<unsigned char*>(out.data()), out.size(),
                                        reinterpret_cast<const unsigned char*>(msg.data()),
                                        msg.size(),
                                        reinterpret_cast<const unsigned char*>(k.data()),
                                        k.size()) == 0);
  return out;
}

row_digest::value digest_of(const row_digest::key& k, const std::vector<std::byte>& msg) {
  row_digest d(k);
  d.update(msg);
  return d.finish();
}

struct sodium_initialized {
  sodium_initialized() { BOOST_TEST_REQUIRE(sodium_init() >= 0); }
};

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(sodium_initialized);

BOOST_AUTO_TEST_CASE(digest_of_nothing_is_sodiums) {
  // Key 00..1f, empty message, with and without an empty update.
  row_digest::key k;
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::byte(i);
  const auto want = sodium_digest(k, {});
  row_digest plain(k);
  BOOST_TEST((plain.finish() == want));
  row_digest empty_update(k);
  empty_update.update({});
  BOOST_TEST((empty_update.finish() == want));
}

BOOST_AUTO_TEST_CASE(digest_is_sodiums_generichash_in_any_chunking) {
  std::mt19937_64 rng(27);
  // Lengths around BLAKE2b's 128-byte block, and several blocks.
  for (std::size_t len = 0; len <= 600; len += (len < 140 ? 1 : 37)) {
    const auto k = random_key(rng);
    std::vector<std::byte> msg(len);
    for (auto& b : msg) b = std::byte(rng());
    const auto want = sodium_digest(k, msg);
    BOOST_TEST_CONTEXT("length " << len) {
      BOOST_TEST((digest_of(k, msg) == want));
      row_digest bytes(k);
      for (std::size_t at = 0; at < len; ++at) bytes.update(std::span(msg).subspan(at, 1));
      BOOST_TEST((bytes.finish() == want));
      // Pieces of 0 to 150 bytes (empty updates included); a copy taken
      // midway, fed the rest, finishes to the same digest.
      for (int round = 0; round < 3; ++round) {
        row_digest pieces(k);
        std::optional<row_digest> copy;
        std::size_t copied_at = 0;
        for (std::size_t at = 0; at < len;) {
          const std::size_t n = std::min<std::size_t>(rng() % 151, len - at);
          pieces.update(std::span(msg).subspan(at, n));
          at += n;
          if (!copy && at >= len / 2) {
            copy.emplace(pieces);
            copied_at = at;
          }
        }
        BOOST_TEST((pieces.finish() == want));
        if (copy) {
          copy->update(std::span(msg).subspan(copied_at));
          BOOST_TEST((copy->finish() == want));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(different_rows_digest_apart) {
  // Rows that differ in one byte, by a trailing zero byte or by a byte
  // less, and a thousand random rows: all digest apart.
  const row_digest::key k{};
  std::vector<std::byte> msg(37, std::byte{5});
  const auto base = digest_of(k, msg);
  std::set<row_digest::value> seen{base};
  for (std::size_t i = 0; i < msg.size(); ++i) {
    auto other = msg;
    other[i] ^= std::byte{1};
    BOOST_TEST(seen.insert(digest_of(k, other)).second, "byte " << i);
  }
  auto longer = msg;
  longer.push_back(std::byte{0});
  BOOST_TEST(seen.insert(digest_of(k, longer)).second);
  auto shorter = msg;
  shorter.pop_back();
  BOOST_TEST(seen.insert(digest_of(k, shorter)).second);
  BOOST_TEST(seen.insert(digest_of(k, {})).second);
  // Many random rows of a decoder's size (about 25 bytes): all apart.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1000; ++i) {
    std::vector<std::byte> row(20 + rng() % 12);
    for (auto& b : row) b = std::byte(rng());
    seen.insert(digest_of(k, row));
  }
  BOOST_TEST(seen.size() == msg.size() + 4 + 1000);
}

BOOST_AUTO_TEST_CASE(different_keys_digest_apart) {
  std::vector<std::byte> msg(37, std::byte{5});
  row_digest::key k{};
  std::set<row_digest::value> seen{digest_of(k, msg)};
  // Every bit of the key counts (a key cut to its first 16 bytes, say,
  // would digest alike for flips in the rest).
  for (std::size_t i = 0; i < k.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto other = k;
      other[i] ^= std::byte(1u << bit);
      BOOST_TEST(seen.insert(digest_of(other, msg)).second, "byte " << i << " bit " << bit);
    }
  }
  // The empty row too.
  BOOST_TEST((digest_of(k, {}) != digest_of(row_digest::key{std::byte{1}}, {})));
}

BOOST_AUTO_TEST_CASE(process_key_is_drawn_once_and_is_not_a_constant) {
  const auto& k = row_digest::process_key();
  BOOST_TEST(&row_digest::process_key() == &k);
  const row_digest::key first = k;
  BOOST_TEST((row_digest::process_key() == first));
  // 256 random bits are never all zero, nor their halves equal, in
  // practice (2^-128): a key left at a constant would be.
  BOOST_TEST((k != row_digest::key{}));
  BOOST_TEST(!std::equal(k.begin(), k.begin() + 16, k.begin() + 16));
  const auto zero = [](std::byte b) { return b == std::byte{0}; };
  BOOST_TEST(!std::all_of(k.begin(), k.begin() + 16, zero));
  BOOST_TEST(!std::all_of(k.begin() + 16, k.end(), zero));
  // Digests under it are stable within the process and are libsodium's.
  std::vector<std::byte> msg(25, std::byte{7});
  BOOST_TEST((digest_of(row_digest::process_key(), msg) == digest_of(k, msg)));
  BOOST_TEST((digest_of(k, msg) == sodium_digest(k, msg)));
}
