// GptConfig: presets validate, the MUDD gate lane layout matches the seed's own accounting
// (init_mudd_gate's comment: pre 23 lanes, post 13), JSON round trip, and bad configs are
// rejected with the JSON pointer of the field.
#include "model/gpt_config.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/gpt.h"
#include "test_util.h"

namespace deg {
namespace {

TEST(GptConfig, PresetsValidate) {
  for (const auto& name : gpt_preset_names()) {
    GptConfig c = gpt_preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_EQ(c.num_layers, 11) << name;
  }
  EXPECT_THROW(gpt_preset("huge"), Error);
}

TEST(GptConfig, SpeedrunGateLanesMatchTheSeed) {
  const GptConfig c = gpt_preset("speedrun-124m");
  const auto g = c.gate_lanes();
  // seed 003 init_mudd_gate: "pre: xsa[1,3] 12 + attn[3] 6 + x0[0,1,2] 3 + bigram[0,1] 2 = 23",
  // "post: attn[10] 6 + x0[4,5,7] 3 + bigram[4,5,9] 3 + skip 1 = 13".
  EXPECT_EQ(g.pre_count, 23);
  EXPECT_EQ(g.post_count, 13);
  EXPECT_EQ(g.xsa[1], 0);
  EXPECT_EQ(g.xsa[3], 6);
  EXPECT_EQ(g.attn_gate[3], 12);
  EXPECT_EQ(g.x0[0], 18);
  EXPECT_EQ(g.ngram[1], 22);
  EXPECT_EQ(g.attn_gate[10], 0);
  EXPECT_EQ(g.x0[7], 8);
  EXPECT_EQ(g.ngram[9], 11);
  EXPECT_EQ(g.skip, 12);
  EXPECT_EQ(c.qk_dim(3), 128);
  EXPECT_EQ(c.qk_dim(0), 64);
  EXPECT_EQ(c.v_dim(1), 64);
  EXPECT_EQ(c.v_dim(5), 128);
}

TEST(GptConfig, JsonRoundTrip) {
  for (const auto& name : gpt_preset_names()) {
    const GptConfig c = gpt_preset(name);
    const Json j = gpt_config_to_json(c);
    EXPECT_EQ(j["family"], "gpt");
    const GptConfig back = gpt_config_from_json(json_parse(j.dump(), "test"), "test");
    EXPECT_EQ(gpt_config_to_json(back), j) << name;
  }
  testing::TempDir dir;
  gpt_config_save(gpt_preset("tiny"), dir / "config.json");
  EXPECT_EQ(gpt_config_to_json(gpt_config_resolve((dir / "config.json").string())),
            gpt_config_to_json(gpt_preset("tiny")));
  EXPECT_EQ(gpt_config_resolve(dir.path().string()).model_dim, 48);
}

TEST(GptConfig, RejectsInconsistentTopology) {
  Json j = gpt_config_to_json(gpt_preset("tiny"));
  j["xsa_layers"] = {1, 5};  // 5 is past the post gate layer
  try {
    gpt_config_from_json(j, "cfg.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().pointer, "/xsa_layers");
    EXPECT_EQ(e.context().path, "cfg.json");
  }
  j = gpt_config_to_json(gpt_preset("tiny"));
  j["attn_layers"] = {0, 1, 2, 3, 5, 8, 11};
  EXPECT_THROW(gpt_config_from_json(j, "cfg.json"), Error);
  j = gpt_config_to_json(gpt_preset("tiny"));
  j["family"] = "qwen3_5";
  EXPECT_THROW(gpt_config_from_json(j, "cfg.json"), Error);
  j = gpt_config_to_json(gpt_preset("tiny"));
  j.erase("model_dim");
  EXPECT_THROW(gpt_config_from_json(j, "cfg.json"), Error);
}

TEST(GptConfig, ParameterCountMatchesTheTensorTable) {
  // parameter_count() is written out by hand; the tensor table is what the loader, the saver and
  // the trainer use. They must agree for every preset, once the table's buffers (the n-gram sign
  // pool, the rotary frequencies and attention scales: fixed, not trained) are set aside.
  for (const auto& name : gpt_preset_names()) {
    const GptConfig c = gpt_preset(name);
    int64_t n = 0;
    for (const auto& [tensor, shape] : gpt_tensor_table(c)) n += shape_numel(shape);
    const int64_t buffers = c.ngram_sign_rows * c.ngram_dim + c.narrow_head_dim + c.head_dim + 2;
    EXPECT_EQ(c.parameter_count() + buffers, n) << name;
  }
}

// The FLOP count's N: the tensor table less its lookup tables and buffers; and the figures the
// PyTorch reference counts its own way (gpt_train_reference.py's "matmul_parameters", printed
// on the H100 on 2026-12-07: small at vocab 32768; speedrun-124m-1gpu at 50304).
TEST(GptConfig, MatmulParameterCountIsTheTableLessItsLookups) {
  for (const auto& name : gpt_preset_names()) {
    const GptConfig c = gpt_preset(name);
    int64_t n = 0;
    for (const auto& [tensor, shape] : gpt_tensor_table(c))
      if (tensor != "embed" && tensor != "value_embeds" && tensor != "ngram_table" &&
          tensor != "ngram_sign_pool" && tensor.rfind("rotary.", 0) != 0)
        n += shape_numel(shape);
    EXPECT_EQ(c.matmul_parameter_count(), n) << name;
  }
  GptConfig small = gpt_preset("small");
  small.vocab_size = 32768;
  EXPECT_EQ(small.matmul_parameter_count(), 42'543'239);
  EXPECT_EQ(gpt_preset("speedrun-124m-1gpu").matmul_parameter_count(), 98'811'379);
}

// The attention's FLOPs against the mask enumerated pair by pair (tiny: paired and unpaired
// layers, short and long windows, documents of several lengths); and small over 48 documents
// of 1,024 tokens against the reference's model FLOPs a token for its random-token run
// (261,573,882 with 6 N; H100, 2026-12-07).
TEST(GptConfig, AttentionFlopsCountTheVisiblePairs) {
  GptConfig c = gpt_preset("tiny");
  c.window_short = 5;
  c.window_long = 11;
  std::vector<int32_t> seg;
  for (const int len : {7, 1, 23, 16, 3})
    for (int t = 0; t < len; ++t) seg.push_back(int32_t(seg.size()) - t);
  int64_t want = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    if (!c.has_attn(i)) continue;
    const int per = c.paired(i) ? 2 : 1;
    const int64_t window = c.long_window(i) ? c.window_long : c.window_short;
    int64_t pairs = 0;
    for (int64_t q = 0; q < per * int64_t(seg.size()); ++q)
      for (int64_t k = 0; k <= q; ++k) pairs += k >= per * seg[size_t(q / per)] && q - k <= window;
    want += 3 * 2 * (c.num_heads / per) * (c.qk_dim(i) + c.v_dim(i)) * pairs;
  }
  bool paired = false;
  for (int i = 0; i < c.num_layers; ++i) paired = paired || (c.has_attn(i) && c.paired(i));
  EXPECT_TRUE(paired) << "tiny has a paired-head layer to count";
  EXPECT_EQ(gpt_attention_flops(c, seg), want);

  GptConfig small = gpt_preset("small");
  small.vocab_size = 32768;
  std::vector<int32_t> docs(49152);
  for (size_t t = 0; t < docs.size(); ++t) docs[t] = int32_t(t / 1024 * 1024);
  EXPECT_EQ(6 * small.matmul_parameter_count() * 49152 + gpt_attention_flops(small, docs),
            int64_t(261'573'882) * 49152);
}

TEST(GptConfig, SpeedrunOneGpuIsSpeedrunWithATableThatFitsOneH200) {
  // speedrun-124m's n-gram table (84.6M rows x 768, ~130 GB in bf16) is sharded over 8 GPUs; the
  // one-GPU preset keeps 2^22 rows. Counted from the tensor table the loader and trainer use: the
  // table is 3,221,225,472 of 3,513,204,211 parameters, and f32 weights, gradients and two Adam
  // moments (16 bytes a parameter) take 56.2 GB of an H200's 141 GB.
  const GptConfig one = gpt_preset("speedrun-124m-1gpu");
  int64_t n = 0;
  for (const auto& [tensor, shape] : gpt_tensor_table(one)) n += shape_numel(shape);
  const int64_t buffers =
      one.ngram_sign_rows * one.ngram_dim + one.narrow_head_dim + one.head_dim + 2;
  EXPECT_EQ(n - buffers, 3'513'204'211);
  EXPECT_EQ(one.parameter_count(), n - buffers);
  EXPECT_EQ(one.ngram_vocab * one.ngram_dim, 3'221'225'472);
  EXPECT_LT(16 * (n - buffers), int64_t(60) << 30);
  // Everything else is speedrun-124m's.
  Json a = gpt_config_to_json(one), b = gpt_config_to_json(gpt_preset("speedrun-124m"));
  for (const char* key : {"name", "ngram_vocab"}) a.erase(key), b.erase(key);
  EXPECT_EQ(a, b);
  EXPECT_EQ(gpt_preset("speedrun-124m").ngram_vocab, 84'602'880);
}

TEST(GptConfig, PyTorchReferenceConfigsAreThePresets) {
  // tools/reference/gpt_train_reference.py reads the presets from tools/reference/configs: they
  // must be gpt_preset's (regenerate them with gpt_config_save when a preset changes).
  for (const auto& name : gpt_preset_names()) {
    const auto path = testing::source_path("tools/reference/configs/" + name + ".json");
    EXPECT_EQ(json_load(path), gpt_config_to_json(gpt_preset(name))) << path;
  }
}

TEST(GptConfig, SmallTrunkHas20To30MillionParameters) {
  // `small` is our default trunk: ~20-30M parameters outside the vocabulary-sized tables.
  const GptConfig c = gpt_preset("small");
  const int64_t tables = (2 + int64_t(c.value_embed_layers.size())) * c.vocab_size * c.model_dim +
                         c.ngram_vocab * c.ngram_dim;
  const int64_t trunk = c.parameter_count() - tables;
  EXPECT_GT(trunk, 20'000'000);
  EXPECT_LT(trunk, 30'000'000);
}

TEST(GptConfig, CompactFitsTheDefaultModelsBudget) {
  // The shipped default model (issue #16): <= 25 MB in all, its trunk's tensors in bf16 beside
  // bf16 heads (~1.4 MB at d 256) and a tokenizer.json (~0.3 MB at 4096 tokens).
  const GptConfig c = gpt_preset("compact");
  EXPECT_EQ(c.vocab_size, 4096);
  EXPECT_LT(2 * c.parameter_count(), 23'000'000) << c.parameter_count();
  EXPECT_GE(c.window_short, 1024);  // a query sees the start of a long e-mail
}

}  // namespace
}  // namespace deg
