// Pieces that several backbone families share, so each family file holds only its own math:
// weight lookup by table name with errors that name the tensor, the SwiGLU MLP as ops, and random
// weights for benchmarks. Letters as in backbone.h; N = B * L token rows of a call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "model/backbone.h"

namespace deg {

// The ranges of config.json values the families support (docs/hardening.md). Values outside
// them are refused where config.json is read, with the key's JSON pointer, so none reaches a
// kernel: rope tables hold at most 256 frequencies (head_dim 512), token ids are int32, and the
// sizes bound every allocation a config can ask for.
inline constexpr int64_t kMaxConfigVocab = int64_t(1) << 22;  // 4,194,304 token ids
inline constexpr int64_t kMaxConfigHidden = 65536;            // C
inline constexpr int64_t kMaxConfigWidth = int64_t(1) << 20;  // MLP width 1,048,576
inline constexpr int64_t kMaxConfigLayers = 1024;
inline constexpr int64_t kMaxConfigHeads = 1024;
inline constexpr int64_t kMaxConfigHeadDim = 512;
inline constexpr int64_t kMaxConfigConvKernel = 64;
inline constexpr int64_t kMaxConfigWindow = int64_t(1) << 31;
inline constexpr double kMinConfigEps = 1e-12, kMaxConfigEps = 1.0;  // RMSNorm epsilon
inline constexpr double kMinRopeTheta = 1.0, kMaxRopeTheta = 1e12;
inline constexpr double kMaxConfigSoftcap = 1e6;

// Weights by table name (relative to the text prefix, plus "lm_head.weight").
using TensorMap = std::map<std::string, Tensor>;

std::string layer_name(int64_t i, const std::string& rest);  // "layers.<i>.<rest>"

// The tensor `name` of `shape`, f32 or bf16 and contiguous (a view: never copied). Throws
// deg::Error naming the tensor when it is missing, of the wrong shape or dtype, or holds a NaN
// or an infinity (checked once, when the family is built).
const Tensor& weight_need(const TensorMap& w, const std::string& name, const Shape& shape);
// The same, read into an f32 copy (norm weights, conv kernels: small vectors).
std::vector<float> weight_f32(const TensorMap& w, const std::string& name, const Shape& shape);
// weight_need's tensor on `ops`' device: the view itself on the CPU, a copy in GPU memory.
Tensor weight_on(const Ops& ops, const TensorMap& w, const std::string& name, const Shape& shape);
// A small f32 vector (norm weights, conv kernels, gate constants) on `ops`' device.
Tensor vector_on(const Ops& ops, const std::vector<float>& v);
// Weights [N_i, K] that multiply one input, as adjacent row blocks of one device tensor (a view
// each, in order), so the backend can run them as one GEMM (CudaOps::gemm merges outputs whose
// weights and outputs are adjacent). On the CPU, or when their dtypes differ, weight_on's
// tensors (the CPU's stay mapped from the file).
std::vector<Tensor> weights_stacked_on(const Ops& ops, const TensorMap& w,
                                       const std::vector<std::pair<std::string, Shape>>& parts);

// Rows a projection reads (GemmArgs::x or ::xb): f32, or — for bf16 dot products with bf16
// weights — already rounded to bf16 by the op that wrote them (NormArgs::yb, GluArgs::outb), which
// spares the GEMM its own rounding pass over them (the products' bits are the same).
struct ProjectionInput {
  float* f32 = nullptr;
  bf16* b16 = nullptr;
};
// n rows of k as bf16 from the call's arena when `rounded`; else f32: `in_place` (an op's f32
// result kept where it is) or, when null, from the arena.
ProjectionInput projection_input(const Exec& x, int64_t n, int64_t k, bool rounded,
                                 float* in_place = nullptr);
// Each output's y (+)= in · Wᵀ over n rows of k at row stride ld (0: k), as one Ops::gemm.
void project(const Exec& x, ProjectionInput in, int64_t n, int64_t k,
             std::span<const GemmOutput> outs, GemmPrecision precision, int64_t ld = 0);

// h += down(silu(gate(xn)) * up(xn)) over n token rows: xn [n, C] (already normed), gate and up
// [I, C], down [C, I]; scratch from the call's arena.
struct SwigluMlpArgs {
  float* h = nullptr;  // [n, C] residual, updated in place
  ProjectionInput xn;  // [n, C]
  int64_t n = 0;
  int64_t hidden = 0;  // C
  int64_t width = 0;   // I
  const Tensor* gate = nullptr;
  const Tensor* up = nullptr;
  const Tensor* down = nullptr;
  GemmPrecision precision = GemmPrecision::exact;
};
void swiglu_mlp(const Exec& x, const SwigluMlpArgs& a);

// Self-attention of a layer call: this call's real K/V written into the rows' own buffers (k
// and v null: a K/V-sharing layer, which reads its source layer's), then causal attention over
// each row's prefix and own keys. q, k, v are per token [H*D], [Hkv*D], [Hkv*D] contiguous
// (already normed and rotated). Returns the attention output [N, H*D] from the call's arena.
struct SelfAttentionArgs {
  const LayerCall* call = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t heads = 0;     // H
  int64_t kv_heads = 0;  // Hkv
  int64_t head_dim = 0;  // D
  float scale = 1;
  int64_t window = 0;  // > 0: sliding attention
  bool bf16 = false;   // bf16 dot products (AttendArgs::bf16)
};
// The call's dot products are bf16: bf16 precision over bf16 weights such as `w` (GemmPrecision).
inline bool bf16_products(GemmPrecision precision, const Tensor& w) {
  return precision == GemmPrecision::bf16 && w.dtype() == DType::bf16;
}
// Every defined weight of one projection call has bf16 products (its input may be bf16 rows:
// GemmArgs::xb serves bf16 weights only).
inline bool bf16_products(GemmPrecision precision, std::initializer_list<const Tensor*> ws) {
  return std::all_of(ws.begin(), ws.end(), [&](const Tensor* w) {
    return !w->defined() || bf16_products(precision, *w);
  });
}
float* self_attention(const Exec& x, const SelfAttentionArgs& a);

// Random weights for benchmarks: every tensor of `table` filled from a counter-based hash
// (uniform, std 0.02; reproducible and parallel). `f32(name, shape)` picks tensors kept in f32
// (the rest are `dtype`); `adjust(name, unit, x)` may replace a value x drawn from unit in [0, 1)
// (norm weights around their identity, decay parameters).
struct RandomWeightsArgs {
  const std::vector<std::pair<std::string, Shape>>* table = nullptr;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  std::function<bool(const std::string&, const Shape&)> f32;
  std::function<float(const std::string&, float, float)> adjust;
};
TensorMap random_weights(const RandomWeightsArgs& a);

}  // namespace deg
