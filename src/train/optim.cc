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

void polar_express(const Ops& ops, float* x, int64_t R, int64_t K, int64_t count,
                   GemmPrecision precision) {
  // On the wide orientation: X [R, K] with R <= K, A = X Xᵀ [R, R], Y = B X. A tall X works on
  // Z = Xᵀ without moving it: A = Xᵀ X, and Yᵀ = (B Z)ᵀ = X Bᵀ. The count matrices go through
  // each product together (a strided batch), and through the combinations as one block of rows.
  const bool tall = R > K;
  const int64_t r = tall ? K : R, n = R * K;
  ops.frobenius_normalize({.x = x, .n = n, .count = count, .margin = 2e-2, .eps = 1e-6});
  const Tensor A = ops.alloc({count, r, r}, DType::f32), B = ops.alloc({count, r, r}, DType::f32);
  const Tensor Y = ops.alloc({count, R, K}, DType::f32);
  float *a = A.mutable_data<float>(), *b = B.mutable_data<float>(), *y = Y.mutable_data<float>();
  const int64_t rr = r * r;
  for (const auto& c : kPolarCoeffs) {
    ops.matmul({.a = x,  // A = Xᵀ X (tall) or X Xᵀ
                .lda = K,
                .ta = tall,
                .b = x,
                .ldb = K,
                .tb = !tall,
                .c = a,
                .ldc = r,
                .m = r,
                .n = r,
                .k = tall ? R : K,
                .precision = precision,
                .batch = count,
                .stride_a = n,
                .stride_b = n,
                .stride_c = rr});
    ops.matmul({.a = a,
                .lda = r,
                .b = a,
                .ldb = r,
                .c = b,
                .ldc = r,
                .m = r,
                .n = r,
                .k = r,
                .precision = precision,
                .batch = count,
                .stride_a = rr,
                .stride_b = rr,
                .stride_c = rr});
    const CombineTerm bt[] = {{.s = float(c[2])}, {.x = a, .ldx = r, .s = float(c[1])}};
    ops.combine({.y = b, .ldy = r, .rows = count * r, .n = r, .terms = bt});  // B = c1 A + c2 A A
    if (tall) {                                                               // Y = X Bᵀ
      ops.matmul({.a = x,
                  .lda = K,
                  .b = b,
                  .ldb = r,
                  .tb = true,
                  .c = y,
                  .ldc = K,
                  .m = R,
                  .n = K,
                  .k = K,
                  .precision = precision,
                  .batch = count,
                  .stride_a = n,
                  .stride_b = rr,
                  .stride_c = n});
    } else {  // Y = B X
      ops.matmul({.a = b,
                  .lda = r,
                  .b = x,
                  .ldb = K,
                  .c = y,
                  .ldc = K,
                  .m = R,
                  .n = K,
                  .k = R,
                  .precision = precision,
                  .batch = count,
                  .stride_a = rr,
                  .stride_b = n,
                  .stride_c = n});
    }
    const CombineTerm xt[] = {{.s = float(c[0])}, {.x = y, .ldx = K}};
    ops.combine({.y = x, .ldy = K, .rows = count * R, .n = K, .terms = xt});  // X = c0 X + Y
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

namespace {
constexpr int64_t kZeroRow = 4096;  // floats cleared per copy_rows row
}  // namespace

GptOptimizer::GptOptimizer(const GptParams& params, OptimizerHyper hyper, const Ops& ops)
    : ops_(&ops), hyper_(hyper) {
  const GptConfig& c = params.config();
  int64_t most = 1;
  for (const auto& t : params.tensors()) {
    ParamRule rule = gpt_param_rule(c, t.name);
    if (rule.kind == ParamRule::Kind::normuon && ends_with(t.name, ".attn.qk"))
      rule.group_rows = t.shape[0] / c.num_heads;  // 2 heads of this layer's q/k width
    rules_.push_back(rule);
    names_.push_back(t.name);
    shapes_.push_back(t.shape);
    m_.push_back(ops.alloc({t.numel()}, DType::f32));
    if (rule.kind == ParamRule::Kind::adam) {
      v_.push_back(ops.alloc({t.numel()}, DType::f32));
    } else {
      const int64_t rows = rule.group_rows ? rule.group_rows : t.shape[0], cols = t.shape[1];
      const int64_t groups = t.shape[0] / rows;
      v_.push_back(ops.alloc({groups * (rows >= cols ? rows : cols)}, DType::f32));
      auto cls = std::find_if(muon_.begin(), muon_.end(),
                              [&](const MuonClass& m) { return m.rows == rows && m.cols == cols; });
      if (cls == muon_.end()) cls = muon_.insert(muon_.end(), MuonClass{rows, cols, {}});
      for (int64_t gi = 0; gi < groups; ++gi) cls->blocks.emplace_back(rules_.size() - 1, gi);
      most = std::max(most, int64_t(cls->blocks.size()) * rows * cols);
    }
  }
  u_ = ops.alloc({most}, DType::f32);
  zero_row_ = ops.alloc({kZeroRow}, DType::f32);
}

void GptOptimizer::clear(float* x, int64_t n) const {
  const int64_t rows = n / kZeroRow, rest = n % kZeroRow;
  const float* z = zero_row_.data<float>();
  if (rows) ops_->copy_rows(z, 0, x, kZeroRow, rows, kZeroRow);
  if (rest) ops_->copy_rows(z, 0, x + rows * kZeroRow, rest, 1, rest);
}

void GptOptimizer::bind(MuonClass& c, const std::vector<float*>& p,
                        const std::vector<float*>& g) const {
  const int64_t n = c.rows * c.cols, nsec = std::max(c.rows, c.cols);
  const size_t count = c.blocks.size();
  std::vector<float*> t(4 * count);
  for (size_t j = 0; j < count; ++j) {
    const auto [k, gi] = c.blocks[j];
    t[j] = g[k] + gi * n;
    t[count + j] = m_[k].mutable_data<float>() + gi * n;
    t[2 * count + j] = p[k] + gi * n;
    t[3 * count + j] = v_[k].mutable_data<float>() + gi * nsec;
  }
  if (t == c.bound) return;
  c.bound = t;
  c.table = ops_->alloc({int64_t(t.size())}, DType::i64);
  static_assert(sizeof(float*) == sizeof(int64_t));
  ops_->to_device(c.table.raw_mutable(), t.data(), t.size() * sizeof(float*));
  if (c.lr_muls.numel() == 0) {
    std::vector<float> mul(count);
    for (size_t j = 0; j < count; ++j)
      mul[j] = std::sqrt(std::max(1.0f, float(c.rows) / float(c.cols))) *
               rules_[c.blocks[j].first].matrix_lr_mul;
    c.lr_muls = ops_->alloc({int64_t(count)}, DType::f32);
    ops_->to_device(c.lr_muls.raw_mutable(), mul.data(), count * sizeof(float));
  }
}

// Every block of the class at once: Nesterov (which clears the gradients), the batched Polar
// Express, NorMuon's step.
void GptOptimizer::normuon(MuonClass& c, const std::vector<float*>& p, const std::vector<float*>& g,
                           float lr_scale, float momentum) {
  const Ops& ops = *ops_;
  bind(c, p, g);
  const int64_t count = int64_t(c.blocks.size());
  float* const* table = reinterpret_cast<float* const*>(c.table.raw());
  float* u = u_.mutable_data<float>();
  ops.nesterov({.u = u,
                .n = c.rows * c.cols,
                .momentum = momentum,
                .count = count,
                .gs = table,
                .bufs = table + count});
  polar_express(ops, u, c.rows, c.cols, count, hyper_.polar);
  const float lr = hyper_.muon_lr * lr_scale;
  ops.normuon_step({.u = u,
                    .rows = c.rows,
                    .cols = c.cols,
                    .beta2 = hyper_.muon_beta2,
                    .lr = lr,
                    .wd = hyper_.muon_wd * lr,
                    .count = count,
                    .ps = table + 2 * count,
                    .seconds = table + 3 * count,
                    .lr_muls = c.lr_muls.data<float>()});
}

void GptOptimizer::adam(float* p, float* g, size_t k, float lr_scale) {
  const AdamHyper& h = rules_[k].adam;
  const double lr = double(hyper_.adam_lr) * lr_scale * h.lr_mul;
  const double bias1 = 1.0 - std::pow(double(h.beta1), double(adam_t_));
  const double bias2 = 1.0 - std::pow(double(h.beta2), double(adam_t_));
  ops_->adam_step({.p = p,
                   .g = g,
                   .m = m_[k].mutable_data<float>(),
                   .v = v_[k].mutable_data<float>(),
                   .n = m_[k].numel(),
                   .beta1 = h.beta1,
                   .beta2 = h.beta2,
                   .eps = hyper_.adam_eps,
                   .step_size = float(lr * std::sqrt(bias2) / bias1),
                   .wd = float(lr * lr * hyper_.adam_wd * h.wd_mul)});
}

void GptOptimizer::step(GptParams& params, std::vector<ParamTensor>& grads, float lr_scale,
                        float momentum, bool do_adam, bool tied) {
  DEG_CHECK(ops_->device() == Device::cpu, "a host step needs the CPU's optimizer");
  auto& ps = params.tensors();
  DEG_CHECK(ps.size() == grads.size(), "optimizer layout");
  std::vector<float*> p, g;
  for (size_t k = 0; k < ps.size(); ++k) {
    p.push_back(ps[k].data.data());
    g.push_back(grads[k].data.data());
  }
  step(p, g, lr_scale, momentum, do_adam, tied);
}

void GptOptimizer::step(const std::vector<float*>& p, const std::vector<float*>& g, float lr_scale,
                        float momentum, bool do_adam, bool tied) {
  const Ops& ops = *ops_;
  DEG_CHECK(p.size() == rules_.size() && g.size() == rules_.size(), "optimizer layout");
  if (do_adam) ++adam_t_;
  size_t embed = p.size(), head = p.size();
  for (size_t k = 0; k < p.size(); ++k) {
    if (names_[k] == "embed") embed = k;
    if (names_[k] == "lm_head") head = k;
  }
  const int64_t tied_n = embed < p.size() ? m_[embed].numel() : 0;
  if (tied && do_adam) {  // g_head += g_embed; g_embed = 0
    const CombineTerm t[] = {{.s = 1.0f}, {.x = g[embed], .ldx = tied_n}};
    ops.combine({.y = g[head], .ldy = tied_n, .rows = 1, .n = tied_n, .terms = t});
    clear(g[embed], tied_n);
  }
  for (MuonClass& c : muon_) normuon(c, p, g, lr_scale, momentum);
  for (size_t k = 0; k < p.size(); ++k)
    if (rules_[k].kind == ParamRule::Kind::adam && do_adam && !(tied && k == embed))
      adam(p[k], g[k], k, lr_scale);
  if (tied && do_adam) ops.copy_rows(p[head], tied_n, p[embed], tied_n, 1, tied_n);
}

void GptOptimizer::save(const std::filesystem::path& path) const {
  std::vector<NamedTensor> out;
  for (size_t k = 0; k < names_.size(); ++k) {
    out.push_back({"m." + names_[k], host_copy(m_[k])});
    out.push_back({"v." + names_[k], host_copy(v_[k])});
  }
  safetensors_write(path, out, {{"adam_steps", std::to_string(adam_t_)}});
}

void GptOptimizer::load(const std::filesystem::path& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  for (size_t k = 0; k < names_.size(); ++k) {
    for (auto [prefix, dst] : {std::pair{"m.", &m_[k]}, std::pair{"v.", &v_[k]}}) {
      const std::vector<float> src = f.tensor(prefix + names_[k]).to_f32_vector();
      if (int64_t(src.size()) != dst->numel())
        throw Error(ErrorKind::format, "optimizer state does not fit this model",
                    {.path = path.string(), .tensor = prefix + names_[k]});
      *dst = ops_->upload(Tensor::from_vector(src, {int64_t(src.size())}));
    }
  }
  adam_t_ = std::stoll(f.metadata().at("adam_steps"));
}

int64_t time_budget_steps(int64_t done, double elapsed, double budget, int64_t most,
                          int64_t current) {
  if ((done != 10 && done != 40 && done != 160) || elapsed <= 0) return current;
  const double fit = std::floor(budget * double(done) / elapsed);
  return std::clamp<int64_t>(int64_t(std::min(fit, 1e15)), done, most);
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
