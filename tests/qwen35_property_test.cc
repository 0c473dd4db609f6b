// Properties of the Family machinery on a real (tiny, HF-made) Qwen3.5 model: fork == full
// forward, chunked prefill == dense, bitwise batch invariance of fork rows (alone, in a batch of 7
// rows over 3 prefixes, reordered), padding exactness (a padded position changes no state), and
// decoding with keep == the full forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backbone_test_util.h"
#include "io/safetensors.h"
#include "kernels/delta_rule.h"
#include "kernels/ops.h"
#include "model/load.h"
#include "test_util.h"
#include "tiny_model.h"

namespace deg {
namespace {

using testing::bitwise_equal;
using testing::concat;
using testing::Doc;
using testing::full_hidden;
using testing::kept_rec;
using testing::random_ids;
using testing::rel_max_error;
using testing::row_of;
using testing::span_of;

std::unique_ptr<Backbone> open_fixture(const std::string& name, BackboneOptions opts = {}) {
  return backbone_open(testing::fixture_path("qwen35/" + name), opts);
}

// Every property on each backend (the CUDA one where a GPU is visible) and GEMM precision.
class Qwen35Property : public ::testing::TestWithParam<std::tuple<GemmPrecision, Device>> {
 protected:
  GemmPrecision precision() const { return std::get<0>(GetParam()); }
  bool exact() const { return precision() == GemmPrecision::exact; }

