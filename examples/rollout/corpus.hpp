// examples/rollout/corpus.hpp — the prompts and responses the example streams.
//
// The text is examples/data/corpus.txt (fortune(6) format, see
// examples/data/README), compiled into the binary so the example runs
// with no arguments and no data files. Each entry is split into a prompt
// and the response a policy would have generated for it:
//   "Q: ... A: ..." jokes  -> the question | the answer
//   several lines          -> the first line | the rest
//   one line               -> the first sentence | the rest, or the words
//                             up to the middle | the rest
//
//   const auto& c = rollout::corpus::embedded();
//   std::cout << c.pairs()[0].prompt << c.pairs()[0].response;
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rollout {

/// One prompt and its response, as UTF-8 text. prompt + response is the
/// entry's full text.
struct text_pair {
  std::string prompt;
  std::string response;  ///< never empty
  std::string source;    ///< "riddles" or "fortunes" (the fortune file)
};

class corpus {
 public:
  /// The corpus built into the binary (parsed once, on first use).
  static const corpus& embedded();

  /// Parses fortune-format text: entries separated by lines holding "%".
  /// Empty entries are skipped.
  static corpus parse(std::string_view text);

  std::span<const text_pair> pairs() const noexcept { return pairs_; }
  std::size_t size() const noexcept { return pairs_.size(); }

 private:
  std::vector<text_pair> pairs_;
};

/// Splits one entry into prompt and response (rules in the file comment).
/// REQUIRES: entry is not empty.
text_pair split_entry(std::string_view entry);

}  // namespace rollout
