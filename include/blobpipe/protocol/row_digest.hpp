// blobpipe/protocol/row_digest.hpp — the keyed digest of the index rows a
// consumer was announced (docs/wire.md "Consumer").
//
// The push decoder keeps no row of an open blob: it digests each row as it
// is announced (in canonical form, append_index_row) and, when the tail
// arrives, digests the tail's rows and compares. row_digest is that
// digest: keyed BLAKE2b with a 128-bit output, libsodium's incremental
// crypto_generichash (init with a key, update, final), keyed with a
// 256-bit key drawn once per process from libsodium's randombytes_buf
// (process_key()), which no peer ever sees. Keyed BLAKE2b is a
// pseudorandom function: without the key a sender cannot compute a
// digest, so it cannot craft a tail whose rows differ from the announced
// ones and still match (each try succeeds with probability about 2^-128).
// Its state is libsodium's crypto_generichash_state (384 bytes, 64-byte
// aligned), held inline: nothing is allocated, so an open blob's memory
// stays constant (decoder::open_blob_bytes).
//
//   blobpipe::row_digest d(blobpipe::row_digest::process_key());
//   d.update(row_bytes);                  // any chunking
//   blobpipe::row_digest::value v = d.finish();
//
// The state is opaque storage here, so this header (and decoder.hpp,
// which includes it) does not need <sodium.h>; row_digest.cpp checks its
// size and alignment against crypto_generichash_state. Linking needs
// libsodium (Debian's libsodium-dev). test/row_digest_test.cpp checks the
// digest against libsodium's one-shot crypto_generichash.
#pragma once

#include <array>
#include <cstddef>
#include <span>

namespace blobpipe {

/// Keyed BLAKE2b-128 in progress (see the file comment). Copyable; no heap.
class row_digest {
 public:
  /// 256-bit key (crypto_generichash's recommended key length).
  using key = std::array<std::byte, 32>;
  /// 128-bit result: the bytes crypto_generichash_final writes.
  using value = std::array<std::byte, 16>;

  /// The key every decoder of this process uses: 32 bytes from libsodium's
  /// randombytes_buf (after sodium_init()), drawn once, on first use;
  /// thread-safe. Throws std::runtime_error if libsodium cannot be
  /// initialized.
  static const key& process_key();

  explicit row_digest(const key& k) noexcept;
  /// Adds `bytes` (any length; updates in any chunking give one result).
  void update(std::span<const std::byte> bytes) noexcept;
  /// The digest of every byte added. The object is spent afterwards.
  value finish() noexcept;

  /// sizeof and alignof libsodium's crypto_generichash_state (1.0.18),
  /// checked in row_digest.cpp.
  static constexpr std::size_t state_bytes = 384;
  static constexpr std::size_t state_align = 64;

 private:
  // A crypto_generichash_state lives here (an array of unsigned char
  // implicitly creates it; copying the bytes copies the state, which holds
  // no pointers).
  alignas(state_align) unsigned char state_[state_bytes];
};

}  // namespace blobpipe
