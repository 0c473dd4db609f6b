// Character spans <-> token spans, and the trimming of a copied span into a value (the seed's
// `token_span` and `trim_span`, rule for rule). Spans are half-open [start, end) in code points of
// the document text; token spans are inclusive [first, last] indices into the context tokens.
// UTF-8 helpers for code-point text live here too: the span rules index code points, as Python
// strings do, never bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deg::schema {

// One context token's character range [start, end) in code points of the document.
struct CharRange {
  int64_t start = 0;
  int64_t end = 0;
};

// Token offsets prepared for repeated span lookups: when both the starts and the ends are
// non-decreasing (every tokenizer's case) lookups bisect, otherwise they scan linearly.
class TokenOffsets {
 public:
  explicit TokenOffsets(std::vector<CharRange> offsets);

  const std::vector<CharRange>& offsets() const { return offsets_; }
  bool monotone() const { return monotone_; }
  int64_t size() const { return int64_t(offsets_.size()); }

 private:
  std::vector<CharRange> offsets_;
  std::vector<int64_t> starts_;  // [T] offsets_[t].start
  std::vector<int64_t> ends_;    // [T] offsets_[t].end
  bool monotone_ = true;

  friend std::optional<std::pair<int64_t, int64_t>> token_span(const TokenOffsets&, int64_t,
                                                               int64_t);
};

// Char span [start, end) -> inclusive token span [first, last]: the first token ending after
// `start` and the last token starting before `end`. nullopt when no token ends after `start` or
// none starts before `end` (the seed raises there). `first > last` is possible for an empty
// span that falls between tokens; callers decide what that means.
std::optional<std::pair<int64_t, int64_t>> token_span(const TokenOffsets& offsets, int64_t start,
                                                      int64_t end);

// Token-span characters -> value characters: strips whitespace and the boundary punctuation a
// token carried in (unbalanced brackets and quotes, a symmetric pair of quotes or brackets,
// leading `>` and `'`, trailing `,;:` and closing quotes), and symmetric markdown `*` emphasis.
// `*` is never stripped one-sided: it can be value text (`****4821`). Returns [start, end).
std::pair<int64_t, int64_t> trim_span(std::u32string_view text, int64_t start, int64_t end);

// Python's str.isspace() for one code point (Unicode category Zs or bidi class WS, B or S).
bool is_space(char32_t c);

// UTF-8 -> code points; nullopt when `utf8` is not valid UTF-8.
std::optional<std::u32string> utf8_to_code_points(std::string_view utf8);
// Code points -> UTF-8 (code points are assumed valid: they came from utf8_to_code_points).
std::string code_points_to_utf8(std::u32string_view text);

}  // namespace deg::schema
