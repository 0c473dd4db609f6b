// Finite-difference checks of every backward in the training core (src/train/): linear,
// RMS norm, ReLU^2 MLP, the MUDD heads, attention core and sublayer in every mode, the
// soft-capped multi-token loss, and the whole gpt model on the `tiny` preset.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "model/gpt_config.h"
#include "model/heads.h"
#include "train/attention.h"
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

TEST(TrainGradcheck, MlpAndHeads) {
  Rng rng(2);
  const int64_t T = 4, C = 6, F = 10;
  Buf x = random_buf(rng, T * C), fc = random_buf(rng, F * C, 0.5),
      proj = random_buf(rng, F * C, 0.5);
  Buf r = random_buf(rng, T * C);
  auto f = [&] {
    MlpActs a;
    mlp_forward(x.data(), fc.data(), proj.data(), T, C, F, a);
    return weighted(a.out, r);
  };
  MlpActs a;
  mlp_forward(x.data(), fc.data(), proj.data(), T, C, F, a);
  Buf dx = zeros(T * C), dfc = zeros(F * C), dproj = zeros(F * C);
  mlp_backward(x.data(), fc.data(), proj.data(), T, C, F, a, r.data(), dx.data(), dfc.data(),
               dproj.data());
  expect_grad("mlp dx", f, x.data(), T * C, dx.data());
  expect_grad("mlp dfc", f, fc.data(), F * C, dfc.data());
  expect_grad("mlp dproj", f, proj.data(), F * C, dproj.data());

  const int64_t M = 5, n = 4, G = 3;
  Buf w1 = random_buf(rng, M * C, 0.5), w2 = random_buf(rng, n * M), b2 = random_buf(rng, n);
  Buf w2g = random_buf(rng, n * G * M);
  float scale = 0.7f;
  Buf ro = random_buf(rng, T * n), rd = random_buf(rng, T * n * G);
  auto hw = [&] {
    return HeadWeights{.w1 = w1.data(),
                       .w2 = w2.data(),
                       .b2 = b2.data(),
                       .w2g = w2g.data(),
                       .M = M,
                       .n = n,
                       .G = G,
                       .scale = scale};
  };
  auto h = [&] {
    HeadActs ha;
    head_forward(hw(), x.data(), T, C, ha);
    return weighted(ha.out, ro) + weighted(ha.deltas, rd);
  };
  HeadActs ha;
  head_forward(hw(), x.data(), T, C, ha);
  Buf hdx = zeros(T * C), dw1 = zeros(M * C), dw2 = zeros(n * M), db2 = zeros(n),
      dw2g = zeros(n * G * M);
  head_backward(hw(), x.data(), T, C, ha, ro.data(), rd.data(), hdx.data(),
                {.w1 = dw1.data(), .w2 = dw2.data(), .b2 = db2.data(), .w2g = dw2g.data()});
  expect_grad("head dx", h, x.data(), T * C, hdx.data());
  expect_grad("head dw1", h, w1.data(), M * C, dw1.data());
  expect_grad("head dw2", h, w2.data(), n * M, dw2.data());
  expect_grad("head db2", h, b2.data(), n, db2.data());
  expect_grad("head dw2g", h, w2g.data(), n * G * M, dw2g.data());
  // A learned scale (the MUDD gates) on a head without deltas.
  auto gate_w = [&] {
    return HeadWeights{
        .w1 = w1.data(), .w2 = w2.data(), .b2 = b2.data(), .M = M, .n = n, .scale = scale};
  };
  auto hg = [&] {
    HeadActs ga;
    head_forward(gate_w(), x.data(), T, C, ga);
    return weighted(ga.out, ro);
  };
  HeadActs ga;
  head_forward(gate_w(), x.data(), T, C, ga);
  Buf gdx = zeros(T * C), gw1 = zeros(M * C), gw2 = zeros(n * M), gb2 = zeros(n);
  float dscale = 0;
  head_backward(gate_w(), x.data(), T, C, ga, ro.data(), nullptr, gdx.data(),
                {.w1 = gw1.data(), .w2 = gw2.data(), .b2 = gb2.data(), .scale = &dscale});
  expect_grad("gate dx", hg, x.data(), T * C, gdx.data());
  expect_grad("gate dscale", hg, &scale, 1, &dscale);
}

TEST(TrainGradcheck, AttentionCore) {
  Rng rng(3);
  const int64_t N = 12, S = 2, dq = 4, dv = 3;
  std::vector<int32_t> seg = {0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5, 5};
  const AttnCore a{
      .N = N, .S = S, .dq = dq, .dv = dv, .seg_start = seg.data(), .window = 3, .scale = 0.6f};
  Buf q = random_buf(rng, N * S * dq), k = random_buf(rng, N * S * dq),
      v = random_buf(rng, N * S * dv);
  Buf r = random_buf(rng, N * S * dv);
  auto f = [&] {
    Buf o = zeros(N * S * dv), l = zeros(N * S);
    attention_core_forward(a, q.data(), k.data(), v.data(), o.data(), l.data());
    return weighted(o, r);
  };
  Buf o = zeros(N * S * dv), l = zeros(N * S);
  attention_core_forward(a, q.data(), k.data(), v.data(), o.data(), l.data());
  Buf dq_ = zeros(N * S * dq), dk = zeros(N * S * dq), dvv = zeros(N * S * dv);
  attention_core_backward(a, q.data(), k.data(), v.data(), o.data(), l.data(), r.data(), dq_.data(),
                          dk.data(), dvv.data());
  expect_grad("core dq", f, q.data(), N * S * dq, dq_.data(), 40);
  expect_grad("core dk", f, k.data(), N * S * dq, dk.data(), 40);
  expect_grad("core dv", f, v.data(), N * S * dv, dvv.data(), 40);
}

