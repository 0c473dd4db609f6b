// Turning logits into answers: softmax at a temperature, masked picks, the best valid span (type
// and format aware, null outcome, masked null), anchored items with min/max items.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/decode.h"
#include "schema/spans.h"

namespace deg::engine {
namespace {

ContextText context_of(const std::string& text) {
  // One token per word (and per run of spaces), as a tokenizer would split it.
  std::vector<schema::CharRange> ranges;
  int64_t i = 0, n = int64_t(text.size());
  while (i < n) {
    int64_t j = i;
    const bool space = text[size_t(i)] == ' ';
    while (j < n && (text[size_t(j)] == ' ') == space) ++j;
    ranges.push_back({i, j});
    i = j;
  }
  return {std::u32string(text.begin(), text.end()), schema::TokenOffsets(ranges)};
}

TEST(Decode, SoftmaxAndTemperature) {
  float l[3] = {1.0f, 2.0f, -INFINITY};
  auto p = softmax(l, 3, 1.0);
  EXPECT_NEAR(p[1], std::exp(1.0) / (1 + std::exp(1.0)), 1e-12);
  EXPECT_EQ(p[2], 0.0);
  auto hot = softmax(l, 3, 2.0);  // a higher temperature flattens
  EXPECT_LT(hot[1], p[1]);
  Pick best = pick_best(l, 3, 1.0, {true, false, true});
  EXPECT_EQ(best.index, 0);
  EXPECT_DOUBLE_EQ(best.probability, 1.0);
}

TEST(Decode, BestValidSpanAndNull) {
  // tokens: "Total"(0) " "(1) "due"(2) " "(3) "312.97"(4) " "(5) "EUR"(6)
  ContextText ctx = context_of("Total due 312.97 EUR");
  const int64_t T = ctx.offsets.size();
  ASSERT_EQ(T, 7);
  std::vector<float> start(size_t(T + 1), -5.0f), end(size_t(T + 1), -5.0f);
  start[0] = 3;  // "Total" scores best but is no number
  end[0] = 3;
  start[4] = 2;
  end[4] = 2;
  schema::ValueSpec number;
  number.types = {schema::ValueType::number};
  SpanAnswer a = decode_span(start.data(), end.data(), ctx, number, false, 1.0);
  ASSERT_TRUE(a.value);
  EXPECT_EQ(*a.value, 312.97);
  EXPECT_EQ(a.char_start, 10);
  EXPECT_EQ(a.char_end, 16);
  auto ps = softmax(start.data(), T + 1, 1.0), pe = softmax(end.data(), T + 1, 1.0);
  EXPECT_NEAR(a.confidence, ps[4] * pe[4], 1e-12);

  // The null outcome wins when it scores above every valid span...
  start[size_t(T)] = 3;
  end[size_t(T)] = 3;
  SpanAnswer n = decode_span(start.data(), end.data(), ctx, number, false, 1.0);
  EXPECT_FALSE(n.value);
  // ...unless it is masked (a required field).
  SpanAnswer m = decode_span(start.data(), end.data(), ctx, number, true, 1.0);
  ASSERT_TRUE(m.value);
  EXPECT_EQ(*m.value, 312.97);

  // A masked field finds a valid value beyond the first candidates.
  std::vector<float> flat(size_t(T + 1), 0.0f);
  flat[0] = 9;
  SpanAnswer far = decode_span(flat.data(), flat.data(), ctx, number, true, 1.0,
                               {.max_tokens = 8, .candidates = 1});
  ASSERT_TRUE(far.value);
  EXPECT_EQ(*far.value, 312.97);
}

// A masked field's search past its first candidates takes the spans in score order (ties: the
// earlier start, then the earlier end) until one reads as a value: against every span of the
// window sorted, over logits with many ties and a value only a few spans hold — an integer in a
// range (spans streamed in order) and a date (a bounded length: every span looked at).
TEST(Decode, DeepSearchTakesSpansInScoreOrder) {
  std::string text;
  std::mt19937 rng(7);
  for (int i = 0; i < 90; ++i) {
    const uint32_t r = rng() % 14;
    text += (r == 0   ? std::to_string(500 + rng() % 20)
             : r == 1 ? "2026-0" + std::to_string(1 + rng() % 9) + "-1" + std::to_string(rng() % 10)
                      : "w" + std::to_string(rng() % 50)) +
            " ";
  }
  const ContextText ctx = context_of(text);
  const int64_t T = ctx.offsets.size();
  schema::ValueSpec integer;  // an integer in [505, 507]: a handful of spans read as one
  integer.types = {schema::ValueType::integer};
  integer.minimum = 505;
  integer.maximum = 507;
  schema::ValueSpec date{.types = {schema::ValueType::string}, .format = "date"};
  for (int trial = 0; trial < 40; ++trial) {
    const schema::ValueSpec& spec = trial % 2 ? date : integer;
    std::vector<float> start(size_t(T + 1)), end(size_t(T + 1));
    for (int64_t t = 0; t <= T; ++t) {  // few distinct values: ties everywhere
      start[size_t(t)] = rng() % 9 == 0 ? -INFINITY : float(rng() % 4);
      end[size_t(t)] = float(rng() % 4) * 0.5f;
    }
    const int64_t max_tokens = 6;
    struct Span {
      float score;
      int64_t s, e;
    };
    std::vector<Span> all;
    for (int64_t s = 0; s < T; ++s)
      for (int64_t e = s; e < std::min(T, s + max_tokens); ++e)
        if (std::isfinite(start[size_t(s)]))
          all.push_back({start[size_t(s)] + end[size_t(e)], s, e});
    std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) {
      return a.score != b.score ? a.score > b.score : (a.s != b.s ? a.s < b.s : a.e < b.e);
    });
    std::optional<std::pair<int64_t, int64_t>> want;
    std::pair<int64_t, int64_t> want_tokens;
    for (const Span& c : all) {
      const auto& off = ctx.offsets.offsets();
      auto [ts, te] = schema::trim_span(ctx.text, off[size_t(c.s)].start, off[size_t(c.e)].end);
      if (te <= ts) continue;
      if (!schema::value_read(spec, utf8_of(ctx.text.substr(size_t(ts), size_t(te - ts)))))
        continue;
      want = {ts, te};
      want_tokens = {c.s, c.e};
      break;
    }
    const SpanAnswer got = decode_span(start.data(), end.data(), ctx, spec, true, 1.0,
                                       {.max_tokens = max_tokens, .candidates = 1 + trial % 3 * 8});
    ASSERT_EQ(got.value.has_value(), want.has_value()) << "trial " << trial;
    if (!want) continue;
    EXPECT_EQ(got.char_start, want->first) << "trial " << trial;
    EXPECT_EQ(got.char_end, want->second) << "trial " << trial;
    const auto ps = softmax(start.data(), T + 1, 1.0), pe = softmax(end.data(), T + 1, 1.0);
    EXPECT_EQ(got.confidence, ps[size_t(want_tokens.first)] * pe[size_t(want_tokens.second)])
        << "trial " << trial;
  }
}

