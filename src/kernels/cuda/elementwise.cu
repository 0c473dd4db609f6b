// The CUDA backend's row-wise and elementwise ops (launch.h): norms, rotary embedding, K/V
// writes, the causal conv, the delta-rule gates, GLU gates, residual adds, gathers, copies and
// the GEMM operand conversions. All f32, in the CPU backend's expression order where it has one.
//
// Batch invariance: every output element is computed by one thread, or (norms) one warp per
// vector with a reduction whose shape depends on the vector's length only, so no result depends
// on how many rows a call has.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kNormWarps = kThreads / 32;  // normalised vectors per block (a warp each)

// Blocks for n threads' worth of work, capped (the kernels loop over the rest).
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// Rows and columns of a [rows, n] elementwise op: blockIdx.y (and its multiples) the row,
// 32-bit column indices.
dim3 row_grid(int64_t rows, int64_t n) {
  const int64_t x = (n + kThreads - 1) / kThreads;
  return dim3(unsigned(x), unsigned(rows < 65535 ? rows : 65535));
}

#define DEG_ROW_LOOP(r, j, rows, n)                                      \
  for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)               \
    for (int j = int(blockIdx.x * blockDim.x + threadIdx.x); j < int(n); \
         j += int(gridDim.x * blockDim.x))

// A loop over [0, n) spread over the whole grid.
#define DEG_GRID_LOOP(i, n)                                                 \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__device__ float silu(float x) {
  return x / (1.0f + expf(-x));
}
__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
// PyTorch's gelu(approximate="tanh").
__device__ float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

// Round to nearest even, NaN kept quiet: the CPU's f32_to_bf16.
__device__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

// Two or four values as bf16 bits, in memory order.
__device__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(f32_to_bf16_bits(lo)) | uint32_t(f32_to_bf16_bits(hi)) << 16;
}
__device__ uint2 pack_bf16(float4 v) {
  return make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}

// The sum of v over a warp in a fixed order (xor butterfly); every lane gets it.
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- norms: a vector (r, h) of at most kWarpNormDim elements is read once into registers in
// chunks of four consecutive elements (by float4 where the rows allow it), chunk k of lane l
// holding elements 4 (l + 32 k) .. + 3. Its sum of squares: each chunk's four squares from 0 in
// order, the chunks of a lane in k order, then the warp's butterfly over the lanes. Either a warp
// holds every chunk of its vector (many vectors), or a block of one warp per chunk index k (few
// vectors: decode's rows) meets the chunk sums in shared memory and adds them in the same order:
// the same bits, which never depend on the rows' count or alignment. A longer vector takes a
// block of kThreads (thread t sums elements t, t + kThreads, ... in order, then the warps' sums
// in order). A thread writes the elements it read (y may be x). ----

constexpr int kWarpNormDim = 2048;

// The sum of v over the block's kThreads threads (warp sums, then in warp order); all get it.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kNormWarps];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float s = warp_sums[0];
  for (int w = 1; w < kNormWarps; ++w) s += warp_sums[w];
  return s;
}

// Elements i .. i + 3 of p (zeros past n): one float4 where vec, else one at a time.
__device__ float4 load4(const float* p, int i, int n, bool vec) {
  if (vec) return *reinterpret_cast<const float4*>(p + i);
  return make_float4(i < n ? p[i] : 0.0f, i + 1 < n ? p[i + 1] : 0.0f, i + 2 < n ? p[i + 2] : 0.0f,
                     i + 3 < n ? p[i + 3] : 0.0f);
}
__device__ void store4(float* p, int i, int n, bool vec, float4 v) {
  if (vec) {
    *reinterpret_cast<float4*>(p + i) = v;
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4 && i + k < n; ++k) p[i + k] = e[k];
}
__device__ void store4_bf16(uint16_t* p, int i, int n, bool vec, float4 v) {
  if (vec) {
    *reinterpret_cast<uint2*>(p + i) = pack_bf16(v);
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4 && i + k < n; ++k) p[i + k] = f32_to_bf16_bits(e[k]);
}
__device__ float chunk_squares(float4 v) {
  float s = v.x * v.x;
  s += v.y * v.y;
  s += v.z * v.z;
  return s + v.w * v.w;
}

