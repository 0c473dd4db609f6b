// Unicode helpers over utf8proc; see unicode.h. The normalization stream reproduces the
// iterator contract of unicode-normalization-alignments 0.1.12 (used by HF tokenizers 0.23):
// decompose each char fully, stable-sort every run of non-starters by combining class, then
// recompose greedily with the same blocking rules and the same emission order.
#include "text/unicode.h"

#include <utf8proc.h>

#include <algorithm>

namespace deg::text {

namespace {

struct CodeRange {
  char32_t first;
  char32_t last;
};

#include "text/unicode_age.inc"

template <size_t N>
bool in_ranges(char32_t c, const CodeRange (&table)[N]) {
  const CodeRange* it = std::upper_bound(
      table, table + N, c, [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != table && c <= (it - 1)->last;
}

// Unassigned for the Unicode 9.0 normalization tables HF uses (see unicode_age.inc).
bool unknown_to_unicode9(char32_t c) {
  return c >= 0x7FD && in_ranges(c, kPost9Normalization);
}

const utf8proc_property_t* prop(char32_t c) {
  return utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
}

bool is_hangul(char32_t c) {
  return (c >= 0x1100 && c <= 0x11FF) || (c >= 0xAC00 && c <= 0xD7A3);
}

// The primary composite of (starter, c), or 0. utf8proc's composition step alone on a
// two-element buffer is exactly the pairwise table (Hangul included, exclusions honoured).
char32_t compose_pair(char32_t starter, char32_t c) {
  if (unknown_to_unicode9(starter) || unknown_to_unicode9(c)) return 0;
  utf8proc_int32_t buf[2] = {static_cast<utf8proc_int32_t>(starter),
                             static_cast<utf8proc_int32_t>(c)};
  utf8proc_ssize_t n = utf8proc_normalize_utf32(
      buf, 2, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
  if (n != 1 || unknown_to_unicode9(static_cast<char32_t>(buf[0]))) return 0;
  return static_cast<char32_t>(buf[0]);
}

struct Decomposed {
  char32_t c;
  int ccc;
  int change;
};

void decompose(const std::u32string& in, bool compat, std::vector<Decomposed>& out) {
  utf8proc_int32_t buf[32];
  const auto options =
      static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0));
  for (char32_t ch : in) {
    utf8proc_ssize_t n =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(ch), buf, 32, options, nullptr);
    if (n <= 0 || n > 32) {  // unassigned or invalid: kept as is
      buf[0] = static_cast<utf8proc_int32_t>(ch);
      n = 1;
    }
    for (utf8proc_ssize_t i = 0; i < n; ++i) {
      char32_t d = static_cast<char32_t>(buf[i]);
      out.push_back({d, combining_class(d), i == 0 ? 0 : 1});
    }
  }
  // Canonical ordering: each maximal run of non-starters, stably by class.
  size_t i = 0;
  while (i < out.size()) {
    if (out[i].ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && out[j].ccc != 0) ++j;
    std::stable_sort(out.begin() + i, out.begin() + j,
                     [](const Decomposed& a, const Decomposed& b) { return a.ccc < b.ccc; });
    i = j;
  }
}

// The crate's Recompositions state machine, driven to completion.
void recompose(const std::vector<Decomposed>& in, std::vector<CharChange>& out) {
  bool have_composee = false;
  CharChange composee{0, 0};
  int last_ccc = -1;  // -1: none
  std::vector<CharChange> buffer;
  auto flush_buffer = [&] {
    out.insert(out.end(), buffer.begin(), buffer.end());
    buffer.clear();
  };
  for (const Decomposed& d : in) {
    const CharChange ch{d.c, d.change};
    if (!have_composee) {
      if (d.ccc != 0) {
        out.push_back(ch);
        continue;
      }
      composee = ch;
      have_composee = true;
      continue;
    }
    if (last_ccc < 0) {
      if (char32_t r = compose_pair(composee.c, ch.c)) {
        composee = {r, composee.change + ch.change - 1};
        continue;
      }
      if (d.ccc == 0) {
        out.push_back(composee);
        composee = ch;
        continue;
      }
      buffer.push_back(ch);
      last_ccc = d.ccc;
      continue;
    }
    if (last_ccc >= d.ccc) {  // blocked from the composee
      if (d.ccc == 0) {
        out.push_back(composee);
        flush_buffer();
        composee = ch;
        last_ccc = -1;
        continue;
      }
      buffer.push_back(ch);
      last_ccc = d.ccc;
      continue;
    }
    if (char32_t r = compose_pair(composee.c, ch.c)) {
      composee = {r, composee.change + ch.change - 1};
      continue;
    }
    buffer.push_back(ch);
    last_ccc = d.ccc;
  }
  if (have_composee) out.push_back(composee);
  flush_buffer();
}

}  // namespace

// ---- UTF-8 ---------------------------------------------------------------------------------

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t n = utf8_seq_len(b0);
  char32_t c = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) {
    c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  i += n;
  return c;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

size_t utf8_len(char32_t c) {
  return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

std::u32string utf8_to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(utf8_next(s, i));
  return out;
}

size_t utf8_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char b : s) n += (b & 0xC0) != 0x80;
  return n;
}

