// NormalizedText: a piece of text being tokenized, with the alignment of every normalized byte
// back to the original input — deg's counterpart of HF's NormalizedString. Normalizers and
// pre-tokenizers edit it through transform(), which follows HF's alignment rules exactly
// (including their quirks), so token offsets land where HF puts them.
//
// Alignments are absolute: byte ranges into the whole original input (HF keeps them relative
// to each slice plus a shift; the sums are the same).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/unicode.h"

namespace deg::text {

struct ByteSpan {
  uint32_t start = 0;
  uint32_t end = 0;
  bool operator==(const ByteSpan&) const = default;
};

// A match list over a string: consecutive [start, end) ranges covering it, each flagged as a
// pattern match or not (HF's Pattern::find_matches).
struct MatchRange {
  uint32_t start;
  uint32_t end;
  bool is_match;
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

class NormalizedText {
 public:
  NormalizedText() = default;
  // The whole of `original` (valid UTF-8), each byte aligned to its character's range.
  explicit NormalizedText(std::string_view original);

  const std::string& text() const { return text_; }
  const std::vector<ByteSpan>& alignments() const { return align_; }
  bool empty() const { return text_.empty(); }
  // The original range this piece covers (HF's offsets_original).
  ByteSpan original_range() const { return original_; }

  // Original byte range of normalized bytes [start, end): first alignment's start to the
  // last alignment's end (HF's convert_offsets on a normalized range). Empty input range:
  // returns it unchanged, shifted to the piece start.
  ByteSpan to_original(size_t start, size_t end) const;

  // The sub-piece of normalized bytes [start, end) (on char boundaries).
  NormalizedText slice(size_t start, size_t end) const;

  // slice(0, size()) in place: the original range becomes what the alignments cover.
  void reslice_whole() { original_ = to_original(0, text_.size()); }

  // Replaces the whole text by `dest`, consuming input chars as the changes say (HF's
  // transform(dest, initial_offset): the first `initial_offset` chars are removed).
  void transform(const std::vector<CharChange>& dest, size_t initial_offset);

  // Replaces each match by `content`; every new char aligns to the last byte of its match.
  void replace(const std::vector<MatchRange>& matches, std::string_view content);
  void prepend(std::string_view s);
  void lowercase();
  void normalize(NormForm form);
  void strip(bool left, bool right);
  void filter_combining_marks();
  // Maps every byte to a printable char (GPT-2 byte-level alphabet), keeping alignments.
  void to_byte_level();

  // Splits by a match list under `behavior` (HF's NormalizedString::split); empty pieces are
  // kept (the caller drops them).
  std::vector<NormalizedText> split(const std::vector<MatchRange>& matches,
                                    SplitBehavior behavior) const;

 private:
  std::string text_;
  std::vector<ByteSpan> align_;  // one per byte of text_
  ByteSpan original_;
};

// Matches of a char predicate (HF's Pattern for Fn(char) -> bool).
template <class Pred>
std::vector<MatchRange> match_chars(std::string_view s, Pred pred) {
  std::vector<MatchRange> out;
  if (s.empty()) {
    out.push_back({0, 0, false});
    return out;
  }
  uint32_t last = 0;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    char32_t c = utf8_next(s, i);
    if (pred(c)) {
      if (last < b) out.push_back({last, static_cast<uint32_t>(b), false});
      out.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(i), true});
      last = static_cast<uint32_t>(i);
    }
  }
  if (last < s.size()) out.push_back({last, static_cast<uint32_t>(s.size()), false});
  return out;
}

// Matches of a literal string, leftmost, non-overlapping (HF compiles it as an escaped regex).
std::vector<MatchRange> match_literal(std::string_view s, std::string_view needle);

void invert_matches(std::vector<MatchRange>& matches);

}  // namespace deg::text
