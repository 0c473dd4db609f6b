// `deg inspect`: parameter counting (tied heads once), both HF layouts, deg checkpoints, and the
// golden count of the tiny Qwen3.5 snapshots made by tools/reference (PyTorch's own count).
#include <gtest/gtest.h>

#include "deg/model_info.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace deg {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

Tensor ones(const Shape& s, DType t = DType::bf16) {
  return Tensor::empty(s, t);
}

TEST(Inspect, CountsTiedHeadOnceInBothLayouts) {
  for (bool multimodal : {false, true}) {
    for (bool head_stored : {false, true}) {
      TempDir dir;
      std::string p = multimodal ? "model.language_model." : "model.";
      std::vector<NamedTensor> w = {{p + "embed_tokens.weight", ones({10, 4})},
                                    {p + "norm.weight", ones({4}, DType::f32)}};
      if (head_stored) w.push_back({"lm_head.weight", ones({10, 4})});
      safetensors_write(dir / "model.safetensors", w);
      Json config = {{"model_type", multimodal ? "qwen3_5" : "qwen3_5_text"}};
      Json text = {{"model_type", "qwen3_5_text"}, {"tie_word_embeddings", true}};
      if (multimodal) {
        config["text_config"] = text;
      } else {
        config.update(text);
      }
      testing::write_text(dir / "config.json", config.dump());
      ModelInfo info = model_info(dir.path());
      EXPECT_EQ(info.format, "hf-snapshot");
      EXPECT_EQ(info.parameters, 44) << multimodal << head_stored;
      EXPECT_EQ(info.text_model_type, "qwen3_5_text");
      EXPECT_EQ(info.text_prefix, p);
      EXPECT_EQ(info.parameters_by_dtype["bf16"], 40);
      EXPECT_EQ(info.tensors.size(), head_stored ? 3u : 2u);
    }
  }
}

TEST(Inspect, UntiedHeadCounts) {
  TempDir dir;
  safetensors_write(dir / "model.safetensors", {{"model.embed_tokens.weight", ones({10, 4})},
                                                {"lm_head.weight", ones({10, 4})}});
  testing::write_text(dir / "config.json",
                      R"({"model_type": "lfm2", "tie_word_embeddings": false})");
  EXPECT_EQ(model_info(dir.path()).parameters, 80);
}

TEST(Inspect, DegCheckpoint) {
  TempDir dir;
  safetensors_write(dir / "backbone.safetensors", {{"model.embed_tokens.weight", ones({10, 4})}});
  safetensors_write(dir / "heads.safetensors", {{"choice.q.weight", ones({4, 4}, DType::f32)}});
  testing::write_text(dir / "deg.json", R"({"backbone": "qwen3.5-0.8b", "base": "/x"})");
  ModelInfo info = model_info(dir.path());
  EXPECT_EQ(info.format, "deg-checkpoint");
  EXPECT_EQ(info.model_type, "qwen3.5-0.8b");
  EXPECT_EQ(info.parameters, 56);
  fs::remove(dir / "heads.safetensors");
  EXPECT_THROW(model_info(dir.path()), Error);
}

TEST(Inspect, CliTextJsonAndErrors) {
  TempDir dir;
  safetensors_write(dir / "model.safetensors", {{"model.embed_tokens.weight", ones({10, 4})}});
  testing::write_text(dir / "config.json", R"({"model_type": "qwen3_5_text"})");
  auto r = testing::run_deg({"inspect", dir.path().string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters   40"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.embed_tokens.weight"), std::string::npos);
  r = testing::run_deg({"inspect", "--json", dir.path().string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["parameters"], 40);
  EXPECT_EQ(j["tensors"][0]["shape"], Json::array({10, 4}));

  r = testing::run_deg({"inspect", (dir / "nope").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;
  testing::write_text(dir / "model.safetensors", "garbage");
  r = testing::run_deg({"inspect", dir.path().string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
}

// PyTorch's own parameter count (sum of numel over model.parameters(), which shares a tied head)
// of the tiny snapshots tools/reference/qwen35_fixtures.py saved, in both layouts.
TEST(Inspect, MatchesPyTorchCountOnReferenceSnapshots) {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(testing::fixture_path("qwen35"))) {
    if (!fs::exists(entry.path() / "meta.json")) continue;
    Json meta = Json::parse(testing::read_text(entry.path() / "meta.json"));
    ModelInfo info = model_info(entry.path());
    EXPECT_EQ(info.parameters, meta["num_parameters"].get<int64_t>()) << entry.path();
    EXPECT_EQ(info.tied_embeddings, meta["tied"].get<bool>()) << entry.path();
    EXPECT_EQ(info.text_prefix,
              meta["layout"] == "multimodal" ? "model.language_model." : "model.");
    ++checked;
  }
  EXPECT_GE(checked, 2) << "reference snapshots missing from tests/fixtures/qwen35";
}

TEST(Cli, VersionAndHelp) {
  auto r = testing::run_deg({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("deg ", 0), 0u) << r.out;
  r = testing::run_deg({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("inspect"), std::string::npos);
  r = testing::run_deg({});
  EXPECT_NE(r.exit_code, 0);
  // A --model that is not there: fill names it (without --model it takes the default model,
  // EngineTest.FillFindsTheDefaultModel).
  testing::TempDir dir;
  testing::write_text(dir / "s.json",
                      R"({"type": "object", "properties": {"a": {"type": "string"}}})");
  testing::write_text(dir / "doc.txt", "some text");
  r = testing::run_deg({"fill", "--model", (dir / "nowhere").string(), "--schema",
                        (dir / "s.json").string(), (dir / "doc.txt").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find((dir / "nowhere").string()), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deg
