// Reading extracted texts as typed values: integer and number syntax, bounds, string lengths in
// code points, patterns (ECMAScript meaning of \d, unanchored search, backtracking limit) and
// formats.
#include <gtest/gtest.h>

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
