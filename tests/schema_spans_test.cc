// token_span and trim_span against the seed's own rules: tests/fixtures/schema/spans_cases.json
// holds the outputs of the seed's Python functions (seed_spans.py, the seed text with its
// indentation restored) on hand-picked and random inputs, so the C++ port is checked against
// Python's semantics rather than against expectations we wrote ourselves.
#include <gtest/gtest.h>

#include "io/json.h"
#include "schema/spans.h"
#include "test_util.h"

namespace deg::schema {
namespace {

const Json& cases() {
  static const Json j = json_load(testing::fixture_path("schema/spans_cases.json"));
  return j;
}

TEST(SchemaSpans, TrimSpanMatchesSeed) {
  int checked = 0;
  for (const Json& c : cases()["trim_span"]) {
    const std::u32string text = *utf8_to_code_points(c["text"].get<std::string>());
    const auto [start, end] = trim_span(text, c["start"].get<int64_t>(), c["end"].get<int64_t>());
    ASSERT_EQ(start, c["want"][0].get<int64_t>()) << c.dump();
    ASSERT_EQ(end, c["want"][1].get<int64_t>()) << c.dump();
    ++checked;
  }
  EXPECT_GT(checked, 4000);
}

TEST(SchemaSpans, TokenSpanMatchesSeed) {
  int found = 0, missing = 0;
  for (const Json& c : cases()["token_span"]) {
    std::vector<CharRange> ranges;
    for (const Json& o : c["offsets"]) ranges.push_back({o[0].get<int64_t>(), o[1].get<int64_t>()});
    const TokenOffsets offsets(std::move(ranges));
    const auto got = token_span(offsets, c["start"].get<int64_t>(), c["end"].get<int64_t>());
    if (c["want"].is_null()) {
      EXPECT_FALSE(got.has_value()) << c.dump();
      ++missing;
    } else {
      ASSERT_TRUE(got.has_value()) << c.dump();
      EXPECT_EQ(got->first, c["want"][0].get<int64_t>()) << c.dump();
      EXPECT_EQ(got->second, c["want"][1].get<int64_t>()) << c.dump();
      ++found;
    }
  }
  EXPECT_GT(found, 100);
  EXPECT_GT(missing, 10);
}

TEST(SchemaSpans, NonMonotoneOffsetsGiveTheSeedsSpans) {
  // Offsets that are not sorted take the linear scan; sorted ones bisect. Both must answer what
  // the seed's definition says for every span: the first token (in index order) ending after
  // `start`, the last starting before `end`.
  auto seed = [](const std::vector<CharRange>& o, int64_t start,
                 int64_t end) -> std::optional<std::pair<int64_t, int64_t>> {
    int64_t first = -1, last = -1;
    for (int64_t t = 0; t < int64_t(o.size()); ++t) {
      if (first < 0 && o[size_t(t)].end > start) first = t;
      if (o[size_t(t)].start < end) last = t;
    }
    if (first < 0 || last < 0) return std::nullopt;
    return std::pair{first, last};
  };
  const std::vector<CharRange> shuffled{{4, 6}, {0, 2}, {2, 4}, {8, 9}, {6, 8}};
  const std::vector<CharRange> sorted{{0, 2}, {2, 4}, {4, 6}, {6, 8}, {8, 9}};
  const TokenOffsets scan(shuffled), bisect(sorted);
  EXPECT_FALSE(scan.monotone());
  EXPECT_TRUE(bisect.monotone());
  int checked = 0;
  for (int64_t start = 0; start <= 10; ++start) {
    for (int64_t end = start; end <= 10; ++end) {
      EXPECT_EQ(token_span(scan, start, end), seed(shuffled, start, end)) << start << ".." << end;
      EXPECT_EQ(token_span(bisect, start, end), seed(sorted, start, end)) << start << ".." << end;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 66);
}

TEST(SchemaSpans, IsSpaceFollowsPython) {
  // Python: all of these are str.isspace(); the zero-width space and the letter are not.
  for (char32_t c :
       {U' ', U'\t', U'\n', U'\v', U'\f', U'\r', U'\x1c', U'\x1f', U'\x85', U'\xa0', U'\u1680',
        U'\u2000', U'\u200a', U'\u2028', U'\u2029', U'\u202f', U'\u205f', U'\u3000'}) {
    EXPECT_TRUE(is_space(c)) << uint32_t(c);
  }
  for (char32_t c : {U'a', U'\u200b', U'\ufeff', U'*', U'\0'})
    EXPECT_FALSE(is_space(c)) << uint32_t(c);
}

TEST(SchemaSpans, Utf8RoundTripAndRejection) {
  const std::string text = "caf\xc3\xa9 \xe2\x80\x9cq\xe2\x80\x9d \xf0\x9f\x98\x80";
  const auto cps = utf8_to_code_points(text);
  ASSERT_TRUE(cps.has_value());
  EXPECT_EQ(cps->size(), 10u);
  EXPECT_EQ(code_points_to_utf8(*cps), text);
  EXPECT_FALSE(utf8_to_code_points("\xff").has_value());
  EXPECT_FALSE(utf8_to_code_points("\xc3").has_value());
  EXPECT_FALSE(utf8_to_code_points("\xed\xa0\x80").has_value());  // an encoded surrogate
}

}  // namespace
}  // namespace deg::schema
