// Optimizers of the gpt trainer: Polar Express orthogonalises, Adam's first step is the seed's
// formula, NorMuon's first update has equal row energy and the orthogonalised norm, steps are
// deterministic, and the schedules have the speedrun's shape.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cuda_runtime.h"
#include "model/gpt_config.h"
#include "train/gpt_params.h"
#include "train/gpt_step.h"
#include "train/ops.h"
#include "train/optim.h"

namespace deg::train {
namespace {

// The eigenvalues of the short side's Gram matrix (the squared singular values), by power
// iteration: an orthogonal matrix has them all at 1.
std::pair<double, double> gram_eigen_range(const Buf& x, int64_t R, int64_t K) {
  const bool tall = R > K;
  const int64_t r = tall ? K : R, n = tall ? R : K;
  std::vector<double> g(size_t(r * r));
  for (int64_t a = 0; a < r; ++a)
    for (int64_t b = 0; b < r; ++b) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k)
        s += tall ? double(x[size_t(k * K + a)]) * x[size_t(k * K + b)]
                  : double(x[size_t(a * K + k)]) * x[size_t(b * K + k)];
      g[size_t(a * r + b)] = s;
    }
  auto top = [&](double shift, double sign) {
    std::vector<double> v(static_cast<size_t>(r), 1.0), w(static_cast<size_t>(r), 0.0);
    double lambda = 0;
    for (int it = 0; it < 500; ++it) {
      for (int64_t a = 0; a < r; ++a) {
        double s = shift * v[size_t(a)];
        for (int64_t b = 0; b < r; ++b) s += sign * g[size_t(a * r + b)] * v[size_t(b)];
        w[size_t(a)] = s;
      }
      double nrm = 0;
      for (double e : w) nrm += e * e;
      nrm = std::sqrt(nrm);
      lambda = nrm;
      for (int64_t a = 0; a < r; ++a) v[size_t(a)] = w[size_t(a)] / nrm;
    }
    return lambda;
  };
  const double hi = top(0.0, 1.0);
  const double lo = hi - top(hi, -1.0);
  return {lo, hi};
}

TEST(TrainOptim, PolarExpressIsNearOrthogonal) {
  Rng rng(11);
  for (auto [R, K] : {std::pair<int64_t, int64_t>{8, 32}, {40, 10}}) {
    Buf x = zeros(R * K);
    for (auto& v : x) v = float(rng.normal());
    Buf before = x;
    polar_express(x.data(), R, K);
    const auto [lo, hi] = gram_eigen_range(x, R, K);
    const auto [lo0, hi0] = gram_eigen_range(before, R, K);
    // Squared singular values spread several-fold in the input, within ~15% of 1 after.
    EXPECT_GT(hi0 / lo0, 3.0);
    EXPECT_GT(lo, 0.6);
    EXPECT_LT(hi, 1.4);
    EXPECT_GT(dot(before.data(), x.data(), R * K), 0.0f);  // points the same way as the input
  }
  // Rows scaled by 1, 10, 19: afterwards every row has about unit energy (5 iterations do not
  // fully orthogonalise the smallest singular directions of a square Gaussian; loose bound).
  const int64_t R = 12, K = 20;
  Buf x = zeros(R * K);
  for (auto& v : x) v = float(rng.normal());
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < K; ++j) x[size_t(i * K + j)] *= float(1 + 9 * (i % 3));
  polar_express(x.data(), R, K);
  const auto [lo, hi] = gram_eigen_range(x, R, K);
  EXPECT_GT(lo, 0.6);
  EXPECT_LT(hi, 1.4);
}

struct Tiny {
  GptParams params = GptParams::create(gpt_preset("tiny"));
  std::vector<ParamTensor> grads;
  Tiny() {
    params.init(3);
    grads = params.zeros_like();
  }
  ParamTensor& grad(const std::string& name) {
    for (auto& g : grads)
      if (g.name == name) return g;
    throw std::runtime_error(name);
  }
};

