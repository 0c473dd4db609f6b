// The gpt family on the Family contract (src/model/gpt.cc) against the trainer's forward
// (src/train/gpt_step.cc, itself checked against PyTorch autograd): soft-capped logits within
// 1e-4 relative on the `tiny` preset with random weights and on the checkpoint of a short
// pretraining run. Properties of the family machinery: fork rows == the full forward (forks right
// after positions 0, 1, 2 where smear and the n-gram hashes read the prefix's last tokens),
// chunked prefill == dense across window boundaries, bitwise batch invariance (a fork row alone,
// in a batch of 7 rows over 3 prefixes, reordered), padding writes no state, decoding with keep.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backbone_test_util.h"
#include "core/error.h"
#include "deg/engine.h"
#include "deg/input.h"
#include "deg/train.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/gpt.h"
#include "model/load.h"
#include "test_util.h"
#include "tiny_model.h"
#include "train/data.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"

namespace deg {
namespace {

using testing::bitwise_equal;
using testing::concat;
using testing::Doc;
using testing::full_hidden;
using testing::random_ids;
using testing::rel_max_error;
using testing::row_of;
using testing::span_of;

namespace fs = std::filesystem;

// The seed's init plus noise on every tensor, so every path carries signal (the init zeroes the
// MLP projections, the smear lambda, the MUDD second layers, ...): gates, lambdas and biases move
// by O(1), matrices by a few times their init scale, the head spreads the logits over the cap.
train::GptParams random_params(const GptConfig& cfg, uint64_t seed) {
  train::GptParams p = train::GptParams::create(cfg);
  p.init(seed);
  train::Rng rng(seed + 7);
  for (auto& t : p.tensors()) {
    const bool gate = t.shape.size() == 1 || t.name.ends_with("lambdas") ||
                      t.name.ends_with("b2") || t.name.ends_with("gate");
    const double sd = gate ? 0.5 : t.name == "lm_head" ? 0.3 : 0.05;
    for (float& x : t.data) x += float(rng.normal() * sd);
  }
  return p;
}

// The trainer's final-norm hidden states [T, C] of one sequence.
std::vector<float> trainer_hidden(const train::GptParams& p, const std::vector<int32_t>& ids) {
  const GptConfig& c = p.config();
  train::GptBatch b{.inputs = ids,
                    .targets = std::vector<int32_t>(ids.size(), -1),
                    .prefix = {},
                    .seg_start = std::vector<int32_t>(ids.size(), 0)};
  train::GptActs acts;
  train::gpt_forward(p, b, {.window_short = c.window_short, .window_long = c.window_long}, acts);
  return acts.final_xn;
}

void save_checkpoint(const train::GptParams& p, const fs::path& dir) {
  fs::create_directories(dir);
  gpt_config_save(p.config(), dir / "config.json");
  p.save(dir / "model.safetensors");
}

// The trainer's soft-capped logits [T, V] of one sequence (one attention segment).
std::vector<float> trainer_logits(const train::GptParams& p, const std::vector<int32_t>& ids) {
  const GptConfig& c = p.config();
  train::GptBatch b{.inputs = ids,
                    .targets = std::vector<int32_t>(ids.size(), -1),
                    .prefix = {},
                    .seg_start = std::vector<int32_t>(ids.size(), 0)};
  return train::gpt_logits(p, b, {.window_short = c.window_short, .window_long = c.window_long});
}

TEST(GptInference, TensorTableIsTheTrainers) {
  for (const char* preset : {"tiny", "small"}) {
    const GptConfig cfg = gpt_preset(preset);
    const train::GptParams p = train::GptParams::create(cfg);
    std::vector<std::pair<std::string, Shape>> want;
    for (const auto& t : p.tensors()) want.push_back({t.name, t.shape});
    want.push_back({"ngram_sign_pool", {cfg.ngram_sign_rows, cfg.ngram_dim}});
    want.push_back({"rotary.narrow.freq", {int64_t(p.rotary_narrow.freq.size())}});
    want.push_back({"rotary.narrow.attn_scale", {1}});
    want.push_back({"rotary.wide.freq", {int64_t(p.rotary_wide.freq.size())}});
    want.push_back({"rotary.wide.attn_scale", {1}});
    EXPECT_EQ(gpt_tensor_table(cfg), want) << preset;
  }
}

TEST(GptInference, RandomWeightsLogitsEqualTrainer) {
  testing::TempDir dir;
  const train::GptParams p = random_params(gpt_preset("tiny"), 5);
  save_checkpoint(p, dir.path());
  // 150 tokens: past both windows (16 and 48 positions; paired layers use two per token).
  const std::vector<int32_t> ids = random_ids(150, p.config().vocab_size, 1);
  const std::vector<float> want = trainer_logits(p, ids);
  for (Device device : testing::test_devices()) {
    SCOPED_TRACE(device == Device::cuda ? "cuda" : "cpu");
    auto bb = backbone_open(dir.path(), {.device = device});
    EXPECT_EQ(bb->spec().family, "gpt");
    const Tensor got = backbone_forward(*bb, ids, /*logits=*/true);
    ASSERT_EQ(got.shape(), (Shape{150, p.config().vocab_size}));
    EXPECT_LT(rel_max_error(got.to_f32_vector(), want), 1e-4);
    EXPECT_LT(
        rel_max_error(backbone_forward(*bb, ids, false).to_f32_vector(), trainer_hidden(p, ids)),
        1e-4);
    // A fork over the first 37 ids answers the same.
    const Tensor forked = backbone_forward(*bb, ids, true, /*fork_at=*/37);
    EXPECT_LT(rel_max_error(forked.to_f32_vector(), want), 1e-4);
  }
}

TEST(GptInference, PretrainedCheckpointLogitsEqualTrainer) {
  testing::TempDir dir;
  // A small character-level text (0 = document start).
  const std::string words[] = {"the cat ", "sees ", "a red house", ". ", "my friend ", "calls "};
  std::mt19937 rng(3);
  std::vector<uint16_t> tokens;
  for (int d = 0; d < 80; ++d) {
    tokens.push_back(0);
    for (int w = 0; w < 12; ++w)
      for (char ch : words[rng() % 6])
        tokens.push_back(ch == ' ' ? 27 : ch == '.' ? 28 : uint16_t(ch - 'a' + 1));
  }
  fs::create_directories(dir / "data");
  train::shard_write(dir / "data" / "train_000000.bin", tokens);
  train::data_info_write(dir / "data", {.bos_id = 0, .vocab_size = 29});
  train::pretrain({.config = "tiny",
                   .data_dir = dir / "data",
                   .out_dir = dir / "ckpt",
                   .steps = 10,
                   .seed = 2,
                   .batch_tokens = 64,
                   .max_seq_len = 64,
                   .val_tokens = 64});
  const train::GptParams p = train::GptParams::load(gpt_config_resolve((dir / "ckpt").string()),
                                                    dir / "ckpt" / "model.safetensors");
  auto bb = backbone_open(dir / "ckpt");
  const std::vector<int32_t> ids(tokens.begin(), tokens.begin() + 120);
  EXPECT_LT(rel_max_error(backbone_forward(*bb, ids, true).to_f32_vector(), trainer_logits(p, ids)),
            1e-4);
}

TEST(GptInference, MissingTensorIsNamed) {
  testing::TempDir dir;
  const train::GptParams p = random_params(gpt_preset("tiny"), 1);
  save_checkpoint(p, dir.path());
  // The same checkpoint, one tensor short.
  SafetensorsFile file = SafetensorsFile::open(dir / "model.safetensors");
  std::vector<NamedTensor> kept;
  for (const TensorInfo& t : file.tensors())
    if (t.name != "layers.3.attn.qk") kept.push_back({t.name, file.tensor(t.name)});
  safetensors_write(dir / "short.safetensors", kept);
  fs::rename(dir / "short.safetensors", dir / "model.safetensors");
  try {
    backbone_open(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found);
    EXPECT_EQ(e.context().tensor, "layers.3.attn.qk") << e.what();
  }
}

// A device backend fills as the CPU does (instantiated where a GPU is visible): a deg checkpoint
// on random gpt weights and heads, a schema with every head kind, a long document (past both
// windows) and a short one in one call.
class GptBackends : public ::testing::TestWithParam<Device> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GptBackends);

TEST_P(GptBackends, FillAnswersAsTheCpu) {  // GetParam() is Device::cuda
  testing::TempDir dir;
  GptConfig cfg = gpt_preset("tiny");
  cfg.vocab_size = 320;  // the tiny tokenizer's 259 ids
  save_checkpoint(random_params(cfg, 6), dir / "base");
  testing::write_text(dir / "base" / "tokenizer.json", testing::tiny_tokenizer_json());
  checkpoint_init({.base = dir / "base", .out = dir / "deg", .seed = 4});
  const auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "order": {"type": "string"},
      "total": {"type": "number"},
      "currency": {"enum": ["EUR", "USD", "GBP"]},
      "urgent": {"type": "boolean"},
      "items": {"type": "array", "maxItems": 3, "items": {"type": "string"}}
    }
  })");
  std::string long_doc;
  for (int i = 0; i < 12; ++i)
    long_doc += "Order CD-" + std::to_string(70 + i) + " costs 12.50 EUR. ";
  const std::vector<DocumentParts> docs = {{DocumentPart::of_text(long_doc)},
                                           {DocumentPart::of_text("Refund 3 USD now, urgent!")}};
  auto fill = [&](const std::string& device) {
    Engine e = Engine::open({.model = dir / "deg", .device = device, .gemm = "exact"});
    std::vector<nlohmann::ordered_json> out;
    for (const FillResult& r : e.fill(schema, docs)) {
      EXPECT_TRUE(r.ok()) << r.error;
      nlohmann::ordered_json fields = nlohmann::ordered_json::array();
      for (const FieldReport& f : r.fields) fields.push_back({f.path, f.confidence});
      out.push_back({{"value", r.value}, {"fields", fields}});
    }
    return out;
  };
  const auto cpu = fill("cpu"), gpu = fill("cuda");
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t d = 0; d < cpu.size(); ++d) {
    EXPECT_EQ(gpu[d]["value"], cpu[d]["value"]) << "document " << d;
    ASSERT_EQ(gpu[d]["fields"].size(), cpu[d]["fields"].size());
    for (size_t f = 0; f < cpu[d]["fields"].size(); ++f)
      EXPECT_NEAR(gpu[d]["fields"][f][1].get<double>(), cpu[d]["fields"][f][1].get<double>(), 1e-3)
          << "document " << d << " " << cpu[d]["fields"][f][0];
  }
}

