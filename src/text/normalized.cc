// NormalizedText: see normalized.h. Each edit mirrors the HF NormalizedString method of the
// same name; comments note where HF's behaviour is surprising but kept on purpose.
#include "text/normalized.h"

#include <algorithm>

#include "text/byte_level.h"

namespace deg::text {

NormalizedText::NormalizedText(std::string_view original) : text_(original) {
  align_.resize(text_.size());
  for (size_t i = 0; i < text_.size();) {
    size_t n = utf8_seq_len(static_cast<unsigned char>(text_[i]));
    n = std::min(n, text_.size() - i);
    ByteSpan span{static_cast<uint32_t>(i), static_cast<uint32_t>(i + n)};
    for (size_t k = 0; k < n; ++k) align_[i + k] = span;
    i += n;
  }
  original_ = {0, static_cast<uint32_t>(text_.size())};
}

ByteSpan NormalizedText::to_original(size_t start, size_t end) const {
  if (start >= end || end > align_.size()) {
    // HF returns the (normalized) range itself, relative to the piece.
    return {original_.start + static_cast<uint32_t>(start),
            original_.start + static_cast<uint32_t>(end)};
  }
  return {align_[start].start, align_[end - 1].end};
}

NormalizedText NormalizedText::slice(size_t start, size_t end) const {
  NormalizedText out;
  out.text_ = text_.substr(start, end - start);
  out.align_.assign(align_.begin() + static_cast<ptrdiff_t>(start),
                    align_.begin() + static_cast<ptrdiff_t>(end));
  out.original_ = to_original(start, end);
  return out;
}

void NormalizedText::transform(const std::vector<CharChange>& dest, size_t initial_offset) {
  // Byte offset of each input char, to consume them as the changes say.
  size_t offset = 0;  // bytes of text_ consumed so far
  auto consume_char = [&] {
    if (offset < text_.size()) {
      offset +=
          std::min(utf8_seq_len(static_cast<unsigned char>(text_[offset])), text_.size() - offset);
    }
  };
  for (size_t k = 0; k < initial_offset; ++k) consume_char();

  const ByteSpan piece_start{original_.start, original_.start};
  auto align_at = [&](size_t idx) {
    // HF indexes out of bounds (and panics) on inconsistent change lists; we clamp.
    if (align_.empty()) return piece_start;
    return align_[std::min(idx, align_.size() - 1)];
  };

  std::string text;
  std::vector<ByteSpan> align;
  text.reserve(text_.size() + dest.size());
  align.reserve(text_.size() + dest.size());
  for (const CharChange& d : dest) {
    ByteSpan a;
    if (d.change > 0) {
      a = offset < 1 ? piece_start : align_at(offset - 1);
    } else {
      a = align_at(offset);
      consume_char();
      for (int k = 0; k < -d.change; ++k) consume_char();
    }
    size_t before = text.size();
    utf8_append(text, d.c);
    align.insert(align.end(), text.size() - before, a);
  }
  text_ = std::move(text);
  align_ = std::move(align);
}

void NormalizedText::replace(const std::vector<MatchRange>& matches, std::string_view content) {
  bool any = false;
  for (const MatchRange& m : matches) any |= m.is_match;
  if (!any) return;
  std::string text;
  std::vector<ByteSpan> align;
  text.reserve(text_.size());
  align.reserve(text_.size());
  const ByteSpan piece_start{original_.start, original_.start};
  for (const MatchRange& m : matches) {
    if (!m.is_match) {
      text.append(text_, m.start, m.end - m.start);
      align.insert(align.end(), align_.begin() + m.start, align_.begin() + m.end);
      continue;
    }
    // Every inserted char takes the alignment of the last byte of the match.
    ByteSpan a = m.end < 1 ? piece_start : align_[m.end - 1];
    text.append(content);
    align.insert(align.end(), content.size(), a);
  }
  text_ = std::move(text);
  align_ = std::move(align);
}

void NormalizedText::prepend(std::string_view s) {
  if (text_.empty()) return;
  size_t first_len = std::min(utf8_seq_len(static_cast<unsigned char>(text_[0])), text_.size());
  // HF re-inserts the first char after `s`: everything new takes the first char's alignment;
  // with an empty `s` the first char becomes an insertion at the piece start.
  ByteSpan a = s.empty() ? ByteSpan{original_.start, original_.start} : align_[0];
  text_.insert(0, s);
  align_.insert(align_.begin(), s.size(), a);
  std::fill(align_.begin() + static_cast<ptrdiff_t>(s.size()),
            align_.begin() + static_cast<ptrdiff_t>(s.size() + first_len), a);
}

void NormalizedText::lowercase() {
  bool ascii = true;
  for (unsigned char b : text_) ascii &= b < 0x80;
  if (ascii) {  // one byte per char, change 0: alignments stay
    for (char& ch : text_) {
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
    }
    return;
  }
  std::vector<CharChange> dest;
  dest.reserve(text_.size());
  std::u32string lower;
  for (size_t i = 0; i < text_.size();) {
    char32_t c = utf8_next(text_, i);
    lower.clear();
    to_lowercase(c, lower);
    for (size_t k = 0; k < lower.size(); ++k) dest.push_back({lower[k], k > 0 ? 1 : 0});
  }
  transform(dest, 0);
}

void NormalizedText::normalize(NormForm form) {
  if (normalization_is_identity(text_, form)) return;
  std::vector<CharChange> dest;
  normalize_changes(utf8_to_u32(text_), form, dest);
  transform(dest, 0);
}

void NormalizedText::strip(bool left, bool right) {
  std::u32string chars = utf8_to_u32(text_);
  const size_t count = chars.size();
  size_t leading = 0, trailing = 0;
  if (left) {
    while (leading < count && is_whitespace(chars[leading])) ++leading;
  }
  if (right) {
    while (trailing < count && is_whitespace(chars[count - 1 - trailing])) ++trailing;
  }
  if (leading == 0 && trailing == 0) return;
  // HF compares a char index with a byte length here; kept as is (it only matters for
  // multi-byte text), with Rust's release-mode wrap-around meaning "never equal".
  const long long marked =
      static_cast<long long>(text_.size()) - static_cast<long long>(trailing) - 1;
  std::vector<CharChange> dest;
  for (size_t i = 0; i < count; ++i) {
    if (i < leading || i >= count - trailing) continue;
    if (static_cast<long long>(i) == marked) {
      dest.push_back({chars[i], -static_cast<int>(trailing)});
    } else {
      dest.push_back({chars[i], 0});
    }
  }
  transform(dest, leading);
}

void NormalizedText::filter_combining_marks() {
  std::vector<CharChange> dest;
  int removed = 0;
  size_t removed_start = 0;
  bool have_last = false;
  char32_t last = 0;
  for (size_t i = 0; i < text_.size();) {
    char32_t c = utf8_next(text_, i);
    if (!is_combining_mark(c)) {
      if (have_last) {
        dest.push_back({last, -removed});
      } else {
        removed_start = static_cast<size_t>(removed);
      }
      last = c;
      have_last = true;
      removed = 0;
    } else {
      ++removed;
    }
  }
  if (have_last) dest.push_back({last, -removed});
  transform(dest, removed_start);
}

void NormalizedText::to_byte_level() {
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  std::string text;
  std::vector<ByteSpan> align;
  text.reserve(text_.size() * 2);
  align.reserve(text_.size() * 2);
  for (size_t i = 0; i < text_.size(); ++i) {
    const std::string& s = alphabet.utf8_of_byte[static_cast<unsigned char>(text_[i])];
    text.append(s);
    // All bytes of a char share its alignment, so byte i's alignment is the char's.
    align.insert(align.end(), s.size(), align_[i]);
  }
  text_ = std::move(text);
  align_ = std::move(align);
}

std::vector<NormalizedText> NormalizedText::split(const std::vector<MatchRange>& matches,
                                                  SplitBehavior behavior) const {
  struct Part {
    uint32_t start, end;
    bool remove;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size());
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const MatchRange& m : matches) parts.push_back({m.start, m.end, false});
      break;
    case SplitBehavior::removed:
      for (const MatchRange& m : matches) parts.push_back({m.start, m.end, m.is_match});
      break;
    case SplitBehavior::contiguous: {
      bool previous = false;
      for (const MatchRange& m : matches) {
        if (m.is_match == previous && !parts.empty()) {
          parts.back().end = m.end;
        } else {
          parts.push_back({m.start, m.end, false});
        }
        previous = m.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_previous: {
      bool previous = false;
      for (const MatchRange& m : matches) {
        if (m.is_match && !previous && !parts.empty()) {
          parts.back().end = m.end;
        } else {
          parts.push_back({m.start, m.end, false});
        }
        previous = m.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous && !parts.empty()) {
          parts.back().start = it->start;
        } else {
          parts.push_back({it->start, it->end, false});
        }
        previous = it->is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
  }
  std::vector<NormalizedText> out;
  out.reserve(parts.size());
  for (const Part& p : parts) {
    if (!p.remove) out.push_back(slice(p.start, p.end));
  }
  return out;
}

std::vector<MatchRange> match_literal(std::string_view s, std::string_view needle) {
  std::vector<MatchRange> out;
  if (s.empty()) {
    out.push_back({0, 0, false});
    return out;
  }
  size_t prev = 0;
  if (!needle.empty()) {
    for (size_t pos = s.find(needle); pos != std::string_view::npos;
         pos = s.find(needle, pos + needle.size())) {
      if (prev != pos) out.push_back({uint32_t(prev), uint32_t(pos), false});
      out.push_back({uint32_t(pos), uint32_t(pos + needle.size()), true});
      prev = pos + needle.size();
    }
  }
  if (prev != s.size()) out.push_back({uint32_t(prev), uint32_t(s.size()), false});
  return out;
}

void invert_matches(std::vector<MatchRange>& matches) {
  for (MatchRange& m : matches) m.is_match = !m.is_match;
}

}  // namespace deg::text