// Loads' and stores' widths of a norm launch: float4 where every vector starts 16-byte aligned
// (8-byte for bf16 results) and dim is a multiple of four.
struct NormVec {
  bool in, out;
};

// Chunk e (elements i ..) of vector (r, h) normed with inv and written.
__device__ void rms_norm_put(const NormLaunch& a, NormVec vec, int64_t r, int64_t h, int i,
                             float4 e, float inv) {
  const int dim = int(a.dim);
  const int64_t yo = r * a.ldy + h * a.hy;
  float o[4] = {e.x, e.y, e.z, e.w};
  const float4 gv =
      a.gate ? load4(a.gate + r * a.ldg + h * a.hg, i, dim, vec.in) : make_float4(0, 0, 0, 0);
  const float gs[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = i + k < dim ? i + k : i;  // past dim: a value nobody stores
    if (a.gate) {
      const float w = a.w ? a.w[j] : 1.0f;
      o[k] = (w * (o[k] * inv)) * silu(gs[k]);
    } else {
      const float w = a.w ? (a.one_plus_w ? 1.0f + a.w[j] : a.w[j]) : 1.0f;
      o[k] = (o[k] * inv) * w;
    }
  }
  const float4 ov = make_float4(o[0], o[1], o[2], o[3]);
  if (a.yb) {
    store4_bf16(a.yb + yo, i, dim, vec.out, ov);
  } else {
    store4(a.y + yo, i, dim, vec.out, ov);
  }
}

// A warp per vector of at most 128 kChunks elements.
template <int kChunks>
__global__ void rms_norm_warp_kernel(NormLaunch a, NormVec vec) {
  const int64_t v = int64_t(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  if (v >= a.rows * a.heads) return;
  const int lane = int(threadIdx.x % 32), dim = int(a.dim);
  const int64_t r = v / a.heads, h = v % a.heads;
  const float* x = a.x + r * a.ldx + h * a.hx;
  float4 e[kChunks];
  float ss = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = 4 * (lane + 32 * c);
    e[c] = i < dim ? load4(x, i, dim, vec.in) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += chunk_squares(e[c]);
  }
  const float inv = 1.0f / sqrtf(warp_sum(ss) / float(a.dim) + a.eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = 4 * (lane + 32 * c);
    if (i < dim) rms_norm_put(a, vec, r, h, i, e[c], inv);
  }
}

// A block of kChunks warps per vector, warp k holding every lane's chunk k.
template <int kChunks>
__global__ void rms_norm_split_kernel(NormLaunch a, NormVec vec) {
  __shared__ float sums[kChunks][32];
  __shared__ float inv_of;
  const int64_t v = blockIdx.x, r = v / a.heads, h = v % a.heads;
  const int lane = int(threadIdx.x % 32), c = int(threadIdx.x / 32), dim = int(a.dim);
  const int i = 4 * (lane + 32 * c);
  const float4 e = i < dim ? load4(a.x + r * a.ldx + h * a.hx, i, dim, vec.in)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  sums[c][lane] = chunk_squares(e);
  __syncthreads();
  if (c == 0) {
    float ss = 0;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) ss += sums[k][lane];
    ss = warp_sum(ss);
    if (lane == 0) inv_of = 1.0f / sqrtf(ss / float(a.dim) + a.eps);
  }
  __syncthreads();
  if (i < dim) rms_norm_put(a, vec, r, h, i, e, inv_of);
}

// A block per vector (dims past kWarpNormDim).
__global__ void rms_norm_block_kernel(NormLaunch a) {
  const int64_t v = int64_t(blockIdx.x);
  const int lane = int(threadIdx.x), dim = int(a.dim);
  const int64_t r = v / a.heads, h = v % a.heads;
  const float* x = a.x + r * a.ldx + h * a.hx;
  const int64_t yo = r * a.ldy + h * a.hy;
  // Element i's result to y, or rounded to bf16 into yb.
  auto put = [&](int i, float v) {
    if (a.yb) {
      a.yb[yo + i] = f32_to_bf16_bits(v);
    } else {
      a.y[yo + i] = v;
    }
  };
  float ss = 0;
  for (int i = lane; i < dim; i += kThreads) ss += x[i] * x[i];
  const float inv = 1.0f / sqrtf(block_sum(ss) / float(a.dim) + a.eps);
  if (a.gate) {
    const float* g = a.gate + r * a.ldg + h * a.hg;
    for (int i = lane; i < dim; i += kThreads) {
      const float w = a.w ? a.w[i] : 1.0f;
      put(i, (w * (x[i] * inv)) * silu(g[i]));
    }
    return;
  }
  for (int i = lane; i < dim; i += kThreads) {
    const float w = a.w ? (a.one_plus_w ? 1.0f + a.w[i] : a.w[i]) : 1.0f;
    put(i, (x[i] * inv) * w);
  }
}

