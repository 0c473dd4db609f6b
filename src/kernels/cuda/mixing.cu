// The CUDA backend's f32 row ops in the CPU's expression order (kernels/cpu/scalar_ops.cc):
// activations, bias and scale, left-to-right combinations of terms with per-token lane
// coefficients, sigmoid gates and projection removal over f64-accumulated dot products,
// interleaved rotary at paired-head positions, shifted ids and the hashed n-gram embedding.
//
// Batch invariance: every output element (or every (token, head) of the dot-product ops) is
// computed by one thread in the CPU's order, from its own inputs only.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

__device__ float activate(const ActivationLaunch& a, float x) {
  switch (a.act) {
    case 0: {
      const float r = x > 0 ? x : 0.0f;
      return r * r;
    }
    case 1: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case 2: return a.a * sigmoid((x + a.b) / a.c);
    case 3: return sigmoid(x);
    case 4: return x / (1.0f + expf(-x));
    default: {
      const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
  }
}

// kVec: four columns a thread (by_float4).
template <bool kVec>
__global__ void activation_kernel(ActivationLaunch a) {
  if constexpr (kVec) {
    const int64_t n4 = a.n / 4;
    DEG_GRID_LOOP(e, a.rows * n4) {
      const int64_t r = e / n4, j = e % n4;
      const float4 x = reinterpret_cast<const float4*>(a.x + r * a.ldx)[j];
      reinterpret_cast<float4*>(a.y + r * a.ldy)[j] =
          make_float4(activate(a, x.x), activate(a, x.y), activate(a, x.z), activate(a, x.w));
    }
  } else {
    DEG_GRID_LOOP(e, a.rows * a.n) {
      const int64_t r = e / a.n, j = e % a.n;
      a.y[r * a.ldy + j] = activate(a, a.x[r * a.ldx + j]);
    }
  }
}

__global__ void bias_scale_kernel(BiasScaleLaunch a) {
  DEG_GRID_LOOP(e, a.rows * a.n) {
    const int64_t r = e / a.n, j = e % a.n;
    const float x = a.x[r * a.ldx + j];
    a.y[r * a.ldy + j] = a.bias ? (x + a.bias[j]) * a.s : x * a.s;
  }
}

__device__ float term_coef(const CombineTermLaunch& t, int64_t r, int64_t g) {
  if (!t.lane) return t.s;
  float c = t.s * t.lane[r * t.ldl + g * t.gl];
  if (t.add) c += t.add[r * t.lda + g * t.ga];
  if (t.offset != 0.0f) c = t.offset + c;
  return c;
}

// y[r, j] = sum_k coef_k(r, j / group) x_k[r, j], left to right; the thread reads y[r, j] (a
// null term's x) before writing it.
__global__ void combine_kernel(CombineLaunch a) {
  DEG_GRID_LOOP(e, a.rows * a.n) {
    const int64_t r = e / a.n, j = e % a.n, g = j / a.group;
    float* y = a.y + r * a.ldy + j;
    bool reads_y = false;  // y is read only for a term that is the output row itself
    for (int k = 0; k < a.terms; ++k) reads_y |= a.term[k].x == nullptr;
    const float before = reads_y ? *y : 0.0f;
    float acc = 0.0f;
    for (int k = 0; k < a.terms; ++k) {
      const CombineTermLaunch& t = a.term[k];
      const float x = t.x ? t.x[r * t.ldx + j] : before;
      const float p = term_coef(t, r, g) * x;
      acc = k == 0 ? p : acc + p;
    }
    *y = acc;
  }
}

__global__ void sigmoid_gates_kernel(SigmoidGatesLaunch a) {
  DEG_GRID_LOOP(e, a.rows * a.heads) {
    const int64_t r = e / a.heads, h = e % a.heads;
    const float* w = a.w + h * a.ldw;
    float z = float(dot_f64(w, a.x + r * a.ldx, a.n));
    if (a.x2) z += float(dot_f64(w + a.n, a.x2 + r * a.ldx2, a.n));
    a.out[r * a.ldo + h] = a.s * sigmoid(z);
  }
}

// (x0, x1) -> (c x0 + s x1, c x1 - s x0) at angle position * freq[2i] (in f64, cos and sin
// rounded to f32) over the first `dims` dims of each head of the row's real tokens.
__global__ void rope_pairs_kernel(RopePairsLaunch a) {
  const int i = blockIdx.y;
  const int64_t n = a.rows.length[i], pairs = a.dims / 2, per_token = a.heads * pairs;
  const int64_t row0 = (a.rows.first + i) * a.rows.tokens;
  DEG_GRID_LOOP(e, n * per_token) {
    const int64_t t = e / per_token, h = (e % per_token) / pairs, d = 2 * (e % pairs);
    const int64_t pos = a.rows.position[i] + t;
    const int64_t p = a.paired_heads ? 2 * pos + h % 2 : pos;
    float* x = a.x + (row0 + t) * a.ldx + h * a.hs;
    const double th = double(p) * double(a.freq[d]);
    const float c = float(cos(th)), s = a.inverse ? -float(sin(th)) : float(sin(th));
    const float x0 = x[d], x1 = x[d + 1];
    x[d] = c * x0 + s * x1;
    x[d + 1] = c * x1 - s * x0;
  }
}

// y_h -= tanh(strength_h) (y_h . v_h / max(v_h . v_h, eps)) v_h per (real token, head): a warp
// per vector, lane l taking dims l, l + 32, ... of both f64 dot products (meeting in
// group_sum's tree), then its own dims of y.
__global__ void subtract_projection_kernel(ProjectionLaunch a) {
  const int i = blockIdx.y;
  const int64_t n = a.rows.length[i] * a.heads, row0 = (a.rows.first + i) * a.rows.tokens;
  const LaneGroups lg(kWarp);
  const int64_t lane = lg.lane;
  for (int64_t e = lg.first; lg.warp_has(e, n); e += lg.warps * lg.per_warp) {
    const bool on = e < n;
    const int64_t tok = row0 + (on ? e / a.heads : 0), h = on ? e % a.heads : 0;
    float* y = a.y + tok * a.ldy + h * a.hy;
    const float* v = a.v + tok * a.ldv + h * a.hv;
    double vv_s = 0, yv_s = 0;
    if (on)
      for (int64_t d = lane; d < a.dim; d += kWarp) {
        vv_s += double(v[d]) * double(v[d]);
        yv_s += double(y[d]) * double(v[d]);
      }
    const float vv = float(group_sum(vv_s, kWarp)), yv = float(group_sum(yv_s, kWarp));
    if (!on) continue;
    const float den = vv > a.eps ? vv : a.eps;
    const float m = -(tanhf(a.strength[tok * a.lds + h]) * yv / den);
    for (int64_t d = lane; d < a.dim; d += kWarp) y[d] += m * v[d];
  }
}

// Every token of the chunk's rows, padded ones included (their positions continue the row's).
__global__ void shift_ids_kernel(ShiftIdsLaunch a) {
  const int i = blockIdx.y;
  const int64_t L = a.rows.tokens, k = a.back, b = a.rows.first + i;
  DEG_GRID_LOOP(t, L) {
    const int64_t at = b * L + t, pos = a.rows.position[i] + t;
    int32_t id = -1;
    if (pos >= k) {
      id = t >= k ? a.ids[at - k] : a.history[b * a.history_len + a.history_len - (k - t)];
    }
    if (a.out) a.out[at] = id;
    if (a.lane) a.lane[at * a.ld_lane] = float(id);
  }
}

__device__ int32_t wrap_mul(int32_t m, int32_t x) {
  return int32_t(uint32_t(m) * uint32_t(x));
}

__device__ int32_t py_mod(int32_t a, int32_t m) {  // Python's % for m > 0
  const int32_t r = a % m;
  return r < 0 ? r + m : r;
}

__device__ float table_at(const NgramLaunch& a, int64_t row, int64_t d) {
  if (!a.bf16) return static_cast<const float*>(a.table)[row * a.dim + d];
  const uint16_t b = static_cast<const uint16_t*>(a.table)[row * a.dim + d];
  return __uint_as_float(uint32_t(b) << 16);
}

// The table rows (bigram, trigram) and sign rows of the token at `at` of its row, position pos.
struct NgramHit {
  int32_t rows[2], signs[2];
};

__device__ NgramHit ngram_hit(const NgramLaunch& a, int64_t at, int64_t pos) {
  const int32_t half = int32_t(a.table_rows / 2), bmod = half - 1;
  const int32_t tmod = int32_t(a.table_rows) - half - 1, mask = int32_t(a.sign_rows - 1);
  const int32_t x = a.ids[at], p1 = a.prev1[at], p2 = a.prev2[at];
  const int32_t prev = pos == 1 ? bmod : p1;
  NgramHit h;
  h.rows[0] = pos == 0
                  ? bmod
                  : py_mod(wrap_mul(a.bigram_rows[0], x) ^ wrap_mul(a.bigram_rows[1], prev), bmod);
  h.rows[1] = pos < 2 ? half + tmod
                      : py_mod(wrap_mul(a.trigram_rows[0], x) ^ wrap_mul(a.trigram_rows[1], p1) ^
                                   wrap_mul(a.trigram_rows[2], p2),
                               tmod) +
                            half;
  h.signs[0] =
      pos < 1 ? 0 : (wrap_mul(a.bigram_signs[1], p1) ^ wrap_mul(a.bigram_signs[0], x)) & mask;
  h.signs[1] = pos < 2 ? 0
                       : (wrap_mul(a.trigram_signs[2], p2) ^ wrap_mul(a.trigram_signs[1], p1) ^
                          wrap_mul(a.trigram_signs[0], x)) &
                             mask;
  return h;
}

// y[token, d] = bigram row[d] * its sign[d] + trigram row[d] * its sign[d] (0 + the first, then
// the second, as the CPU sums), every token of the chunk's rows.
__global__ void ngram_embed_kernel(NgramLaunch a) {
  const int i = blockIdx.y;
  const int64_t L = a.rows.tokens, b = a.rows.first + i, Dn = a.dim;
  DEG_GRID_LOOP(e, L * Dn) {
    const int64_t t = e / Dn, d = e % Dn, at = b * L + t;
    const NgramHit h = ngram_hit(a, at, a.rows.position[i] + t);
    float out = 0.0f;
    out += table_at(a, h.rows[0], d) * a.sign_pool[int64_t(h.signs[0]) * Dn + d];
    out += table_at(a, h.rows[1], d) * a.sign_pool[int64_t(h.signs[1]) * Dn + d];
    a.y[at * a.ldy + d] = out;
  }
}

__global__ void ngram_entries_kernel(NgramLaunch a, int32_t* rows, int32_t* signs) {
  const int i = blockIdx.y;
  const int64_t L = a.rows.tokens, b = a.rows.first + i;
  DEG_GRID_LOOP(t, L) {
    const int64_t at = b * L + t;
    const NgramHit h = ngram_hit(a, at, a.rows.position[i] + t);
    for (int c = 0; c < 2; ++c) {
      rows[2 * at + c] = h.rows[c];
      signs[2 * at + c] = h.signs[c];
    }
  }
}

int64_t longest(const Rows& r) {
  int64_t most = 0;
  for (int i = 0; i < r.count; ++i) most = r.length[i] > most ? r.length[i] : most;
  return most;
}

}  // namespace

