// Properties of the Family machinery on an LFM2 backbone (a tiny random snapshot written at test
// time: conv, conv, attention, conv, attention; bf16 weights): fork == full forward (also over
// prefixes shorter than the conv tail), chunked prefill == dense (bitwise: no op of LFM2 depends
// on how the input was cut), bitwise batch invariance of fork rows (alone, in a batch of 7 rows
// over 3 prefixes, reordered), padding exactness (a padded position writes no conv tail and no
// K/V), decoding with keep == the full forward, and named errors for broken snapshots.
#include <gtest/gtest.h>

#include "backbone_test_util.h"
#include "core/error.h"
#include "io/json.h"
#include "model/lfm2.h"
#include "model/load.h"
#include "test_util.h"
#include "tiny_model.h"

namespace deg {
namespace {

using testing::bitwise_equal;
using testing::concat;
using testing::Doc;
using testing::full_hidden;
using testing::random_ids;
using testing::rel_max_error;
using testing::row_of;
using testing::row_slice;
using testing::span_of;

// One tiny snapshot for the whole file.
const std::filesystem::path& tiny_dir() {
  static testing::TempDir* dir = [] {
    auto* d = new testing::TempDir();
    testing::write_tiny_lfm2(d->path(), 5);
    return d;
  }();
  return dir->path();
}

// Every property on each backend (the CUDA one where a GPU is visible) and GEMM precision.
class Lfm2Property : public ::testing::TestWithParam<std::tuple<GemmPrecision, Device>> {
 protected:
  GemmPrecision precision() const { return std::get<0>(GetParam()); }

  void SetUp() override {
    bb_ = backbone_open(
        tiny_dir(),
        {.precision = precision(), .device = std::get<1>(GetParam()), .read_chunk = 64});
    ASSERT_EQ(bb_->spec().family, "lfm2");
    const int64_t V = bb_->spec().vocab;
    // Prefixes of 70, 1 (shorter than the conv tail) and 130 tokens.
    for (int i = 0; i < 3; ++i) {
      Doc d{.prefix = random_ids(std::vector<int64_t>{70, 1, 130}[size_t(i)], V, 10 + i),
            .state = bb_->empty_state(1)};
      bb_->prefill(TokenBatch::single(d.prefix), d.state);
      docs_.push_back(std::move(d));
    }
    // 7 rows over the 3 prefixes, lengths 1..24.
    const int64_t lens[] = {24, 5, 17, 1, 24, 9, 13};
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

  double tol() const { return precision() == GemmPrecision::exact ? 1e-5 : 1e-2; }

  std::unique_ptr<Backbone> bb_;
  std::vector<Doc> docs_;
  std::vector<std::vector<int32_t>> rows_;
  std::vector<int64_t> prow_;
};

TEST_P(Lfm2Property, LayersAreConvAndAttentionAsConfigured) {
  const auto& layers = bb_->spec().layers;
  ASSERT_EQ(layers.size(), 5u);
  for (size_t i : {0u, 1u, 3u}) {
    EXPECT_EQ(layers[i].kind, LayerKind::recurrent);
    EXPECT_TRUE(layers[i].rec_shape.empty());
    EXPECT_EQ(layers[i].conv_kernel, 3);
    EXPECT_EQ(layers[i].conv_channels, bb_->spec().hidden);
  }
  for (size_t i : {2u, 4u}) EXPECT_EQ(layers[i].kind, LayerKind::attention);
}

TEST_P(Lfm2Property, ForkRowsEqualFullForward) {
  ForkState fs = bb_->fork(prefixes(), prow_, 24);
  Tensor h = bb_->fork_forward(TokenBatch::padded(rows_), fs, /*keep=*/false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    Tensor full = full_hidden(*bb_, concat(d.prefix, rows_[r]));
    const int64_t n = int64_t(rows_[r].size());
    EXPECT_LT(rel_max_error(row_of(h, int64_t(r), n), span_of(full, int64_t(d.prefix.size()), n)),
              tol())
        << "row " << r;
  }
}

TEST_P(Lfm2Property, ForkRowsAreBitwiseBatchInvariant) {
  ForkState all = bb_->fork(prefixes(), prow_, 24);
  Tensor batched = bb_->fork_forward(TokenBatch::padded(rows_), all, false);
  std::vector<std::vector<int32_t>> rev(rows_.rbegin(), rows_.rend());
  std::vector<int64_t> rev_prow(prow_.rbegin(), prow_.rend());
  ForkState back = bb_->fork(prefixes(), rev_prow, 24);
  Tensor reordered = bb_->fork_forward(TokenBatch::padded(rev), back, false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const int64_t n = int64_t(rows_[r].size());
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, n);
    Tensor alone = bb_->fork_forward(TokenBatch::single(rows_[r]), one, false);
    std::vector<float> ref = row_of(alone, 0, n);
    EXPECT_TRUE(bitwise_equal(row_of(batched, int64_t(r), n), ref)) << "row " << r << " batched";
    EXPECT_TRUE(bitwise_equal(row_of(reordered, int64_t(rows_.size() - 1 - r), n), ref))
        << "row " << r << " reordered";
  }
}

TEST_P(Lfm2Property, PaddingWritesNoState) {
  // Keep state for a padded batch; each row's kept conv tails and K equal those of the row run
  // alone (bitwise), so padded positions wrote nothing.
  ForkState all = bb_->fork(prefixes(), prow_, 24);
  bb_->fork_forward(TokenBatch::padded(rows_), all, /*keep=*/true);
  const auto& specs = bb_->spec().layers;
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 24);
    bb_->fork_forward(TokenBatch::single(rows_[r]), one, true);
    EXPECT_EQ(all.own_len[r], one.own_len[0]);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].kind == LayerKind::recurrent) {
        EXPECT_TRUE(bitwise_equal(row_slice(all.own[i].tail, int64_t(r), INT64_MAX),
                                  row_slice(one.own[i].tail, 0, INT64_MAX)))
            << "tail layer " << i << " row " << r;
      } else {
        for (const Tensor* t : {&all.own[i].k, &all.own[i].v}) {
          const Tensor& u = t == &all.own[i].k ? one.own[i].k : one.own[i].v;
          const int64_t n = int64_t(rows_[r].size()) * specs[i].head_dim;  // KV head 0
          EXPECT_TRUE(bitwise_equal(row_slice(*t, int64_t(r), n), row_slice(u, 0, n)))
              << "k/v layer " << i << " row " << r;
        }
      }
    }
  }
}

