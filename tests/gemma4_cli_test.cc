// `deg forward`, `deg init` and `deg fill` on tiny random Gemma 4 snapshots (text and multimodal
// layouts, tests/tiny_model.h): forward writes the library's logits, a checkpoint runs the same
// backbone as its base (the per-layer embedding table read from the base), and fill answers a
// schema through Gemma's turn layout. Random heads: only the machinery is checked.
#include <gtest/gtest.h>

#include "deg/engine.h"
#include "io/json.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/load.h"
#include "schema/plan.h"
#include "test_util.h"
#include "tiny_model.h"

namespace deg {
namespace {

std::vector<int32_t> some_ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t((i * 37 + 11) % 259));
  return ids;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_f32_vector() == b.to_f32_vector();
}

class Gemma4Cli : public ::testing::TestWithParam<bool> {};

TEST_P(Gemma4Cli, ForwardWritesTheLibraryLogitsAndForkAtAgrees) {
  testing::TempDir tmp;
  testing::write_tiny_gemma4(tmp / "m", 4, /*multimodal=*/GetParam());
  std::vector<int32_t> ids = some_ids(50);  // longer than the window (8)
  std::string text;
  for (int32_t id : ids) text += std::to_string(id) + " ";
  testing::write_text(tmp / "ids.txt", text);
  auto r = testing::run_deg({"forward", "--model", (tmp / "m").string(), "--ids-file",
                             (tmp / "ids.txt").string(), "--out", (tmp / "a.npy").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto bb = backbone_open(tmp / "m");
  Tensor want = backbone_forward(*bb, ids, /*logits=*/true);
  EXPECT_TRUE(same_bits(npy_read(tmp / "a.npy"), want));
  r = testing::run_deg({"forward", "--model", (tmp / "m").string(), "--ids-file",
                        (tmp / "ids.txt").string(), "--out", (tmp / "b.npy").string(), "--fork-at",
                        "37"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<float> a = npy_read(tmp / "b.npy").to_f32_vector(), b = want.to_f32_vector();
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  EXPECT_LT(err / scale, 1e-5);
}

TEST_P(Gemma4Cli, InitThenFillAnswersTheSchema) {
  testing::TempDir t;
  testing::write_tiny_gemma4(t / "base", 6, /*multimodal=*/GetParam());
  auto r = testing::run_deg(
      {"init", "--base", (t / "base").string(), "--out", (t / "ck").string(), "--seed", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json meta = json_load(t / "ck" / "deg.json");
  EXPECT_EQ(meta["backbone"], "gemma4");
  // The checkpoint leaves the per-layer embedding table in the base and still runs the same
  // backbone as the base with every tensor in bf16 (bitwise).
  auto ck = SafetensorsFile::open(t / "ck" / "backbone.safetensors");
  bool has_table = false;
  for (const TensorInfo& info : ck.tensors())
    has_table |= info.name.find("embed_tokens_per_layer") != std::string::npos;
  EXPECT_FALSE(has_table);
  std::filesystem::create_directories(t / "base16");
  std::filesystem::copy_file(t / "base" / "config.json", t / "base16" / "config.json");
  auto base = SafetensorsFile::open(t / "base" / "model.safetensors");
  std::vector<NamedTensor> rounded;
  for (const TensorInfo& info : base.tensors())
    rounded.push_back({info.name, base.tensor(info.name).to(DType::bf16)});
  safetensors_write(t / "base16" / "model.safetensors", rounded);
  auto from_ck = backbone_open_checkpoint(t / "ck", {t / "ck" / "backbone.safetensors"});
  auto from_base = backbone_open(t / "base16");
  std::vector<int32_t> ids = some_ids(30);
  EXPECT_TRUE(
      same_bits(backbone_forward(*from_ck, ids, true), backbone_forward(*from_base, ids, true)));

  testing::expect_fill_support_example(t / "ck");

  // The library agrees with the CLI, and a field's report does not depend on the batch.
  Engine engine = Engine::open({.model = t / "ck"});
  EXPECT_EQ(engine.backbone_name(), "gemma4");
  OrderedJson s =
      schema::schema_load(testing::source_path("examples/support.schema.json").string());
  const std::string text = testing::read_text(testing::source_path("examples/support.txt"));
  std::vector<FillResult> alone = engine.fill(s, {text});
  std::vector<FillResult> batch = engine.fill(s, {"refund for order AB-123456 please", text});
  ASSERT_TRUE(alone[0].ok()) << alone[0].error;
  ASSERT_TRUE(batch[1].ok()) << batch[1].error;
  EXPECT_EQ(alone[0].value.dump(), batch[1].value.dump());
  ASSERT_EQ(alone[0].fields.size(), batch[1].fields.size());
  for (size_t i = 0; i < alone[0].fields.size(); ++i)
    EXPECT_EQ(alone[0].fields[i].confidence, batch[1].fields[i].confidence)
        << alone[0].fields[i].path;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Gemma4Cli, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "multimodal" : "text"; });

}  // namespace
}  // namespace deg
