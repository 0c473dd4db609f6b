// JSON Schema `format` checks (value.h: format_check) for the formats an extracted text can be
// held to. Each follows its RFC's grammar closely enough to reject text that is not the thing
// (a date with month 13, an e-mail without a domain), without network or locale lookups.
#include <arpa/inet.h>

#include <array>
#include <cctype>
#include <string>

#include "schema/spans.h"
#include "schema/value.h"

namespace deg::schema {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// `n` digits at text[i..]; advances i.
bool digits(std::string_view text, size_t& i, size_t n, int& value) {
  value = 0;
  for (size_t k = 0; k < n; ++k, ++i) {
    if (i >= text.size() || !is_digit(text[i])) return false;
    value = value * 10 + (text[i] - '0');
  }
  return true;
}

bool literal(std::string_view text, size_t& i, char c) {
  if (i < text.size() && text[i] == c) {
    ++i;
    return true;
  }
  return false;
}

bool literal_ci(std::string_view text, size_t& i, char c) {
  if (i < text.size() && std::tolower(static_cast<unsigned char>(text[i])) == c) {
    ++i;
    return true;
  }
  return false;
}

// RFC 3339 full-date at text[i..].
bool full_date(std::string_view text, size_t& i) {
  int y = 0, m = 0, d = 0;
  if (!digits(text, i, 4, y) || !literal(text, i, '-') || !digits(text, i, 2, m) ||
      !literal(text, i, '-') || !digits(text, i, 2, d)) {
    return false;
  }
  static constexpr std::array<int, 12> kDays = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (m < 1 || m > 12 || d < 1 || d > kDays[m - 1]) return false;
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return !(m == 2 && d == 29 && !leap);
}

// RFC 3339 full-time (partial-time, then Z or +hh:mm) at text[i..]; a leap second is allowed.
bool full_time(std::string_view text, size_t& i) {
  int h = 0, m = 0, s = 0;
  if (!digits(text, i, 2, h) || !literal(text, i, ':') || !digits(text, i, 2, m) ||
      !literal(text, i, ':') || !digits(text, i, 2, s)) {
    return false;
  }
  if (h > 23 || m > 59 || s > 60) return false;
  if (literal(text, i, '.')) {
    const size_t start = i;
    while (i < text.size() && is_digit(text[i])) ++i;
    if (i == start) return false;
  }
  if (literal_ci(text, i, 'z')) return true;
  if (!literal(text, i, '+') && !literal(text, i, '-')) return false;
  int oh = 0, om = 0;
  return digits(text, i, 2, oh) && literal(text, i, ':') && digits(text, i, 2, om) && oh <= 23 &&
         om <= 59;
}

bool is_date(std::string_view t) {
  size_t i = 0;
  return full_date(t, i) && i == t.size();
}

bool is_time(std::string_view t) {
  size_t i = 0;
  return full_time(t, i) && i == t.size();
}

bool is_date_time(std::string_view t) {
  size_t i = 0;
  return full_date(t, i) && literal_ci(t, i, 't') && full_time(t, i) && i == t.size();
}

bool is_hostname(std::string_view t) {
  if (t.empty() || t.size() > 253) return false;
  size_t label = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '.') {
      if (label == 0 || t[i - 1] == '-') return false;
      label = 0;
    } else if (is_alpha(c) || is_digit(c) || (c == '-' && label > 0)) {
      if (++label > 63) return false;
    } else {
      return false;
    }
  }
  return label > 0 && t.back() != '-';
}

bool is_ipv4(std::string_view t) {
  size_t i = 0;
  for (int part = 0; part < 4; ++part) {
    if (part > 0 && !literal(t, i, '.')) return false;
    const size_t start = i;
    int value = 0;
    while (i < t.size() && is_digit(t[i]) && i - start < 3) value = value * 10 + (t[i++] - '0');
    if (i == start || value > 255 || (t[start] == '0' && i - start > 1)) return false;
  }
  return i == t.size();
}

bool is_ipv6(std::string_view t) {
  if (t.size() > 45) return false;
  unsigned char buf[16];
  return inet_pton(AF_INET6, std::string(t).c_str(), buf) == 1;
}

// RFC 5321/5322 in its common form: dot-atom local part (or a quoted string) @ a hostname or an
// address literal. `international` lets non-ASCII through (idn-email).
bool is_email(std::string_view t, bool international) {
  const size_t at = t.rfind('@');
  if (at == std::string_view::npos || at == 0 || at + 1 == t.size()) return false;
  const std::string_view local = t.substr(0, at);
  const std::string_view domain = t.substr(at + 1);
  if (local.size() >= 2 && local.front() == '"' && local.back() == '"') {
    for (char c : local.substr(1, local.size() - 2)) {
      if (c == '"' || static_cast<unsigned char>(c) < 0x20) return false;
    }
  } else {
    static constexpr std::string_view kAtext = "!#$%&'*+-/=?^_`{|}~";
    if (local.front() == '.' || local.back() == '.') return false;
    for (size_t i = 0; i < local.size(); ++i) {
      const char c = local[i];
      const bool ok = is_alpha(c) || is_digit(c) || kAtext.find(c) != std::string_view::npos ||
                      (c == '.' && local[i - 1] != '.') ||
                      (international && static_cast<unsigned char>(c) >= 0x80);
      if (!ok) return false;
    }
  }
  if (domain.size() >= 2 && domain.front() == '[' && domain.back() == ']') {
    const std::string_view inner = domain.substr(1, domain.size() - 2);
    if (inner.starts_with("IPv6:")) return is_ipv6(inner.substr(5));
    return is_ipv4(inner);
  }
  if (!international) return is_hostname(domain);
  for (char c : domain) {
    if (c == ' ' || c == '@' || static_cast<unsigned char>(c) < 0x20) return false;
  }
  return domain.front() != '.' && domain.back() != '.';
}

