// BPE training (src/text/bpe_train.h, `deg tokenizer train`): merges worked out by hand on tiny
// texts, the incremental trainer against a naive one that recounts every pair before each
// merge, chunked parallel word counting against one regex pass over the whole text, vocabulary
// size, special tokens, determinism, encode -> decode round trips through the written
// tokenizer.json, the CLI's output and errors; and golden tests against HF `tokenizers`
// (fixtures from tools/reference/bpe_tokenizer_reference.py): HF's BpeTrainer with deg's
// settings writes the same tokenizer.json as deg's trainer, and HF encodes held-out text with it
// to the ids, offsets and decoded text deg gives.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "text/bpe_train.h"
#include "text/byte_level.h"
#include "text/pre_tokenizers.h"
#include "text/regex.h"
#include "text/unicode.h"
#include "tokenizer_test_util.h"

namespace deg::testing {
namespace {

namespace fs = std::filesystem;
using text::BpeTrainer;
using text::BpeTrainOptions;
using text::BpeVocabulary;

const std::string kG = "\xC4\xA0";  // Ġ, the byte-level character of ' '

BpeVocabulary train_on(const std::string& text, int64_t vocab, int64_t min_frequency = 1,
                       std::vector<std::string> specials = {"<|endoftext|>"}) {
  BpeTrainer t(
      {.vocab_size = vocab, .min_frequency = min_frequency, .special_tokens = std::move(specials)});
  t.add_text(text);
  return t.train();
}

// Merges as "left right" strings.
std::vector<std::string> merge_strings(const BpeVocabulary& v) {
  std::vector<std::string> out;
  for (const auto& [a, b] : v.merges)
    out.push_back(v.tokens[size_t(a)] + " " + v.tokens[size_t(b)]);
  return out;
}

TEST(TokenizerTrain, FirstMergesWorkedOutByHand) {
  // Words: "ab" once, " ab" twice, " abc" once. (a, b) occurs 4 times, (Ġ, a) 3, (b, c) once;
  // after merging ab: (Ġ, ab) 3, (ab, c) 1; min_frequency 2 stops there.
  const BpeVocabulary v = train_on("ab ab ab abc", 1000, 2);
  EXPECT_EQ(merge_strings(v), (std::vector<std::string>{"a b", kG + " ab"}));
  ASSERT_EQ(v.tokens.size(), 1u + 256u + 2u);
  EXPECT_EQ(v.tokens[257], "ab");
  EXPECT_EQ(v.tokens[258], kG + "ab");
  // min_frequency 1 also takes the pair seen once.
  EXPECT_EQ(merge_strings(train_on("ab ab ab abc", 1000, 1)),
            (std::vector<std::string>{"a b", kG + " ab", kG + "ab c"}));
}

TEST(TokenizerTrain, TiesGoToTheSmallestPairOfIds) {
  // Every pair occurs once. Ids: x 88, y 89 (printable ASCII from id 1), Ġ 221: (x, y) is the
  // smallest pair, then (y, x), then (Ġ, yx).
  EXPECT_EQ(merge_strings(train_on("xy yx", 1000)),
            (std::vector<std::string>{"x y", "y x", kG + " yx"}));
}

TEST(TokenizerTrain, RepeatedTokensMergeLeftToRight) {
  // "aaaa" -> aa aa, " aaa" -> Ġ aa a: (a, a) 5 times first; then three pairs once each,
  // the smallest first: (Ġ 221, aa 257), which turns (aa, a) into (Ġaa 258, a); then
  // (aa, aa) before (Ġaa, a).
  const BpeVocabulary v = train_on("aaaa aaa", 1000);
  EXPECT_EQ(merge_strings(v), (std::vector<std::string>{"a a", kG + " aa", "aa aa", kG + "aa a"}));
}

// ---- against the slow way ------------------------------------------------------------------

// The same rules, naively: every pair recounted before each merge, each word rewritten.
std::vector<std::string> naive_merges(const std::map<std::string, int64_t>& words,
                                      int64_t vocab_size, int64_t min_frequency,
                                      const std::vector<std::string>& specials) {
  std::vector<std::string> tokens = specials;
  std::map<std::string, int32_t> id_of;
  for (size_t i = 0; i < tokens.size(); ++i) id_of[tokens[i]] = int32_t(i);
  const auto& alphabet = text::byte_level_alphabet();
  std::vector<int32_t> byte_id(256);
  for (char32_t c = 0; c < 324; ++c) {
    const int b = alphabet.byte_of_char[c];
    if (b < 0) continue;
    byte_id[size_t(b)] = int32_t(tokens.size());
    id_of[alphabet.utf8_of_byte[size_t(b)]] = int32_t(tokens.size());
    tokens.push_back(alphabet.utf8_of_byte[size_t(b)]);
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> ws;
  for (const auto& [w, n] : words) {
    std::vector<int32_t> ids;
    for (unsigned char c : w) ids.push_back(byte_id[c]);
    ws.emplace_back(ids, n);
  }
  std::vector<std::string> merges;
  while (int64_t(tokens.size()) < vocab_size) {
    std::map<std::pair<int32_t, int32_t>, int64_t> counts;
    for (const auto& [ids, n] : ws)
      for (size_t i = 0; i + 1 < ids.size(); ++i) counts[{ids[i], ids[i + 1]}] += n;
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_n = 0;
    for (const auto& [p, n] : counts)  // ascending pairs: the first of the highest count wins
      if (n > best_n) best = p, best_n = n;
    if (best_n < min_frequency || best_n == 0) break;
    const std::string s = tokens[size_t(best.first)] + tokens[size_t(best.second)];
    merges.push_back(tokens[size_t(best.first)] + " " + tokens[size_t(best.second)]);
    if (!id_of.count(s)) {
      id_of[s] = int32_t(tokens.size());
      tokens.push_back(s);
    }
    for (auto& [ids, n] : ws) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
          out.push_back(id_of[s]);
          i += 2;
        } else {
          out.push_back(ids[i++]);
        }
      }
      ids = out;
    }
  }
  return merges;
}

