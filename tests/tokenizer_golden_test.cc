// Golden tests: deg's tokenizer against HF `tokenizers` 0.23 (outputs made on the GPU machine
// by tools/reference/tokenizer_fixtures.py). For the five real tokenizer.json files and the
// variants, every corpus text must give exactly HF's ids and code-point offsets, and the
// decode cases HF's text.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "text/unicode.h"
#include "tokenizer_test_util.h"

namespace deg::testing {
namespace {

using text::Offsets;

std::string show(const std::string& s) {
  return Json(s.substr(0, 120)).dump(-1, ' ', true, Json::error_handler_t::replace);
}

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, MatchesHfIdsOffsetsAndDecode) {
  const std::string name = GetParam();
  const Json config = config_json(name);
  ASSERT_FALSE(config.is_null());
  const text::Tokenizer tok = text::Tokenizer::from_json(config, name);

  const Json meta = json_load(fixture_path("tokenizers/meta.json"));
  EXPECT_EQ(tok.vocab_size(), meta["configs"][name]["vocab_size"].get<int64_t>());

  const std::vector<std::string> texts = corpus_texts();
  const auto expected = read_jsonl_lines(fixture_path("tokenizers/expected_" + name + ".jsonl"));
  ASSERT_EQ(expected.size(), texts.size()) << "fixtures out of date: rerun the reference script";
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    const Json want = json_parse(expected[i], "expected line");
    const std::vector<int32_t> want_ids = want["ids"].get<std::vector<int32_t>>();
    const std::vector<Offsets> want_offsets = expand_offsets(want["offsets"]);
    const text::Encoding got = tok.encode(texts[i]);
    if (got.ids == want_ids && got.offsets == want_offsets) continue;
    ++failures;
    size_t k = 0;
    while (k < got.ids.size() && k < want_ids.size() && got.ids[k] == want_ids[k] &&
           got.offsets[k] == want_offsets[k]) {
      ++k;
    }
    ADD_FAILURE() << name << " text " << i << " " << show(texts[i])
                  << ": first difference at token " << k << " of " << want_ids.size()
                  << " (deg has " << got.ids.size() << ")"
                  << (k < want_ids.size()
                          ? fmt::format(", HF {} [{}, {}]", want_ids[k], want_offsets[k].first,
                                        want_offsets[k].second)
                          : std::string())
                  << (k < got.ids.size() ? fmt::format(", deg {} [{}, {}]", got.ids[k],
                                                       got.offsets[k].first, got.offsets[k].second)
                                         : std::string());
  }

  for (const std::string& line :
       read_jsonl_lines(fixture_path("tokenizers/decode_" + name + ".jsonl"))) {
    const Json d = json_parse(line, "decode line");
    const auto ids = d["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids, d["skip_special"].get<bool>()), d["text"].get<std::string>())
        << name << " decode of " << d["ids"].dump();
  }
}

// Byte offsets and code-point offsets describe the same spans, and an added token's string
// maps back to its id.
TEST_P(TokenizerGolden, ByteOffsetsAgreeWithCharOffsets) {
  const std::string name = GetParam();
  const Json config = config_json(name);
  ASSERT_FALSE(config.is_null());
  const text::Tokenizer tok = text::Tokenizer::from_json(config, name);
  for (const std::string& s : corpus_texts()) {
    const text::Encoding enc = tok.encode(s);
    ASSERT_EQ(enc.ids.size(), enc.offsets.size());
    ASSERT_EQ(enc.ids.size(), enc.byte_offsets.size());
    // Code-point index of every byte boundary.
    std::vector<int64_t> char_at(s.size() + 1, -1);
    int64_t ci = 0;
    for (size_t b = 0; b < s.size(); ++b) {
      if ((static_cast<unsigned char>(s[b]) & 0xC0) != 0x80) char_at[b] = ci++;
    }
    char_at[s.size()] = ci;
    for (size_t k = 0; k < enc.ids.size(); ++k) {
      const auto [bs, be] = enc.byte_offsets[k];
      ASSERT_TRUE(bs >= 0 && bs <= be && be <= int64_t(s.size())) << show(s);
      ASSERT_GE(char_at[size_t(bs)], 0) << "byte offset inside a character in " << show(s);
      ASSERT_GE(char_at[size_t(be)], 0) << "byte offset inside a character in " << show(s);
      EXPECT_EQ(enc.offsets[k], (Offsets{char_at[size_t(bs)], char_at[size_t(be)]}))
          << name << " token " << k << " of " << show(s);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, TokenizerGolden, ::testing::ValuesIn(config_names()),
                         [](const auto& info) { return info.param; });

// Every real tokenizer and variant on damaged and unusual input (the sanitizer pass fuzzes a
// subset: tokenizer_unit_test.cc).
TEST(TokenizerFuzz, EveryConfigNeverCrashes) {
  fuzz_tokenizers(config_names(), 150);
}

}  // namespace
}  // namespace deg::testing
