// Keyed BLAKE2b-128 (see row_digest.hpp): libsodium's incremental
// crypto_generichash over a state held inline.
#include "blobpipe/protocol/row_digest.hpp"

#include <sodium.h>

#include <new>
#include <stdexcept>

namespace blobpipe {
namespace {

static_assert(sizeof(crypto_generichash_state) == row_digest::state_bytes,
              "row_digest::state_bytes must be libsodium's crypto_generichash_state");
static_assert(alignof(crypto_generichash_state) == row_digest::state_align,
              "row_digest::state_align must be libsodium's crypto_generichash_state");
static_assert(std::tuple_size_v<row_digest::key> >= crypto_generichash_KEYBYTES_MIN &&
              std::tuple_size_v<row_digest::key> <= crypto_generichash_KEYBYTES_MAX);
static_assert(std::tuple_size_v<row_digest::value> >= crypto_generichash_BYTES_MIN &&
              std::tuple_size_v<row_digest::value> <= crypto_generichash_BYTES_MAX);

crypto_generichash_state* state_of(unsigned char* storage) noexcept {
  return std::launder(reinterpret_cast<crypto_generichash_state*>(storage));
}

row_digest::key draw_key() {
  // 0: initialized now, 1: already; -1: failed (no random source).
  if (sodium_init() < 0) throw std::runtime_error("sodium_init failed: no row digest key");
  row_digest::key k;
  randombytes_buf(k.data(), k.size());
  return k;
}

}  // namespace

const row_digest::key& row_digest::process_key() {
  static const key k = draw_key();
  return k;
}

row_digest::row_digest(const key& k) noexcept {
  // Cannot fail: the key and output lengths are within libsodium's bounds
  // (static_asserts above).
  crypto_generichash_init(::new (static_cast<void*>(state_)) crypto_generichash_state,
                          reinterpret_cast<const unsigned char*>(k.data()), k.size(),
                          std::tuple_size_v<value>);
}

void row_digest::update(std::span<const std::byte> bytes) noexcept {
  crypto_generichash_update(state_of(state_), reinterpret_cast<const unsigned char*>(bytes.data()),
                            bytes.size());
}

row_digest::value row_digest::finish() noexcept {
  value out;
  crypto_generichash_final(state_of(state_), reinterpret_cast<unsigned char*>(out.data()),
                           out.size());
  return out;
}

}  // namespace blobpipe
