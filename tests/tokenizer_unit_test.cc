// Tokenizer properties that need no reference output: fuzzed input never crashes and keeps
// offsets in range, invalid UTF-8 reads as U+FFFD with byte offsets into the given bytes,
// concurrent and parallel encodes agree, and loading errors say what to do.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "core/error.h"
#include "text/unicode.h"
#include "tokenizer_test_util.h"

namespace deg::testing {
namespace {

// The sanitizer pass fuzzes the real tokenizers that load fastest under it and their variants
// (loading gemma3 takes 14 s there); the release pass fuzzes every one (tokenizer_golden_test).
TEST(TokenizerFuzz, RandomBytesAndUnicodeNeverCrash) {
  fuzz_tokenizers({"qwen3", "llama3", "qwen3_nfd_strip_digits", "llama3_nfkc_lower"}, 150);
}

TEST(TokenizerUtf8, InvalidBytesReadAsReplacementCharacter) {
  const text::Tokenizer tok = load_tokenizer("qwen3");
  // Maximal invalid subparts: \xE2\x82 (truncated), \xFF, \xC0, \xED\xA0 (a surrogate start).
  const std::string input =
      "ab\xE2\x82 c\xFF\xC0"
      "d \xED\xA0\x80x";
  std::vector<uint32_t> map;
  const std::string repaired = text::utf8_repair(input, &map);
  EXPECT_EQ(repaired, "ab\uFFFD c\uFFFD\uFFFDd \uFFFD\uFFFD\uFFFDx");
  const text::Encoding bad = tok.encode(input);
  const text::Encoding good = tok.encode(repaired);
  EXPECT_EQ(bad.ids, good.ids);
  EXPECT_EQ(bad.offsets, good.offsets);
  ASSERT_EQ(bad.byte_offsets.size(), good.byte_offsets.size());
  for (size_t k = 0; k < bad.byte_offsets.size(); ++k) {
    EXPECT_EQ(bad.byte_offsets[k].first, map[size_t(good.byte_offsets[k].first)]);
    EXPECT_EQ(bad.byte_offsets[k].second, map[size_t(good.byte_offsets[k].second)]);
  }
  EXPECT_EQ(bad.byte_offsets.back().second, int64_t(input.size()));
}

TEST(TokenizerUtf8, RepairMatchesUnicodeMaximalSubparts) {
  // Each row: input, number of U+FFFD it becomes (Unicode 15 §3.9, Table 3-8 practice).
  const std::vector<std::pair<std::string, int>> cases = {
      {"\x80", 1},     {"\xC2", 1},         {"\xE0\x80", 2},
      {"\xE0\xA0", 1}, {"\xF0\x90\x80", 1}, {"\xF4\x90\x80\x80", 4},
      {"\xF5", 1},     {"\xC0\xAF", 2},     {"\xED\xBF\xBF", 3}};
  for (const auto& [in, n] : cases) {
    std::string want;
    for (int i = 0; i < n; ++i) want += "\uFFFD";
    EXPECT_EQ(text::utf8_repair(in, nullptr), want) << Json(in.size()).dump();
  }
}

TEST(TokenizerThreads, ConcurrentAndParallelEncodesAgree) {
  const text::Tokenizer tok = load_tokenizer("llama3");
  std::string long_text;
  const std::vector<std::string> texts = corpus_texts();
  while (long_text.size() < (300u << 10)) {
    for (const std::string& t : texts) long_text += t + "\n";
  }
  const text::Encoding serial = tok.encode(long_text, {.parallel = false});
  const text::Encoding parallel = tok.encode(long_text);
  EXPECT_EQ(serial.ids, parallel.ids);
  EXPECT_EQ(serial.offsets, parallel.offsets);
  EXPECT_EQ(serial.byte_offsets, parallel.byte_offsets);

  std::vector<text::Encoding> want;
  for (const std::string& t : texts) want.push_back(tok.encode(t));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = w; i < texts.size(); i += 2) {
          mismatches[size_t(w)] += tok.encode(texts[i]).ids != want[i].ids;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TokenizerApi, TokenLookupsAgreeWithEncoding) {
  const text::Tokenizer tok = load_tokenizer("qwen3");
  for (const std::string s : {"<|im_start|>", "<|endoftext|>", "</think>"}) {
    const text::Encoding enc = tok.encode(s);
    ASSERT_EQ(enc.ids.size(), 1u) << s;
    EXPECT_EQ(tok.token_to_id(s), enc.ids[0]);
    EXPECT_EQ(tok.id_to_token(enc.ids[0]), s);
  }
  EXPECT_TRUE(tok.is_special(*tok.token_to_id("<|im_start|>")));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("</think>")));  // added, not special
  EXPECT_FALSE(tok.token_to_id("no such token at all").has_value());
  EXPECT_FALSE(tok.id_to_token(-1).has_value());
  EXPECT_FALSE(tok.id_to_token(int32_t(tok.vocab_size()) + 10).has_value());
  const text::Encoding hello = tok.encode("Hello world");
  EXPECT_EQ(tok.decode(hello.ids, true), "Hello world");
}

