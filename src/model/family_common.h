// Pieces that several backbone families share, so each family file holds only its own math:
// weight lookup by table name with errors that name the tensor, per-row parallel loops, RMSNorm
// over token rows, embedding rows, the SwiGLU MLP, the attention pass over a call's rows (one task
// per row, KV head and block of queries) and random weights for benchmarks. Letters as in
// backbone.h; N = B * L token rows of a call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/backbone.h"

namespace deg {

// Weights by table name (relative to the text prefix, plus "lm_head.weight").
using TensorMap = std::map<std::string, Tensor>;

std::string layer_name(int64_t i, const std::string& rest);  // "layers.<i>.<rest>"

// The tensor `name` of `shape`, f32 or bf16 and contiguous (a view: never copied). Throws
// deg::Error naming the tensor when it is missing or of the wrong shape or dtype.
const Tensor& weight_need(const TensorMap& w, const std::string& name, const Shape& shape);
// The same, read into an f32 copy (norm weights, conv kernels: small vectors).
std::vector<float> weight_f32(const TensorMap& w, const std::string& name, const Shape& shape);

// fn(i) for i in [0, n) over the pool, at least `grain` items per thread (1 for coarse tasks).
void for_each_index(int64_t n, int64_t grain, const std::function<void(int64_t)>& fn);

// kernels' rms_norm with its rows spread over the pool (strides as in `a`).
void rms_norm_parallel(const RmsNormArgs& a);

// y[i] = rms_norm(x[i]) for n rows of dim floats (contiguous), parallel over rows.
void rms_norm_rows(const float* x, float* y, int64_t n, int64_t dim, const std::vector<float>& w,
                   float eps, NormScale scale);

// h[i, 0:C] = table[ids[i]] (f32 or bf16 [V, C]) for n tokens at row stride ldh.
void gather_embeddings(const Tensor& table, const int32_t* ids, int64_t n, float* h, int64_t ldh);

// h += down(silu(gate(xn)) * up(xn)) over n token rows: xn [n, C] (already normed), gate and up
// [I, C], down [C, I]. Uses layer scratch slots kLayerSlots + 1 and + 2.
struct SwigluMlpArgs {
  float* h = nullptr;         // [n, C] residual, updated in place
  const float* xn = nullptr;  // [n, C]
  int64_t n = 0;
  int64_t hidden = 0;  // C
  int64_t width = 0;   // I
  const Tensor* gate = nullptr;
  const Tensor* up = nullptr;
  const Tensor* down = nullptr;
  GemmPrecision precision = GemmPrecision::exact;
};
void swiglu_mlp(const SwigluMlpArgs& a);

// Causal attention of every row of a layer call over its prefix and own K/V (this call's K/V
// already written into the rows' own buffers). Query head g of KV head h sits at
// q[(b * L + t) * ldq + (h * group + g) * D]; the output has the same layout in `out`, and
// padded positions of `out` are zeroed. One task per (row, KV head, block of 16 queries).
// RMSNorm in place of `heads` contiguous head vectors of `d` floats (q/k/v norms).
void norm_heads(float* x, int64_t heads, int64_t d, const float* w, float eps, NormScale scale);

// One token's K and V (`kv_heads` heads of `d`, contiguous) written at own position
// rv.own_before + t of a row's buffers.
void store_kv(const RowView& rv, int64_t t, const float* k, const float* v, int64_t kv_heads,
              int64_t d);

struct AttendRowsArgs {
  const LayerCall* call = nullptr;
  const float* q = nullptr;  // [N, ldq]
  int64_t ldq = 0;
  float* out = nullptr;  // [N, ldo]
  int64_t ldo = 0;
  int64_t kv_heads = 0;  // Hkv
  int64_t group = 1;     // query heads per KV head
  int64_t head_dim = 0;  // D
  float scale = 1;
  int64_t window = 0;  // > 0: sliding attention over the last `window` positions
};
// Work units are (row, KV head, block of queries); when there are fewer than threads (a decode
// step over few KV heads) each unit's query heads are split among more units. A query head's
// output is computed the same way in any split, so results do not depend on it.
void attend_rows(const AttendRowsArgs& a);

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
