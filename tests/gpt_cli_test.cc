// A gpt trunk through the command line: `deg shard` a small text with a byte-level tokenizer,
// `deg pretrain` a few steps, `deg forward` on the pretrain checkpoint (its logits equal the
// trainer's forward of the saved weights), `deg inspect`, `deg init --base` that checkpoint and
// `deg fill` a small schema whose output validates against it (valijson).
#include <gtest/gtest.h>

#include <cmath>

#include "io/json.h"
#include "io/npy.h"
#include "model/gpt_config.h"
#include "schema/validate.h"
#include "test_util.h"
#include "tiny_model.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"

namespace deg {
namespace {

namespace fs = std::filesystem;
using testing::run_deg;

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "category": {"enum": ["billing", "shipping", "other"]},
    "order_id": {"type": "string"},
    "urgent": {"type": "boolean"},
    "summary": {"type": "string", "x-generate": true, "maxLength": 12}
  },
  "required": ["category"]
})";

std::string corpus(int docs, int seed) {
  const char* lines[] = {"Please refund order AB-123 today.",    "My parcel never arrived.",
                         "The invoice total is wrong.",          "Where is my package?",
                         "I was charged twice for order CD-77.", "Thanks for the quick help!"};
  std::string text;
  for (int d = 0; d < docs; ++d) {
    if (d) text += "<|endoftext|>";
    for (int l = 0; l < 4; ++l) text += std::string(lines[(d * 7 + l * 3 + seed) % 6]) + "\n";
  }
  return text;
}

void expect_valid(const std::string& schema_text, const Json& value) {
  const auto why = schema::schema_violations(Json::parse(schema_text), value);
  EXPECT_TRUE(why.empty()) << value.dump() << "\n" << fmt::format("{}", fmt::join(why, "; "));
}

TEST(GptCli, ShardPretrainForwardInitFill) {
  testing::TempDir t;
  fs::create_directories(t / "tok");
  testing::write_text(t / "tok" / "tokenizer.json", testing::tiny_tokenizer_json());
  testing::write_text(t / "train.txt", corpus(40, 0));
  testing::write_text(t / "val.txt", corpus(4, 1));
  auto r = run_deg({"shard", "--tokenizer", (t / "tok").string(), "--out", (t / "data").string(),
                    "--val", (t / "val.txt").string(), (t / "train.txt").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The tiny preset with room for the tokenizer's 259 ids.
  Json cfg = gpt_config_to_json(gpt_preset("tiny"));
  cfg["vocab_size"] = 320;
  testing::write_text(t / "tiny320.json", cfg.dump());
  r = run_deg({"pretrain", "--config", (t / "tiny320.json").string(), "--data",
               (t / "data").string(), "--steps", "4", "--out", (t / "ckpt").string(),
               "--batch-tokens", "64", "--max-seq-len", "64", "--val-tokens", "64", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // deg forward on the pretrain checkpoint == the trainer's forward of its weights.
  const std::vector<int32_t> ids = {256, 80,  108, 101, 97,  115, 101, 32,  114, 101, 102, 117,
                                    110, 100, 32,  111, 114, 100, 101, 114, 32,  65,  66,  10};
  std::string ids_text;
  for (int32_t id : ids) ids_text += std::to_string(id) + " ";
  testing::write_text(t / "ids.txt", ids_text);
  r = run_deg({"forward", "--model", (t / "ckpt").string(), "--ids-file", (t / "ids.txt").string(),
               "--out", (t / "logits.npy").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor got = npy_read(t / "logits.npy");
  ASSERT_EQ(got.shape(), (Shape{int64_t(ids.size()), 320}));
  const train::GptParams p = train::GptParams::load(gpt_config_resolve((t / "ckpt").string()),
                                                    t / "ckpt" / "model.safetensors");
  train::GptBatch b{.inputs = ids,
                    .targets = std::vector<int32_t>(ids.size(), -1),
                    .prefix = {},
                    .seg_start = std::vector<int32_t>(ids.size(), 0)};
  const std::vector<float> want = train::gpt_logits(
      p, b, {.window_short = p.config().window_short, .window_long = p.config().window_long});
  const std::vector<float> have = got.to_f32_vector();
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(have[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  EXPECT_LT(err / scale, 1e-4);

  r = run_deg({"inspect", (t / "ckpt").string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["model_type"], "gpt");

  r = run_deg({"init", "--base", (t / "ckpt").string(), "--out", (t / "deg").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_deg({"inspect", (t / "deg").string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["model_type"], "gpt");

  testing::write_text(t / "schema.json", kSchema);
  testing::write_text(t / "doc.txt", "Hello, I was charged twice for order CD-77. Please fix it.");
  r = run_deg({"fill", "--model", (t / "deg").string(), "--schema", (t / "schema.json").string(),
               (t / "doc.txt").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json out = Json::parse(r.out);
  EXPECT_TRUE(out.contains("category"));  // required
  expect_valid(kSchema, out);
}

}  // namespace
}  // namespace deg
