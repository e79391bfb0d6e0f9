// examples/rollout/sample.cpp — see sample.hpp.
#include "examples/rollout/sample.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "blobpipe/format/pickle.hpp"
#include "examples/rollout/digest.hpp"

namespace rollout {
namespace {

// Weight of the unigram prior in the interpolated bigram estimate: a byte
// pair seen rarely still gets a sensible, non-zero probability.
constexpr double prior_weight = 4.0;

template <class T>
std::span<const std::byte> bytes_of(std::span<const T> v) {
  return std::as_bytes(v);
}

float text_reward(std::string_view response) {
  std::size_t good = 0;
  for (unsigned char c : response)
    if (std::isalpha(c) || c == ' ') ++good;
  return static_cast<float>(good) / static_cast<float>(response.size());
}

}  // namespace

sample_builder::sample_builder(const corpus& c, std::size_t seq_len)
    : corpus_(&c), seq_len_(seq_len), bigram_(256 * 256, 0) {
  std::array<std::uint64_t, 256> uni{};
  std::uint64_t total = 0;
  for (const auto& p : c.pairs()) {
    std::string text = p.prompt + p.response;
    for (std::size_t i = 0; i < text.size(); ++i) {
      auto b = static_cast<std::uint8_t>(text[i]);
      ++uni[b];
      ++total;
      if (i > 0) {
        auto a = static_cast<std::uint8_t>(text[i - 1]);
        ++bigram_[a * 256u + b];
        ++row_total_[a];
      }
    }
  }
  for (std::size_t b = 0; b < 256; ++b)
    unigram_[b] = (static_cast<double>(uni[b]) + 1.0) / (static_cast<double>(total) + 256.0);
}

float sample_builder::logprob(std::uint8_t prev, std::uint8_t next) const noexcept {
  double p = (bigram_[prev * 256u + next] + prior_weight * unigram_[next]) /
             (row_total_[prev] + prior_weight);
  return static_cast<float>(std::log(p));
}

std::shared_ptr<const sample_builder::row> sample_builder::build_row(std::size_t n) const {
  const text_pair& tp = corpus_->pairs()[n];
  auto r = std::make_shared<row>();
  r->prompt_tokens = tp.prompt.size();
  std::string text = tp.prompt + tp.response;
  if (seq_len_ > 0) {
    // --seq-len: the response repeated (or cut) to make seq_len tokens.
    const std::size_t want = std::max(seq_len_, r->prompt_tokens + 1) - r->prompt_tokens;
    text.resize(r->prompt_tokens);
    const std::string& src = tp.response.empty() ? tp.prompt : tp.response;
    for (std::size_t i = 0; i < want; ++i) text.push_back(src[i % src.size()]);
  }
  r->input_ids.reserve(text.size());
  for (unsigned char c : text) r->input_ids.push_back(c);
  // Generation logprobs exist only for generated tokens; NeMo RL stores 0
  // for the prompt part, and token_mask tells the loss which part is which.
  r->logprobs.assign(text.size(), 0.0f);
  r->token_mask.assign(text.size(), 0);
  for (std::size_t i = r->prompt_tokens; i < text.size(); ++i) {
    auto prev = static_cast<std::uint8_t>(text[i - 1]);  // prompt is never empty
    r->logprobs[i] = logprob(prev, static_cast<std::uint8_t>(text[i]));
    r->token_mask[i] = 1;
  }
  r->reward = text_reward(tp.response);
  r->digest = {digest64(std::as_bytes(std::span(r->input_ids))),
               digest64(std::as_bytes(std::span(r->logprobs))),
               digest64(std::as_bytes(std::span(r->token_mask))),
               digest64(std::as_bytes(std::span(&r->reward, 1)))};
  return r;
}

std::shared_ptr<const sample_builder::row> sample_builder::row_of(std::size_t n) const {
  if (pool_.empty()) pool_.resize(corpus_->size());
  if (pool_[n]) return pool_[n];
  auto r = build_row(n);
  if (13 * r->input_ids.size() + 4 <= pooled_row_bytes) pool_[n] = r;
  return r;
}

std::vector<std::byte> sample_builder::meta_of(std::int64_t idx, std::size_t n,
                                               const row& r) const {
  const text_pair& tp = corpus_->pairs()[n];
  // A flat dict of scalars: pickle() cannot fail on it.
  return blobpipe::pickle(blobpipe::pickle_value::dict{
                              {"idx", idx},
                              {"source", tp.source},
                              {"entry", n},
                              {"prompt_tokens", r.prompt_tokens},
                              {"response_tokens", r.input_ids.size() - r.prompt_tokens},
                              {"finished", true},
                              {"stop_reason", nullptr},
                          })
      .value();
}

sample sample_builder::make(std::int64_t idx) const {
  const auto n = static_cast<std::size_t>(idx) % corpus_->size();
  const auto r = row_of(n);
  sample s;
  s.idx = idx;
  s.prompt_tokens = r->prompt_tokens;
  s.input_ids = r->input_ids;
  s.logprobs = r->logprobs;
  s.token_mask = r->token_mask;
  s.reward = r->reward;
  s.meta = meta_of(idx, n, *r);
  return s;
}

expectation sample_builder::expect(std::int64_t idx) const {
  const auto n = static_cast<std::size_t>(idx) % corpus_->size();
  const auto r = row_of(n);
  expectation e;
  e.tokens = r->input_ids.size();
  for (std::size_t f = 0; f < r->digest.size(); ++f) e.digest[f] = r->digest[f];
  e.digest[4] = digest64(meta_of(idx, n, *r));
  return e;
}

void corrupt(sample& s) noexcept {
  if (s.logprobs.empty()) return;
  auto* b = reinterpret_cast<unsigned char*>(&s.logprobs.back());
  b[0] ^= 1;
}

std::vector<field> fields(const sample& s) {
  using blobpipe::value;
  const auto T = static_cast<std::int64_t>(s.input_ids.size());
  std::span<const std::int64_t> ids(s.input_ids);
  std::span<const float> lp(s.logprobs);
  std::span<const std::uint8_t> mask(s.token_mask);
  std::span<const float> reward(&s.reward, 1);
  std::vector<field> out;
  out.reserve(field_count);
  out.push_back({sample_key(s.idx, field_names[0]), value::tensor(ids, {T}), bytes_of(ids)});
  out.push_back({sample_key(s.idx, field_names[1]), value::tensor(lp, {T}), bytes_of(lp)});
  out.push_back({sample_key(s.idx, field_names[2]), value::tensor(mask, {T}, "bool"),
                 bytes_of(mask)});
  // A 0-d tensor (shape []) holds one element, as torch.tensor(0.5) does.
  out.push_back({sample_key(s.idx, field_names[3]), value::tensor(reward, {}), bytes_of(reward)});
  out.push_back({sample_key(s.idx, field_names[4]), value::pickle(s.meta), s.meta});
  return out;
}

std::string sample_key(std::int64_t idx, std::string_view name) {
  std::string k = std::to_string(idx);
  k.push_back('@');
  k.append(name);
  return k;
}

std::optional<parsed_key> parse_sample_key(std::string_view key) {
  std::size_t at = key.find('@');
  if (at == std::string_view::npos || at == 0) return std::nullopt;
  parsed_key out;
  auto [end, ec] = std::from_chars(key.data(), key.data() + at, out.idx);
  if (ec != std::errc{} || end != key.data() + at || out.idx < 0) return std::nullopt;
  std::string_view name = key.substr(at + 1);
  for (std::size_t i = 0; i < field_count; ++i) {
    if (field_names[i] == name) {
      out.field = i;
      return out;
    }
  }
  return std::nullopt;
}

}  // namespace rollout