TEST_P(Lfm2Property, ConvTailHoldsTheLastRealInputs) {
  // A row of 5 tokens padded to 24 keeps the same tail as the row alone, and that tail differs
  // from the tail after one more token: the tail is the row's own last K-1 conv inputs.
  const Doc& d = docs_[0];
  ForkState a = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 8);
  bb_->fork_forward(TokenBatch::single(rows_[1]), a, true);
  ForkState b = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 8);
  bb_->fork_forward(TokenBatch::single(concat(rows_[1], {7})), b, true);
  EXPECT_FALSE(bitwise_equal(row_slice(a.own[0].tail, 0, INT64_MAX),
                             row_slice(b.own[0].tail, 0, INT64_MAX)));
  // The newest tail row of a equals the oldest of b after the extra token (K - 1 = 2 rows).
  const int64_t C = bb_->spec().hidden;
  std::vector<float> ta = row_slice(a.own[0].tail, 0, INT64_MAX);
  std::vector<float> tb = row_slice(b.own[0].tail, 0, INT64_MAX);
  EXPECT_TRUE(bitwise_equal(std::vector<float>(ta.begin() + C, ta.end()),
                            std::vector<float>(tb.begin(), tb.begin() + C)));
}

TEST_P(Lfm2Property, TrunkBatchWithPaddingEqualsRowsAlone) {
  std::vector<std::vector<int32_t>> docs{docs_[0].prefix, docs_[2].prefix};
  State both = bb_->empty_state(2);
  Tensor h = bb_->prefill(TokenBatch::padded(docs), both);
  for (int r = 0; r < 2; ++r) {
    const Doc& d = docs_[size_t(r == 0 ? 0 : 2)];
    const int64_t n = int64_t(d.prefix.size());
    EXPECT_EQ(both.lengths[size_t(r)], n);
    EXPECT_TRUE(bitwise_equal(row_of(h, r, n), span_of(full_hidden(*bb_, d.prefix), 0, n)))
        << "doc " << r;
    for (size_t i = 0; i < both.layers.size(); ++i) {
      const LayerState& l = both.layers[i];
      const LayerState& u = d.state.layers[i];
      if (l.tail.defined()) {
        EXPECT_TRUE(bitwise_equal(row_slice(l.tail, r, INT64_MAX), row_slice(u.tail, 0, INT64_MAX)))
            << "tail layer " << i << " doc " << r;
      } else {
        const int64_t count = n * l.k.dim(3);  // KV head 0 up to the row's length
        EXPECT_TRUE(bitwise_equal(row_slice(l.k, r, count), row_slice(u.k, 0, count)))
            << "k layer " << i << " doc " << r;
      }
    }
  }
}