// Words of a few letters (one of them two bytes long) so that pairs repeat, overlap and tie.
std::string random_words(uint64_t seed, int words) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> letters = {"a", "b", "c", "\xC3\xA9"};
  std::string s;
  for (int i = 0; i < words; ++i) {
    if (i > 0) s += rng() % 9 == 0 ? "<|endoftext|>" : " ";
    const int len = 1 + int(rng() % 6);
    for (int k = 0; k < len; ++k) s += letters[rng() % letters.size()];
  }
  return s;
}

TEST(TokenizerTrain, IncrementalCountsMatchANaiveRecount) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    BpeTrainer t({.vocab_size = 420, .min_frequency = seed == 4 ? 3 : 1});
    t.add_text(random_words(seed, 3000));
    const BpeVocabulary v = t.train();
    const auto want = naive_merges(t.word_counts(), 420, seed == 4 ? 3 : 1, {"<|endoftext|>"});
    EXPECT_GT(want.size(), 100u);
    EXPECT_EQ(merge_strings(v), want) << "seed " << seed;
  }
}

// ---- word counting ------------------------------------------------------------------------

// Text with the whitespace the GPT-2 split is delicate about around newlines.
std::string messy_text(uint64_t seed, size_t bytes) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> parts = {"the",
                                          "Cat",
                                          "isn't",
                                          "42",
                                          "3.14",
                                          "\xE4\xB8\x96\xE7\x95\x8C",
                                          "\xF0\x9F\x98\x80",
                                          "!!",
                                          " ",
                                          "  ",
                                          "\t",
                                          "\n",
                                          "\n\n",
                                          " \n",
                                          "\r\n",
                                          "x\n",
                                          "\n ",
                                          "),",
                                          "\xC2\xA0",
                                          "caf\xC3\xA9"};
  std::string s;
  while (s.size() < bytes) s += parts[rng() % parts.size()];
  return s;
}

TEST(TokenizerTrain, ChunkedCountingMatchesOnePassOverTheWholeText) {
  const std::string text = messy_text(7, 3'000'000);  // about three chunks
  BpeTrainer t({.vocab_size = 300});
  t.add_text(text);
  std::map<std::string, int64_t> want;
  const text::Regex split(text::kGpt2SplitPattern, "test");
  int64_t total = 0;
  for (const text::MatchRange& r : split.match_ranges(text)) {
    if (r.end > r.start) ++want[text.substr(r.start, r.end - r.start)], ++total;
  }
  EXPECT_EQ(t.word_count(), total);
  EXPECT_EQ(t.word_counts(), want);
}

