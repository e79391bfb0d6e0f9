// examples/rollout/sample.hpp — one rollout sample as NeMo RL's data plane
// keys it, built deterministically from the corpus.
//
// Sample n (prompt + response of corpus entry n mod size) becomes five
// entries, one blob per sample:
//   "{n}@input_ids"            int64   [T]  UTF-8 bytes as token ids
//   "{n}@generation_logprobs"  float32 [T]  0 on prompt tokens; on response
//                                           tokens the log-probability a
//                                           byte-bigram model of the corpus
//                                           gives the token
//   "{n}@token_mask"           bool    [T]  0 prompt, 1 response
//   "{n}@reward"               float32 []   share of letters and spaces in
//                                           the response (0..1)
//   "{n}@meta"                 pickle       {'idx', 'source', 'entry',
//                                            'prompt_tokens',
//                                            'response_tokens',
//                                            'finished', 'stop_reason'}
// Byte-level tokens keep the example free of a tokenizer; the bigram
// model makes the logprobs vary with the text as a policy's would.
// Samples n and n + size share their token rows (all but meta): the
// builder computes each row once (a pool, see sample_builder) and copies
// it, so a worker builds samples at memory speed.
//
//   rollout::sample_builder b(rollout::corpus::embedded());
//   rollout::sample s = b.make(7);
//   for (const auto& f : rollout::fields(s)) co_await blob.emit(f.key, f.value);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "blobpipe/format/layout.hpp"
#include "examples/rollout/corpus.hpp"

namespace rollout {

/// The per-sample key suffixes, in the order a worker emits them.
inline constexpr std::array<std::string_view, 5> field_names = {
    "input_ids", "generation_logprobs", "token_mask", "reward", "meta"};
inline constexpr std::size_t field_count = field_names.size();

/// A sample's values; the vectors own the memory the entries point at.
struct sample {
  std::int64_t idx = 0;
  std::size_t prompt_tokens = 0;
  std::vector<std::int64_t> input_ids;
  std::vector<float> logprobs;
  std::vector<std::uint8_t> token_mask;  ///< torch.bool is one byte, 0 or 1
  float reward = 0;
  std::vector<std::byte> meta;           ///< pickle bytes
};

/// One entry of a sample: its key, the value to emit, and its bytes.
struct field {
  std::string key;
  blobpipe::value value;             ///< borrows from the sample
  std::span<const std::byte> bytes;  ///< exactly the entry's bytes
};

/// The five entries of `s`, in field_names order. They borrow from `s`:
/// keep `s` alive and unchanged while they are used.
std::vector<field> fields(const sample& s);

/// Damages `s` for a test of the trainer's check (--corrupt-sample): flips
/// the lowest bit of the last generation logprob's first byte.
void corrupt(sample& s) noexcept;

/// What the trainer expects of a sample without building it: its token
/// count and the digest64 (digest.hpp) of each of its five entries' bytes.
struct expectation {
  std::size_t tokens = 0;                            ///< T, elements
  std::array<std::uint64_t, field_count> digest{};  ///< field_names order
};

/// "{idx}@{name}".
std::string sample_key(std::int64_t idx, std::string_view name);

/// A parsed key: sample number and position in field_names.
struct parsed_key {
  std::int64_t idx = 0;
  std::size_t field = 0;
};
/// Parses "{idx}@{name}" with a known name; nullopt otherwise.
std::optional<parsed_key> parse_sample_key(std::string_view key);

/// Builds samples from a corpus. Holds the byte-bigram model (256 x 256
/// counts) trained once over the whole corpus.
class sample_builder {
 public:
  /// REQUIRES: c is not empty and outlives the builder. `seq_len` > 0
  /// makes every sample exactly that many tokens (prompt + response): the
  /// response is repeated, or cut, to fit (at least one response token).
  explicit sample_builder(const corpus& c, std::size_t seq_len = 0);

  /// Sample `idx` (>= 0): entry idx mod size. Same idx, same bytes. Its
  /// token row comes from the pool (built on first use); only the meta
  /// pickle is built per sample. Not thread-safe (the pool is filled
  /// lazily): one thread per builder, as the example's io_context is.
  sample make(std::int64_t idx) const;

  /// The digests make(idx) would give, from the pool's digests of the
  /// token row and the digest of the meta pickle (a few hundred bytes
  /// built here): no token row is built or copied once pooled.
  expectation expect(std::int64_t idx) const;

  /// log P(next | prev) under the model, natural log.
  float logprob(std::uint8_t prev, std::uint8_t next) const noexcept;

 private:
  const corpus* corpus_;
  std::size_t seq_len_ = 0;
  std::vector<std::uint32_t> bigram_;  // [prev * 256 + next]
  std::array<std::uint32_t, 256> row_total_{};
  std::array<double, 256> unigram_{};  // add-one smoothed P(next)

  // One corpus entry's token row and its digests (fields 0..3).
  struct row {
    std::size_t prompt_tokens = 0;
    std::vector<std::int64_t> input_ids;
    std::vector<float> logprobs;
    std::vector<std::uint8_t> token_mask;
    float reward = 0;
    std::array<std::uint64_t, 4> digest{};
  };
  // Rows of up to this many bytes (13 T + 4) are kept, one per corpus
  // entry (187 entries: at most 48 MB); longer ones are built per call.
  static constexpr std::size_t pooled_row_bytes = 256 * 1024;
  std::shared_ptr<const row> row_of(std::size_t entry) const;
  std::shared_ptr<const row> build_row(std::size_t entry) const;
  std::vector<std::byte> meta_of(std::int64_t idx, std::size_t entry, const row& r) const;
  mutable std::vector<std::shared_ptr<const row>> pool_;  // [entry], filled on use
};

}  // namespace rollout