struct AttnMode {
  const char* name;
  bool paired, key_offset, xsa, gate, aux;
  int64_t dq, dv;
};

class TrainGradcheckAttn : public ::testing::TestWithParam<AttnMode> {};

TEST_P(TrainGradcheckAttn, Layer) {
  const AttnMode m = GetParam();
  Rng rng(4);
  const int64_t T = 10, H = 4, hd = 4, C = 16;
  std::vector<int32_t> seg = {0, 0, 0, 0, 4, 4, 4, 4, 4, 4};
  RotaryState rot = rotary_initial(m.dq, 2, 0.5f);
  for (auto& f : rot.freq) f *= 3.0f;  // visible rotation at these short positions
  const AttnLayerShape s{.T = T,
                         .C = C,
                         .H = H,
                         .dq = m.dq,
                         .dv = m.dv,
                         .aux_width = hd,
                         .rotary_dim = 2,
                         .paired = m.paired,
                         .key_offset = m.key_offset,
                         .window = 3,
                         .attn_scale = 0.7f,
                         .eps = 1e-6f,
                         .freq = rot.freq.data(),
                         .seg_start = seg.data()};
  Buf xn = random_buf(rng, T * C), wqk = random_buf(rng, 2 * H * m.dq * C, 0.4),
      wv = random_buf(rng, H * m.dv * C, 0.4), wo = random_buf(rng, C * H * m.dv, 0.4);
  Buf aux = random_buf(rng, T * C), lanes = random_buf(rng, T * 2 * H, 0.8);
  for (int64_t i = T * H; i < T * 2 * H; ++i) lanes[size_t(i)] = 0.5f + 0.3f * lanes[size_t(i)];
  float sa0 = 0.8f, osc = 1.3f;
  Buf r = random_buf(rng, T * C);
  auto inputs = [&] {
    AttnLayerInputs in{.xn = xn.data(),
                       .w_qk = wqk.data(),
                       .w_v = wv.data(),
                       .w_o = wo.data(),
                       .sa0 = sa0,
                       .o_scale = osc,
                       .aux_v = m.aux ? aux.data() : nullptr};
    if (m.xsa) in.xsa = {lanes.data(), 2 * H};
    if (m.gate) in.gate = {lanes.data() + H, 2 * H};
    return in;
  };
  auto f = [&] {
    AttnSaved sv;
    Buf out = zeros(T * C);
    attention_layer_forward(s, inputs(), sv, out.data());
    return weighted(out, r);
  };
  AttnSaved sv;
  Buf out = zeros(T * C);
  attention_layer_forward(s, inputs(), sv, out.data());
  Buf dxn = zeros(T * C), dqk = zeros(wqk.size()), dwv = zeros(wv.size()), dwo = zeros(wo.size()),
      daux = zeros(T * C), dlanes = zeros(T * 2 * H);
  AttnLayerGrads g{.dxn = dxn.data(),
                   .dw_qk = dqk.data(),
                   .dw_v = dwv.data(),
                   .dw_o = dwo.data(),
                   .daux_v = daux.data(),
                   .dxsa = {dlanes.data(), 2 * H},
                   .dgate = {dlanes.data() + H, 2 * H}};
  attention_layer_backward(s, inputs(), sv, r.data(), g);
  expect_grad("attn dxn", f, xn.data(), T * C, dxn.data(), 32);
  expect_grad("attn dwqk", f, wqk.data(), int64_t(wqk.size()), dqk.data(), 32);
  expect_grad("attn dwv", f, wv.data(), int64_t(wv.size()), dwv.data(), 32);
  expect_grad("attn dwo", f, wo.data(), int64_t(wo.size()), dwo.data(), 32);
  expect_grad("attn dsa0", f, &sa0, 1, &g.dsa0);
  expect_grad("attn do_scale", f, &osc, 1, &g.do_scale);
  if (m.aux) expect_grad("attn daux", f, aux.data(), T * C, daux.data(), 32);
  if (m.xsa || m.gate) expect_grad("attn dlanes", f, lanes.data(), T * 2 * H, dlanes.data(), 40);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TrainGradcheckAttn,
    ::testing::Values(AttnMode{"plain", false, false, false, false, false, 2, 4},
                      AttnMode{"paired_aux", true, false, false, false, true, 2, 4},
                      AttnMode{"wide_key_offset_gate", false, true, false, true, true, 4, 4},
                      AttnMode{"xsa_half_v", false, false, true, true, true, 2, 2}),
    [](const auto& info) { return std::string(info.param.name); });

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
