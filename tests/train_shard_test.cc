// `deg shard`: text files -> token shards the loader reads back as the tokenizer's encodings,
// one document per end-of-text separator, each after the separator's id; data.json and
// tokenizer.json written next to them; a vocabulary too large for uint16 is refused.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/json.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "train/data.h"

namespace deg::train {
namespace {

namespace fs = std::filesystem;

// A small character-level BPE tokenizer.json with "<|endoftext|>" as a special token.
std::string tiny_tokenizer_json() {
  Json vocab = {{"<|endoftext|>", 0}, {"<unk>", 1}};
  const std::string chars = "abcdefghijklmnopqrstuvwxyz .,\n";
  for (char c : chars) vocab[std::string(1, c)] = int(vocab.size());
  vocab["th"] = int(vocab.size());
  vocab["the"] = int(vocab.size());
  Json j = {{"version", "1.0"},
            {"added_tokens",
             {{{"id", 0},
               {"content", "<|endoftext|>"},
               {"single_word", false},
               {"lstrip", false},
               {"rstrip", false},
               {"normalized", false},
               {"special", true}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder", nullptr},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", "<unk>"},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"vocab", vocab},
              {"merges", {"t h", "th e"}}}}};
  return j.dump();
}

TEST(TrainShard, TextFilesToShards) {
  testing::TempDir dir;
  fs::create_directories(dir / "tok");
  testing::write_text(dir / "tok" / "tokenizer.json", tiny_tokenizer_json());
  const std::string a = "the cat sat.<|endoftext|>then the dog ran.\n", b = "a bird sang.";
  testing::write_text(dir / "a.txt", a);
  testing::write_text(dir / "b.txt", b);
  testing::write_text(dir / "v.txt", "the end.");
  const auto r = testing::run_deg({"shard", "--tokenizer", (dir / "tok").string(), "--out",
                                   (dir / "data").string(), "--val", (dir / "v.txt").string(),
                                   (dir / "a.txt").string(), (dir / "b.txt").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json out = json_parse(r.out, "stdout");
  EXPECT_EQ(out["documents"], 4);
  EXPECT_EQ(out["bos_id"], 0);
  const text::Tokenizer tok = text::Tokenizer::load(dir / "tok");
  std::vector<uint16_t> expected;
  for (std::string doc : {std::string("the cat sat."), std::string("then the dog ran.\n"), b}) {
    expected.push_back(0);
    for (int32_t t : tok.encode(doc).ids) expected.push_back(uint16_t(t));
  }
  EXPECT_EQ(shard_read(dir / "data" / "train_000000.bin"), expected);
  EXPECT_EQ(shard_files(dir / "data", "val").size(), 1u);
  const DataInfo info = data_info_read(dir / "data");
  EXPECT_EQ(info.bos_id, 0);
  EXPECT_EQ(info.vocab_size, tok.vocab_size());
  EXPECT_TRUE(fs::exists(dir / "data" / "tokenizer.json"));
  // The loader starts its first batch on the first document.
  ShardLoader loader(shard_files(dir / "data", "train"), info.bos_id);
  const GptBatch batch = loader.next(6, 64);
  EXPECT_EQ(batch.inputs[0], 0);
  EXPECT_EQ(std::vector<int32_t>(batch.inputs.begin() + 1, batch.inputs.end()),
            std::vector<int32_t>(expected.begin() + 1, expected.begin() + 6));
}

TEST(TrainShard, MissingSeparatorIsAUserError) {
  testing::TempDir dir;
  std::string json = tiny_tokenizer_json();
  testing::write_text(dir / "tokenizer.json", json);
  testing::write_text(dir / "a.txt", "abc");
  const auto r =
      testing::run_deg({"shard", "--tokenizer", dir.path().string(), "--out", (dir / "o").string(),
                        "--separator", "<nope>", (dir / "a.txt").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--separator"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deg::train