TEST_P(Lfm2Property, PrefillInPiecesEqualsOnePieceBitwise) {
  const std::vector<int32_t>& ids = docs_[2].prefix;  // 130 tokens
  Tensor whole = full_hidden(*bb_, ids);
  for (int64_t split : {int64_t(1), int64_t(2), int64_t(50), int64_t(64)}) {
    State s = bb_->empty_state(1);
    std::vector<int32_t> a(ids.begin(), ids.begin() + split), b(ids.begin() + split, ids.end());
    bb_->prefill(TokenBatch::single(a), s);
    Tensor second = bb_->prefill(TokenBatch::single(b), s);  // extends s in place
    EXPECT_EQ(s.lengths[0], int64_t(ids.size()));
    EXPECT_TRUE(bitwise_equal(row_of(second, 0, int64_t(b.size())),
                              span_of(whole, split, int64_t(b.size()))))
        << "split " << split;
  }
  BackboneOptions o = bb_->options();
  for (int64_t chunk : {int64_t(48), int64_t(4096)}) {
    bb_->set_options({.precision = o.precision, .read_chunk = chunk});
    EXPECT_TRUE(bitwise_equal(full_hidden(*bb_, ids).to_f32_vector(), whole.to_f32_vector()))
        << "read chunk " << chunk;
  }
  bb_->set_options(o);
}

TEST_P(Lfm2Property, DecodeWithKeepEqualsFullForward) {
  for (int p : {0, 1}) {  // a long prefix and a one-token prefix
    const Doc& d = docs_[size_t(p)];
    const std::vector<int32_t>& tail = rows_[0];  // 24 tokens: a header of 8, then 16 steps
    Tensor full = full_hidden(*bb_, concat(d.prefix, tail));
    ForkState fs = bb_->fork({{.state = &d.state, .row = 0}}, {0},
                             int64_t(tail.size()));  // static: decode never reallocates
    std::vector<int32_t> header(tail.begin(), tail.begin() + 8);
    Tensor h = bb_->fork_forward(TokenBatch::single(header), fs, true);
    EXPECT_LT(rel_max_error(row_of(h, 0, 8), span_of(full, int64_t(d.prefix.size()), 8)), tol());
    for (size_t t = 8; t < tail.size(); ++t) {
      Tensor step = bb_->fork_forward(TokenBatch::single({tail[t]}), fs, true, /*decode=*/true);
      EXPECT_LT(rel_max_error(row_of(step, 0, 1), span_of(full, int64_t(d.prefix.size() + t), 1)),
                tol())
          << "prefix " << p << " step " << t;
    }
    EXPECT_EQ(fs.own_len[0], int64_t(tail.size()));
  }
}