cudaError_t launch_activation(const ActivationLaunch& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  if (by_float4(a.n, {a.x, a.y}, {a.ldx, a.ldy})) {
    activation_kernel<true><<<grid_for(a.rows * a.n / 4), kThreads, 0, stream>>>(a);
  } else {
    activation_kernel<false><<<grid_for(a.rows * a.n), kThreads, 0, stream>>>(a);
  }
  return launched();
}

cudaError_t launch_bias_scale(const BiasScaleLaunch& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  bias_scale_kernel<<<grid_for(a.rows * a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_combine(const CombineLaunch& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  if (a.terms < 1 || a.terms > kCombineTerms || a.group < 1) return cudaErrorInvalidValue;
  combine_kernel<<<grid_for(a.rows * a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_sigmoid_gates(const SigmoidGatesLaunch& a, cudaStream_t stream) {
  if (a.rows * a.heads == 0) return cudaSuccess;
  sigmoid_gates_kernel<<<grid_for(a.rows * a.heads), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_rope_pairs(const RopePairsLaunch& a, cudaStream_t stream) {
  const int64_t most = longest(a.rows);
  if (most == 0 || a.dims < 2 || a.heads == 0) return cudaSuccess;
  rope_pairs_kernel<<<dim3(grid_for(most * a.heads * (a.dims / 2)), unsigned(a.rows.count)),
                      kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_subtract_projection(const ProjectionLaunch& a, cudaStream_t stream) {
  const int64_t most = longest(a.rows);
  if (most == 0 || a.heads == 0) return cudaSuccess;
  subtract_projection_kernel<<<dim3(grid_for(most * a.heads * kWarp), unsigned(a.rows.count)),
                               kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_shift_ids(const ShiftIdsLaunch& a, cudaStream_t stream) {
  if (a.rows.count == 0 || a.rows.tokens == 0) return cudaSuccess;
  shift_ids_kernel<<<dim3(grid_for(a.rows.tokens), unsigned(a.rows.count)), kThreads, 0, stream>>>(
      a);
  return launched();
}

cudaError_t launch_ngram_entries(const NgramLaunch& a, int32_t* rows, int32_t* signs,
                                 cudaStream_t stream) {
  if (a.rows.count == 0 || a.rows.tokens == 0) return cudaSuccess;
  ngram_entries_kernel<<<dim3(grid_for(a.rows.tokens), unsigned(a.rows.count)), kThreads, 0,
                         stream>>>(a, rows, signs);
  return launched();
}

cudaError_t launch_ngram_embed(const NgramLaunch& a, cudaStream_t stream) {
  if (a.rows.count == 0 || a.rows.tokens * a.dim == 0) return cudaSuccess;
  ngram_embed_kernel<<<dim3(grid_for(a.rows.tokens * a.dim), unsigned(a.rows.count)), kThreads, 0,
                       stream>>>(a);
  return launched();
}

}  // namespace deg::cuda