TEST(Decode, AnchorsRespectRegionAndItemBounds) {
  std::vector<float> l = {5, -3, 4, -1, 0.5f, -2, 6, 1};
  auto items = decode_anchors(l.data(), 8, 1, 7, 0, std::nullopt);
  // Positive logits inside [1, 7): tokens 2, 4, 6.
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].anchor, 2);
  EXPECT_EQ(items[0].region_end, 4);
  EXPECT_EQ(items[2].anchor, 6);
  EXPECT_EQ(items[2].region_end, 7);
  EXPECT_NEAR(items[1].probability, 1 / (1 + std::exp(-0.5)), 1e-12);
  auto capped = decode_anchors(l.data(), 8, 1, 7, 0, 2);  // keep the two most probable, in order
  ASSERT_EQ(capped.size(), 2u);
  EXPECT_EQ(capped[0].anchor, 2);
  EXPECT_EQ(capped[1].anchor, 6);
  auto more = decode_anchors(l.data(), 8, 1, 7, 4, std::nullopt);  // adds the best negative
  ASSERT_EQ(more.size(), 4u);
  EXPECT_EQ(more[1].anchor, 3);
  EXPECT_TRUE(decode_anchors(l.data(), 8, 1, 2, 0, std::nullopt).empty());
}

TEST(Decode, Utf8Helpers) {
  EXPECT_EQ(utf8_of(U"a\u00e9\u4e2d\U0001F600"), "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
  EXPECT_EQ(utf8_prefix("a\xc3\xa9\xe4\xb8\xad", 2), "a\xc3\xa9");
  EXPECT_EQ(utf8_prefix("ab", 5), "ab");
}

}  // namespace
}  // namespace deg::engine