// A warp per vector of at most 128 kChunks elements, in place, the rms_norm warp form's order.
template <int kChunks>
__global__ void l2_norm_kernel(L2NormLaunch a, bool vec) {
  const int64_t v = int64_t(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  if (v >= a.rows * a.heads) return;
  const int lane = int(threadIdx.x % 32), dim = int(a.dim);
  float* x = a.x + (v / a.heads) * a.ldx + (v % a.heads) * a.dim;
  float4 e[kChunks];
  float ss = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = 4 * (lane + 32 * c);
    e[c] = i < dim ? load4(x, i, dim, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += chunk_squares(e[c]);
  }
  const float inv = 1.0f / sqrtf(warp_sum(ss) + a.eps);
  const float scale = v % a.heads < a.heads - a.unscaled_heads ? a.post_scale : 1.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = 4 * (lane + 32 * c);
    if (i >= dim) break;
    const float4 o = make_float4((e[c].x * inv) * scale, (e[c].y * inv) * scale,
                                 (e[c].z * inv) * scale, (e[c].w * inv) * scale);
    store4(x, i, dim, vec, o);
  }
}

// Chunks of four per lane a vector of dim elements needs, rounded up to a power of two.
int norm_chunks(int64_t dim) {
  int c = 1;
  while (128 * c < dim) c *= 2;
  return c;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---- per-row ops (one chunk of rows; blockIdx.y = row of the chunk) ----

__global__ void rope_kernel(RopeLaunch a) {
  const int i = blockIdx.y;
  const int64_t n = a.rows.length[i], per_token = a.heads * a.half;
  const int64_t row0 = (a.rows.first + i) * a.rows.tokens;
  DEG_GRID_LOOP(e, n * per_token) {
    const int64_t t = e / per_token, h = (e % per_token) / a.half, j = e % a.half;
    const float angle = float(a.rows.position[i] + t) * a.inv_freq[j];
    const float c = cosf(angle), s = sinf(angle);
    float* v = a.x + (row0 + t) * a.ldx + h * a.hs;
    const float x0 = v[j], x1 = v[j + a.half];
    v[j] = x0 * c - x1 * s;
    v[j + a.half] = x1 * c + x0 * s;
  }
}

__global__ void kv_write_kernel(KvWriteLaunch a) {
  const int i = blockIdx.y;
  const int64_t n = a.rows.length[i], width = a.k_dim > a.v_dim ? a.k_dim : a.v_dim;
  const int64_t per_token = a.kv_heads * width;
  const int64_t row0 = (a.rows.first + i) * a.rows.tokens;
  const KvRow& kv = a.kv[i];
  DEG_GRID_LOOP(e, n * per_token) {
    const int64_t t = e / per_token, h = (e % per_token) / width, d = e % width;
    const int64_t at = h * kv.own_stride + (kv.own_before + t) * a.dim + d;
    if (d < a.k_dim) kv.own_k[at] = a.k[(row0 + t) * a.ldk + h * a.hk + d];
    if (d < a.v_dim) kv.own_v[at] = a.v[(row0 + t) * a.ldv + h * a.hv + d];
  }
}

// y over the row's tokens (padded ones zeroed): input s < 0 reads the tail's row K - 1 + s.
// Thread (channel c, tile of kConvTokens tokens): the last kConvWindow inputs slide through
// registers (every input is loaded once per tile), channels coalesced across the warp; the sum
// runs over j = 0 .. K - 1 in order, as the CPU's.
constexpr int kConvTokens = 16;
constexpr int kConvWindow = 8;  // K at most this; launch_causal_conv checks

__global__ void conv_kernel(ConvLaunch a) {
  const int i = blockIdx.z;
  const int c = int(blockIdx.x) * kThreads + int(threadIdx.x);
  const int C = int(a.channels), K = int(a.kernel);
  if (c >= C) return;
  const int n = int(a.rows.length[i]);
  const int t0 = int(blockIdx.y) * kConvTokens;
  const int64_t L = a.rows.tokens, row0 = (a.rows.first + i) * L;
  const int t_end = t0 + kConvTokens < int(L) ? t0 + kConvTokens : int(L);
  const float* x = a.x + row0 * a.ldx + c;
  float* y = a.y + row0 * a.ldy + c;
  const float* tail = a.state[i].tail_in;
  // w[jj] is tap jj - (kConvWindow - K), aligned with the window (compile-time indices only).
  float w[kConvWindow];
#pragma unroll
  for (int jj = 0; jj < kConvWindow; ++jj) {
    const int j = jj - (kConvWindow - K);
    w[jj] = j >= 0 ? a.w[int64_t(c) * K + j] : 0.0f;
  }
  // window[kConvWindow - 1 - d] holds input t - d of the token t being computed; input s < 0
  // comes from the tail (row K - 1 + s).
  float window[kConvWindow];
#pragma unroll
  for (int d = 1; d < kConvWindow; ++d) {
    const int s = t0 - d;
    float in = 0.0f;
    if (d < K && s < n) in = s >= 0 ? x[int64_t(s) * a.ldx] : tail[int64_t(K - 1 + s) * a.ldt + c];
    window[kConvWindow - 1 - d] = in;
  }
  // The tile's inputs first, all loads in flight at once (x and y do not alias).
  float in[kConvTokens];
#pragma unroll
  for (int u = 0; u < kConvTokens; ++u) {
    const int t = t0 + u;
    in[u] = t < t_end && t < n ? x[int64_t(t) * a.ldx] : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kConvTokens; ++u) {
    const int t = t0 + u;
    if (t >= t_end) break;
    if (t >= n) {
      y[int64_t(t) * a.ldy] = 0.0f;
      continue;
    }
    window[kConvWindow - 1] = in[u];
    float acc = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kConvWindow; ++jj) {
      if (jj >= kConvWindow - K) acc += w[jj] * window[jj];  // tap jj - (kConvWindow - K)
    }
    y[int64_t(t) * a.ldy] = a.silu ? silu(acc) : acc;
#pragma unroll
    for (int d = 0; d < kConvWindow - 1; ++d) window[d] = window[d + 1];
  }
  // One tile per row (short rows, decode): the row's new tail is the window's last K - 1
  // inputs, window[kConvWindow - K + j] = input n - (K - 1) + j; this thread alone read the
  // channel's tail_in (which tail_out may be), so it writes it too.
  float* tail_out = a.state[i].tail_out;
  if (gridDim.y == 1 && tail_out) {
#pragma unroll
    for (int jj = 0; jj < kConvWindow - 1; ++jj)
      if (jj >= kConvWindow - K) tail_out[int64_t(jj - (kConvWindow - K)) * a.ldt + c] = window[jj];
  }
}

