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

  /// Sample `idx` (>= 0): entry idx mod size. Same idx, same bytes.
  sample make(std::int64_t idx) const;

  /// log P(next | prev) under the model, natural log.
  float logprob(std::uint8_t prev, std::uint8_t next) const noexcept;

 private:
  const corpus* corpus_;
  std::size_t seq_len_ = 0;
  std::vector<std::uint32_t> bigram_;  // [prev * 256 + next]
  std::array<std::uint32_t, 256> row_total_{};
  std::array<double, 256> unigram_{};  // add-one smoothed P(next)
};

}  // namespace rollout
