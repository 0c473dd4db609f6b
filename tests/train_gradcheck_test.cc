// Finite-difference checks of the training core (src/train/): linear, RMS norm, the soft-capped
// multi-token loss, the head losses, and the whole gpt model (its one definition, model/gpt.cc,
// over the ops' backward) on the `tiny` preset, in the packed-stream and the fork layouts. Each
// op's backward has its own check in tests/ops_backward_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "model/gpt_config.h"
#include "model/heads.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"
#include "train/head_loss.h"
#include "train/loss.h"
#include "train/ops.h"

namespace deg::train {
namespace {

Buf random_buf(Rng& rng, int64_t n, double scale = 1.0) {
  Buf b = zeros(n);
  for (auto& x : b) x = float(rng.normal() * scale);
  return b;
}

// Compares analytic gradients of f with central differences at `samples` entries of x.
void expect_grad(const char* what, const std::function<double()>& f, float* x, int64_t n,
                 const float* analytic, int samples = 24, float eps = 1e-2f, float rtol = 3e-2f) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(analytic[i]));
  const float atol = 2e-3f * amax + 1e-6f;
  int bad = 0;
  for (int s = 0; s < samples && s < n; ++s) {
    const int64_t i = n <= samples ? s : (int64_t(s) * 7919 + 13) % n;
    const float keep = x[i];
    x[i] = keep + eps;
    const double fp = f();
    x[i] = keep - eps;
    const double fm = f();
    x[i] = keep;
    const float num = float((fp - fm) / (2.0 * eps));
    if (std::fabs(num - analytic[i]) > atol + rtol * std::fabs(num)) {
      if (++bad <= 3)
        ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << num;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

double weighted(const Buf& out, const Buf& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * r[i];
  return s;
}

TEST(TrainGradcheck, LinearAndNorm) {
  Rng rng(1);
  const int64_t N = 5, K = 7, M = 6;
  Buf x = random_buf(rng, N * K), w = random_buf(rng, M * K), r = random_buf(rng, N * M);
  auto f = [&] {
    Buf y = zeros(N * M);
    matmul_nt(x.data(), w.data(), y.data(), N, K, M);
    return weighted(y, r);
  };
  Buf dx = zeros(N * K), dw = zeros(M * K);
  linear_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), N, K, M);
  expect_grad("linear dx", f, x.data(), N * K, dx.data());
  expect_grad("linear dw", f, w.data(), M * K, dw.data());

  Buf rn = random_buf(rng, N * K);
  auto g = [&] {
    Buf y = zeros(N * K), rs = zeros(N);
    rmsnorm_forward(x.data(), y.data(), rs.data(), N, K, 1e-6f);
    return weighted(y, rn);
  };
  Buf y = zeros(N * K), rs = zeros(N), dxn = zeros(N * K);
  rmsnorm_forward(x.data(), y.data(), rs.data(), N, K, 1e-6f);
  rmsnorm_backward(y.data(), rs.data(), rn.data(), dxn.data(), N, K);
  expect_grad("rmsnorm dx", g, x.data(), N * K, dxn.data());
}

TEST(TrainGradcheck, SoftcapLoss) {
  Rng rng(5);
  const int64_t T = 7, C = 5, V = 11;
  Buf xn = random_buf(rng, T * C), w = random_buf(rng, V * C, 2.0);
  std::vector<int32_t> targets = {3, 1, -1, 10, 0, 5, 7}, prefix = {2, -1, 4, 4, -1, 9, 1};
  const SoftcapLoss loss{.mtp_weights = {1.0f, 0.5f, 0.25f}, .prefix_weight = 0.3f};
  auto in = [&] {
    return LossInputs{.xn = xn.data(),
                      .w = w.data(),
                      .targets = targets.data(),
                      .prefix = prefix.data(),
                      .T = T,
                      .C = C,
                      .V = V};
  };
  auto f = [&] { return softcap_loss(loss, in(), nullptr, nullptr); };
  Buf dx = zeros(T * C), dw = zeros(V * C);
  softcap_loss(loss, in(), dx.data(), dw.data());
  expect_grad("loss dx", f, xn.data(), T * C, dx.data(), 35, 1e-2f);
  expect_grad("loss dw", f, w.data(), V * C, dw.data(), 40, 1e-2f);
}

// The whole tiny model: every parameter tensor, at non-initial random values.
// Every tensor's gradient of the whole model's loss on batch b, by central differences.
void expect_model_grads(GptParams& p, const GptBatch& b, const GptStepOptions& o, Rng& rng) {
  auto grads = p.zeros_like();
  gpt_loss_and_grad(p, b, o, grads);
  auto f = [&] { return gpt_loss(p, b, o); };
  // Per tensor: the derivative along a random direction (single entries are below the f32
  // resolution of the loss), plus the largest entries one by one.
  for (size_t k = 0; k < grads.size(); ++k) {
    auto& t = p.tensors()[k];
    const auto& g = grads[k].data;
    double gmax = 0;
    for (float v : g) gmax = std::max(gmax, double(std::fabs(v)));
    EXPECT_GT(gmax, 0.0) << t.name << " gets no gradient";
    // Unit directions: along the gradient (expects |g|) and a random one (expects g . d).
    Buf along = zeros(t.numel()), rnd = zeros(t.numel());
    double gn = 0, rn = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] == 0.0f) continue;  // table rows no token reads
      along[i] = g[i];
      rnd[i] = float(rng.normal());
      gn += double(g[i]) * g[i];
      rn += double(rnd[i]) * rnd[i];
    }
    const Buf keep = t.data;
    for (Buf* dir : {&along, &rnd}) {
      const double norm = std::sqrt(dir == &along ? gn : rn);
      double ana = 0;
      for (size_t i = 0; i < dir->size(); ++i) {
        (*dir)[i] = float((*dir)[i] / norm);
        ana += double((*dir)[i]) * g[i];
      }
      const float eps = 1e-2f;
      for (size_t i = 0; i < dir->size(); ++i) t.data[i] = keep[i] + eps * (*dir)[i];
      const double fp = f();
      for (size_t i = 0; i < dir->size(); ++i) t.data[i] = keep[i] - eps * (*dir)[i];
      const double fm = f();
      t.data = keep;
      const double num = (fp - fm) / (2.0 * eps);
      EXPECT_NEAR(ana, num, 3e-2 * std::fabs(num) + 3e-5)
          << t.name << (dir == &along ? " (along the gradient)" : " (random direction)");
    }
    const float eps = 1e-2f;
    size_t imax = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (std::fabs(g[i]) > std::fabs(g[imax])) imax = i;
    t.data[imax] = keep[imax] + eps;
    const double gp = f();
    t.data[imax] = keep[imax] - eps;
    const double gm = f();
    t.data = keep;
    const double num1 = (gp - gm) / (2.0 * eps);
    EXPECT_NEAR(g[imax], num1, 5e-2 * std::fabs(num1) + 3e-5) << t.name << "[" << imax << "]";
  }
}

