// NorMuon + Adam and the step schedules (see optim.h).
#include "train/optim.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "train/ops.h"

namespace deg::train {
namespace {

// Computed for num_iters=5, safety_factor=2e-2, cushion=2 (modded-nanogpt polar_express_coeffs).
constexpr double kPolarCoeffs[5][3] = {
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void polar_express(const Ops& ops, float* x, int64_t R, int64_t K) {
  // On the wide orientation: X [R, K] with R <= K, A = X Xᵀ [R, R], Y = B X. A tall X works on
  // Z = Xᵀ without moving it: A = Xᵀ X, and Yᵀ = (B Z)ᵀ = X Bᵀ.
  const bool tall = R > K;
  const int64_t r = tall ? K : R;
  const double fro = std::sqrt(ops.sum_squares(x, R * K));
  ops.scale({.y = x, .ldy = K, .rows = R, .n = K, .s = float(1.0 / (fro * (1 + 2e-2) + 1e-6))});
  const Tensor A = ops.alloc({r, r}, DType::f32), B = ops.alloc({r, r}, DType::f32);
  const Tensor Y = ops.alloc({R, K}, DType::f32);
  float *a = A.mutable_data<float>(), *b = B.mutable_data<float>(), *y = Y.mutable_data<float>();
  for (const auto& c : kPolarCoeffs) {
    if (tall) {  // A = Xᵀ X
      ops.matmul({.a = x,
                  .lda = K,
                  .ta = true,
                  .b = x,
                  .ldb = K,
                  .c = a,
                  .ldc = r,
                  .m = r,
                  .n = r,
                  .k = R});
    } else {  // A = X Xᵀ
      ops.matmul({.a = x,
                  .lda = K,
                  .b = x,
                  .ldb = K,
                  .tb = true,
                  .c = a,
                  .ldc = r,
                  .m = r,
                  .n = r,
                  .k = K});
    }
    ops.matmul({.a = a, .lda = r, .b = a, .ldb = r, .c = b, .ldc = r, .m = r, .n = r, .k = r});
    const CombineTerm bt[] = {{.s = float(c[2])}, {.x = a, .ldx = r, .s = float(c[1])}};
    ops.combine({.y = b, .ldy = r, .rows = r, .n = r, .terms = bt});  // B = c1 A + c2 A A
    if (tall) {                                                       // Y = X Bᵀ
      ops.matmul({.a = x,
                  .lda = K,
                  .b = b,
                  .ldb = r,
                  .tb = true,
                  .c = y,
                  .ldc = K,
                  .m = R,
                  .n = K,
                  .k = K});
    } else {  // Y = B X
      ops.matmul({.a = b, .lda = r, .b = x, .ldb = K, .c = y, .ldc = K, .m = R, .n = K, .k = R});
    }
    const CombineTerm xt[] = {{.s = float(c[0])}, {.x = y, .ldx = K}};
    ops.combine({.y = x, .ldy = K, .rows = R, .n = K, .terms = xt});  // X = c0 X + Y
  }
}

void polar_express(float* x, int64_t R, int64_t K) {
  polar_express(cpu_ops(), x, R, K);
}

ParamRule gpt_param_rule(const GptConfig& c, const std::string& name) {
  using K = ParamRule::Kind;
  // train_gpt.py TrainingManager.param_table (NorMuon era), names mapped to deg's.
  if (ends_with(name, ".attn.qk"))  // per head pair, as the seed's qk_bank groups
    return {.kind = K::normuon, .group_rows = 0};
  if (ends_with(name, ".attn.v") || ends_with(name, ".attn.o") || ends_with(name, "mlp.fc"))
    return {.kind = K::normuon};
  if (ends_with(name, "mlp.proj")) return {.kind = K::normuon, .matrix_lr_mul = 2.0f};
  auto adam = [](float b1, float b2, float lr_mul = 1.0f, float wd_mul = 1.0f) {
    return ParamRule{.kind = K::adam, .adam = {b1, b2, lr_mul, wd_mul}};
  };
  (void)c;
  if (name == "scalars") return adam(0.9f, 0.99f, 5.0f, 0.0f);
  if (name == "smear_gate") return adam(0.9f, 0.99f, 0.01f, 0.0f);
  if (name == "ve_gate") return adam(0.9f, 0.99f);
  if (name == "lm_head" || name == "embed") return adam(0.5f, 0.95f, 1.0f, 150.0f);
  if (name == "value_embeds" || name == "ngram_table") return adam(0.75f, 0.95f, 75.0f, 5.0f);
  if (name == "post_lambdas") return adam(0.9f, 0.95f, 1.0f, 0.0f);
  if (name == "resid_lambdas") return adam(0.9f, 0.95f, 5.0f, 0.0f);
  if (name == "mudd_w1" || name == "mudd_w2" || name == "mudd_w2g") return adam(0.9f, 0.99f, 0.25f);
  if (name == "mudd_b2") return adam(0.9f, 0.99f, 0.25f, 0.0f);
  if (name == "mudd_gate_w1" || name == "mudd_gate_w2") return adam(0.9f, 0.99f, 0.1f);
  if (name == "mudd_gate_b2" || name == "mudd_gate_scale") return adam(0.9f, 0.99f, 0.1f, 0.0f);
  DEG_CHECK(false, "no optimizer rule for {}", name);
  return {};
}

GptOptimizer::GptOptimizer(const GptParams& params, OptimizerHyper hyper) : hyper_(hyper) {
  const GptConfig& c = params.config();
  for (const auto& t : params.tensors()) {
    ParamRule rule = gpt_param_rule(c, t.name);
    if (rule.kind == ParamRule::Kind::normuon && ends_with(t.name, ".attn.qk"))
      rule.group_rows = t.shape[0] / c.num_heads;  // 2 heads of this layer's q/k width
    rules_.push_back(rule);
    names_.push_back(t.name);
    m_.emplace_back(t.data.size(), 0.0f);
    if (rule.kind == ParamRule::Kind::adam) {
      v_.emplace_back(t.data.size(), 0.0f);
    } else {
      const int64_t rows = rule.group_rows ? rule.group_rows : t.shape[0], cols = t.shape[1];
      const int64_t groups = t.shape[0] / rows;
      v_.emplace_back(size_t(groups * (rows >= cols ? rows : cols)), 0.0f);
    }
  }
}

void GptOptimizer::normuon(ParamTensor& p, ParamTensor& g, size_t k, float lr_scale,
                           float momentum) {
  const Ops& ops = cpu_ops();
  const ParamRule& rule = rules_[k];
  const int64_t rows = rule.group_rows ? rule.group_rows : p.shape[0], cols = p.shape[1];
  const int64_t groups = p.shape[0] / rows, n = rows * cols;
  const int64_t nsec = rows >= cols ? rows : cols;
  const float lr = hyper_.muon_lr * lr_scale;
  const float lr_eff =
      lr * std::sqrt(std::max(1.0f, float(rows) / float(cols))) * rule.matrix_lr_mul;
  Buf u = zeros(n);
  for (int64_t gi = 0; gi < groups; ++gi) {
    ops.nesterov({.g = g.data.data() + gi * n,
                  .buf = m_[k].data() + gi * n,
                  .u = u.data(),
                  .n = n,
                  .momentum = momentum});
    polar_express(ops, u.data(), rows, cols);
    ops.normuon_step({.u = u.data(),
                      .p = p.data.data() + gi * n,
                      .second = v_[k].data() + gi * nsec,
                      .rows = rows,
                      .cols = cols,
                      .beta2 = hyper_.muon_beta2,
                      .lr = lr_eff,
                      .wd = hyper_.muon_wd * lr});
  }
  std::fill(g.data.begin(), g.data.end(), 0.0f);
}

void GptOptimizer::adam(ParamTensor& p, ParamTensor& g, size_t k, float lr_scale) {
  const AdamHyper& h = rules_[k].adam;
  const double lr = double(hyper_.adam_lr) * lr_scale * h.lr_mul;
  const double bias1 = 1.0 - std::pow(double(h.beta1), double(adam_t_));
  const double bias2 = 1.0 - std::pow(double(h.beta2), double(adam_t_));
  cpu_ops().adam_step({.p = p.data.data(),
                       .g = g.data.data(),
                       .m = m_[k].data(),
                       .v = v_[k].data(),
                       .n = int64_t(p.data.size()),
                       .beta1 = h.beta1,
                       .beta2 = h.beta2,
                       .eps = hyper_.adam_eps,
                       .step_size = float(lr * std::sqrt(bias2) / bias1),
                       .wd = float(lr * lr * hyper_.adam_wd * h.wd_mul)});
}

void GptOptimizer::step(GptParams& params, std::vector<ParamTensor>& grads, float lr_scale,
                        float momentum, bool do_adam, bool tied) {
  auto& ps = params.tensors();
  DEG_CHECK(ps.size() == grads.size() && ps.size() == rules_.size(), "optimizer layout");
  if (do_adam) ++adam_t_;
  size_t embed = ps.size(), head = ps.size();
  for (size_t k = 0; k < ps.size(); ++k) {
    if (ps[k].name == "embed") embed = k;
    if (ps[k].name == "lm_head") head = k;
  }
  if (tied && do_adam) {
    axpy(1.0f, grads[embed].data.data(), grads[head].data.data(), grads[head].numel());
    std::fill(grads[embed].data.begin(), grads[embed].data.end(), 0.0f);
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    if (rules_[k].kind == ParamRule::Kind::normuon) {
      normuon(ps[k], grads[k], k, lr_scale, momentum);
    } else if (do_adam && !(tied && k == embed)) {
      adam(ps[k], grads[k], k, lr_scale);
    }
  }
  if (tied && do_adam) ps[embed].data = ps[head].data;
}

void GptOptimizer::save(const std::filesystem::path& path) const {
  std::vector<NamedTensor> out;
  for (size_t k = 0; k < names_.size(); ++k) {
    out.push_back({"m." + names_[k], Tensor::from_vector(m_[k], {int64_t(m_[k].size())})});
    out.push_back({"v." + names_[k], Tensor::from_vector(v_[k], {int64_t(v_[k].size())})});
  }
  safetensors_write(path, out, {{"adam_steps", std::to_string(adam_t_)}});
}

void GptOptimizer::load(const std::filesystem::path& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  for (size_t k = 0; k < names_.size(); ++k) {
    for (auto [prefix, dst] : {std::pair{"m.", &m_[k]}, std::pair{"v.", &v_[k]}}) {
      std::vector<float> src = f.tensor(prefix + names_[k]).to_f32_vector();
      if (src.size() != dst->size())
        throw Error(ErrorKind::format, "optimizer state does not fit this model",
                    {.path = path.string(), .tensor = prefix + names_[k]});
      *dst = std::move(src);
    }
  }
  adam_t_ = std::stoll(f.metadata().at("adam_steps"));
}

float TrainSchedule::lr_scale(int64_t step) const {
  float lr = 1.0f;
  if (warmup_steps > 0 && step < warmup_steps) lr = float(step + 1) / float(warmup_steps);
  const int64_t cd_start = int64_t(double(total_steps) * (1.0 - cooldown_frac));
  if (step >= cd_start && total_steps > cd_start) {
    const float t = std::min(1.0f, float(step - cd_start) / float(total_steps - cd_start));
    lr = lr * (1.0f - t) + lr_floor * t;
  }
  return lr;
}

float TrainSchedule::momentum(int64_t step) const {
  const int64_t cd_start = total_steps - momentum_cooldown;
  if (step < momentum_warmup)
    return momentum_min + float(step) / float(momentum_warmup) * (momentum_max - momentum_min);
  if (step > cd_start)
    return momentum_max -
           float(step - cd_start) / float(momentum_cooldown) * (momentum_max - momentum_min);
  return momentum_max;
}

}  // namespace deg::train