TEST_P(Lfm2Property, IdleRowInADecodeBatchKeepsItsTail) {
  ForkState fs = bb_->fork(prefixes(), {0, 1}, 32);  // room for a row and a step
  bb_->fork_forward(TokenBatch::padded({rows_[0], rows_[1]}), fs, true);
  const int64_t before = fs.own_len[1];
  std::vector<float> tail_before = row_slice(fs.own[0].tail, 1, INT64_MAX);
  TokenBatch step{.ids = {3, 0}, .rows = 2, .tokens = 1, .lengths = {1, 0}};
  bb_->fork_forward(step, fs, true, true);
  EXPECT_EQ(fs.own_len[1], before);
  EXPECT_TRUE(bitwise_equal(tail_before, row_slice(fs.own[0].tail, 1, INT64_MAX)));
}

INSTANTIATE_TEST_SUITE_P(Precision, Lfm2Property,
                         ::testing::Combine(::testing::Values(GemmPrecision::exact,
                                                              GemmPrecision::bf16),
                                            ::testing::ValuesIn(testing::test_devices())),
                         testing::PrecisionOnDevice());

TEST(Lfm2Errors, MissingTensorIsNamed) {
  // A snapshot whose config asks for one more (conv) layer than the weights hold.
  testing::TempDir tmp;
  Json cfg = json_load(tiny_dir() / "config.json");
  cfg["num_hidden_layers"] = 6;
  cfg["layer_types"].push_back("conv");
  testing::write_text(tmp / "config.json", cfg.dump());
  std::filesystem::copy_file(tiny_dir() / "model.safetensors", tmp / "model.safetensors");
  try {
    backbone_open(tmp.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found);
    EXPECT_EQ(e.context().tensor, "model.layers.5.operator_norm.weight") << e.what();
  }
}

TEST(Lfm2Errors, BadConfigsAreNamed) {
  auto load = [](Json j) { return Lfm2Config::from_json(JsonConfig(j, "config.json")); };
  Json base = json_load(tiny_dir() / "config.json");
  Json bad = base;
  bad["layer_types"][1] = "mamba";
  try {
    load(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().pointer, "/layer_types") << e.what();
    EXPECT_NE(std::string(e.what()).find("mamba"), std::string::npos);
  }
  bad = base;
  bad["conv_bias"] = true;
  EXPECT_THROW(load(bad), Error);
  bad = base;
  bad["num_key_value_heads"] = 3;
  EXPECT_THROW(load(bad), Error);
}

TEST(Lfm2Config, OriginalLfm2KeysMeanWhatHfReadsThemAs) {
  // The original LFM2 config keys (block_ff_dim, theta, tie_embedding, full_attn_idxs) read as
  // the transformers-5 ones do; HF prefers the original key where both are present.
  Json modern = json_load(tiny_dir() / "config.json");
  Json original = modern;
  original.erase("intermediate_size");
  original.erase("rope_theta");
  original.erase("tie_word_embeddings");
  original.erase("layer_types");
  original["block_ff_dim"] = modern["intermediate_size"];
  original["intermediate_size"] = 4096;  // ignored: block_ff_dim wins
  original["theta"] = modern["rope_theta"];
  original["tie_embedding"] = modern["tie_word_embeddings"];
  original["full_attn_idxs"] = {2, 4};
  Lfm2Config a = Lfm2Config::from_json(JsonConfig(modern, "a"));
  Lfm2Config b = Lfm2Config::from_json(JsonConfig(original, "b"));
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tied, b.tied);
  EXPECT_EQ(a.layers, b.layers);
  // transformers 5 may nest the rotary settings, flat or per layer type.
  Json nested = modern;
  nested.erase("rope_theta");
  nested["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 7e5}}}};
  EXPECT_EQ(Lfm2Config::from_json(JsonConfig(nested, "c")).rope_theta, 7e5);
  nested["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 9e5}};
  EXPECT_EQ(Lfm2Config::from_json(JsonConfig(nested, "d")).rope_theta, 9e5);
  // A multimodal (lfm2_vl) snapshot nests the text model's config.
  Json vl = {{"model_type", "lfm2_vl"}, {"text_config", modern}};
  Lfm2Config c = Lfm2Config::from_json(JsonConfig(vl, "e"));
  EXPECT_EQ(c.layers, a.layers);
  EXPECT_EQ(c.ffn, a.ffn);
}

}  // namespace
}  // namespace deg