INSTANTIATE_TEST_SUITE_P(Device, GptBackends, ::testing::ValuesIn(testing::gpu_devices()),
                         [](const auto&) { return std::string("cuda"); });

// On each of testing::test_devices(): the CPU, and CUDA where a GPU is visible.
class GptProperty : public ::testing::TestWithParam<Device> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    save_checkpoint(random_params(gpt_preset("tiny"), 9), dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    bb_ = backbone_open(dir_->path(), {.device = GetParam()});
    const int64_t V = bb_->spec().vocab;
    // Prefixes of 1, 2 and 61 tokens: forks right after the smear / n-gram boundary positions.
    for (int i = 0; i < 3; ++i) {
      Doc d{.prefix = random_ids(std::vector<int64_t>{1, 2, 61}[size_t(i)], V, 10 + i),
            .state = bb_->empty_state(1)};
      bb_->prefill(TokenBatch::single(d.prefix), d.state);
      docs_.push_back(std::move(d));
    }
    // 7 rows over the 3 prefixes, lengths 1..40 (past the short window).
    const int64_t lens[] = {40, 5, 17, 1, 40, 9, 13};
    for (int r = 0; r < 7; ++r) {
      rows_.push_back(random_ids(lens[r], V, 100 + r));
      prow_.push_back(int64_t(r % 3));
    }
  }

  std::vector<PrefixRef> prefixes() const {
    std::vector<PrefixRef> p;
    for (const Doc& d : docs_) p.push_back({.state = &d.state, .row = 0});
    return p;
  }

  static testing::TempDir* dir_;
  std::unique_ptr<Backbone> bb_;
  std::vector<Doc> docs_;
  std::vector<std::vector<int32_t>> rows_;
  std::vector<int64_t> prow_;
};

