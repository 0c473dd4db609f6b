// Properties of the Family machinery on a tiny random Gemma 4 (window 8, K/V-sharing layers,
// per-layer embeddings, double-wide MLP; tests/tiny_model.h): fork == full forward (prefixes
// far longer than the window), chunked prefill == dense (bitwise), bitwise batch invariance of
// fork rows (alone, in a batch of 7 rows over 3 prefixes, reordered), padding exactness,
// decoding with keep == the full forward, and bounded sliding state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backbone_test_util.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/json.h"
#include "kernels/gemm.h"
#include "model/gemma4.h"
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
using testing::span_of;

constexpr int64_t kWindow = 8;

// Row `row`, KV head 0, positions [0, n) of a [B, Hkv, cap, D] K/V buffer (on any device).
std::vector<float> kv_of(const Tensor& t, int64_t row, int64_t n) {
  const Tensor h = host_copy(t);
  const int64_t per = h.numel() / h.dim(0);
  const float* p = h.data<float>() + row * per;
  return std::vector<float>(p, p + n * h.dim(3));
}

// The positions a sliding layer's trunk keeps of n (backbone.cc): the last window - 1, and
// before them back to a multiple of 64.
int64_t sliding_kept(int64_t n) {
  return n <= kWindow - 1 ? n : n - (n - (kWindow - 1)) / 64 * 64;
}

// On each of testing::test_devices() (the CPU, and CUDA where a GPU is visible).
class Gemma4Property : public ::testing::TestWithParam<std::tuple<GemmPrecision, Device>> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_gemma4(*dir_ / "text", 5);
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    bb_ = backbone_open(*dir_ / "text",
                        {.precision = precision(), .device = device(), .read_chunk = 64});
    const int64_t V = bb_->spec().vocab;
    for (int i = 0; i < 3; ++i) {
      Doc d{.prefix = random_ids(std::vector<int64_t>{70, 41, 130}[size_t(i)], V, 10 + i),
            .state = bb_->empty_state(1)};
      bb_->prefill(TokenBatch::single(d.prefix), d.state);
      docs_.push_back(std::move(d));
    }
    // 7 rows over the 3 prefixes, lengths 1..24 (several longer than the window).
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
  GemmPrecision precision() const { return std::get<0>(GetParam()); }
  Device device() const { return std::get<1>(GetParam()); }
  double tolerance() const { return precision() == GemmPrecision::exact ? 1e-5 : 1e-2; }

  static testing::TempDir* dir_;
  std::unique_ptr<Backbone> bb_;
  std::vector<Doc> docs_;
  std::vector<std::vector<int32_t>> rows_;
  std::vector<int64_t> prow_;
};

testing::TempDir* Gemma4Property::dir_ = nullptr;

TEST_P(Gemma4Property, SpecDeclaresWindowsAndSharing) {
  const auto& l = bb_->spec().layers;
  ASSERT_EQ(l.size(), 6u);
  const int64_t windows[] = {kWindow, kWindow, 0, kWindow, kWindow, 0};
  const int sources[] = {-1, -1, -1, -1, 3, 2};
  const int64_t dims[] = {16, 16, 32, 16, 16, 32};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(l[i].window, windows[i]) << i;
    EXPECT_EQ(l[i].kv_source, sources[i]) << i;
    EXPECT_EQ(l[i].head_dim, dims[i]) << i;
  }
  EXPECT_EQ(bb_->spec().stream_width(), 64 + 6 * 8);
  EXPECT_EQ(bb_->spec().logit_softcap, 5.0f);
}

TEST_P(Gemma4Property, ForkRowsEqualFullForward) {
  ForkState fs = bb_->fork(prefixes(), prow_, 24);
  Tensor h = bb_->fork_forward(TokenBatch::padded(rows_), fs, /*keep=*/false);
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    Tensor full = full_hidden(*bb_, concat(d.prefix, rows_[r]));
    const int64_t n = int64_t(rows_[r].size());
    EXPECT_LT(rel_max_error(row_of(h, int64_t(r), n), span_of(full, int64_t(d.prefix.size()), n)),
              tolerance())
        << "row " << r;
  }
}

