// NorMuon + Adam and the step schedules (see optim.h).
#include "train/optim.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"
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

void polar_express(float* x, int64_t R, int64_t K) {
  // Work on the wide orientation: X [r, k] with r <= k; A = X X^T is [r, r].
  const bool tall = R > K;
  const int64_t r = tall ? K : R, k = tall ? R : K;
  Buf X = zeros(r * k);
  if (tall) {
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < K; ++j) X[size_t(j * k + i)] = x[i * K + j];
  } else {
    std::memcpy(X.data(), x, sizeof(float) * size_t(R * K));
  }
  const double fro = std::sqrt(double(dot(X.data(), X.data(), r * k)));
  const float inv = float(1.0 / (fro * (1 + 2e-2) + 1e-6));
  for (auto& v : X) v *= inv;
  Buf A = zeros(r * r), B = zeros(r * r), Y = zeros(r * k);
  for (const auto& c : kPolarCoeffs) {
    matmul_nt(X.data(), X.data(), A.data(), r, k, r);  // A = X X^T
    matmul_nn(A.data(), A.data(), B.data(), r, r, r);  // B = A A
    for (size_t i = 0; i < B.size(); ++i) B[i] = float(c[1] * A[i] + c[2] * B[i]);
    matmul_nn(B.data(), X.data(), Y.data(), r, r, k);  // Y = B X
    for (size_t i = 0; i < Y.size(); ++i) X[i] = float(c[0] * X[i] + Y[i]);
  }
  if (tall) {
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < K; ++j) x[i * K + j] = X[size_t(j * k + i)];
  } else {
    std::memcpy(x, X.data(), sizeof(float) * size_t(R * K));
  }
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
  const ParamRule& rule = rules_[k];
  const int64_t rows = rule.group_rows ? rule.group_rows : p.shape[0], cols = p.shape[1];
  const int64_t groups = p.shape[0] / rows, n = rows * cols;
  const bool tall = rows >= cols;
  const int64_t red = tall ? cols : rows, nsec = tall ? rows : cols;
  const float lr = hyper_.muon_lr * lr_scale;
  const float lr_eff =
      lr * std::sqrt(std::max(1.0f, float(rows) / float(cols))) * rule.matrix_lr_mul;
  const float wd_eff = hyper_.muon_wd * lr;
  for (int64_t gi = 0; gi < groups; ++gi) {
    float* gr = g.data.data() + gi * n;
    float* buf = m_[k].data() + gi * n;
    float* pw = p.data.data() + gi * n;
    float* second = v_[k].data() + gi * nsec;
    // Nesterov: buf <- lerp(buf, g, 1 - mom); update <- lerp(g, buf, mom).
    Buf u = zeros(n);
    for (int64_t i = 0; i < n; ++i) {
      buf[i] += (1.0f - momentum) * (gr[i] - buf[i]);
      u[size_t(i)] = gr[i] + momentum * (buf[i] - gr[i]);
    }
    polar_express(u.data(), rows, cols);
    // NorMuon variance reduction: per-row (tall) or per-column (wide) mean square.
    Buf vmean = zeros(nsec);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float x = u[size_t(i * cols + j)];
        vmean[size_t(tall ? i : j)] += x * x / float(red);
      }
    double vnorm_sq = 0, scaled = 0;
    Buf step = zeros(nsec);
    for (int64_t s = 0; s < nsec; ++s) {
      vnorm_sq += double(vmean[size_t(s)]) * double(red);
      second[s] += (1.0f - hyper_.muon_beta2) * (vmean[size_t(s)] - second[s]);
      step[size_t(s)] = 1.0f / std::sqrt(std::max(second[s], 1e-10f));
      scaled += double(vmean[size_t(s)]) * double(red) * step[size_t(s)] * step[size_t(s)];
    }
    const float ratio = float(std::sqrt(vnorm_sq) / std::max(std::sqrt(scaled), 1e-10));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const size_t e = size_t(i * cols + j);
        const float v = u[e] * step[size_t(tall ? i : j)] * ratio;
        // Cautious weight decay: only where the update and the weight agree in sign.
        const float decay = (v * pw[e] >= 0.0f) ? pw[e] * wd_eff * lr_eff : 0.0f;
        pw[e] = pw[e] - decay - v * lr_eff;
      }
  }
  std::fill(g.data.begin(), g.data.end(), 0.0f);
}

void GptOptimizer::adam(ParamTensor& p, ParamTensor& g, size_t k, float lr_scale) {
  const AdamHyper& h = rules_[k].adam;
  const double lr = double(hyper_.adam_lr) * lr_scale * h.lr_mul;
  const double bias1 = 1.0 - std::pow(double(h.beta1), double(adam_t_));
  const double bias2 = 1.0 - std::pow(double(h.beta2), double(adam_t_));
  const float step_size = float(lr * std::sqrt(bias2) / bias1);
  const float eff_wd = float(lr * lr * hyper_.adam_wd * h.wd_mul);
  float* m = m_[k].data();
  float* v = v_[k].data();
  for (size_t i = 0; i < p.data.size(); ++i) {
    const float gi = g.data[i];
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
    float upd = m[i] / (std::sqrt(v[i]) + hyper_.adam_eps) * step_size;
    if (upd * p.data[i] > 0.0f) upd += p.data[i] * eff_wd;
    p.data[i] -= upd;
  }
  std::fill(g.data.begin(), g.data.end(), 0.0f);
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