testing::TempDir* GptProperty::dir_ = nullptr;

TEST_P(GptProperty, ForkRowsEqualFullForward) {
  ForkState fs = bb_->fork(prefixes(), prow_, 40);
  Tensor h = bb_->fork_forward(TokenBatch::padded(rows_), fs, /*keep=*/false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    Tensor full = full_hidden(*bb_, concat(d.prefix, rows_[r]));
    const int64_t n = int64_t(rows_[r].size());
    // Same per-token arithmetic, same keys in the same order: bitwise.
    const std::vector<float> fork = row_of(h, int64_t(r), n),
                             whole = span_of(full, int64_t(d.prefix.size()), n);
    EXPECT_TRUE(bitwise_equal(fork, whole))
        << "row " << r << ", token " << testing::first_difference(fork, whole, h.dim(2));
  }
}

TEST_P(GptProperty, ChunkedPrefillEqualsDense) {
  const std::vector<int32_t> ids = random_ids(150, bb_->spec().vocab, 4);
  const Tensor dense = full_hidden(*bb_, ids);
  for (int64_t chunk : {int64_t(16), int64_t(40), int64_t(64)}) {
    bb_->set_options({.read_chunk = chunk});
    EXPECT_TRUE(bitwise_equal(full_hidden(*bb_, ids).to_f32_vector(), dense.to_f32_vector()))
        << "read_chunk " << chunk;
  }
  // Two prefill calls extend one state.
  bb_->set_options({});
  State s = bb_->empty_state(1);
  const std::vector<int32_t> a(ids.begin(), ids.begin() + 53), b(ids.begin() + 53, ids.end());
  bb_->prefill(TokenBatch::single(a), s);
  const Tensor second = bb_->prefill(TokenBatch::single(b), s);
  EXPECT_TRUE(
      bitwise_equal(row_of(second, 0, int64_t(b.size())), span_of(dense, 53, int64_t(b.size()))));
}