TEST_P(Gemma4Property, ForkRowsAreBitwiseBatchInvariant) {
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

TEST_P(Gemma4Property, PaddingWritesNoState) {
  // Keep state for a padded batch; each row's own K/V equal those of the row run alone.
  ForkState all = bb_->fork(prefixes(), prow_, 24);
  bb_->fork_forward(TokenBatch::padded(rows_), all, /*keep=*/true);
  const auto& specs = bb_->spec().layers;
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Doc& d = docs_[size_t(prow_[r])];
    ForkState one = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 24);
    bb_->fork_forward(TokenBatch::single(rows_[r]), one, true);
    EXPECT_EQ(all.own_len[r], one.own_len[0]);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].kv_source >= 0) {
        EXPECT_FALSE(all.own[i].k.defined()) << "shared layer " << i << " owns K/V";
        continue;
      }
      const int64_t n = int64_t(rows_[r].size());
      EXPECT_TRUE(bitwise_equal(kv_of(all.own[i].k, int64_t(r), n), kv_of(one.own[i].k, 0, n)))
          << "k layer " << i << " row " << r;
      EXPECT_TRUE(bitwise_equal(kv_of(all.own[i].v, int64_t(r), n), kv_of(one.own[i].v, 0, n)))
          << "v layer " << i << " row " << r;
    }
  }
}

TEST_P(Gemma4Property, TrunkBatchWithPaddingEqualsRowsAlone) {
  std::vector<std::vector<int32_t>> docs{docs_[0].prefix, docs_[2].prefix};
  State both = bb_->empty_state(2);
  Tensor h = bb_->prefill(TokenBatch::padded(docs), both);
  const auto& specs = bb_->spec().layers;
  for (int r = 0; r < 2; ++r) {
    const Doc& d = docs_[size_t(r == 0 ? 0 : 2)];
    const int64_t n = int64_t(d.prefix.size());
    EXPECT_EQ(both.lengths[size_t(r)], n);
    Tensor alone = full_hidden(*bb_, d.prefix);
    EXPECT_TRUE(bitwise_equal(row_of(h, r, n), span_of(alone, 0, n))) << "doc " << r;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].kv_source >= 0) continue;
      // Sliding layers keep their last window - 1 positions (and back to a multiple of 64),
      // global layers all of them.
      const int64_t kept = specs[i].window > 0 ? sliding_kept(n) : n;
      EXPECT_TRUE(
          bitwise_equal(kv_of(both.layers[i].k, r, kept), kv_of(d.state.layers[i].k, 0, kept)))
          << "layer " << i << " doc " << r;
    }
  }
}

TEST_P(Gemma4Property, PrefillInPiecesEqualsOnePieceBitwise) {
  const std::vector<int32_t>& ids = docs_[2].prefix;  // 130 tokens
  Tensor whole = full_hidden(*bb_, ids);
  for (int64_t split : {int64_t(64), int64_t(50), int64_t(5)}) {
    State s = bb_->empty_state(1);
    std::vector<int32_t> a(ids.begin(), ids.begin() + split), b(ids.begin() + split, ids.end());
    bb_->prefill(TokenBatch::single(a), s);
    Tensor second = bb_->prefill(TokenBatch::single(b), s);  // extends s in place
    EXPECT_EQ(s.lengths[0], int64_t(ids.size()));
    EXPECT_TRUE(bitwise_equal(row_of(second, 0, int64_t(b.size())),
                              span_of(whole, split, int64_t(b.size()))))
        << "split " << split;
  }
  // One read of the whole input, and reads of 48 and of fewer tokens than the window.
  const BackboneOptions o = bb_->options();
  for (int64_t chunk : {int64_t(4096), int64_t(48), int64_t(5)}) {
    bb_->set_options({.precision = o.precision, .read_chunk = chunk});
    EXPECT_TRUE(bitwise_equal(full_hidden(*bb_, ids).to_f32_vector(), whole.to_f32_vector()))
        << "read chunk " << chunk;
  }
  bb_->set_options(o);
}