TEST(TokenizerLoad, FindsTokenizerJsonAndExplainsWhenMissing) {
  TempDir dir;
  const auto real = cached_tokenizer_path("llama3");
  ASSERT_TRUE(std::filesystem::exists(real));
  // A file, a snapshot directory, and a deg checkpoint naming its base.
  EXPECT_EQ(text::find_tokenizer_json(real), real);
  std::filesystem::create_directories(dir / "snap");
  std::filesystem::copy_file(real, dir / "snap/tokenizer.json");
  EXPECT_EQ(text::find_tokenizer_json(dir / "snap"), dir / "snap/tokenizer.json");
  std::filesystem::create_directories(dir / "ckpt");
  write_text(dir / "ckpt/deg.json", R"({"base": "../snap"})");
  EXPECT_EQ(std::filesystem::weakly_canonical(text::find_tokenizer_json(dir / "ckpt")),
            std::filesystem::weakly_canonical(dir / "snap/tokenizer.json"));

  auto expect_error = [](const std::filesystem::path& p, const std::string& needle) {
    try {
      text::Tokenizer::load(p);
      ADD_FAILURE() << "no error for " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::not_found);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::filesystem::create_directories(dir / "empty");
  expect_error(dir / "empty", "tokenizer.json not found");
  std::filesystem::create_directories(dir / "ckpt2");
  write_text(dir / "ckpt2/deg.json", R"({"base": "../nowhere"})");
  expect_error(dir / "ckpt2", "base");
  expect_error(dir / "does-not-exist", "no such file");
}

TEST(TokenizerLoad, RejectsUnsupportedAndBrokenConfigs) {
  auto kind_of = [](const Json& j) {
    try {
      text::Tokenizer::from_json(j, "test.json");
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::internal;
  };
  Json wordpiece = {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}};
  EXPECT_EQ(kind_of(wordpiece), ErrorKind::unsupported);
  Json bad_merge = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", {"a b"}}}}};
  EXPECT_EQ(kind_of(bad_merge), ErrorKind::format);  // "ab" is not in the vocab
  Json bad_regex = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", Json::array()}}},
                    {"pre_tokenizer",
                     {{"type", "Split"},
                      {"pattern", {{"Regex", "(unclosed"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}}}};
  EXPECT_EQ(kind_of(bad_regex), ErrorKind::format);
  Json unknown_normalizer = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", Json::array()}}},
      {"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", ""}}}};
  EXPECT_EQ(kind_of(unknown_normalizer), ErrorKind::unsupported);
}

// id_limit: one past the largest id, which counts the gaps vocab_size() does not (a model's
// vocabulary rows past it are never written by this tokenizer).
TEST(TokenizerApi, IdLimitCountsGapsInTheIds) {
  const text::Tokenizer qwen = load_tokenizer("qwen3");
  EXPECT_EQ(qwen.id_limit(), qwen.vocab_size());  // ids 0 .. 151,668 without gaps
  const Json gappy = {
      {"model",
       {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"c", 5}}}, {"merges", Json::array()}}},
      {"added_tokens", {{{"id", 3}, {"content", "<end>"}, {"special", true}}}}};
  const text::Tokenizer tok = text::Tokenizer::from_json(gappy, "gappy.json");
  EXPECT_EQ(tok.token_to_id("<end>"), 3);  // HF's rule: the next id after the vocabulary's count
  EXPECT_EQ(tok.vocab_size(), 4);
  EXPECT_EQ(tok.id_limit(), 6);  // "c"
}

}  // namespace
}  // namespace deg::testing