TEST_P(GptProperty, ForkRowsAreBitwiseBatchInvariant) {
  ForkState all = bb_->fork(prefixes(), prow_, 40);
  Tensor batched = bb_->fork_forward(TokenBatch::padded(rows_), all, false);
  std::vector<std::vector<int32_t>> rev(rows_.rbegin(), rows_.rend());
  std::vector<int64_t> rev_prow(prow_.rbegin(), prow_.rend());
  // Reordered, and with the prefixes listed in another order.
  for (int64_t& p : rev_prow) p = 2 - p;
  std::vector<PrefixRef> rev_prefixes = prefixes();
  std::reverse(rev_prefixes.begin(), rev_prefixes.end());
  ForkState back = bb_->fork(rev_prefixes, rev_prow, 40);
  Tensor reordered = bb_->fork_forward(TokenBatch::padded(rev), back, false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const int64_t n = int64_t(rows_[r].size());
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, n);
    const std::vector<float> ref =
        row_of(bb_->fork_forward(TokenBatch::single(rows_[r]), one, false), 0, n);
    EXPECT_TRUE(bitwise_equal(row_of(batched, int64_t(r), n), ref)) << "row " << r << " batched";
    EXPECT_TRUE(bitwise_equal(row_of(reordered, int64_t(rows_.size() - 1 - r), n), ref))
        << "row " << r << " reordered";
  }
}