// RFC 3986 characters a URI may hold outside percent-escapes (IRIs add non-ASCII).
bool uri_char(char c, bool iri) {
  static constexpr std::string_view kAllowed = "-._~:/?#[]@!$&'()*+,;=";
  return is_alpha(c) || is_digit(c) || kAllowed.find(c) != std::string_view::npos ||
         (iri && static_cast<unsigned char>(c) >= 0x80);
}

bool uri_chars(std::string_view t, bool iri) {
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '%') {
      if (i + 2 >= t.size() || !is_hex(t[i + 1]) || !is_hex(t[i + 2])) return false;
      i += 2;
    } else if (!uri_char(t[i], iri)) {
      return false;
    }
  }
  return true;
}

// An absolute URI: scheme ":" then the rest, all in the URI character set.
bool is_uri(std::string_view t, bool iri) {
  const size_t colon = t.find(':');
  if (colon == std::string_view::npos || colon == 0 || !is_alpha(t[0])) return false;
  for (size_t i = 1; i < colon; ++i) {
    const char c = t[i];
    if (!is_alpha(c) && !is_digit(c) && c != '+' && c != '-' && c != '.') return false;
  }
  return uri_chars(t, iri);
}

bool is_uuid(std::string_view t) {
  if (t.size() != 36) return false;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? t[i] != '-' : !is_hex(t[i])) return false;
  }
  return true;
}

// ISO 8601 duration as RFC 3339 appendix A writes it: P[nY][nM][nD][T[nH][nM][nS]] or PnW.
bool is_duration(std::string_view t) {
  size_t i = 0;
  if (!literal(t, i, 'P') || i == t.size()) return false;
  auto number_then = [&](std::string_view units, size_t& unit_at) {
    const size_t start = i;
    while (i < t.size() && is_digit(t[i])) ++i;
    if (i == start || i == t.size()) return false;
    const size_t u = units.find(t[i]);
    if (u == std::string_view::npos || u < unit_at) return false;
    unit_at = u + 1;
    ++i;
    return true;
  };
  size_t unit = 0;
  bool any = false;
  while (i < t.size() && t[i] != 'T') {
    if (!number_then("YMDW", unit)) return false;
    any = true;
  }
  if (literal(t, i, 'T')) {
    if (i == t.size()) return false;
    unit = 0;
    while (i < t.size()) {
      if (!number_then("HMS", unit)) return false;
    }
    any = true;
  }
  const bool weeks = t.find('W') != std::string_view::npos;
  return any && (!weeks || (t.size() >= 3 && t.back() == 'W' &&
                            t.find_first_of("YMDT") == std::string_view::npos));
}

bool is_json_pointer(std::string_view t) {
  if (t.empty()) return true;
  if (t[0] != '/') return false;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '~' && (i + 1 >= t.size() || (t[i + 1] != '0' && t[i + 1] != '1'))) return false;
  }
  return true;
}

bool is_regex(std::string_view t) {
  try {
    Pattern::compile(t);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

LengthBounds format_length_bounds(std::string_view f) {
  if (f == "date") return {10, 10};       // YYYY-MM-DD
  if (f == "time") return {9, -1};        // hh:mm:ssZ, then fractions and offsets
  if (f == "date-time") return {20, -1};  // YYYY-MM-DDThh:mm:ssZ, ...
  if (f == "ipv4") return {7, 15};        // 0.0.0.0 .. 255.255.255.255
  if (f == "ipv6") return {2, 45};        // :: .. is_ipv6's limit
  if (f == "uuid") return {36, 36};
  if (f == "hostname") return {1, 253};
  if (f == "email" || f == "idn-email") return {3, -1};  // a@b
  return {};
}

bool format_known(std::string_view f) {
  static constexpr std::array<std::string_view, 16> kKnown = {
      "date", "date-time", "time",         "email", "idn-email",     "hostname",
      "ipv4", "ipv6",      "uri",          "iri",   "uri-reference", "iri-reference",
      "uuid", "duration",  "json-pointer", "regex"};
  for (std::string_view k : kKnown) {
    if (k == f) return true;
  }
  return false;
}

bool format_check(std::string_view f, std::string_view t) {
  if (f == "date") return is_date(t);
  if (f == "date-time") return is_date_time(t);
  if (f == "time") return is_time(t);
  if (f == "email") return is_email(t, false);
  if (f == "idn-email") return is_email(t, true);
  if (f == "hostname") return is_hostname(t);
  if (f == "ipv4") return is_ipv4(t);
  if (f == "ipv6") return is_ipv6(t);
  if (f == "uri") return is_uri(t, false);
  if (f == "iri") return is_uri(t, true);
  if (f == "uri-reference") return uri_chars(t, false);
  if (f == "iri-reference") return uri_chars(t, true);
  if (f == "uuid") return is_uuid(t);
  if (f == "duration") return is_duration(t);
  if (f == "json-pointer") return is_json_pointer(t);
  if (f == "regex") return is_regex(t);
  return true;
}

}  // namespace deg::schema