// The new tail: the last K - 1 inputs of [tail_in, the row's real x]; one thread per channel
// reads them all before writing (tail_out may be tail_in).
__global__ void conv_tail_kernel(ConvLaunch a) {
  const int i = blockIdx.y;
  const StateRow st = a.state[i];
  if (!st.tail_out) return;
  const int64_t n = a.rows.length[i], K = a.kernel, C = a.channels;
  const int64_t row0 = (a.rows.first + i) * a.rows.tokens;
  constexpr int kMaxTail = 16;
  DEG_GRID_LOOP(c, C) {
    float keep[kMaxTail];
    for (int64_t j = 0; j < K - 1 && j < kMaxTail; ++j) {
      const int64_t s = n + j;  // index into [tail_in (K - 1), x (n)]
      keep[j] = s < K - 1 ? st.tail_in[s * a.ldt + c] : a.x[(row0 + s - (K - 1)) * a.ldx + c];
    }
    for (int64_t j = 0; j < K - 1 && j < kMaxTail; ++j) st.tail_out[j * a.ldt + c] = keep[j];
  }
}

__global__ void delta_gates_kernel(DeltaGatesLaunch a) {
  const int i = blockIdx.y;
  const int64_t n = a.rows.length[i], H = a.heads, L = a.rows.tokens;
  const int64_t row0 = (a.rows.first + i) * L;
  DEG_GRID_LOOP(e, L * H) {
    const int64_t t = e / H, h = e % H;
    float* bt = a.beta + (row0 + t) * a.ld + h;
    float* gt = a.g + (row0 + t) * a.ld + h;
    const bool real = t < n;
    *bt = real ? 1.0f / (1.0f + expf(-*bt)) : 0.0f;
    const float x = *gt + a.dt_bias[h];
    *gt = real ? a.neg_decay[h] * (x > 20.0f ? x : log1pf(expf(x))) : 0.0f;
  }
}

