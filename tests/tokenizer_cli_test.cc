// `deg tokenize` / `deg detokenize` end to end: the CLI prints what the library computes.
#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace deg::testing {
namespace {

std::string encoding_line(const text::Encoding& enc) {
  Json j = {{"ids", enc.ids}, {"offsets", Json::array()}};
  for (const auto& [s, e] : enc.offsets) j["offsets"].push_back({s, e});
  return j.dump();
}

TEST(TokenizerCli, TokenizeMatchesLibrary) {
  const auto model = cached_tokenizer_path("qwen3");
  ASSERT_TRUE(std::filesystem::exists(model)) << "run scripts/fetch-test-data";
  const text::Tokenizer tok = text::Tokenizer::load(model);
  const std::string input = "Hello wörld 👋🏽\n<|im_start|>user\n";
  CommandResult r = run_deg({"tokenize", "--model", model.parent_path().string()}, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out), Json::parse(encoding_line(tok.encode(input))));

  r = run_deg({"tokenize", "--model", model.string(), "--jsonl"},
              "\"first text\"\n{\"text\": \"second\\ttext\"}\n\n\"\"\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = read_jsonl_lines_from(r.out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(Json::parse(lines[0]), Json::parse(encoding_line(tok.encode("first text"))));
  EXPECT_EQ(Json::parse(lines[1]), Json::parse(encoding_line(tok.encode("second\ttext"))));
  EXPECT_EQ(Json::parse(lines[2]), Json::parse(encoding_line(tok.encode(""))));
}

TEST(TokenizerCli, DetokenizeRoundTrips) {
  const auto model = cached_tokenizer_path("qwen3");  // of the five, the fastest to load
  ASSERT_TRUE(std::filesystem::exists(model)) << "run scripts/fetch-test-data";
  const text::Tokenizer tok = text::Tokenizer::load(model);
  const text::Encoding enc = tok.encode("<|im_start|>Grüße, 世界!\n\n");
  CommandResult r = run_deg({"detokenize", "--model", model.string()}, Json(enc.ids).dump() + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out).get<std::string>(), tok.decode(enc.ids, true));
  r = run_deg({"detokenize", "--model", model.string(), "--keep-special"},
              Json(enc.ids).dump() + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out).get<std::string>(), tok.decode(enc.ids, false));
}

TEST(TokenizerCli, BadInputGivesClearErrors) {
  TempDir dir;
  CommandResult r = run_deg({"tokenize", "--model", dir.path().string()}, "x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
  const auto model = cached_tokenizer_path("llama3");
  r = run_deg({"tokenize", "--model", model.string(), "--jsonl"}, "[1, 2]\n");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("line 1"), std::string::npos) << r.err;
  r = run_deg({"detokenize", "--model", model.string()}, "[1, \"x\"]\n");
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

}  // namespace
}  // namespace deg::testing