TEST_P(GptProperty, PaddingWritesNoState) {
  ForkState all = bb_->fork(prefixes(), prow_, 40);
  bb_->fork_forward(TokenBatch::padded(rows_, /*pad_id=*/7), all, /*keep=*/true);
  const auto& specs = bb_->spec().layers;
  const int64_t Hn = bb_->spec().history;
  ASSERT_EQ(Hn, 2);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 40);
    bb_->fork_forward(TokenBatch::single(rows_[r]), one, true);
    EXPECT_EQ(all.own_len[r], one.own_len[0]);
    EXPECT_EQ(std::vector<int32_t>(all.own_history.begin() + int64_t(r) * Hn,
                                   all.own_history.begin() + int64_t(r + 1) * Hn),
              one.own_history)
        << "row " << r;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].kind != LayerKind::attention) continue;
      for (bool keys : {true, false}) {
        const Tensor t = host_copy(keys ? all.own[i].k : all.own[i].v);
        const Tensor u = host_copy(keys ? one.own[i].k : one.own[i].v);
        // Every head's real positions.
        const int64_t H = t.dim(1), D = t.dim(3), n = int64_t(rows_[r].size());
        for (int64_t h = 0; h < H; ++h) {
          const float* a = t.data<float>() + ((int64_t(r) * H + h) * t.dim(2)) * D;
          const float* b = u.data<float>() + (h * u.dim(2)) * D;
          EXPECT_TRUE(
              bitwise_equal(std::vector<float>(a, a + n * D), std::vector<float>(b, b + n * D)))
              << "layer " << i << " head " << h << " row " << r;
        }
      }
    }
  }
}

TEST_P(GptProperty, TrunkBatchWithPaddingEqualsRowsAlone) {
  std::vector<std::vector<int32_t>> docs{docs_[2].prefix, docs_[1].prefix};
  State both = bb_->empty_state(2);
  Tensor h = bb_->prefill(TokenBatch::padded(docs, 5), both);
  for (int r = 0; r < 2; ++r) {
    const Doc& d = docs_[size_t(r == 0 ? 2 : 1)];
    const int64_t n = int64_t(d.prefix.size());
    EXPECT_EQ(both.lengths[size_t(r)], n);
    EXPECT_TRUE(bitwise_equal(row_of(h, r, n), span_of(full_hidden(*bb_, d.prefix), 0, n)))
        << "doc " << r;
    EXPECT_EQ(std::vector<int32_t>(both.history.begin() + 2 * r, both.history.begin() + 2 * r + 2),
              d.state.history);
  }
}

TEST_P(GptProperty, DecodeWithKeepEqualsFullForward) {
  const Doc& d = docs_[1];
  const std::vector<int32_t>& tail = rows_[0];  // 40 tokens: a header of 3, then decode steps
  Tensor full = full_hidden(*bb_, concat(d.prefix, tail));
  ForkState fs = bb_->fork({{.state = &d.state, .row = 0}}, {0},
                           int64_t(tail.size()));  // static: decode never reallocates
  std::vector<int32_t> header(tail.begin(), tail.begin() + 3);
  Tensor h = bb_->fork_forward(TokenBatch::single(header), fs, true);
  EXPECT_TRUE(bitwise_equal(row_of(h, 0, 3), span_of(full, int64_t(d.prefix.size()), 3)));
  for (size_t t = 3; t < tail.size(); ++t) {
    Tensor step = bb_->fork_forward(TokenBatch::single({tail[t]}), fs, true, /*decode=*/true);
    EXPECT_TRUE(bitwise_equal(row_of(step, 0, 1), span_of(full, int64_t(d.prefix.size() + t), 1)))
        << "step " << t;
  }
  EXPECT_EQ(fs.own_len[0], int64_t(tail.size()));
}

INSTANTIATE_TEST_SUITE_P(Device, GptProperty, ::testing::ValuesIn(testing::test_devices()),
                         [](const auto& info) {
                           return std::string(info.param == Device::cuda ? "cuda" : "cpu");
                         });

}  // namespace
}  // namespace deg