TEST(TokenizerTrain, SpecialTokensAreCutOutOfTheText) {
  BpeTrainer t({.vocab_size = 300, .special_tokens = {"<|a|>", "<|ab|>"}});
  t.add_text("x<|ab|>y <|a|>z");  // the longer special wins where both match
  const std::map<std::string, int64_t> want = {{"x", 1}, {"y", 1}, {" ", 1}, {"z", 1}};
  EXPECT_EQ(t.word_counts(), want);
}

// ---- the tokenizer it writes ----------------------------------------------------------------

std::string english_text(uint64_t seed, int sentences) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> words = {
      "the",   "model",  "reads", "a",      "document", "and",   "fills",  "every", "field",
      "of",    "schema", "with",  "value",  "its",      "span",  "when",   "text",  "tokens",
      "there", "are",    "many",  "words",  "in",       "this",  "corpus", "2024",  "is",
      "don't", "we'll",  "price", "$12.50", "invoice",  "total", "date"};
  // Made-up words from syllables too, so that there are thousands of distinct words.
  const std::vector<std::string> syllables = {"ka", "lo", "mi",  "nu", "ter", "ad", "sen",
                                              "po", "ri", "vel", "qu", "ash", "on", "di"};
  auto word = [&] {
    if (rng() % 2) return words[rng() % words.size()];
    std::string w;
    for (int n = 1 + int(rng() % 3); n > 0; --n) w += syllables[rng() % syllables.size()];
    return w;
  };
  std::string s;
  for (int i = 0; i < sentences; ++i) {
    const int n = 4 + int(rng() % 10);
    for (int k = 0; k < n; ++k) {
      if (k) s += ' ';
      s += word();
    }
    s += rng() % 4 == 0 ? ".\n" : ". ";
  }
  return s;
}

text::Tokenizer load_trained(const BpeVocabulary& v) {
  return text::Tokenizer::from_json(json_parse(text::bpe_tokenizer_json(v), "trained"), "trained");
}

TEST(TokenizerTrain, VocabSizeAndSpecialTokens) {
  const BpeVocabulary v = train_on(english_text(1, 2000), 600, 2, {"<|endoftext|>", "<|pad|>"});
  EXPECT_EQ(v.tokens.size(), 600u);
  EXPECT_EQ(v.merges.size(), 600u - 2u - 256u);  // no merge spelled an existing token here
  const text::Tokenizer tok = load_trained(v);
  EXPECT_EQ(tok.vocab_size(), 600);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok.token_to_id("<|pad|>"), 1);
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(2));
  const Json j = json_parse(text::bpe_tokenizer_json(v), "trained");
  ASSERT_EQ(j["added_tokens"].size(), 2u);
  EXPECT_EQ(j["added_tokens"][1]["content"], "<|pad|>");
  EXPECT_TRUE(j["added_tokens"][1]["special"].get<bool>());
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_FALSE(j["pre_tokenizer"]["add_prefix_space"].get<bool>());
  EXPECT_TRUE(j["pre_tokenizer"]["use_regex"].get<bool>());
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["post_processor"]["type"], "ByteLevel");
  // The text between specials encodes without them; a special in the text is one token.
  const auto ids = tok.encode("the model<|endoftext|>the model").ids;
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 1);
  // A small vocabulary is a prefix of a larger one trained on the same text.
  const BpeVocabulary small = train_on(english_text(1, 2000), 400, 2, {"<|endoftext|>", "<|pad|>"});
  EXPECT_TRUE(std::equal(small.tokens.begin(), small.tokens.end(), v.tokens.begin()));
}