// ---- elementwise ----

__device__ __forceinline__ float glu_one(const GluLaunch& a, float g, float up) {
  const float act = a.act == 0 ? silu(g) : a.act == 1 ? gelu_tanh(g) : sigmoid(g);
  return act * up;
}

// Columns in fours (kVector: every row start and n 16-byte aligned, float4 accesses).
template <bool kVector>
__global__ void glu_kernel(GluLaunch a) {
  const int64_t n4 = kVector ? a.n / 4 : a.n;
  DEG_ROW_LOOP(r, j, a.rows, n4) {
    float* out = a.out + r * a.ldo;
    const float* gate = a.gate + r * a.ldg;
    const float* up = a.up ? a.up + r * a.ldu : out;  // no up: the gate scales out
    if constexpr (kVector) {
      const float4 g = reinterpret_cast<const float4*>(gate)[j];
      const float4 u = reinterpret_cast<const float4*>(up)[j];
      const float4 v = make_float4(glu_one(a, g.x, u.x), glu_one(a, g.y, u.y), glu_one(a, g.z, u.z),
                                   glu_one(a, g.w, u.w));
      if (a.outb) {
        reinterpret_cast<uint2*>(a.outb + r * a.ldo)[j] = pack_bf16(v);
      } else {
        reinterpret_cast<float4*>(out)[j] = v;
      }
    } else {
      const float v = glu_one(a, gate[j], up[j]);
      if (a.outb) {
        a.outb[r * a.ldo + j] = f32_to_bf16_bits(v);
      } else {
        out[j] = v;
      }
    }
  }
}

bool aligned4(const void* p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 4 == 0;
}

__global__ void binary_kernel(BinaryLaunch a) {
  DEG_ROW_LOOP(r, j, a.rows, a.n) {
    float* y = a.y + r * a.ldy + j;
    if (!a.a) {
      *y = *y * a.s;
    } else {
      const float v = a.a[r * a.lda + j];
      *y = a.mul ? *y * v : *y + v;
    }
  }
}

__global__ void softcap_kernel(float* y, int64_t n, float cap) {
  DEG_GRID_LOOP(i, n) y[i] = tanhf(y[i] / cap) * cap;
}

__global__ void copy_rows_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                                 int64_t n) {
  DEG_ROW_LOOP(r, j, rows, n) {
    y[r * ldy + j] = x[r * ldx + j];
  }
}

// The same in float4s: x, y, ldx, ldy and n all multiples of 4 floats (16 bytes).
__global__ void copy_rows4_kernel(const float4* x, int64_t ldx4, float4* y, int64_t ldy4,
                                  int64_t rows, int64_t n4) {
  DEG_ROW_LOOP(r, j, rows, n4) {
    y[r * ldy4 + j] = x[r * ldx4 + j];
  }
}

// y [rows, n] at ldy = (accumulate ? y : 0) + parts[0] + parts[1] + ..., summed in that order;
// parts [count, rows, n] contiguous.
__global__ void sum_parts_kernel(const float* parts, int64_t count, float* y, int64_t ldy,
                                 int64_t rows, int64_t n, bool accumulate) {
  DEG_ROW_LOOP(r, j, rows, n) {
    float s = accumulate ? y[r * ldy + j] : 0.0f;
    for (int64_t p = 0; p < count; ++p) s += parts[(p * rows + r) * n + j];
    y[r * ldy + j] = s;
  }
}