// bf16 products (the bf16 training path's Polar Express, as the seed's): still near orthogonal,
// near the f32 result and not it. Five iterations of a polynomial whose first coefficients are 8,
// -22 and 16 carry bf16's rounding far: 5.2% and 5.8% apart here (root-mean-square).
TEST(TrainOptim, PolarExpressInBf16StaysNearF32) {
  Rng rng(12);
  for (auto [R, K] : {std::pair<int64_t, int64_t>{8, 32}, {40, 10}}) {
    Buf x = zeros(R * K);
    for (auto& v : x) v = float(rng.normal());
    Buf low = x;
    polar_express(cpu_ops(), x.data(), R, K);
    polar_express(cpu_ops(), low.data(), R, K, 1, GemmPrecision::bf16_all);
    const auto [lo, hi] = gram_eigen_range(low, R, K);
    EXPECT_GT(lo, 0.6);
    EXPECT_LT(hi, 1.4);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff += double(low[i] - x[i]) * (low[i] - x[i]);
      norm += double(x[i]) * x[i];
    }
    EXPECT_GT(diff, 0.0);
    EXPECT_LT(std::sqrt(diff / norm), 0.1) << R << " x " << K;
  }
}
TEST(TrainOptim, AdamFirstStepIsTheSeedFormula) {
  Tiny t;
  const OptimizerHyper h;
  GptOptimizer opt(t.params, h);
  const float p0 = t.params.get("scalars").data[3], p4 = t.params.get("scalars").data[4];
  const float g = 0.37f;
  t.grad("scalars").data[3] = g;
  opt.step(t.params, t.grads, 0.5f, 0.9f, true, true);
  // scalars: betas (0.9, 0.99), lr_mul 5, wd_mul 0 (train_gpt.py param_table).
  const double lr = 0.008 * 0.5 * 5.0, b1 = 0.9, b2 = 0.99;
  const double m = (1 - b1) * g, v = (1 - b2) * g * g;
  const double step_size = lr * std::sqrt(1 - b2) / (1 - b1);
  const double expected = p0 - m / (std::sqrt(v) + 1e-10) * step_size;
  EXPECT_NEAR(t.params.get("scalars").data[3], expected, 1e-6);
  EXPECT_EQ(t.params.get("scalars").data[4], p4);  // no gradient, no move
  EXPECT_EQ(t.grad("scalars").data[3], 0.0f);      // consumed
  // Tied: embed equals lm_head after an Adam step.
  EXPECT_EQ(t.params.get("embed").data, t.params.get("lm_head").data);
}

TEST(TrainOptim, AdamWaitsForItsStepAndAccumulates) {
  Tiny t;
  GptOptimizer opt(t.params, {});
  const float p0 = t.params.get("post_lambdas").data[0];
  t.grad("post_lambdas").data[0] = 1.0f;
  opt.step(t.params, t.grads, 1.0f, 0.9f, false, true);
  EXPECT_EQ(t.params.get("post_lambdas").data[0], p0);
  EXPECT_EQ(t.grad("post_lambdas").data[0], 1.0f);  // kept for the next (Adam) step
}

TEST(TrainOptim, NorMuonFirstUpdateHasEqualRowEnergy) {
  Tiny t;
  OptimizerHyper h;
  h.muon_wd = 0.0f;
  GptOptimizer opt(t.params, h);
  Rng rng(5);
  ParamTensor& g = t.grad("layers.0.mlp.fc");  // [F 64, C 48]: tall
  for (auto& v : g.data) v = float(rng.normal());
  const Buf grad = g.data;
  const Buf before = t.params.get("layers.0.mlp.fc").data;
  opt.step(t.params, t.grads, 1.0f, 0.0f, false, false);
  const auto& after = t.params.get("layers.0.mlp.fc").data;
  const int64_t R = 64, K = 48;
  const float lr_eff = 0.023f * std::sqrt(float(R) / float(K));
  Buf upd = zeros(R * K);
  for (size_t i = 0; i < upd.size(); ++i) upd[i] = (before[i] - after[i]) / lr_eff;
  Buf ortho = grad;
  polar_express(ortho.data(), R, K);
  // Same Frobenius norm as the orthogonalised momentum, every row the same mean square.
  EXPECT_NEAR(dot(upd.data(), upd.data(), R * K), dot(ortho.data(), ortho.data(), R * K),
              1e-3 * dot(ortho.data(), ortho.data(), R * K));
  const float row0 = dot(upd.data(), upd.data(), K);
  for (int64_t i = 1; i < R; ++i)
    EXPECT_NEAR(dot(upd.data() + i * K, upd.data() + i * K, K), row0, 1e-3 * row0) << i;
  EXPECT_GT(dot(upd.data(), grad.data(), R * K), 0.0f);  // a descent direction
}

TEST(TrainOptim, StepsAreDeterministic) {
  auto run = [] {
    Tiny t;
    GptOptimizer opt(t.params, {});
    Rng rng(9);
    for (int s = 0; s < 3; ++s) {
      for (auto& g : t.grads)
        for (auto& v : g.data) v = float(rng.normal() * 0.01);
      opt.step(t.params, t.grads, 1.0f, 0.9f, s % 2 == 1, true);
    }
    return t.params.get("layers.3.attn.qk").data;
  };
  EXPECT_EQ(run(), run());
}

TEST(TrainOptim, Schedules) {
  const TrainSchedule s{.total_steps = 1000};
  EXPECT_FLOAT_EQ(s.lr_scale(0), 1.0f);
  // schedule.py: cd_start = int(1000 * (1 - 0.8)) = 199 (Python's float rounding, as here).
  EXPECT_FLOAT_EQ(s.lr_scale(199), 1.0f);
  EXPECT_NEAR(s.lr_scale(600), 1.0f + (0.3f - 1.0f) * (401.0f / 801.0f), 1e-6);
  EXPECT_FLOAT_EQ(s.lr_scale(1000), 0.3f);
  EXPECT_FLOAT_EQ(s.momentum(0), 0.85f);
  EXPECT_NEAR(s.momentum(150), 0.90f, 1e-6);
  EXPECT_FLOAT_EQ(s.momentum(500), 0.95f);
  EXPECT_NEAR(s.momentum(975), 0.90f, 1e-6);
  const TrainSchedule w{.total_steps = 100, .warmup_steps = 10};
  EXPECT_FLOAT_EQ(w.lr_scale(0), 0.1f);
  EXPECT_FLOAT_EQ(w.lr_scale(9), 1.0f);
}