namespace {

// Bytes of a valid sequence starting at s[i], or 0 when the bytes there are invalid; in that
// case *bad gets the length of the maximal invalid subpart (at least 1).
size_t valid_seq_at(std::string_view s, size_t i, size_t* bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      *bad = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *bad = k;
      return 0;
    }
  }
  return need;
}

}  // namespace

size_t utf8_valid_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t bad = 0;
    size_t n = valid_seq_at(s, i, &bad);
    if (n == 0) return i;
    i += n;
  }
  return s.size();
}

std::string utf8_repair(std::string_view bytes, std::vector<uint32_t>* source_offset) {
  std::string out;
  out.reserve(bytes.size() + 8);
  if (source_offset) source_offset->clear();
  size_t i = 0;
  while (i < bytes.size()) {
    size_t bad = 0;
    size_t n = valid_seq_at(bytes, i, &bad);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      if (source_offset) {
        for (size_t k = 0; k < n; ++k) source_offset->push_back(static_cast<uint32_t>(i + k));
      }
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      if (source_offset) {
        for (int k = 0; k < 3; ++k) source_offset->push_back(static_cast<uint32_t>(i));
      }
      i += bad;
    }
  }
  if (source_offset) source_offset->push_back(static_cast<uint32_t>(bytes.size()));
  return out;
}

// ---- character classes -------------------------------------------------------------------

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto cat = prop(c)->category;
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_alphanumeric(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  auto cat = prop(c)->category;
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  auto cat = prop(c)->category;
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO &&
         !in_ranges(c, kPost8Punctuation);
}

bool is_combining_mark(char32_t c) {
  if (unknown_to_unicode9(c)) return false;
  auto cat = prop(c)->category;
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  auto cat = prop(c)->category;
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NL) ||
         cat == UTF8PROC_CATEGORY_PC;
}

int combining_class(char32_t c) {
  if (c < 0x300 || unknown_to_unicode9(c)) return 0;
  return prop(c)->combining_class;
}

void to_lowercase(char32_t c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
  } else if (c == 0x130) {  // the one unconditional multi-char mapping of SpecialCasing.txt
    out.push_back(0x69);
    out.push_back(0x307);
  } else {
    out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
}

// ---- normalization -------------------------------------------------------------------------

void normalize_changes(const std::u32string& in, NormForm form, std::vector<CharChange>& out) {
  out.clear();
  std::vector<Decomposed> decomposed;
  decomposed.reserve(in.size() + 8);
  const bool compat = form == NormForm::nfkd || form == NormForm::nfkc;
  decompose(in, compat, decomposed);
  if (form == NormForm::nfd || form == NormForm::nfkd) {
    out.reserve(decomposed.size());
    for (const Decomposed& d : decomposed) out.push_back({d.c, d.change});
    return;
  }
  recompose(decomposed, out);
}

bool normalization_is_identity(std::string_view utf8, NormForm /*form*/) {
  // Conservative for every form: no char that decomposes (canonically or not), reorders,
  // or can be the second half of a composition.
  for (size_t i = 0; i < utf8.size();) {
    if (static_cast<unsigned char>(utf8[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t c = utf8_next(utf8, i);
    if (is_hangul(c)) return false;
    if (unknown_to_unicode9(c)) continue;
    const utf8proc_property_t* p = prop(c);
    if (p->combining_class != 0 || p->decomp_seqindex != UINT16_MAX) return false;
    if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;
  }
  return true;
}

}  // namespace deg::text