__global__ void gather_rows_kernel(const float* x, int64_t ldx, const int32_t* index, float* y,
                                   int64_t ldy, int64_t rows, int64_t n) {
  DEG_ROW_LOOP(r, j, rows, n) {
    y[r * ldy + j] = x[int64_t(index[r]) * ldx + j];
  }
}

// A 32 x 32 tile per block of 32 x 8 threads, staged through shared memory (one column of
// padding keeps the transposed reads free of bank conflicts), so both the reads of x and the
// writes of y are along rows.
constexpr int kTransposeTile = 32, kTransposeRows = 8;

__global__ void transpose_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                                 int64_t cols) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];
  const int64_t i0 = int64_t(blockIdx.y) * kTransposeTile,
                j0 = int64_t(blockIdx.x) * kTransposeTile;
  for (int k = threadIdx.y; k < kTransposeTile; k += kTransposeRows) {
    const int64_t i = i0 + k, j = j0 + threadIdx.x;
    if (i < rows && j < cols) tile[k][threadIdx.x] = x[i * ldx + j];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTransposeTile; k += kTransposeRows) {
    const int64_t j = j0 + k, i = i0 + threadIdx.x;
    if (i < rows && j < cols) y[j * ldy + i] = tile[threadIdx.x][k];
  }
}

__device__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

__global__ void gather_kernel(GatherLaunch a) {
  const int64_t C = a.cols;
  DEG_GRID_LOOP(e, a.n * C) {
    const int64_t i = e / C, c = e % C;
    float* y = a.y + i * a.ldy + c;
    if (a.soft_rows && a.soft_rows[i] >= 0) {
      *y = a.soft[int64_t(a.soft_rows[i]) * C + c];
      continue;
    }
    const int64_t id = a.id_lane ? int64_t(a.id_lane[i * a.ld_id]) : a.ids[i];
    if (id < 0) continue;
    const float v = a.bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(a.table)[id * C + c])
                           : static_cast<const float*>(a.table)[id * C + c];
    const float scale = a.row_scale ? a.row_scale[i * a.ld_scale] : a.scale;
    if (!a.keep && scale == 1.0f && a.mix == 1.0f) {
      *y = v;
    } else {
      const float before = a.keep ? *y : 0.0f;
      *y = (before * (a.keep ? 1.0f : 0.0f) + v * scale) * a.mix;
    }
  }
}

// Columns in fours where kVector (rows of x 16-byte aligned, n a multiple of 4).
template <bool kVector>
__global__ void to_bf16_kernel(const float* x, int64_t ldx, int64_t rows, int64_t n,
                               uint16_t* out) {
  DEG_ROW_LOOP(r, j, rows, kVector ? n / 4 : n) {
    if constexpr (kVector) {
      reinterpret_cast<uint2*>(out + r * n)[j] =
          pack_bf16(reinterpret_cast<const float4*>(x + r * ldx)[j]);
    } else {
      out[r * n + j] = f32_to_bf16_bits(x[r * ldx + j]);
    }
  }
}

__global__ void widen_bf16_kernel(const uint16_t* in, int64_t count, float* out) {
  DEG_GRID_LOOP(i, count) out[i] = bf16_bits_to_f32(in[i]);
}

