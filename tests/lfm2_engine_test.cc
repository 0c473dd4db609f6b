// The fill engine and the CLI on a tiny random LFM2 snapshot (tiny_model.h): `deg init` makes a
// checkpoint, the lfm chat layout finds its tokens (ChatML opened by <|startoftext|>, padded with
// <|pad|>, turns ended by <|im_end|>), `deg fill` answers and a document's report is the same
// alone and in a batch. The answers of random heads are meaningless; these are properties of the
// machinery on this family.
#include <gtest/gtest.h>

#include "backbone_test_util.h"
#include "deg/engine.h"
#include "engine/model.h"
#include "io/json.h"
#include "io/npy.h"
#include "model/checkpoint.h"
#include "schema/plan.h"
#include "test_util.h"
#include "tiny_model.h"

namespace deg {
namespace {

class Lfm2Engine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_lfm2(*dir_ / "base", 17);
    checkpoint_init({.base = *dir_ / "base", .out = *dir_ / "ckpt", .seed = 3});
  }
  static void TearDownTestSuite() { delete dir_; }

  static testing::TempDir* dir_;
};

testing::TempDir* Lfm2Engine::dir_ = nullptr;

TEST_F(Lfm2Engine, CheckpointUsesTheLfmChatLayout) {
  auto model = engine::DegModel::open(*dir_ / "ckpt");
  EXPECT_EQ(model->backbone().spec().family, "lfm2");
  EXPECT_EQ(model->name(), "lfm2");
  const text::Tokenizer& tok = model->tokenizer();
  EXPECT_EQ(model->pad_id(), tok.token_to_id("<|pad|>"));
  EXPECT_EQ(model->eos_id(), tok.token_to_id("<|im_end|>"));
  // The trunk opens with bos, then a ChatML system turn and an opened user turn.
  std::vector<int32_t> ids = model->encode_template(model->layout().bos + model->layout().prefix);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], tok.token_to_id("<|startoftext|>"));
  EXPECT_EQ(ids[1], tok.token_to_id("<|im_start|>"));
  int im_start = 0, im_end = 0;
  for (int32_t id : ids) {
    im_start += id == tok.token_to_id("<|im_start|>");
    im_end += id == tok.token_to_id("<|im_end|>");
  }
  EXPECT_EQ(im_start, 2);  // system, user
  EXPECT_EQ(im_end, 1);    // the system turn is closed, the user turn stays open
}

TEST_F(Lfm2Engine, FillIsTheSameAloneAndInABatch) {
  Engine engine = Engine::open({.model = *dir_ / "ckpt"});
  EXPECT_EQ(engine.backbone_name(), "lfm2");
  OrderedJson schema =
      schema::schema_load(testing::source_path("examples/invoice.schema.json").string());
  std::vector<std::string> docs = {testing::read_text(testing::source_path("examples/invoice.txt")),
                                   "Invoice INV-7 from Acme Ltd, total 12.50 EUR, due 2026-01-31."};
  std::vector<FillResult> batch = engine.fill(schema, docs);
  ASSERT_EQ(batch.size(), docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_TRUE(batch[d].ok()) << batch[d].error;
    std::vector<FillResult> alone = engine.fill(schema, {docs[d]});
    EXPECT_EQ(alone[0].value, batch[d].value);
    ASSERT_EQ(alone[0].fields.size(), batch[d].fields.size());
    for (size_t i = 0; i < alone[0].fields.size(); ++i) {
      EXPECT_EQ(alone[0].fields[i].confidence, batch[d].fields[i].confidence)
          << alone[0].fields[i].path;
    }
  }
}

TEST_F(Lfm2Engine, CliInitAndFill) {
  testing::TempDir t;
  auto r = testing::run_deg(
      {"init", "--base", (*dir_ / "base").string(), "--out", (t / "ck").string(), "--seed", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(testing::read_text(t / "ck" / "heads.safetensors"),
            testing::read_text(*dir_ / "ckpt" / "heads.safetensors"));
  Json meta = json_load(t / "ck" / "deg.json");
  EXPECT_EQ(meta["backbone"], "lfm2");
  testing::expect_fill_support_example(t / "ck");
}

TEST_F(Lfm2Engine, CliForwardOnTheSnapshotMatchesTheLibrary) {
  testing::TempDir t;
  testing::write_text(t / "ids.txt", "256 257 72 101 108 108 111 258 10 33");
  auto r = testing::run_deg({"forward", "--model", (*dir_ / "base").string(), "--ids-file",
                             (t / "ids.txt").string(), "--out", (t / "a.npy").string(), "--fork-at",
                             "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_deg({"forward", "--model", (*dir_ / "base").string(), "--ids-file",
                        (t / "ids.txt").string(), "--out", (t / "b.npy").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Tensor a = npy_read(t / "a.npy"), b = npy_read(t / "b.npy");
  ASSERT_EQ(a.shape(), (Shape{10, 261}));
  EXPECT_LT(testing::rel_max_error(a, b), 1e-5);
}

}  // namespace
}  // namespace deg
