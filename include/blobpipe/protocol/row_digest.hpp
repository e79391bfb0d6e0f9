// blobpipe/protocol/row_digest.hpp — the keyed digest of the index rows a
// consumer was announced (docs/wire.md "Consumer").
//
// The push decoder keeps no row of an open blob: it digests each row as it
// is announced (in canonical form, append_index_row) and, when the tail
// arrives, digests the tail's rows and compares. row_digest is that
// digest: SipHash-2-4 with a 128-bit output, fed incrementally, keyed with
// a 128-bit key drawn once per process from the OS's random source
// (process_key()), which no peer ever sees. SipHash is a pseudorandom
// function: without the key a sender cannot compute a digest, so it cannot
// craft a tail whose rows differ from the announced ones and still match
// (each try succeeds with probability about 2^-128). Its state is 48 bytes
// and allocates nothing, so an open blob's memory stays constant
// (decoder::open_blob_bytes).
//
//   blobpipe::row_digest d(blobpipe::row_digest::process_key());
//   d.update(row_bytes);                  // any chunking
//   blobpipe::row_digest::value v = d.finish();
//
// Source: J.-P. Aumasson and D. J. Bernstein, "SipHash: a fast short-input
// PRF" (2012), with the 128-bit output of the authors' reference code (the
// same function as OpenSSL's SIPHASH MAC with size 16, which
// test/row_digest_test.cpp checks it against).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace blobpipe {

/// SipHash-2-4-128 in progress (see the file comment). Copyable; no heap.
class row_digest {
 public:
  /// 128-bit key, as two little-endian 64-bit halves (k0, k1).
  using key = std::array<std::uint64_t, 2>;
  /// 128-bit result, the low half first (OpenSSL's bytes, read as two
  /// little-endian 64-bit words).
  using value = std::array<std::uint64_t, 2>;

  /// The key every decoder of this process uses: 128 bits from the OS's
  /// random source (getrandom), drawn once, on first use; thread-safe.
  /// Throws std::system_error if the OS gives no random bytes.
  static const key& process_key();

  explicit row_digest(const key& k) noexcept;
  /// Adds `bytes` (any length; updates in any chunking give one result).
  void update(std::span<const std::byte> bytes) noexcept;
  /// The digest of every byte added. The object is spent afterwards.
  value finish() noexcept;

 private:
  void compress(std::uint64_t m) noexcept;
  std::uint64_t v0_, v1_, v2_, v3_;
  std::uint64_t pending_ = 0;   // the last 0..7 bytes, little-endian
  std::uint64_t length_ = 0;    // bytes added, mod 2^64 (only the low byte counts)
};

}  // namespace blobpipe