cudaError_t launched() {
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rms_norm(const NormLaunch& a, cudaStream_t stream) {
  if (a.rows * a.heads == 0) return cudaSuccess;
  const int64_t vectors = a.rows * a.heads;
  if (a.dim > kWarpNormDim) {
    rms_norm_block_kernel<<<unsigned(vectors), kThreads, 0, stream>>>(a);
    return launched();
  }
  const bool dim4 = a.dim % 4 == 0;
  NormVec vec{.in = dim4 && aligned16(a.x) && a.ldx % 4 == 0 && a.hx % 4 == 0 &&
                    (!a.gate || (aligned16(a.gate) && a.ldg % 4 == 0 && a.hg % 4 == 0)),
              .out = dim4 && a.ldy % 4 == 0 && a.hy % 4 == 0 &&
                     (a.yb ? reinterpret_cast<uintptr_t>(a.yb) % 8 == 0 : aligned16(a.y))};
  const int chunks = norm_chunks(a.dim);
  // Few vectors (fewer than a warp per SM scheduler): a block per vector, a warp per chunk index.
  if (chunks >= 4 && vectors < 4 * 132) {
    const unsigned grid = unsigned(vectors);
    switch (chunks) {
      case 4: rms_norm_split_kernel<4><<<grid, 4 * 32, 0, stream>>>(a, vec); break;
      case 8: rms_norm_split_kernel<8><<<grid, 8 * 32, 0, stream>>>(a, vec); break;
      default: rms_norm_split_kernel<16><<<grid, 16 * 32, 0, stream>>>(a, vec); break;
    }
    return launched();
  }
  const unsigned grid = unsigned((vectors + kNormWarps - 1) / kNormWarps);
  switch (chunks) {
    case 1: rms_norm_warp_kernel<1><<<grid, kThreads, 0, stream>>>(a, vec); break;
    case 2: rms_norm_warp_kernel<2><<<grid, kThreads, 0, stream>>>(a, vec); break;
    case 4: rms_norm_warp_kernel<4><<<grid, kThreads, 0, stream>>>(a, vec); break;
    case 8: rms_norm_warp_kernel<8><<<grid, kThreads, 0, stream>>>(a, vec); break;
    default: rms_norm_warp_kernel<16><<<grid, kThreads, 0, stream>>>(a, vec); break;
  }
  return launched();
}

cudaError_t launch_l2_norm(const L2NormLaunch& a, cudaStream_t stream) {
  if (a.rows * a.heads == 0) return cudaSuccess;
  if (a.dim > kWarpNormDim) return cudaErrorInvalidValue;  // no model norms q / k this wide
  const bool vec = a.dim % 4 == 0 && aligned16(a.x) && a.ldx % 4 == 0;
  const unsigned grid = unsigned((a.rows * a.heads + kNormWarps - 1) / kNormWarps);
  switch (norm_chunks(a.dim)) {
    case 1: l2_norm_kernel<1><<<grid, kThreads, 0, stream>>>(a, vec); break;
    case 2: l2_norm_kernel<2><<<grid, kThreads, 0, stream>>>(a, vec); break;
    case 4: l2_norm_kernel<4><<<grid, kThreads, 0, stream>>>(a, vec); break;
    case 8: l2_norm_kernel<8><<<grid, kThreads, 0, stream>>>(a, vec); break;
    default: l2_norm_kernel<16><<<grid, kThreads, 0, stream>>>(a, vec); break;
  }
  return launched();
}

cudaError_t launch_rope(const RopeLaunch& a, cudaStream_t stream) {
  if (a.rows.count == 0) return cudaSuccess;
  int64_t most = 0;
  for (int i = 0; i < a.rows.count; ++i) most = a.rows.length[i] > most ? a.rows.length[i] : most;
  if (most == 0) return cudaSuccess;
  rope_kernel<<<dim3(grid_for(most * a.heads * a.half), unsigned(a.rows.count)), kThreads, 0,
                stream>>>(a);
  return launched();
}

cudaError_t launch_kv_write(const KvWriteLaunch& a, cudaStream_t stream) {
  int64_t most = 0;
  for (int i = 0; i < a.rows.count; ++i) most = a.rows.length[i] > most ? a.rows.length[i] : most;
  if (most == 0) return cudaSuccess;
  const int64_t width = a.k_dim > a.v_dim ? a.k_dim : a.v_dim;
  kv_write_kernel<<<dim3(grid_for(most * a.kv_heads * width), unsigned(a.rows.count)), kThreads, 0,
                    stream>>>(a);
  return launched();
}

cudaError_t launch_causal_conv(const ConvLaunch& a, cudaStream_t stream) {
  if (a.rows.count == 0 || a.channels == 0 || a.rows.tokens == 0) return cudaSuccess;
  if (a.kernel < 1 || a.kernel > kConvWindow) return cudaErrorInvalidValue;
  const unsigned channel_blocks = unsigned((a.channels + kThreads - 1) / kThreads);
  const unsigned tiles = unsigned((a.rows.tokens + kConvTokens - 1) / kConvTokens);
  conv_kernel<<<dim3(channel_blocks, tiles, unsigned(a.rows.count)), kThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess || tiles == 1) return e;  // tails written
  bool tails = false;  // fork rows that are not kept write none
  for (int i = 0; i < a.rows.count; ++i) tails = tails || a.state[i].tail_out;
  if (!tails) return cudaSuccess;
  conv_tail_kernel<<<dim3(grid_for(a.channels), unsigned(a.rows.count)), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_delta_gates(const DeltaGatesLaunch& a, cudaStream_t stream) {
  if (a.rows.count == 0 || a.rows.tokens == 0) return cudaSuccess;
  delta_gates_kernel<<<dim3(grid_for(a.rows.tokens * a.heads), unsigned(a.rows.count)), kThreads, 0,
                       stream>>>(a);
  return launched();
}

cudaError_t launch_glu(const GluLaunch& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  // outb: 8-byte aligned rows of four-column groups.
  const bool out_vector = a.outb ? reinterpret_cast<uintptr_t>(a.outb) % 8 == 0 && a.ldo % 4 == 0
                                 : aligned4(a.out, a.ldo);
  const bool vector = a.n % 4 == 0 && aligned4(a.gate, a.ldg) && out_vector &&
                      (a.up ? aligned4(a.up, a.ldu) : aligned4(a.out, a.ldo));
  if (vector) {
    glu_kernel<true><<<row_grid(a.rows, a.n / 4), kThreads, 0, stream>>>(a);
  } else {
    glu_kernel<false><<<row_grid(a.rows, a.n), kThreads, 0, stream>>>(a);
  }
  return launched();
}

cudaError_t launch_binary(const BinaryLaunch& a, cudaStream_t stream) {
  if (a.rows * a.n == 0) return cudaSuccess;
  binary_kernel<<<row_grid(a.rows, a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_softcap(float* y, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  softcap_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, n, cap);
  return launched();
}

cudaError_t launch_copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                             int64_t n, cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  if (n % 4 == 0 && aligned4(x, ldx) && aligned4(y, ldy)) {
    copy_rows4_kernel<<<row_grid(rows, n / 4), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), ldx / 4, reinterpret_cast<float4*>(y), ldy / 4, rows,
        n / 4);
  } else {
    copy_rows_kernel<<<row_grid(rows, n), kThreads, 0, stream>>>(x, ldx, y, ldy, rows, n);
  }
  return launched();
}