TEST_P(Gemma4Property, SlidingStateIsBounded) {
  // A trunk keeps window - 1 positions per sliding layer, and before them back to a multiple of
  // 64 (at most 63 more), whatever its length; global layers keep all; K/V-sharing layers keep
  // none.
  const auto& specs = bb_->spec().layers;
  for (const Doc& d : docs_) {
    for (size_t i = 0; i < specs.size(); ++i) {
      const Tensor& k = d.state.layers[i].k;
      if (specs[i].kv_source >= 0) {
        EXPECT_FALSE(k.defined()) << i;
      } else if (specs[i].window > 0) {
        const int64_t n = int64_t(d.prefix.size());
        EXPECT_EQ(k.dim(2), sliding_kept(n)) << i;
        EXPECT_EQ(d.state.layers[i].v.dim(2), sliding_kept(n)) << i;
        EXPECT_LE(k.dim(2), kWindow - 1 + 63) << i;
      } else {
        EXPECT_EQ(k.dim(2), int64_t(d.prefix.size())) << i;
      }
    }
  }
  // A 700-token document keeps the same sliding state, and a fork over it agrees with the
  // full forward.
  std::vector<int32_t> long_doc = random_ids(700, bb_->spec().vocab, 77);
  State s = bb_->empty_state(1);
  bb_->prefill(TokenBatch::single(long_doc), s);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].window > 0 && specs[i].kv_source < 0) {
      EXPECT_EQ(s.layers[i].k.dim(2), sliding_kept(700)) << i;
    }
  }
  ForkState fs = bb_->fork({{.state = &s, .row = 0}}, {0}, 4);
  Tensor h = bb_->fork_forward(TokenBatch::single({7, 8, 9}), fs, false);
  Tensor full = full_hidden(*bb_, concat(long_doc, {7, 8, 9}));
  EXPECT_LT(rel_max_error(row_of(h, 0, 3), span_of(full, 700, 3)), tolerance());
}

TEST_P(Gemma4Property, DecodeWithKeepEqualsFullForward) {
  const Doc& d = docs_[1];
  const std::vector<int32_t>& tail = rows_[0];  // 24 tokens: a header of 8, then 16 decode steps
  Tensor full = full_hidden(*bb_, concat(d.prefix, tail));
  ForkState fs = bb_->fork({{.state = &d.state, .row = 0}}, {0},
                           int64_t(tail.size()));  // static: decode never reallocates
  std::vector<int32_t> header(tail.begin(), tail.begin() + 8);
  Tensor h = bb_->fork_forward(TokenBatch::single(header), fs, true);
  EXPECT_LT(rel_max_error(row_of(h, 0, 8), span_of(full, int64_t(d.prefix.size()), 8)),
            tolerance());
  for (size_t t = 8; t < tail.size(); ++t) {
    Tensor step = bb_->fork_forward(TokenBatch::single({tail[t]}), fs, true, /*decode=*/true);
    EXPECT_LT(rel_max_error(row_of(step, 0, 1), span_of(full, int64_t(d.prefix.size() + t), 1)),
              tolerance())
        << "step " << t;
  }
  EXPECT_EQ(fs.own_len[0], int64_t(tail.size()));
}

TEST_P(Gemma4Property, ForkRowsAreBitwiseTheSameWhateverThePoolSize) {
  // With few work units (one row, 2 KV heads) a larger pool splits query heads among threads;
  // a 1-thread pool never does. The bits must not change.
  const Doc& d = docs_[1];
  auto run = [&](int threads) {
    set_thread_count(threads);
    ForkState fs = bb_->fork({{.state = &d.state, .row = 0}}, {0}, 32);
    Tensor h = bb_->fork_forward(TokenBatch::single(rows_[0]), fs, true);
    Tensor step = bb_->fork_forward(TokenBatch::single({rows_[0][0]}), fs, true, true);
    std::vector<float> bits = h.to_f32_vector(), s = step.to_f32_vector();
    bits.insert(bits.end(), s.begin(), s.end());
    return bits;
  };
  const std::vector<float> one = run(1), eight = run(8);
  set_thread_count(available_cores());
  EXPECT_TRUE(bitwise_equal(one, eight));
}

TEST_P(Gemma4Property, IdleRowInADecodeBatchKeepsItsState) {
  ForkState fs = bb_->fork(prefixes(), {0, 1}, 32);  // room for a row and a step
  bb_->fork_forward(TokenBatch::padded({rows_[0], rows_[1]}), fs, true);
  const int64_t before = fs.own_len[1];
  std::vector<float> k_before = kv_of(fs.own[0].k, 1, before);
  TokenBatch step{.ids = {3, 0}, .rows = 2, .tokens = 1, .lengths = {1, 0}};
  Tensor h = bb_->fork_forward(step, fs, true, true);
  EXPECT_EQ(fs.own_len[1], before);
  EXPECT_TRUE(bitwise_equal(kv_of(fs.own[0].k, 1, before), k_before));
  // Row 0 still agrees with the full forward.
  Tensor full = full_hidden(*bb_, concat(concat(docs_[0].prefix, rows_[0]), {3}));
  EXPECT_LT(rel_max_error(row_of(h, 0, 1), span_of(full, full.dim(1) - 1, 1)), tolerance());
}

