// token_span and trim_span: ports of the seed's rules (see spans.h). The punctuation tables are
// the seed's `_OPEN`, `_CLOSE`, `_TRAIL`, `_LEAD` and `_QUOTES`.
#include "schema/spans.h"

#include <utf8proc.h>

#include <algorithm>

#include "core/error.h"

namespace deg::schema {

namespace {

// Opening bracket or quote -> its closing partner (`"` closes itself).
char32_t closer_of(char32_t c) {
  switch (c) {
    case U'(': return U')';
    case U'[': return U']';
    case U'{': return U'}';
    case U'<': return U'>';
    case U'"': return U'"';
    case U'\u201c': return U'\u201d';  // “ ”
    case U'\u2018': return U'\u2019';  // ‘ ’
    case U'\u00ab': return U'\u00bb';  // « »
    default: return 0;
  }
}

// Closing bracket or quote -> its opening partner.
char32_t opener_of(char32_t c) {
  switch (c) {
    case U')': return U'(';
    case U']': return U'[';
    case U'}': return U'{';
    case U'>': return U'<';
    case U'"': return U'"';
    case U'\u201d': return U'\u201c';
    case U'\u2019': return U'\u2018';
    case U'\u00bb': return U'\u00ab';
    default: return 0;
  }
}

// Trailing punctuation a token may carry after a value.
bool is_trail(char32_t c) {
  return c == U',' || c == U';' || c == U':' || c == U'\'' || c == U'"' || c == U'\u201d' ||
         c == U'\u2019' || c == U'\u00bb';
}

// Leading punctuation a token may carry before a value.
bool is_lead(char32_t c) {
  return c == U'>' || c == U'\'' || c == U'"' || c == U'\u201c' || c == U'\u2018' || c == U'\u00ab';
}

// Openers stripped together with a matching closer at the other end.
bool is_wrapping_quote(char32_t c) {
  return c == U'"' || c == U'\u201c' || c == U'\u2018' || c == U'\u00ab' || c == U'[' ||
         c == U'<' || c == U'{';
}

bool contains(std::u32string_view text, int64_t from, int64_t to, char32_t c) {
  for (int64_t i = from; i < to; ++i) {
    if (text[i] == c) return true;
  }
  return false;
}

// Length of the '*' run starting at `i` and walking by `step`, staying within [lo, hi).
int64_t star_run(std::u32string_view text, int64_t i, int64_t step, int64_t lo, int64_t hi) {
  int64_t n = 0;
  while (lo <= i && i < hi && text[i] == U'*') {
    ++n;
    i += step;
  }
  return n;
}

// Markdown `*`/`**` emphasis, stripped only as a symmetric wrapper: the same run of `*` opens and
// closes it, inside the span or (when the token span stopped short) right outside it.
std::optional<std::pair<int64_t, int64_t>> strip_emphasis(std::u32string_view text, int64_t start,
                                                          int64_t end) {
  const int64_t n = int64_t(text.size());
  const int64_t lead = star_run(text, start, 1, start, end);
  const int64_t trail = star_run(text, end - 1, -1, start, end);
  if (lead > 0 && lead == trail && lead < end - start - lead) {
    return std::pair{start + lead, end - lead};
  }
  if (lead > 0 && trail == 0 && star_run(text, end, 1, end, n) == lead && end - start > lead) {
    return std::pair{start + lead, end};
  }
  if (trail > 0 && lead == 0 && star_run(text, start - 1, -1, 0, start) == trail &&
      end - start > trail) {
    return std::pair{start, end - trail};
  }
  return std::nullopt;
}

}  // namespace

bool is_space(char32_t c) {
  if (c > 0x10FFFF) return false;
  const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(c));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

TokenOffsets::TokenOffsets(std::vector<CharRange> offsets) : offsets_(std::move(offsets)) {
  starts_.reserve(offsets_.size());
  ends_.reserve(offsets_.size());
  for (const CharRange& r : offsets_) {
    if (!starts_.empty() && (r.start < starts_.back() || r.end < ends_.back())) monotone_ = false;
    starts_.push_back(r.start);
    ends_.push_back(r.end);
  }
}

std::optional<std::pair<int64_t, int64_t>> token_span(const TokenOffsets& offsets, int64_t start,
                                                      int64_t end) {
  const int64_t n = offsets.size();
  int64_t first = n;
  int64_t last = -1;
  if (offsets.monotone()) {
    first =
        std::upper_bound(offsets.ends_.begin(), offsets.ends_.end(), start) - offsets.ends_.begin();
    last = (std::lower_bound(offsets.starts_.begin(), offsets.starts_.end(), end) -
            offsets.starts_.begin()) -
           1;
  } else {
    for (int64_t t = 0; t < n && first == n; ++t) {
      if (offsets.ends_[t] > start) first = t;
    }
    for (int64_t t = 0; t < n; ++t) {
      if (offsets.starts_[t] < end) last = t;
    }
  }
  if (first >= n || last < 0) return std::nullopt;
  return std::pair{first, last};
}

std::pair<int64_t, int64_t> trim_span(std::u32string_view text, int64_t start, int64_t end) {
  DEG_CHECK(0 <= start && start <= end && end <= int64_t(text.size()),
            "span [{}, {}) outside a text of {} code points", start, end, text.size());
  while (true) {
    while (start < end && is_space(text[start])) ++start;
    while (end > start && is_space(text[end - 1])) --end;
    if (end - start < 2) return {start, end};
    const char32_t a = text[start];
    const char32_t z = text[end - 1];
    std::optional<std::pair<int64_t, int64_t>> emphasis;
    if (a == U'*' || z == U'*') emphasis = strip_emphasis(text, start, end);
    if (emphasis) {
      std::tie(start, end) = *emphasis;
    } else if (is_wrapping_quote(a) && z == closer_of(a)) {
      ++start;
      --end;
    } else if (closer_of(a) != 0 && !contains(text, start + 1, end, closer_of(a))) {
      ++start;
    } else if (is_lead(a) && closer_of(a) == 0) {
      ++start;
    } else if (opener_of(z) != 0 && !contains(text, start, end - 1, opener_of(z))) {
      --end;
    } else if (is_trail(z) &&
               !(opener_of(z) != 0 && contains(text, start, end - 1, opener_of(z)))) {
      --end;
    } else {
      return {start, end};
    }
  }
}

std::optional<std::u32string> utf8_to_code_points(std::string_view utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(utf8.data());
  utf8proc_ssize_t left = utf8proc_ssize_t(utf8.size());
  while (left > 0) {
    utf8proc_int32_t c = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &c);
    if (n <= 0) return std::nullopt;
    out.push_back(char32_t(c));
    p += n;
    left -= n;
  }
  return out;
}

std::string code_points_to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  utf8proc_uint8_t buf[4];
  for (char32_t c : text) {
    const utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_int32_t(c), buf);
    out.append(reinterpret_cast<const char*>(buf), size_t(n));
  }
  return out;
}

}  // namespace deg::schema