cudaError_t launch_sum_parts(const float* parts, int64_t count, float* y, int64_t ldy, int64_t rows,
                             int64_t n, bool accumulate, cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  sum_parts_kernel<<<row_grid(rows, n), kThreads, 0, stream>>>(parts, count, y, ldy, rows, n,
                                                               accumulate);
  return launched();
}

cudaError_t launch_gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y,
                               int64_t ldy, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  gather_rows_kernel<<<row_grid(rows, n), kThreads, 0, stream>>>(x, ldx, index, y, ldy, rows, n);
  return launched();
}

cudaError_t launch_transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                             int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  const dim3 grid(unsigned((cols + kTransposeTile - 1) / kTransposeTile),
                  unsigned((rows + kTransposeTile - 1) / kTransposeTile));
  transpose_kernel<<<grid, dim3(kTransposeTile, kTransposeRows), 0, stream>>>(x, ldx, y, ldy, rows,
                                                                              cols);
  return launched();
}

cudaError_t launch_gather(const GatherLaunch& a, cudaStream_t stream) {
  if (a.n * a.cols == 0) return cudaSuccess;
  gather_kernel<<<grid_for(a.n * a.cols), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_to_bf16(const float* x, int64_t ldx, int64_t rows, int64_t n, void* out,
                           cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  uint16_t* o = static_cast<uint16_t*>(out);
  if (n % 4 == 0 && aligned4(x, ldx) && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
    to_bf16_kernel<true><<<row_grid(rows, n / 4), kThreads, 0, stream>>>(x, ldx, rows, n, o);
  } else {
    to_bf16_kernel<false><<<row_grid(rows, n), kThreads, 0, stream>>>(x, ldx, rows, n, o);
  }
  return launched();
}

cudaError_t launch_widen_bf16(const void* in, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  widen_bf16_kernel<<<grid_for(count), kThreads, 0, stream>>>(static_cast<const uint16_t*>(in),
                                                              count, out);
  return launched();
}

}  // namespace deg::cuda
