// Reading extracted texts as typed values (value.h): numbers, integers, strings with length,
// pattern and format checks. Patterns run on Oniguruma, the regex engine libdeg already links
// for the tokenizers.
#include "schema/value.h"

#include <oniguruma.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <mutex>

#include "core/error.h"
#include "schema/spans.h"

namespace deg::schema {

namespace {

// Backtracking steps one pattern search may take before it counts as no match.
constexpr unsigned long kRetryLimit = 200'000;

void onig_setup() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// "+1,250.50" -> "1250.50" when the text is a JSON number apart from a leading '+' and comma
// thousands groups; nullopt otherwise.
std::optional<std::string> number_syntax(std::string_view text) {
  std::string s;
  size_t i = 0;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) {
    if (text[i] == '-') s += '-';
    ++i;
  }
  const size_t int_start = i;
  size_t group = 0;  // digits since the last comma
  bool grouped = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == ',')) {
    if (text[i] == ',') {
      if (i == int_start || (grouped && group != 3) || (!grouped && group > 3)) return std::nullopt;
      grouped = true;
      group = 0;
    } else {
      s += text[i];
      ++group;
    }
    ++i;
  }
  if (s.empty() || s == "-" || (grouped && group != 3)) return std::nullopt;
  const size_t digits_at = s[0] == '-' ? 1 : 0;
  if (s.size() - digits_at > 1 && s[digits_at] == '0') return std::nullopt;  // JSON: no "012"
  if (i < text.size() && text[i] == '.') {
    s += '.';
    ++i;
    const size_t frac = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) s += text[i++];
    if (i == frac) return std::nullopt;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    s += 'e';
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) s += text[i++];
    const size_t exp = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) s += text[i++];
    if (i == exp) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  return s;
}

bool numeric_bounds_hold(const ValueSpec& spec, double x) {
  if (spec.minimum && x < *spec.minimum) return false;
  if (spec.maximum && x > *spec.maximum) return false;
  if (spec.exclusive_minimum && x <= *spec.exclusive_minimum) return false;
  if (spec.exclusive_maximum && x >= *spec.exclusive_maximum) return false;
  if (spec.multiple_of && *spec.multiple_of > 0) {
    const double q = x / *spec.multiple_of;
    if (std::abs(q - std::round(q)) > 1e-9 * std::max(1.0, std::abs(q))) return false;
  }
  return true;
}

std::optional<Json> read_integer(const ValueSpec& spec, std::string_view text) {
  const auto s = number_syntax(text);
  if (!s || s->find_first_of(".e") != std::string::npos) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (ec != std::errc() || end != s->data() + s->size()) return std::nullopt;  // out of range
  if (!numeric_bounds_hold(spec, double(v))) return std::nullopt;
  return Json(v);
}

std::optional<Json> read_number(const ValueSpec& spec, std::string_view text) {
  const auto s = number_syntax(text);
  if (!s) return std::nullopt;
  if (s->find_first_of(".e") == std::string::npos) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
    if (ec == std::errc() && end == s->data() + s->size()) {
      if (!numeric_bounds_hold(spec, double(v))) return std::nullopt;
      return Json(v);
    }
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (ec != std::errc() || end != s->data() + s->size() || !std::isfinite(v)) return std::nullopt;
  if (!numeric_bounds_hold(spec, v)) return std::nullopt;
  return Json(v);
}

std::optional<Json> read_string(const ValueSpec& spec, std::string_view text) {
  const auto code_points = utf8_to_code_points(text);
  if (!code_points) return std::nullopt;
  const auto length = int64_t(code_points->size());
  if (spec.min_length && length < *spec.min_length) return std::nullopt;
  if (spec.max_length && length > *spec.max_length) return std::nullopt;
  if (spec.pattern && !spec.pattern->search(text)) return std::nullopt;
  if (!spec.format.empty() && !format_check(spec.format, text)) return std::nullopt;
  return Json(std::string(text));
}

// ECMAScript's `$` (without the m flag) matches only at the very end; Oniguruma's Perl `$` also
// matches before a final newline. Rewrites `$` outside character classes to `\z`.
std::string ecma_anchors(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out += c;
      out += pattern[++i];
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out += (c == '$' && !in_class) ? std::string("\\z") : std::string(1, c);
  }
  return out;
}

}  // namespace

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::integer: return "integer";
    case ValueType::number: return "number";
    case ValueType::string: return "string";
  }
  return "?";
}

std::shared_ptr<const Pattern> Pattern::compile(std::string_view source) {
  onig_setup();
  OnigRegex regex = nullptr;
  OnigErrorInfo info{};
  const std::string onig_source = ecma_anchors(source);
  const auto* p = reinterpret_cast<const OnigUChar*>(onig_source.data());
  // Searches may run on several threads at once (a fill's span searches); Oniguruma does not
  // say onig_new may, so compiles take turns (a "regex" format compiles each span it checks).
  static std::mutex compiling;
  std::unique_lock<std::mutex> turn(compiling);
  const int rc =
      onig_new(&regex, p, p + onig_source.size(),
               ONIG_OPTION_DIGIT_IS_ASCII | ONIG_OPTION_WORD_IS_ASCII | ONIG_OPTION_POSIX_IS_ASCII,
               ONIG_ENCODING_UTF8, ONIG_SYNTAX_PERL_NG, &info);
  turn.unlock();
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    throw Error(
        ErrorKind::unsupported,
        fmt::format("pattern {} does not compile as a regular expression ({}); fix the "
                    "pattern or remove it",
                    Json(std::string(source)).dump(), reinterpret_cast<const char*>(message)));
  }
  return std::shared_ptr<const Pattern>(new Pattern(std::string(source), regex));
}

Pattern::~Pattern() {
  onig_free(static_cast<OnigRegex>(regex_));
}

bool Pattern::search(std::string_view utf8) const {
  auto* regex = static_cast<OnigRegex>(regex_);
  OnigMatchParam* param = onig_new_match_param();
  onig_initialize_match_param(param);
  onig_set_retry_limit_in_match_of_match_param(param, kRetryLimit);
  onig_set_retry_limit_in_search_of_match_param(param, kRetryLimit);
  const auto* p = reinterpret_cast<const OnigUChar*>(utf8.data());
  const auto* end = p + utf8.size();
  const int rc = onig_search_with_param(regex, p, end, p, end, nullptr, ONIG_OPTION_NONE, param);
  onig_free_match_param(param);
  return rc >= 0;  // ONIG_MISMATCH and the retry-limit errors both mean "no"
}

LengthBounds value_length_bounds(const ValueSpec& spec) {
  for (ValueType type : spec.types)
    if (type != ValueType::string) return {};  // a number's text has no fixed length
  LengthBounds b = spec.format.empty() ? LengthBounds{} : format_length_bounds(spec.format);
  if (spec.min_length) b.lo = std::max(b.lo, *spec.min_length);
  if (spec.max_length) b.hi = b.hi < 0 ? *spec.max_length : std::min(b.hi, *spec.max_length);
  return b;
}

std::optional<Json> value_read(const ValueSpec& spec, std::string_view text) {
  for (ValueType type : spec.types) {
    std::optional<Json> v;
    switch (type) {
      case ValueType::integer: v = read_integer(spec, text); break;
      case ValueType::number: v = read_number(spec, text); break;
      case ValueType::string: v = read_string(spec, text); break;
    }
    if (v) return v;
  }
  return std::nullopt;
}

}  // namespace deg::schema