TEST_P(Gemma4Property, LogitsAreSoftCapped) {
  // lm_logits = 5 tanh(raw / 5), raw = hidden · headᵀ (the tied embedding).
  Tensor h = full_hidden(*bb_, docs_[1].prefix);
  Tensor logits = bb_->lm_logits(h);
  const Tensor& head = bb_->family().lm_head();
  const int64_t M = h.numel() / h.dim(-1);
  Tensor raw = Tensor::empty({M, head.dim(0)}, DType::f32);
  const Tensor head_on_host = host_copy(head);
  linear(h.data<float>(), M, h.dim(-1), head_on_host, raw.mutable_data<float>(), false,
         precision());
  std::vector<float> got = logits.to_f32_vector(), want = raw.to_f32_vector();
  for (float& x : want) x = std::tanh(x / 5.0f) * 5.0f;
  // The CPU's own product, bitwise; another backend's sums its products in another order.
  if (device() == Device::cpu) {
    EXPECT_TRUE(bitwise_equal(got, want));
  } else {
    EXPECT_LT(rel_max_error(got, want), tolerance());
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, Gemma4Property,
                         ::testing::Combine(::testing::Values(GemmPrecision::exact,
                                                              GemmPrecision::bf16),
                                            ::testing::ValuesIn(testing::test_devices())),
                         testing::PrecisionOnDevice());

// A plain double-precision forward of one sequence, written from the layer description in
// src/model/gemma4.cc (explicit window masks, K/V sharing by layer index, per-layer inputs by
// slice): the oracle for the optimised stack's wiring. It is not a golden reference (that is HF,
// tools/reference/gemma4_fixtures.py); it shares our reading of HF, not our code.
class Reference {
 public:
  Reference(const Gemma4Config& cfg, const TensorMap& w) : c_(cfg), w_(w) {}

  // final-norm hidden [T][C]
  std::vector<std::vector<double>> forward(const std::vector<int32_t>& ids) const {
    const int64_t T = int64_t(ids.size()), C = c_.hidden, P = c_.ple_dim;
    const int64_t NL = int64_t(c_.layers.size());
    std::vector<std::vector<double>> h(static_cast<size_t>(T)), ple(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      h[size_t(t)] = scaled(row("embed_tokens.weight", ids[size_t(t)]), std::sqrt(double(C)));
      if (P == 0) continue;
      std::vector<double> proj = scaled(matvec("per_layer_model_projection.weight", h[size_t(t)]),
                                        1.0 / std::sqrt(double(C)));
      std::vector<double> tok = row("embed_tokens_per_layer.weight", ids[size_t(t)]);
      for (int64_t l = 0; l < NL; ++l) {
        std::vector<double> seg(proj.begin() + l * P, proj.begin() + (l + 1) * P);
        seg = norm(seg, "per_layer_projection_norm.weight");
        for (int64_t j = 0; j < P; ++j)
          ple[size_t(t)].push_back(
              (seg[size_t(j)] + tok[size_t(l * P + j)] * std::sqrt(double(P))) / std::sqrt(2.0));
      }
    }
    std::vector<std::vector<std::vector<double>>> keys(static_cast<size_t>(NL)),
        values(static_cast<size_t>(NL));
    for (int64_t i = 0; i < NL; ++i) {
      const Gemma4Layer& g = c_.layers[size_t(i)];
      const std::string at = "layers." + std::to_string(i) + ".";
      const int64_t D = g.head_dim, G = g.heads / g.kv_heads;
      std::vector<std::vector<double>> q(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> x = norm(h[size_t(t)], at + "input_layernorm.weight");
        q[size_t(t)] = heads(matvec(at + "self_attn.q_proj.weight", x), D,
                             at + "self_attn.q_norm.weight", g, t);
        if (g.kv_source >= 0) continue;
        keys[size_t(i)].push_back(heads(matvec(at + "self_attn.k_proj.weight", x), D,
                                        at + "self_attn.k_norm.weight", g, t));
        values[size_t(i)].push_back(heads(matvec(at + "self_attn.v_proj.weight", x), D, "", g, -1));
      }
      const auto& K = keys[size_t(g.kv_source >= 0 ? g.kv_source : i)];
      const auto& V = values[size_t(g.kv_source >= 0 ? g.kv_source : i)];
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> o(size_t(g.heads * D));
        const int64_t lo = g.sliding ? std::max<int64_t>(0, t - c_.window + 1) : 0;
        for (int64_t hq = 0; hq < g.heads; ++hq) {
          const int64_t hk = hq / G;
          std::vector<double> p;
          double mx = -INFINITY, total = 0;
          for (int64_t j = lo; j <= t; ++j) {
            double d = 0;
            for (int64_t x = 0; x < D; ++x)
              d += q[size_t(t)][size_t(hq * D + x)] * K[size_t(j)][size_t(hk * D + x)];
            p.push_back(d);
            mx = std::max(mx, d);
          }
          for (double& v : p) total += (v = std::exp(v - mx));
          for (int64_t j = lo; j <= t; ++j)
            for (int64_t x = 0; x < D; ++x)
              o[size_t(hq * D + x)] += p[size_t(j - lo)] / total * V[size_t(j)][size_t(hk * D + x)];
        }
        std::vector<double>& ht = h[size_t(t)];
        add(ht, norm(matvec(at + "self_attn.o_proj.weight", o),
                     at + "post_attention_layernorm.weight"));
        std::vector<double> x = norm(ht, at + "pre_feedforward_layernorm.weight");
        std::vector<double> gate = matvec(at + "mlp.gate_proj.weight", x);
        std::vector<double> up = matvec(at + "mlp.up_proj.weight", x);
        for (size_t k = 0; k < gate.size(); ++k) gate[k] = gelu(gate[k]) * up[k];
        add(ht, norm(matvec(at + "mlp.down_proj.weight", gate),
                     at + "post_feedforward_layernorm.weight"));
        if (P > 0) {
          std::vector<double> pg = matvec(at + "per_layer_input_gate.weight", ht);
          for (int64_t j = 0; j < P; ++j)
            pg[size_t(j)] = gelu(pg[size_t(j)]) * ple[size_t(t)][size_t(i * P + j)];
          add(ht, norm(matvec(at + "per_layer_projection.weight", pg),
                       at + "post_per_layer_input_norm.weight"));
        }
        ht = scaled(ht, vec(at + "layer_scalar")[0]);
      }
    }
    for (auto& ht : h) ht = norm(ht, "norm.weight");
    return h;
  }

 private:
  std::vector<double> vec(const std::string& name) const {
    std::vector<float> f = w_.at(name).to_f32_vector();
    return {f.begin(), f.end()};
  }
  std::vector<double> row(const std::string& name, int64_t r) const {
    const Tensor& t = w_.at(name);
    std::vector<float> f = t.select(0, r).to_f32_vector();
    return {f.begin(), f.end()};
  }
  std::vector<double> matvec(const std::string& name, const std::vector<double>& x) const {
    const Tensor& t = w_.at(name);
    std::vector<float> f = t.to_f32_vector();
    std::vector<double> y(size_t(t.dim(0)));
    for (int64_t r = 0; r < t.dim(0); ++r)
      for (int64_t k = 0; k < t.dim(1); ++k)
        y[size_t(r)] += double(f[size_t(r * t.dim(1) + k)]) * x[size_t(k)];
    return y;
  }
  static std::vector<double> scaled(std::vector<double> x, double s) {
    for (double& v : x) v *= s;
    return x;
  }
  static void add(std::vector<double>& h, const std::vector<double>& x) {
    for (size_t k = 0; k < h.size(); ++k) h[k] += x[k];
  }
  static double gelu(double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  // RMSNorm with weight `name` (none: no scale).
  std::vector<double> norm(std::vector<double> x, const std::string& name) const {
    double ms = 0;
    for (double v : x) ms += v * v;
    const double inv = 1.0 / std::sqrt(ms / double(x.size()) + double(c_.eps));
    std::vector<double> w = name.empty() ? std::vector<double>(x.size(), 1.0) : vec(name);
    for (size_t k = 0; k < x.size(); ++k) x[k] *= inv * w[k];
    return x;
  }
  // Per head: RMSNorm, then (pos >= 0) the layer kind's rotary at position pos.
  std::vector<double> heads(std::vector<double> x, int64_t D, const std::string& weight,
                            const Gemma4Layer& g, int64_t pos) const {
    const Gemma4Rope& r = g.sliding ? c_.sliding_rope : c_.global_rope;
    const int64_t turning = r.proportional ? int64_t(r.partial * double(D) / 2) : D / 2;
    for (int64_t h = 0; h < int64_t(x.size()) / D; ++h) {
      std::vector<double> v = norm({x.begin() + h * D, x.begin() + (h + 1) * D}, weight);
      if (pos >= 0) {
        for (int64_t i = 0; i < turning; ++i) {
          const double a = double(pos) * std::pow(r.theta, -2.0 * double(i) / double(D));
          const double x0 = v[size_t(i)], x1 = v[size_t(i + D / 2)];
          v[size_t(i)] = x0 * std::cos(a) - x1 * std::sin(a);
          v[size_t(i + D / 2)] = x1 * std::cos(a) + x0 * std::sin(a);
        }
      }
      std::copy(v.begin(), v.end(), x.begin() + h * D);
    }
    return x;
  }

  const Gemma4Config& c_;
  const TensorMap& w_;
};

TEST(Gemma4Reference, StackMatchesAPlainDoublePrecisionForward) {
  testing::TempDir tmp;
  testing::write_tiny_gemma4(tmp / "m", 2);
  const Gemma4Config cfg = Gemma4Config::from_json(JsonConfig::load(tmp / "m" / "config.json"));
  const TensorMap weights = gemma4_random_weights(cfg, DType::f32, 21);
  Backbone bb(gemma4_family(cfg, weights), {.read_chunk = 64});
  const std::vector<int32_t> ids = random_ids(90, cfg.vocab, 8);  // 2 reads, window 8
  const std::vector<std::vector<double>> want = Reference(cfg, weights).forward(ids);
  Tensor got = backbone_forward(bb, ids, /*logits=*/false);
  std::vector<float> flat;
  for (const auto& r : want) flat.insert(flat.end(), r.begin(), r.end());
  EXPECT_LT(rel_max_error(got.to_f32_vector(), flat), 1e-5);
}

TEST(Gemma4Layouts, MultimodalSnapshotEqualsTextSnapshot) {
  // Same weights (same seed), text layout with global_head_dim vs multimodal layout with
  // per_layer_config and model.language_model.* names: the same logits, bitwise.
  testing::TempDir tmp;
  testing::write_tiny_gemma4(tmp / "text", 9);
  testing::write_tiny_gemma4(tmp / "mm", 9, /*multimodal=*/true);
  auto a = backbone_open(tmp / "text");
  auto b = backbone_open(tmp / "mm");
  std::vector<int32_t> ids = random_ids(40, 263, 3);
  EXPECT_TRUE(bitwise_equal(backbone_forward(*a, ids, true).to_f32_vector(),
                            backbone_forward(*b, ids, true).to_f32_vector()));
}

TEST(Gemma4Errors, UnsupportedSettingsAndMissingTensorsAreNamed) {
  testing::TempDir tmp;
  testing::write_tiny_gemma4(tmp / "m", 1);
  const auto cfg_path = tmp / "m" / "config.json";
  const std::string good = testing::read_text(cfg_path);
  auto with = [&](const std::string& key, const Json& value) {
    Json j = Json::parse(good);
    j[key] = value;
    testing::write_text(cfg_path, j.dump());
  };
  auto expect_error = [&](ErrorKind kind, const std::string& pointer_or_tensor) {
    try {
      backbone_open(tmp / "m");
      ADD_FAILURE() << "expected an error about " << pointer_or_tensor;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      const std::string where = e.context().pointer + e.context().tensor;
      EXPECT_NE(where.find(pointer_or_tensor), std::string::npos) << e.what();
    }
  };
  with("attention_k_eq_v", true);
  expect_error(ErrorKind::unsupported, "/attention_k_eq_v");
  with("enable_moe_block", true);
  expect_error(ErrorKind::unsupported, "/enable_moe_block");
  with("num_kv_shared_layers", 6);
  expect_error(ErrorKind::unsupported, "/num_kv_shared_layers");
  with("layer_types", Json::array({"sliding_attention", "chunked_attention"}));
  expect_error(ErrorKind::unsupported, "/layer_types");
  with("rope_parameters", Json{{"full_attention", {{"rope_type", "yarn"}}}});
  expect_error(ErrorKind::unsupported, "/rope_parameters/full_attention/rope_type");
  // A wrongly shaped tensor, then a missing one, are named as in the file: with one shared
  // layer fewer than the weights were made for, layer 4 needs K/V projections of its own.
  with("vocab_size_per_layer_input", 300);
  expect_error(ErrorKind::format, "model.embed_tokens_per_layer.weight");
  with("num_kv_shared_layers", 1);
  expect_error(ErrorKind::not_found, "model.layers.4.self_attn.k_proj.weight");
  testing::write_text(cfg_path, good);
  EXPECT_NO_THROW(backbone_open(tmp / "m"));
}

}  // namespace
}  // namespace deg