TEST(TokenizerTrain, SameInputGivesTheSameBytes) {
  const std::string text = english_text(3, 1500) + "<|endoftext|>" + english_text(4, 1500);
  const std::string once = text::bpe_tokenizer_json(train_on(text, 700, 2));
  EXPECT_EQ(once, text::bpe_tokenizer_json(train_on(text, 700, 2)));
  // Fed in two parts, split at the special token: the same counts, the same file.
  BpeTrainer t({.vocab_size = 700});
  const size_t at = text.find("<|endoftext|>");
  t.add_text(text.substr(0, at));
  t.add_text(text.substr(at + 13));
  EXPECT_EQ(once, text::bpe_tokenizer_json(t.train()));
  EXPECT_NE(once, text::bpe_tokenizer_json(train_on(text, 701, 2)));
}

TEST(TokenizerTrain, EncodeDecodeRoundTripsAnyText) {
  const text::Tokenizer tok = load_trained(train_on(english_text(5, 1500), 500, 2));
  const std::vector<std::string> texts = {
      "the model reads a document",
      "  leading spaces, trailing   \n\n\ttabs\r\n",
      "emoji \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD and ZWJ \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
      "\xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 "
      "\xD0\xBA\xD0\xB8\xD1\x80\xD0\xB8\xD0\xBB\xD0\xBB\xD0\xB8\xD1\x86\xD0\xB0",
      "numbers 1234567890 3.14159 -42 $12.50",
      "<|endoftext|>a document<|endoftext|>",
      std::string("nul \0 byte", 10),
      ""};
  for (const std::string& s : texts) {
    const text::Encoding enc = tok.encode(s);
    EXPECT_EQ(tok.decode(enc.ids, false), s) << Json(s).dump();
    for (int32_t id : enc.ids) EXPECT_LT(id, 500);
  }
  // Invalid UTF-8 reads as U+FFFD, so it decodes to the repaired text.
  const std::string bad = "ok \xFF\xFE tail \xC3";
  EXPECT_EQ(tok.decode(tok.encode(bad).ids, false), text::utf8_repair(bad, nullptr));
}

// ---- options and the CLI ------------------------------------------------------------------

