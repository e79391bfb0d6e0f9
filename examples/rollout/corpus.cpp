// examples/rollout/corpus.cpp — see corpus.hpp.
#include "examples/rollout/corpus.hpp"

#include <algorithm>

namespace rollout {
namespace {

// Generated from examples/data/corpus.txt by the genrule `corpus_inc`: the
// file as one raw string literal, so no runfiles lookup can fail.
constexpr std::string_view embedded_text =
#include "examples/corpus_text.inc"
    ;

// A single-line entry: split after the first sentence that is followed by
// more text ("Bank error in your favor.  Collect $200."), else at the
// space nearest before the middle, so both halves are real words.
std::size_t one_line_split(std::string_view s) {
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    if ((s[i] == '.' || s[i] == '!' || s[i] == '?' || s[i] == ';') && s[i + 1] == ' ') {
      std::size_t j = s.find_first_not_of(' ', i + 1);
      if (j != std::string_view::npos) return j;
    }
  }
  std::size_t mid = s.size() / 2;
  std::size_t sp = s.rfind(' ', mid);
  if (sp == std::string_view::npos || sp == 0) return std::max<std::size_t>(mid, 1);
  return sp + 1;
}

}  // namespace

text_pair split_entry(std::string_view entry) {
  text_pair p;
  p.source = entry.starts_with("Q:") ? "riddles" : "fortunes";
  std::size_t cut;
  if (std::size_t a = entry.find("\nA:"); a != std::string_view::npos) {
    cut = a + 1;  // the answer line starts the response
  } else if (std::size_t nl = entry.find('\n'); nl != std::string_view::npos) {
    cut = nl + 1;
  } else {
    cut = one_line_split(entry);
  }
  cut = std::min(cut, entry.size() - 1);  // keep the response non-empty
  p.prompt = std::string(entry.substr(0, cut));
  p.response = std::string(entry.substr(cut));
  return p;
}

corpus corpus::parse(std::string_view text) {
  corpus c;
  std::string entry;
  auto flush = [&] {
    while (!entry.empty() && entry.back() == '\n') entry.pop_back();
    if (!entry.empty()) c.pairs_.push_back(split_entry(entry));
    entry.clear();
  };
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line == "%") {
      flush();
    } else {
      entry.append(line);
      entry.push_back('\n');
    }
  }
  flush();
  return c;
}

const corpus& corpus::embedded() {
  static const corpus c = parse(embedded_text);
  return c;
}

}  // namespace rollout