GptParams perturbed_tiny(Rng& rng) {
  GptConfig c = gpt_preset("tiny");
  GptParams p = GptParams::create(c);
  p.init(7);
  for (auto& t : p.tensors())
    for (auto& x : t.data) x += float(rng.normal() * 0.1);
  for (auto& x : p.get("mudd_gate_scale").data) x = 0.5f;
  for (auto& f : p.rotary_narrow.freq) f *= 2.0f;
  return p;
}

TEST(TrainGradcheck, WholeTinyModel) {
  Rng rng(8);
  GptParams p = perturbed_tiny(rng);
  const GptConfig& c = p.config();
  GptBatch b;
  const int64_t T = 20;
  for (int64_t t = 0; t < T; ++t) {
    b.inputs.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.targets.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.prefix.push_back(t % 3 == 0 ? -1 : int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.seg_start.push_back(t < 9 ? 0 : 9);
  }
  const GptStepOptions o{.mtp_weights = {1.0f, 0.5f, 0.25f},
                         .prefix_weight = 0.25f,
                         .window_short = 4,
                         .window_long = 7};
  expect_model_grads(p, b, o, rng);
}

// The fork layout of `deg train`: a 10-token document and two 5-token queries forked off it,
// each continuing the document's positions and reading its keys (windows cut into them).
TEST(TrainGradcheck, WholeTinyModelForkLayout) {
  Rng rng(11);
  GptParams p = perturbed_tiny(rng);
  const GptConfig& c = p.config();
  GptBatch b;
  for (int64_t t = 0; t < 20; ++t) {
    const bool doc = t < 10;
    const int32_t start = doc ? 0 : t < 15 ? 10 : 15;
    b.inputs.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.targets.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.seg_start.push_back(start);
    b.prev.push_back(t == start && !doc ? 9 : int32_t(t - 1));
    b.pos.push_back(doc ? int32_t(t) : int32_t(10 + t - start));
    b.ctx_lo.push_back(0);
    b.ctx_hi.push_back(doc ? 0 : 10);
  }
  const GptStepOptions o{.window_short = 4, .window_long = 7};
  expect_model_grads(p, b, o, rng);
}

// The fork layout split into calls by length (documents of 7 and 12 tokens, queries of 2 to 5
// tokens forked off both, each call reading prefixes of two calls) gives the loss and gradients
// of the unsplit layout, which the check above verifies.
TEST(TrainGradcheck, ForkLayoutSplitByLengthEqualsOneCall) {
  Rng rng(12);
  GptParams p = perturbed_tiny(rng);
  const GptConfig& c = p.config();
  GptBatch b;
  auto add = [&](int64_t n, int64_t ctx_lo, int64_t ctx_len) {
    const int64_t start = b.size();
    for (int64_t u = 0; u < n; ++u) {
      b.inputs.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
      b.targets.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
      b.seg_start.push_back(int32_t(start));
      b.prev.push_back(u > 0     ? int32_t(start + u - 1)
                       : ctx_len ? int32_t(ctx_lo + ctx_len - 1)
                                 : -1);
      b.pos.push_back(int32_t(ctx_len + u));
      b.ctx_lo.push_back(int32_t(ctx_lo));
      b.ctx_hi.push_back(int32_t(ctx_lo + ctx_len));
    }
  };
  add(12, 0, 0);
  add(7, 0, 0);
  add(3, 0, 12);
  add(5, 12, 7);
  add(2, 12, 7);
  add(4, 0, 12);
  add(5, 0, 12);
  GptStepOptions one{.window_short = 4, .window_long = 7};
  one.call_tokens = int64_t(1) << 30;
  GptStepOptions split = one;
  split.call_tokens = 0;
  auto g1 = p.zeros_like(), g2 = p.zeros_like();
  const double l1 = gpt_loss_and_grad(p, b, one, g1), l2 = gpt_loss_and_grad(p, b, split, g2);
  EXPECT_NEAR(l1, l2, 1e-6 * std::fabs(l1));
  for (size_t k = 0; k < g1.size(); ++k) {
    float amax = 0;
    for (float v : g1[k].data) amax = std::max(amax, std::fabs(v));
    EXPECT_GT(amax, 0.0f) << g1[k].name;
    for (size_t i = 0; i < g1[k].data.size(); ++i)
      ASSERT_NEAR(g1[k].data[i], g2[k].data[i], 1e-5f * amax + 1e-7f)
          << g1[k].name << "[" << i << "]";
  }
}

// d(final) kept on the backend (GptStepOptions::host_final false, as pretraining runs) gives the
// same loss and bitwise the same gradients as the host round trip, split into calls or not.
TEST(TrainGradcheck, FinalStateKeptOnTheBackendEqualsTheHostRoundTrip) {
  Rng rng(13);
  GptParams p = perturbed_tiny(rng);
  const GptConfig& c = p.config();
  GptBatch b;
  for (int64_t t = 0; t < 40; ++t) {
    b.inputs.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.targets.push_back(int32_t(rng.next_u64() % uint64_t(c.vocab_size)));
    b.seg_start.push_back(int32_t(t < 17 ? 0 : 17));
  }
  for (int64_t call_tokens : {int64_t(0), int64_t(1) << 30}) {
    GptStepOptions host{.window_short = 4, .window_long = 7};
    host.call_tokens = call_tokens;
    GptStepOptions kept = host;
    kept.host_final = false;
    auto g1 = p.zeros_like(), g2 = p.zeros_like();
    GptActs work;  // one pass's memory for both, as a run's steps share it
    const double l1 = gpt_loss_and_grad(p, b, host, g1, &work);
    const double l2 = gpt_loss_and_grad(p, b, kept, g2, &work);
    EXPECT_EQ(l1, l2);
    EXPECT_TRUE(work.final_xn.empty());  // nothing copied out
    for (size_t k = 0; k < g1.size(); ++k) {
      float amax = 0;
      for (float v : g1[k].data) amax = std::max(amax, std::fabs(v));
      EXPECT_GT(amax, 0.0f) << g1[k].name;
      EXPECT_TRUE(g1[k].data == g2[k].data) << g1[k].name;
    }
  }
}

// Every head loss's gradients (answers, options, context, each head tensor and the relative
// bias) against central differences, on one set of queries that uses every head.
TEST(TrainGradcheck, HeadLosses) {
  const int64_t C = 12, O = 4, T = 9;
  Heads h = Heads::init(C, 3);
  Rng rng(5);
  for (auto& [name, t] : h.tensors(true)) {
    float* v = t->mutable_data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) v[i] += float(rng.normal() * 0.05);
  }
  h.anchor.prior.bias.mutable_data<float>()[0] = -0.5f;  // anchors near 0.5, not saturated
  Buf a = random_buf(rng, 6 * C), opts = random_buf(rng, O * C), ctx = random_buf(rng, T * C);
  const std::vector<SpanQuery> sq = {{}, {.anchor = 2, .region_end = 6}, {}};
  const std::vector<SpanTarget> st = {{3, 5}, {2, 4}, {}};
  const std::vector<Region> regions = {{1, 8}};
  const std::vector<std::vector<int64_t>> starts = {{2, 5}};
  // answers: 0 choice, 1 noul, 2 count, 3..5 spans; the anchor reads answer 0 too.
  // Each head's loss with its own weight: the gradients carry it, the returned losses do not.
  auto loss = [&](Heads& g, float* da, float* dopts, float* dctx) {
    double l = 0.7 * pointer_loss(h.choice, g.choice, a.data(), opts.data(), O, 2, da, dopts, 0.7f);
    l += 1.3 * noul_loss(h, g, a.data() + C, false, da + C, 1.3f);
    l += count_loss(h, g, a.data() + 2 * C, 1, 7, 3, da + 2 * C);
    l += 0.5 * span_loss(h, g, a.data() + 3 * C, 3, sq, st, ctx.data(), T, da + 3 * C, dctx, 0.5f);
    l += 2.0 * anchor_loss(h, g, a.data(), 1, regions, starts, ctx.data(), T, da, dctx, 2.0f, 3.0f);
    return l;
  };
  Heads g = h.zeros_like();
  Buf da = zeros(6 * C), dopts = zeros(O * C), dctx = zeros(T * C);
  loss(g, da.data(), dopts.data(), dctx.data());
  auto f = [&] {
    Heads scratch = h.zeros_like();
    Buf x = zeros(6 * C), y = zeros(O * C), z = zeros(T * C);
    return loss(scratch, x.data(), y.data(), z.data());
  };
  expect_grad("answers", f, a.data(), 6 * C, da.data(), 72);
  expect_grad("options", f, opts.data(), O * C, dopts.data());
  expect_grad("context", f, ctx.data(), T * C, dctx.data(), 48);
  auto gt = g.tensors(true);
  auto ht = h.tensors(true);
  for (size_t k = 0; k < ht.size(); ++k) {
    // No score query here; the option keys' bias shifts every option's logit alike, so its
    // gradient is exactly zero (the differences see only f32 noise).
    if (ht[k].first.starts_with("score") || ht[k].first == "choice.key.bias") continue;
    const float* gv = gt[k].second->data<float>();
    bool any = false;
    for (int64_t i = 0; i < gt[k].second->numel(); ++i) any = any || gv[i] != 0.0f;
    EXPECT_TRUE(any) << ht[k].first << " gets no gradient";
    expect_grad(ht[k].first.c_str(), f, ht[k].second->mutable_data<float>(), ht[k].second->numel(),
                gv);
  }
}

}  // namespace
}  // namespace deg::train