  void SetUp() override {
    // bf16 weights so the bf16 dot-product GEMM path is exercised too.
    bb_ = open_fixture("lllf_bf16", {.precision = precision(), .device = std::get<1>(GetParam())});
    const int64_t V = bb_->spec().vocab;
    for (int i = 0; i < 3; ++i) {
      Doc d{.prefix = random_ids(std::vector<int64_t>{70, 41, 130}[size_t(i)], V, 10 + i),
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

  std::unique_ptr<Backbone> bb_;
  std::vector<Doc> docs_;
  std::vector<std::vector<int32_t>> rows_;
  std::vector<int64_t> prow_;
};

TEST_P(Qwen35Property, ForkRowsEqualFullForward) {
  ForkState fs = bb_->fork(prefixes(), prow_, 24);
  Tensor h = bb_->fork_forward(TokenBatch::padded(rows_), fs, /*keep=*/false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    Tensor full = full_hidden(*bb_, concat(d.prefix, rows_[r]));
    const int64_t n = int64_t(rows_[r].size());
    EXPECT_LT(rel_max_error(row_of(h, int64_t(r), n), span_of(full, int64_t(d.prefix.size()), n)),
              exact() ? 1e-5 : 1e-2)
        << "row " << r;
  }
}

TEST_P(Qwen35Property, ForkRowsAreBitwiseBatchInvariant) {
  ForkState all = bb_->fork(prefixes(), prow_, 24);
  Tensor batched = bb_->fork_forward(TokenBatch::padded(rows_), all, false);
  // Reordered batch: rows reversed.
  std::vector<std::vector<int32_t>> rev(rows_.rbegin(), rows_.rend());
  std::vector<int64_t> rev_prow(prow_.rbegin(), prow_.rend());
  ForkState back = bb_->fork(prefixes(), rev_prow, 24);
  Tensor reordered = bb_->fork_forward(TokenBatch::padded(rev), back, false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const int64_t n = int64_t(rows_[r].size());
    // Alone: one row over its own prefix only.
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, n);
    Tensor alone = bb_->fork_forward(TokenBatch::single(rows_[r]), one, false);
    std::vector<float> ref = row_of(alone, 0, n);
    EXPECT_TRUE(bitwise_equal(row_of(batched, int64_t(r), n), ref)) << "row " << r << " batched";
    EXPECT_TRUE(bitwise_equal(row_of(reordered, int64_t(rows_.size() - 1 - r), n), ref))
        << "row " << r << " reordered";
  }
}

// Picked tokens (a row's last token and a few inside it, out of order, one twice) are the same
// bits as those tokens of the whole result.
TEST_P(Qwen35Property, PickedForkTokensAreTheWholeResultsRows) {
  const TokenBatch batch = TokenBatch::padded(rows_);
  ForkState all = bb_->fork(prefixes(), prow_, 24);
  const Tensor whole = bb_->fork_forward(batch, all, false);
  std::vector<int64_t> picks;
  for (size_t r = rows_.size(); r-- > 0;) {
    const int64_t base = int64_t(r) * batch.tokens, n = int64_t(rows_[r].size());
    picks.push_back(base + n - 1);
    if (n > 3) picks.push_back(base + n / 3);
  }
  picks.push_back(picks.front());
  ForkState again = bb_->fork(prefixes(), prow_, 24);
  const Tensor picked = bb_->fork_forward(batch, again, false, false, picks);
  const int64_t C = bb_->spec().hidden;
  ASSERT_EQ(picked.numel(), int64_t(picks.size()) * C);
  for (size_t i = 0; i < picks.size(); ++i) {
    const float* a = picked.data<float>() + int64_t(i) * C;
    const float* b = whole.data<float>() + picks[i] * C;
    EXPECT_TRUE(bitwise_equal(std::vector<float>(a, a + C), std::vector<float>(b, b + C)))
        << "pick " << i << " (token " << picks[i] << ")";
  }
  EXPECT_THROW(bb_->fork_forward(batch, again, false, false, std::vector<int64_t>{-1}), Error);
}

TEST_P(Qwen35Property, PaddingWritesNoState) {
  // Keep state for a padded batch; each row's kept state equals the state of the row run alone
  // (bitwise), so padded positions wrote nothing.
  ForkState all = bb_->fork(prefixes(), prow_, 24);
  bb_->fork_forward(TokenBatch::padded(rows_), all, /*keep=*/true);
  const auto& specs = bb_->spec().layers;
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 24);
    bb_->fork_forward(TokenBatch::single(rows_[r]), one, true);
    EXPECT_EQ(all.own_len[r], one.own_len[0]);
    for (size_t i = 0; i < specs.size(); ++i) {
      auto slice = [](const Tensor& d, int64_t row, int64_t count) {
        const Tensor t = host_copy(d);
        const int64_t per = t.numel() / t.dim(0);
        const float* p = t.data<float>() + row * per;
        return std::vector<float>(p, p + std::min(per, count));
      };
      if (specs[i].kind == LayerKind::recurrent) {
        EXPECT_TRUE(bitwise_equal(kept_rec(all, i, int64_t(r)), kept_rec(one, i, 0)))
            << "rec layer " << i << " row " << r;
        EXPECT_TRUE(bitwise_equal(slice(all.own[i].tail, int64_t(r), INT64_MAX),
                                  slice(one.own[i].tail, 0, INT64_MAX)))
            << "tail layer " << i << " row " << r;
      } else {
        // Own K of head 0: the row's real positions.
        const int64_t n = int64_t(rows_[r].size()) * specs[i].head_dim;
        std::vector<float> a = slice(all.own[i].k, int64_t(r), n);
        std::vector<float> b = slice(one.own[i].k, 0, n);
        EXPECT_TRUE(bitwise_equal(a, b)) << "k layer " << i << " row " << r;
      }
    }
  }
}

TEST_P(Qwen35Property, TrunkBatchWithPaddingEqualsRowsAlone) {
  // Prefill two documents of different lengths as one padded batch.
  std::vector<std::vector<int32_t>> docs{docs_[0].prefix, docs_[2].prefix};
  State both = bb_->empty_state(2);
  Tensor h = bb_->prefill(TokenBatch::padded(docs), both);
  for (int r = 0; r < 2; ++r) {
    const Doc& d = docs_[size_t(r == 0 ? 0 : 2)];
    const int64_t n = int64_t(d.prefix.size());
    EXPECT_EQ(both.lengths[size_t(r)], n);
    Tensor alone = full_hidden(*bb_, d.prefix);
    EXPECT_TRUE(bitwise_equal(row_of(h, r, n), span_of(alone, 0, n))) << "doc " << r;
    for (size_t i = 0; i < both.layers.size(); ++i) {
      const LayerState& l = both.layers[i];
      const Tensor t = host_copy(l.rec.defined() ? l.rec : l.k);
      const Tensor u = host_copy(l.rec.defined() ? d.state.layers[i].rec : d.state.layers[i].k);
      const int64_t per = t.numel() / t.dim(0);
      // Recurrent state whole; K of head 0 up to the row's length.
      const int64_t count = l.rec.defined() ? per : n * t.dim(3);
      std::vector<float> a(t.data<float>() + r * per, t.data<float>() + r * per + count);
      std::vector<float> b(u.data<float>(), u.data<float>() + count);
      EXPECT_TRUE(bitwise_equal(a, b)) << "layer " << i << " doc " << r;
    }
  }
}

TEST_P(Qwen35Property, PrefillInPiecesEqualsOnePiece) {
  const std::vector<int32_t>& ids = docs_[2].prefix;  // 130 tokens
  Tensor whole = full_hidden(*bb_, ids);
  for (int64_t split : {int64_t(64), int64_t(50)}) {
    State s = bb_->empty_state(1);
    std::vector<int32_t> a(ids.begin(), ids.begin() + split), b(ids.begin() + split, ids.end());
    bb_->prefill(TokenBatch::single(a), s);
    Tensor second = bb_->prefill(TokenBatch::single(b), s);  // extends s in place
    EXPECT_EQ(s.lengths[0], int64_t(ids.size()));
    std::vector<float> got = row_of(second, 0, int64_t(b.size()));
    std::vector<float> want = span_of(whole, split, int64_t(b.size()));
    if (split % kDeltaRuleChunk == 0) {
      // Same delta-rule chunk boundaries and key order: bitwise.
      EXPECT_TRUE(bitwise_equal(got, want)) << "split " << split;
    } else {
      EXPECT_LT(rel_max_error(got, want), exact() ? 1e-5 : 1e-2);
    }
  }
  // Read chunk not a multiple of 64: same math, different delta-rule chunking.
  BackboneOptions o = bb_->options();
  bb_->set_options({.precision = o.precision, .read_chunk = 48});
  Tensor odd = full_hidden(*bb_, ids);
  bb_->set_options(o);
  EXPECT_LT(rel_max_error(odd.to_f32_vector(), whole.to_f32_vector()), exact() ? 1e-5 : 1e-2);
}

// prefill(on_backend) leaves the hidden states where the backend computes (device memory on a
// GPU): the same bits as the host result, read whole, in chunks (read_chunk 48: the final norm
// writes each chunk at its offset) and as a padded batch of two rows.
TEST_P(Qwen35Property, PrefillOnTheBackendIsTheHostResult) {
  const Ops& ops = bb_->family().ops();
  const BackboneOptions o = bb_->options();
  for (int64_t chunk : {int64_t(0), int64_t(48)}) {
    if (chunk > 0) bb_->set_options({.precision = o.precision, .read_chunk = chunk});
    const TokenBatch batch = TokenBatch::padded({docs_[2].prefix, docs_[1].prefix});
    State host_state = bb_->empty_state(2), backend_state = bb_->empty_state(2);
    const Tensor want = bb_->prefill(batch, host_state);
    const Tensor got = bb_->prefill(batch, backend_state, {}, /*on_backend=*/true);
    ASSERT_EQ(got.device(), ops.device());
    ASSERT_EQ(got.shape(), want.shape());
    std::vector<float> back(size_t(got.numel()));
    ops.to_host(back.data(), got.data<float>(), back.size() * sizeof(float));
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t n = batch.lengths[size_t(r)], C = want.dim(2);
      const std::vector<float> w = row_of(want, r, n);
      const std::vector<float> g(back.begin() + r * want.dim(1) * C,
                                 back.begin() + (r * want.dim(1) + n) * C);
      EXPECT_TRUE(bitwise_equal(g, w)) << "row " << r << " read chunk " << chunk;
    }
  }
  bb_->set_options(o);
}

TEST_P(Qwen35Property, DecodeWithKeepEqualsFullForward) {
  const Doc& d = docs_[1];
  const std::vector<int32_t>& tail = rows_[0];  // 24 tokens: a header of 8, then 16 decode steps
  Tensor full = full_hidden(*bb_, concat(d.prefix, tail));
  ForkState fs = bb_->fork({{.state = &d.state, .row = 0}}, {0},
                           int64_t(tail.size()));  // static: decode never reallocates
  std::vector<const std::byte*> kv;  // each attention layer's own K, fixed at fork time
  for (const LayerState& l : fs.own) kv.push_back(l.k.defined() ? l.k.raw() : nullptr);
  std::vector<int32_t> header(tail.begin(), tail.begin() + 8);
  Tensor h = bb_->fork_forward(TokenBatch::single(header), fs, true);
  const double tol = exact() ? 1e-5 : 1e-2;
  EXPECT_LT(rel_max_error(row_of(h, 0, 8), span_of(full, int64_t(d.prefix.size()), 8)), tol);
  for (size_t t = 8; t < tail.size(); ++t) {
    Tensor step = bb_->fork_forward(TokenBatch::single({tail[t]}), fs, true, /*decode=*/true);
    EXPECT_LT(rel_max_error(row_of(step, 0, 1), span_of(full, int64_t(d.prefix.size() + t), 1)),
              tol)
        << "step " << t;
  }
  EXPECT_EQ(fs.own_len[0], int64_t(tail.size()));
  for (size_t i = 0; i < kv.size(); ++i) {
    if (kv[i]) {
      EXPECT_EQ(fs.own[i].k.raw(), kv[i]) << "layer " << i << " K/V moved";
    }
  }
  // The forks were made for tail.size() tokens: one more is refused, not grown into.
  EXPECT_THROW(bb_->fork_forward(TokenBatch::single({tail[0]}), fs, true, true), Error);
}

TEST_P(Qwen35Property, IdleRowInADecodeBatchKeepsItsState) {
  // Two rows decode; row 1 is idle (length 0) for one step and must not move.
  ForkState fs = bb_->fork(prefixes(), {0, 1}, 32);  // room for a row and a step
  bb_->fork_forward(TokenBatch::padded({rows_[0], rows_[1]}), fs, true);
  const int64_t before = fs.own_len[1];
  TokenBatch step{.ids = {3, 0}, .rows = 2, .tokens = 1, .lengths = {1, 0}};
  const std::vector<float> rec_before = kept_rec(fs, 0, 1);
  bb_->fork_forward(step, fs, true, true);
  EXPECT_EQ(fs.own_len[1], before);
  EXPECT_TRUE(bitwise_equal(rec_before, kept_rec(fs, 0, 1)));
}

// Fork rows that carry their delta-rule states as history (ForkState::hist_cap) against rows with
// states of their own, through kept passes that append, decode steps with an idle row, passes
// not kept (one of 70 tokens over a history: its chunked form reads the history folded first),
// passes past the history (the fold: over a 40-token pass, before a 70-token one's chunked form,
// at one token, from a full history of 63) and steps after them: bitwise where the backend prefers
// histories (CUDA: its recurrence replays them with its own operations), else to rounding (the CPU
// appends through the recurrence where a state of its own takes the chunked form).
TEST_P(Qwen35Property, ForkHistoryGivesTheStateFormsResults) {
  const BackboneOptions o = bb_->options();
  const int64_t V = bb_->spec().vocab;
  const std::vector<int32_t> forty = random_ids(40, V, 7), seventy = random_ids(70, V, 8),
                             thirtynine = random_ids(39, V, 9);
  auto run = [&](ForkHistory history) {
    BackboneOptions h = o;
    h.fork_history = history;
    bb_->set_options(h);
    std::vector<std::vector<float>> outs;
    auto keep = [&](const Tensor& t) {
      outs.emplace_back(t.data<float>(), t.data<float>() + t.numel());
    };
    ForkState fs = bb_->fork(prefixes(), {0, 1, 2}, 160);
    EXPECT_EQ(fs.hist_cap, history == ForkHistory::always ? kDeltaHistoryMax : 0);
    auto steps = [&](int count, int idle) {
      for (int t = 0; t < count; ++t) {
        TokenBatch step{.ids = {int32_t(3 + t), int32_t(7 + t), int32_t(11 + t)},
                        .rows = 3,
                        .tokens = 1,
                        .lengths = {1, t == idle ? 0 : 1, 1}};
        keep(bb_->fork_forward(step, fs, true, true));
      }
    };
    keep(bb_->fork_forward(TokenBatch::padded({rows_[0], rows_[1], rows_[2]}), fs, true));
    steps(4, 2);  // own tokens 28, 8, 21
    keep(bb_->fork_forward(TokenBatch::padded({rows_[3], seventy, rows_[5]}), fs, false));
    keep(bb_->fork_forward(TokenBatch::padded({forty, seventy, {5}}), fs, true));  // 68, 78, 22
    steps(2, -1);
    keep(bb_->fork_forward(TokenBatch::padded({{1}, {2}, thirtynine}), fs, true));  // 71, 81, 63
    steps(2, 0);  // row 2 folds at one token
    bb_->set_options(o);
    return outs;
  };
  const std::vector<std::vector<float>> state = run(ForkHistory::never),
                                        history = run(ForkHistory::always);
  ASSERT_EQ(state.size(), history.size());
  const bool bitwise = std::get<1>(GetParam()) == Device::cuda;
  for (size_t i = 0; i < state.size(); ++i) {
    if (bitwise) {
      EXPECT_TRUE(bitwise_equal(state[i], history[i])) << "pass " << i;
    } else {
      EXPECT_LT(rel_max_error(history[i], state[i]), exact() ? 1e-5 : 1e-2) << "pass " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, Qwen35Property,
                         ::testing::Combine(::testing::Values(GemmPrecision::exact,
                                                              GemmPrecision::bf16),
                                            ::testing::ValuesIn(testing::test_devices())),
                         testing::PrecisionOnDevice());

// A bf16 checkpoint with some projections kept in f32 (in_proj_a and v_proj here) under bf16 dot
// products: an input norm whose projections are not all bf16 writes f32 rows (bf16 rows serve
// bf16 weights only, GemmArgs::xb), so it runs on every backend, and its hidden states stay
// within the bf16 tolerance of the all-bf16 model's.
TEST(Qwen35MixedDtypes, F32ProjectionsBesideBf16OnesRun) {
  testing::TempDir t;
  const std::filesystem::path src = testing::fixture_path("qwen35/lllf_bf16");
  const SafetensorsFile f = SafetensorsFile::open(src / "model.safetensors");
  std::vector<NamedTensor> tensors;
  int widened = 0;
  for (const TensorInfo& i : f.tensors()) {
    Tensor x = f.tensor(i.name);
    const bool keep_f32 = i.name.ends_with("in_proj_a.weight") || i.name.ends_with("v_proj.weight");
    if (keep_f32 && i.dtype == DType::bf16) {
      x = x.to(DType::f32);
      ++widened;
    }
    tensors.push_back({i.name, x});
  }
  ASSERT_GE(widened, 2);
  safetensors_write(t / "model.safetensors", tensors, f.metadata());
  std::filesystem::copy_file(src / "config.json", t / "config.json");
  for (Device d : testing::test_devices()) {
    const BackboneOptions o{.precision = GemmPrecision::bf16, .device = d};
    const auto mixed = backbone_open(t.path(), o);
    const auto all_bf16 = backbone_open(src, o);
    const std::vector<int32_t> ids = random_ids(40, mixed->spec().vocab, 5);
    const Tensor a = full_hidden(*mixed, ids), b = full_hidden(*all_bf16, ids);
    EXPECT_LT(rel_max_error(a, b), 2e-2) << (d == Device::cuda ? "cuda" : "cpu");
    EXPECT_GT(rel_max_error(a, b), 0.0)
        << (d == Device::cuda ? "cuda" : "cpu") << ": the f32 weights changed nothing";
  }
}

// The LM head runs in blocks of vocabulary rows (Qwen3.5-0.8B's [248320, 1024] head has no
// pinned bf16 cuBLASLt algorithm as a whole): over a vocabulary of 70,001 (two full blocks and
// a partial one) each logit is its row's dot product with its head row, and a row's logits are
// bitwise the same alone and among others.
TEST_P(Qwen35Property, LmHeadOverALargeVocabulary) {
  testing::TempDir t;
  testing::write_tiny_qwen35(t / "m", 5, R"({"vocab_size": 70001})", "");
  const auto bb =
      backbone_open(t / "m", {.precision = precision(), .device = std::get<1>(GetParam())});
  const int64_t C = bb->spec().hidden, M = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> h(size_t(M * C));
  for (float& x : h) x = normal(rng);
  const Tensor logits = bb->lm_logits(Tensor::from_vector(h, {M, C}));
  ASSERT_EQ(logits.dim(1), 70001);
  // The head as the host reads it (on a GPU the backbone's copy is in device memory).
  const auto on_host = backbone_open(t / "m", {});
  const std::vector<float> head = on_host->family().lm_head().to_f32_vector(),
                           got = logits.to_f32_vector();
  double worst = 0, largest = 0;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t v = 0; v < 70001; ++v) {
      double want = 0;
      for (int64_t c = 0; c < C; ++c)
        want += double(h[size_t(r * C + c)]) * head[size_t(v * C + c)];
      worst = std::max(worst, std::abs(want - got[size_t(r * 70001 + v)]));
      largest = std::max(largest, std::abs(want));
    }
  EXPECT_LT(worst / largest, exact() ? 1e-5 : 2e-2);  // bf16: the hidden rounded to bf16
  const std::vector<float> alone(h.begin() + 2 * C, h.begin() + 3 * C);
  const std::vector<float> row = bb->lm_logits(Tensor::from_vector(alone, {1, C})).to_f32_vector();
  EXPECT_TRUE(
      bitwise_equal(row, std::vector<float>(got.begin() + 2 * 70001, got.begin() + 3 * 70001)));
  // lm_picks reads the same logits where they are: each row's first largest and next logits.
  const std::vector<Backbone::LogitPick> picks = bb->lm_picks(Tensor::from_vector(h, {M, C}));
  ASSERT_EQ(int64_t(picks.size()), M);
  for (int64_t r = 0; r < M; ++r) {
    const float* l = got.data() + r * 70001;
    const int64_t best = std::max_element(l, l + 70001) - l;
    EXPECT_EQ(picks[size_t(r)].best, best) << r;
    EXPECT_EQ(picks[size_t(r)].best_logit, l[best]) << r;
    EXPECT_FALSE(picks[size_t(r)].bad) << r;
    double sum = 0;
    for (int64_t v = 0; v < 70001; ++v) sum += std::exp(double(l[v]) - double(l[best]));
    EXPECT_NEAR(picks[size_t(r)].sum, sum, 1e-9 * sum) << r;
    EXPECT_NEAR(picks[size_t(r)].log_prob(l[best]), -std::log(sum), 1e-9) << r;
  }
  // Among the first 50,000 ids only (a tokenizer's ids below a padded vocabulary).
  const std::vector<Backbone::LogitPick> first =
      bb->lm_picks(Tensor::from_vector(h, {M, C}), 50000);
  for (int64_t r = 0; r < M; ++r) {
    const float* l = got.data() + r * 70001;
    const int64_t best = std::max_element(l, l + 50000) - l;
    EXPECT_EQ(first[size_t(r)].best, best) << r;
    double sum = 0;
    for (int64_t v = 0; v < 50000; ++v) sum += std::exp(double(l[v]) - double(l[best]));
    EXPECT_NEAR(first[size_t(r)].sum, sum, 1e-9 * sum) << r;
  }
}

TEST(Qwen35Errors, BadBatchesAreUserErrors) {
  auto bb = open_fixture("fl_tied");
  State s = bb->empty_state(1);
  EXPECT_THROW(bb->prefill(TokenBatch::single({1, 2, 99999}), s), Error);
  State two = bb->empty_state(2);
  EXPECT_THROW(bb->prefill(TokenBatch::single({1, 2}), two), Error);
  bb->prefill(TokenBatch::single({1, 2, 3}), s);
  EXPECT_THROW(bb->fork({{.state = &s, .row = 0}}, {1}, 4), Error);
}

TEST(Qwen35Errors, MissingTensorIsNamed) {
  // A snapshot whose config asks for one more layer than the weights hold.
  testing::TempDir tmp;
  const auto src = testing::fixture_path("qwen35/ll_conv3");
  std::string cfg = testing::read_text(src / "config.json");
  auto at = cfg.find("\"num_hidden_layers\": 2");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 22, "\"num_hidden_layers\": 3");
  at = cfg.find("\"layer_types\": [");
  ASSERT_NE(at, std::string::npos);
  cfg.insert(at + 16, "\"linear_attention\", ");
  testing::write_text(tmp / "config.json", cfg);
  std::filesystem::copy_file(src / "model.safetensors", tmp / "model.safetensors");
  try {
    backbone_open(tmp.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found);
    EXPECT_EQ(e.context().tensor, "model.layers.2.input_layernorm.weight") << e.what();
  }
}

}  // namespace
}  // namespace deg
