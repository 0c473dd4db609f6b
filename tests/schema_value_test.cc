// Reading extracted texts as typed values: integer and number syntax, bounds, string lengths in
// code points, patterns (ECMAScript meaning of \d, unanchored search, backtracking limit) and
// formats.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "schema/value.h"

namespace deg::schema {
namespace {

ValueSpec spec_of(std::vector<ValueType> types) {
  return ValueSpec{.types = std::move(types)};
}

TEST(SchemaValue, Integers) {
  const ValueSpec s = spec_of({ValueType::integer});
  EXPECT_EQ(value_read(s, "42"), Json(42));
  EXPECT_EQ(value_read(s, "-7"), Json(-7));
  EXPECT_EQ(value_read(s, "+7"), Json(7));
  EXPECT_EQ(value_read(s, "1,250"), Json(1250));
  EXPECT_FALSE(value_read(s, "1,25"));
  EXPECT_FALSE(value_read(s, "12,5000"));
  EXPECT_FALSE(value_read(s, "4.5"));
  EXPECT_FALSE(value_read(s, "012"));
  EXPECT_FALSE(value_read(s, "12 pcs"));
  EXPECT_FALSE(value_read(s, ""));
  EXPECT_FALSE(value_read(s, "99999999999999999999"));  // beyond int64
}

TEST(SchemaValue, NumbersAndBounds) {
  ValueSpec s = spec_of({ValueType::number});
  EXPECT_EQ(value_read(s, "4.99"), Json(4.99));
  EXPECT_EQ(value_read(s, "3"), Json(3));
  EXPECT_EQ(value_read(s, "1e3"), Json(1000.0));
  EXPECT_EQ(value_read(s, "-1,234.5"), Json(-1234.5));
  EXPECT_FALSE(value_read(s, "4."));
  EXPECT_FALSE(value_read(s, ".5"));
  EXPECT_FALSE(value_read(s, "$4.99"));
  s.minimum = 0;
  s.exclusive_maximum = 10;
  EXPECT_TRUE(value_read(s, "0"));
  EXPECT_FALSE(value_read(s, "-0.5"));
  EXPECT_FALSE(value_read(s, "10"));
  EXPECT_TRUE(value_read(s, "9.99"));
  s.multiple_of = 0.5;
  EXPECT_TRUE(value_read(s, "2.5"));
  EXPECT_FALSE(value_read(s, "2.3"));
}

TEST(SchemaValue, TypesAreTriedInOrder) {
  const ValueSpec s = spec_of({ValueType::integer, ValueType::string});
  EXPECT_EQ(value_read(s, "12"), Json(12));
  EXPECT_EQ(value_read(s, "12a"), Json("12a"));
}

TEST(SchemaValue, StringLengthInCodePoints) {
  ValueSpec s = spec_of({ValueType::string});
  s.min_length = 2;
  s.max_length = 3;
  EXPECT_FALSE(value_read(s, "é"));
  EXPECT_TRUE(value_read(s, "éé"));      // 4 bytes, 2 code points
  EXPECT_TRUE(value_read(s, "日本語"));  // 9 bytes, 3 code points
  EXPECT_FALSE(value_read(s, "abcd"));
  EXPECT_FALSE(value_read(s, "\xff\xfe"));  // not UTF-8
}

// value_length_bounds: every text value_read accepts has a length (code points) within them —
// the shortest and longest valid texts of each bounded format, random texts over the formats'
// alphabets, and min/maxLength on top; numbers are unbounded.
TEST(SchemaValue, LengthBoundsHoldEveryReadableText) {
  auto within = [](LengthBounds b, const std::string& t) {
    const int64_t n = int64_t(utf8_to_code_points(t)->size());
    return n >= b.lo && (b.hi < 0 || n <= b.hi);
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> edges = {
      {"date", {"2024-02-29", "0000-01-01"}},
      {"time", {"00:00:00Z", "23:59:60.123456+23:59"}},
      {"date-time", {"2026-12-03T00:00:00z", "2026-12-03T10:20:30.5-05:00"}},
      {"ipv4", {"0.0.0.0", "255.255.255.255"}},
      {"ipv6", {"::", "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}},
      {"hostname",
       {"a", std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." +
                 std::string(61, 'd')}},
      {"email", {"a@b", "first.last@example.com"}},
      {"idn-email", {"é@b", "日本@例え.jp"}}};
  std::mt19937 rng(5);
  const std::string alphabet = "0123456789abcdefTZ:-.+@[]";
  for (const auto& [format, valid] : edges) {
    ValueSpec s = spec_of({ValueType::string});
    s.format = format;
    const LengthBounds b = value_length_bounds(s);
    EXPECT_EQ(b.lo, format_length_bounds(format).lo) << format;
    for (const std::string& t : valid) {
      ASSERT_TRUE(value_read(s, t)) << format << ": " << t;
      EXPECT_TRUE(within(b, t)) << format << ": " << t;
    }
    for (int i = 0; i < 20000; ++i) {
      std::string t;
      for (size_t n = rng() % 48; n > 0; --n) t += alphabet[rng() % alphabet.size()];
      if (value_read(s, t)) {
        EXPECT_TRUE(within(b, t)) << format << ": " << t;
      }
    }
  }
  ValueSpec date = spec_of({ValueType::string});
  date.format = "date";
  date.max_length = 8;  // nothing can be read
  EXPECT_EQ(value_length_bounds(date).hi, 8);
  EXPECT_LT(value_length_bounds(date).hi, value_length_bounds(date).lo);
  ValueSpec text = spec_of({ValueType::string});
  text.min_length = 2;
  EXPECT_EQ(value_length_bounds(text).lo, 2);
  EXPECT_EQ(value_length_bounds(text).hi, -1);
  ValueSpec either = spec_of({ValueType::string, ValueType::number});
  either.format = "date";
  EXPECT_EQ(value_length_bounds(either).lo, 0);  // "1e300" is a number
  EXPECT_EQ(value_length_bounds(either).hi, -1);
}

TEST(SchemaValue, Patterns) {
  ValueSpec s = spec_of({ValueType::string});
  s.pattern = Pattern::compile(R"(^[A-Z]{2}\d{4}$)");
  EXPECT_TRUE(value_read(s, "AB1234"));
  EXPECT_FALSE(value_read(s, "AB12345"));
  EXPECT_FALSE(value_read(s, "AB١٢٣٤"));  // Arabic-Indic digits are not \d in ECMAScript
  s.pattern = Pattern::compile("b+");     // unanchored: a search
  EXPECT_TRUE(value_read(s, "abba"));
  EXPECT_FALSE(value_read(s, "acca"));
  s.pattern = Pattern::compile("^x$");  // `$` only at the very end (no match before "\n")
  EXPECT_FALSE(value_read(s, "x\n"));
  // Catastrophic backtracking ends at the retry limit as "no match", not a hang.
  s.pattern = Pattern::compile("^(a+)+$");
  EXPECT_FALSE(value_read(s, std::string(40, 'a') + "!"));
  EXPECT_THROW(Pattern::compile("(unclosed"), Error);
}

TEST(SchemaValue, Formats) {
  struct Case {
    const char* format;
    const char* text;
    bool ok;
  };
  const Case cases[] = {
      {"date", "2024-02-29", true},
      {"date", "2023-02-29", false},
      {"date", "2024-13-01", false},
      {"date", "24-01-01", false},
      {"date-time", "2024-01-05T10:20:30Z", true},
      {"date-time", "2024-01-05t10:20:30.123+02:00", true},
      {"date-time", "2024-01-05 10:20:30Z", false},
      {"date-time", "2024-01-05T25:00:00Z", false},
      {"time", "23:59:60Z", true},
      {"time", "12:30", false},
      {"email", "joe.smith@example.com", true},
      {"email", "joe@localhost", true},
      {"email", "\"quoted name\"@example.org", true},
      {"email", "joe..smith@example.com", false},
      {"email", "joe@", false},
      {"email", "<joe@example.com>", false},
      {"idn-email", "jörg@bücher.de", true},
      {"hostname", "mail.example.com", true},
      {"hostname", "-bad.example.com", false},
      {"ipv4", "192.168.0.1", true},
      {"ipv4", "192.168.0.256", false},
      {"ipv4", "01.2.3.4", false},
      {"ipv6", "::1", true},
      {"ipv6", "2001:db8::g", false},
      {"uri", "https://example.com/a?b=c#d", true},
      {"uri", "mailto:joe@example.com", true},
      {"uri", "example.com/path", false},
      {"uri", "http://exa mple.com", false},
      {"uri", "http://x/%zz", false},
      {"uri-reference", "../a/b?c", true},
      {"iri", "http://bücher.de/", true},
      {"uuid", "123e4567-e89b-12d3-a456-426614174000", true},
      {"uuid", "123e4567e89b12d3a456426614174000", false},
      {"duration", "P3Y6M4DT12H30M5S", true},
      {"duration", "PT20M", true},
      {"duration", "P2W", true},
      {"duration", "P", false},
      {"duration", "PT", false},
      {"duration", "P1M2Y", false},
      {"json-pointer", "/a~1b/0", true},
      {"json-pointer", "a/b", false},
      {"regex", "^a+$", true},
      {"regex", "(", false},
      {"phone", "anything at all", true},  // unknown formats are annotations
  };
  for (const Case& c : cases) {
    EXPECT_EQ(format_check(c.format, c.text), c.ok) << c.format << " " << c.text;
  }
  EXPECT_TRUE(format_known("date-time"));
  EXPECT_FALSE(format_known("phone"));
}

}  // namespace
}  // namespace deg::schema
