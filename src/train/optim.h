// Optimizers of the gpt trainer (modded-nanogpt NorMuonAndAdam, train_gpt.py): NorMuon for the
// attention and MLP matrices (Nesterov momentum, Polar Express orthogonalisation, a per-row (or
// per-column) second moment, cautious weight decay) and Adam with cautious weight decay for the
// embeddings, tables, gates and scalars. f32 throughout (the seed keeps bf16 weights with a
// mantissa side buffer: that is f32 arithmetic too). Deterministic: no randomness, fixed orders.
//
// Letters: R rows, K columns of one matrix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "train/gpt_params.h"

namespace deg::train {

// Polar Express (Amsel et al. 2025; modded-nanogpt's 5 coefficient triples): X [R, K] in place
// -> an approximately orthogonal matrix with X's singular vectors (singular values near 1).
// On `ops`' device (x in its memory), or on the CPU. count: that many matrices back to back at
// x, each with the result it would have alone (their products batched). precision: its products'
// (bf16_all: operands rounded to bf16, f32 sums — the seed's bf16 Polar Express).
void polar_express(const Ops& ops, float* x, int64_t R, int64_t K, int64_t count = 1,
                   GemmPrecision precision = GemmPrecision::exact);
void polar_express(float* x, int64_t R, int64_t K);

struct AdamHyper {
  float beta1 = 0.9f, beta2 = 0.99f;
  float lr_mul = 1.0f, wd_mul = 1.0f;
};

// How one parameter is optimised (the seed's param_table).
struct ParamRule {
  enum class Kind : uint8_t { normuon, adam };
  Kind kind = Kind::adam;
  AdamHyper adam;
  int64_t group_rows = 0;      // NorMuon: orthogonalise blocks of this many rows (0: whole)
  float matrix_lr_mul = 1.0f;  // NorMuon: per-matrix multiplier (2 for MLP c_proj)
};
ParamRule gpt_param_rule(const GptConfig& c, const std::string& name);

struct OptimizerHyper {
  float adam_lr = 0.008f, adam_eps = 1e-10f, adam_wd = 0.005f;
  float muon_lr = 0.023f, muon_beta2 = 0.9f, muon_wd = 1.2f;
  // Polar Express's products: exact (f32), or bf16_all under the bf16 training path, as the
  // seed and the PyTorch reference run it.
  GemmPrecision polar = GemmPrecision::exact;
};

// The optimizer's state lives in `ops`' memory (the CPU's, or a GPU's with the parameters and
// gradients it steps), and every update runs as `ops`' ops, so a CPU and a GPU step are the same
// sequence of operations.
class GptOptimizer {
 public:
  GptOptimizer(const GptParams& params, OptimizerHyper hyper, const Ops& ops = cpu_ops());

  // One step: lr_scale multiplies both base rates (the schedule), momentum is NorMuon's.
  // do_adam: Adam parameters step only then (the seed steps them on odd steps, accumulating
  // their gradients over two steps). tied: embed's gradient is added into lm_head's and embed
  // is set to lm_head after the step. Gradients of stepped parameters are zeroed. Host
  // parameters and gradients: the optimizer's backend must be the CPU's.
  void step(GptParams& params, std::vector<ParamTensor>& grads, float lr_scale, float momentum,
            bool do_adam, bool tied);
  // The same over parameter k's values p[k] and gradient g[k] (params.tensors()' order) in the
  // optimizer's backend's memory.
  void step(const std::vector<float*>& p, const std::vector<float*>& g, float lr_scale,
            float momentum, bool do_adam, bool tied);

  // Whether a step with do_adam reads (and then zeroes) parameter k's gradient: NorMuon's every
  // step, Adam's (embed's too) on Adam steps; the others keep accumulating until then.
  bool reads_gradient(size_t k, bool do_adam) const {
    return do_adam || rules_[k].kind == ParamRule::Kind::normuon;
  }
  const Ops& ops() const { return *ops_; }
  int64_t adam_steps() const { return adam_t_; }
  void save(const std::filesystem::path& path) const;
  void load(const std::filesystem::path& path);

 private:
  // NorMuon's matrices of one shape: every block (parameter k's rows [gi rows, (gi + 1) rows))
  // orthogonalised in one batched Polar Express.
  struct MuonClass {
    int64_t rows = 0, cols = 0;
    std::vector<std::pair<size_t, int64_t>> blocks;  // (k, gi)
    // The blocks' gradients, momenta, parameters and second moments ([4, blocks] pointers),
    // as a step last gave them, and in the backend's memory for the batched ops; each block's
    // rate multiplier there too.
    std::vector<float*> bound;
    Tensor table, lr_muls;
  };
  void bind(MuonClass& c, const std::vector<float*>& p, const std::vector<float*>& g) const;
  void normuon(MuonClass& c, const std::vector<float*>& p, const std::vector<float*>& g,
               float lr_scale, float momentum);
  void adam(float* p, float* g, size_t k, float lr_scale);
  void clear(float* x, int64_t n) const;  // x[0, n) = 0

  const Ops* ops_;
  OptimizerHyper hyper_;
  std::vector<ParamRule> rules_;
  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::vector<Tensor> m_, v_;    // Adam moments, or NorMuon momentum / 2nd moment; ops' memory
  std::vector<MuonClass> muon_;  // in the order of their first parameters
  Tensor u_;                     // NorMuon's updates of one class (the largest)
  Tensor zero_row_;              // zeros, read with stride 0 to clear a gradient
  int64_t adam_t_ = 0;
};

// The speedrun's schedules (schedule.py, train_gpt.py get_muon_momentum), over `total` steps.
// A run bounded by time (--max-seconds): after `done` steps in `elapsed` seconds, its length in
// steps. At the probe points (10, 40 and 160 steps done) the steps that fit in `budget` at the
// pace so far (at least `done`, at most `most`); elsewhere `current`, so the schedules that
// follow the length move only at those points.
int64_t time_budget_steps(int64_t done, double elapsed, double budget, int64_t most,
                          int64_t current);

struct TrainSchedule {
  int64_t total_steps = 0;
  int64_t warmup_steps = 0;    // linear lr warmup (the seed uses none)
  float cooldown_frac = 0.8f;  // the lr decays linearly to lr_floor over this last fraction
  float lr_floor = 0.3f;
  int64_t momentum_warmup = 300, momentum_cooldown = 50;
  float momentum_min = 0.85f, momentum_max = 0.95f;
  float lr_scale(int64_t step) const;
  float momentum(int64_t step) const;
};

}  // namespace deg::train