// --max-seconds: the run's length moves only at the probe points, to the steps that fit at the
// pace so far, never below the steps done or above --steps.
TEST(TrainOptim, TimeBudgetSteps) {
  EXPECT_EQ(time_budget_steps(10, 5.0, 60.0, 1000, 1000), 120);
  EXPECT_EQ(time_budget_steps(40, 10.0, 60.0, 1000, 120), 240);
  EXPECT_EQ(time_budget_steps(160, 40.0, 60.0, 1000, 240), 240);
  EXPECT_EQ(time_budget_steps(10, 5.0, 60.0, 100, 1000), 100);   // at most --steps
  EXPECT_EQ(time_budget_steps(10, 50.0, 10.0, 1000, 1000), 10);  // over budget: stop now
  EXPECT_EQ(time_budget_steps(11, 5.0, 60.0, 1000, 777), 777);   // not a probe point
  EXPECT_EQ(time_budget_steps(9, 5.0, 60.0, 1000, 1000), 1000);
}

// Resident training (GptResident, as `deg pretrain` and the step bench run): three steps of loss,
// gradients and optimizer over a backend's resident copies against the host path (the host's
// parameters and gradients, the optimizer on the CPU) — bitwise on the CPU, within float
// rounding on a GPU (its GEMMs and reductions round differently).
TEST(TrainResident, StepsMatchTheHostPath) {
  GptConfig c = gpt_preset("tiny");
  c.vocab_size = 128;
  GptBatch b;
  Rng rng(4);
  for (int64_t t = 0; t < 96; ++t) {
    b.inputs.push_back(int32_t(rng.next_u64() % 128));
    b.seg_start.push_back(t < 40 ? 0 : 40);  // two documents
  }
  for (int64_t t = 0; t < 96; ++t) b.targets.push_back(t + 1 < 96 ? b.inputs[size_t(t + 1)] : -1);
  const GptStepOptions base{
      .mtp_weights = {1.0f, 0.5f}, .window_short = c.window_short, .window_long = c.window_long};
  auto host_run = [&] {
    GptParams p = GptParams::create(c);
    p.init(3);
    GptOptimizer opt(p, {});
    auto grads = p.zeros_like();
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      losses.push_back(gpt_loss_and_grad(p, b, base, grads));
      opt.step(p, grads, 1.0f, 0.9f, s % 2 == 1, true);
    }
    return std::pair{p, losses};
  };
  const auto [want, want_losses] = host_run();
  std::vector<Device> devices = {Device::cpu};
  if (cuda_available()) devices.push_back(Device::cuda);
  for (const Device device : devices) {
    SCOPED_TRACE(device == Device::cpu ? "cpu" : "cuda");
    GptParams p = GptParams::create(c);
    p.init(3);
    const Ops& ops = ops_for(device);
    GptOptimizer opt(p, {}, ops);
    GptResident resident(p, ops);
    auto unused = p.zeros_like();
    GptStepOptions o = base;
    o.device = device;
    o.resident = &resident;
    for (int s = 0; s < 3; ++s) {
      const double loss = gpt_loss_and_grad(p, b, o, unused);
      opt.step(resident.value_ptrs(), resident.grad_ptrs(), 1.0f, 0.9f, s % 2 == 1, true);
      if (device == Device::cpu) {
        EXPECT_EQ(loss, want_losses[size_t(s)]) << "step " << s;
      } else {
        EXPECT_NEAR(loss, want_losses[size_t(s)], 1e-4 * want_losses[size_t(s)]) << "step " << s;
      }
    }
    for (const ParamTensor& g : unused)
      for (float v : g.data) ASSERT_EQ(v, 0.0f) << g.name << ": the host gradients were touched";
    resident.download(p);
    for (size_t k = 0; k < p.tensors().size(); ++k) {
      const std::vector<float>& got = p.tensors()[k].data;
      const std::vector<float>& ref = want.tensors()[k].data;
      if (device == Device::cpu) {
        EXPECT_EQ(got, ref) << p.tensors()[k].name;
        continue;
      }
      double err = 0, scale = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::fabs(double(got[i]) - ref[i]));
        scale = std::max(scale, std::fabs(double(ref[i])));
      }
      // Relative to the tensor, or to an Adam step's size (~1e-3) for tensors that start at zero
      // (Adam turns gradients near zero into full steps, so their rounding shows more).
      EXPECT_LE(err, 1e-3 * std::max(scale, 1e-2)) << p.tensors()[k].name;
    }
  }
}

}  // namespace
}  // namespace deg::train