TEST(TokenizerTrain, BadOptionsAreRefused) {
  auto refused = [](BpeTrainOptions o, const std::string& needle) {
    try {
      BpeTrainer t(std::move(o));
      ADD_FAILURE() << "accepted; wanted an error with " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({.vocab_size = 256}, "at least 257");
  refused({.vocab_size = 300, .min_frequency = 0}, "at least 1");
  refused({.vocab_size = 300, .special_tokens = {"<|x|>", "<|x|>"}}, "twice");
  refused({.vocab_size = 300, .special_tokens = {""}}, "empty");
  refused({.vocab_size = 300, .special_tokens = {"a"}}, "byte tokens");
  BpeTrainer t({.vocab_size = 300});
  t.add_text("<|endoftext|>");
  EXPECT_THROW(t.train(), Error);
}

TEST(TokenizerTrainCli, WritesTokenizerJson) {
  TempDir dir;
  write_text(dir / "a.txt", english_text(8, 800));
  write_text(dir / "b.txt", english_text(9, 800));
  const auto r = run_deg({"tokenizer", "train", "--vocab", "400", "--out", (dir / "tok").string(),
                          "--special", "<|endoftext|>", "--special", "<|pad|>",
                          (dir / "a.txt").string(), (dir / "b.txt").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json summary = json_parse(r.out, "stdout");
  EXPECT_EQ(summary["vocab_size"], 400);
  EXPECT_EQ(summary["special_tokens"], 2);
  const text::Tokenizer tok = text::Tokenizer::load(dir / "tok");
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.token_to_id("<|pad|>"), 1);
  // What the library makes from the same files, byte for byte.
  BpeTrainer t({.vocab_size = 400, .special_tokens = {"<|endoftext|>", "<|pad|>"}});
  t.add_text(read_text(dir / "a.txt"));
  t.add_text(read_text(dir / "b.txt"));
  EXPECT_EQ(read_text(dir / "tok" / "tokenizer.json"), text::bpe_tokenizer_json(t.train()));
  EXPECT_EQ(fs::directory_iterator(dir / "tok")->path().filename(), "tokenizer.json");
}

TEST(TokenizerTrainCli, ErrorsSayWhatToDo) {
  TempDir dir;
  write_text(dir / "a.txt", "some text");
  write_text(dir / "empty.txt", "");
  const std::string out = (dir / "tok").string();
  auto r =
      run_deg({"tokenizer", "train", "--vocab", "200", "--out", out, (dir / "a.txt").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("at least 257"), std::string::npos) << r.err;
  r = run_deg(
      {"tokenizer", "train", "--vocab", "300", "--out", out, (dir / "missing.txt").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
  r = run_deg({"tokenizer", "train", "--vocab", "300", "--out", out, (dir / "empty.txt").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no text"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "tok" / "tokenizer.json"));
  // Too little text for the vocabulary: a smaller tokenizer and a warning.
  r = run_deg({"tokenizer", "train", "--vocab", "300", "--out", out, (dir / "a.txt").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("stopped at 257 tokens"), std::string::npos) << r.err;
  r = run_deg({"tokenizer", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos) << r.out;
  r = run_deg({"tokenizer", "train", "--help"});
  EXPECT_NE(r.out.find("most often"), std::string::npos) << r.out;
}

// ---- golden: HF's trainer and HF's encoder ---------------------------------------------------

// tests/fixtures/tokenizers/trained_bpe (tools/reference/bpe_tokenizer_reference.py): train.txt,
// the tokenizer.json `deg tokenizer train --vocab 1000` made from it, hf_tokenizer.json (HF's
// BpeTrainer on train.txt with deg's settings, saved by HF), held-out texts and HF's encodings.
fs::path trained_fixture(const std::string& name) {
  return fixture_path("tokenizers/trained_bpe/" + name);
}

// deg's trainer makes what HF's trainer made from the same text with deg's settings: the same
// vocabulary, merges, added tokens and sections, so HF reads deg's file as it reads its own. The
// bytes are those of the committed tokenizer.json that the encoding test below loads.
TEST(TokenizerTrainGolden, SameTokenizerAsHfTrainer) {
  TempDir dir;
  const auto r = run_deg({"tokenizer", "train", "--vocab", "1000", "--quiet", "--out",
                          (dir / "tok").string(), trained_fixture("train.txt").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json ours = json_load(dir / "tok" / "tokenizer.json");
  const Json hf = json_load(trained_fixture("hf_tokenizer.json"));
  const Json& om = ours["model"]["merges"];
  const Json& hm = hf["model"]["merges"];
  ASSERT_EQ(om.size(), hm.size());
  for (size_t i = 0; i < om.size(); ++i) ASSERT_EQ(om[i], hm[i]) << "merge " << i;
  EXPECT_EQ(ours["model"]["vocab"], hf["model"]["vocab"]);
  EXPECT_EQ(ours, hf);
  EXPECT_EQ(read_text(dir / "tok" / "tokenizer.json"), read_text(trained_fixture("tokenizer.json")))
      << "the trainer's output changed: if meant, regenerate the fixtures (docs/tokenizer.md)";
}

TEST(TokenizerTrainGolden, MatchesHfIdsOffsetsAndDecode) {
  const text::Tokenizer tok = text::Tokenizer::load(trained_fixture("tokenizer.json"));
  const Json meta = json_load(trained_fixture("meta.json"));
  EXPECT_EQ(tok.vocab_size(), meta["vocab_size"].get<int64_t>());
  const auto texts = read_jsonl_lines(trained_fixture("heldout.jsonl"));
  const auto expected = read_jsonl_lines(trained_fixture("expected.jsonl"));
  ASSERT_EQ(texts.size(), expected.size()) << "fixtures out of date: rerun the reference script";
  ASSERT_GE(texts.size(), 10u);
  int64_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string s = json_parse(texts[i], "heldout").get<std::string>();
    const Json want = json_parse(expected[i], "expected");
    const text::Encoding got = tok.encode(s);
    EXPECT_EQ(got.ids, want["ids"].get<std::vector<int32_t>>()) << "text " << i;
    EXPECT_EQ(got.offsets, expand_offsets(want["offsets"])) << "text " << i;
    EXPECT_EQ(tok.decode(got.ids, false), want["decoded"].get<std::string>()) << "text " << i;
    tokens += int64_t(got.ids.size());
  }
  EXPECT_EQ(tokens, meta["tokens"].get<int64_t>());
}

}  // namespace
}  // namespace deg::testing
