// The CUDA backend's causal softmax attention (launch.h's AttentionLaunch; AttendArgs of
// kernels/ops.h): flash-style, f32 on the CUDA cores, bitwise batch invariant.
//
// Letters: G query heads per KV head (group), D head dim (at most 256), a row's "query rows" are
// its n real tokens times G heads of one KV head, flattened as f = t G + g.
//
// Decomposition. A CTA (256 threads) takes one row, one KV head and a block of that row's query
// rows: 64 of them in the block kernel (prefill), 8 in the few-query kernel (decode, rows whose
// n G is at most kFewLimit). It walks the row's key sequence — prefix keys [0, prefix_len), then
// own keys, read in place from the row's buffers — in blocks of 64 keys aligned at key index 0,
// from the block holding the first key any of its queries can see (0 without a window) to the
// block holding its last query's key. Per key block:
//   1. scores: S = scale (Q K^T), each score one dot product summed over d = 0, 1, ... with f32
//      FMAs (dims padded to a multiple of 4 with zeros);
//   2. softmax step, per query row, by 4 lanes (lane / 8 is the part): part p reads keys
//      p, p + 4, ..., p + 60 of the block; the block max over the keys the query sees (exact, so
//      order-free); new max m' = max(m, block max); alpha = 1 when m' == m, else exp(m - m');
//      p_j = exp(s_j - m') for seen keys and exactly 0 for the others; the block sum is each
//      part's 16 terms in key order, then (part0 + part1) + (part2 + part3); l = l alpha + sum;
//   3. values: acc = acc alpha, then acc = fma(p_j, v_j, acc) for j = 0 .. 63 in order.
// At the end out = acc / l. Padded tokens' outputs are zeroed by a separate kernel.
//
// Shared memory (floats; P = D rounded up to 32, plus 4, so rows of a tile start 4 banks apart):
//   block kernel: Q [64][P], K [64][P], V [64][P], probabilities [64 keys][72], alpha [64],
//     sums [64]: 218,624 bytes at D = 256 (one CTA per SM);
//   few kernel:   Q [8][P],  K [64][P], V [64][P], probabilities [64 keys][8], alpha [8],
//     sums [8]: 143,552 bytes at D = 256.
// K and V tiles arrive with cp.async, each overlapping the other half of the previous block's
// work: V of block b + 1 loads during scores and softmax of b + 1, K of block b + 1 during the
// softmax and values of b. Keys past the CTA's last query's key are zero-filled, never read (a
// row's spare capacity may hold anything).
//
// Batch invariance. A query's output depends only on its own q, the key sequence it sees and D:
//   * every dot product and every value sum runs in one fixed order (explicit _rn intrinsics, so
//     no contraction choice can differ between the two kernels);
//   * key blocks are aligned at key index 0, so the key sequence alone fixes the blocks a query
//     sees, whichever CTA computes it, whether its keys lie in the prefix or in own, whatever L,
//     chunk or batch it comes in;
//   * a block holding no key the query sees leaves its state bitwise unchanged (block max -inf,
//     so m' == m and alpha is exactly 1; every p is exactly 0, and fma(0, v, acc) == acc for the
//     finite v of the row's real keys and the zeros of the zero-filled ones); so do the masked
//     keys inside a block. The blocks a CTA walks beyond a query's reach change nothing for it;
//   * the softmax step is one function, called by both kernels with the same lane layout, and
//     the score and value chains are the same sequence of operations in both kernels, so the
//     block and few-query kernels give the same bits for a query.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kKeyBlock = 64;      // keys per softmax block, aligned at key index 0
constexpr int kBlockQueries = 64;  // query rows per block-kernel CTA
constexpr int kFewQueries = 8;     // query rows per few-query CTA
constexpr int64_t kFewLimit = 16;  // rows with n G <= this go to the few-query kernel
constexpr int kMaxHeadDim = 256;
constexpr int kBlockProbPitch = 72;  // floats per key of the block kernel's probabilities
constexpr unsigned kFullWarp = 0xffffffffu;

// Launch-wide sizes and layout choices (host-computed).
struct Geometry {
  int head_dim;   // D
  int dim4;       // D rounded up to 4: the dot products run over dim4 dims (zeros past D)
  int pitch;      // floats per Q / K / V row in shared memory
  bool q_wide;    // Q rows are 16-byte aligned with D % 4 == 0: float4 copies
  bool kv_wide;   // the same for every K / V row of the chunk
  bool out_wide;  // the same for the output rows: float4 stores
  float scale;
};

// ---- asynchronous copies into shared memory ----

__device__ __forceinline__ void copy16_async(float* dst, const float* src) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src) : "memory");
}

__device__ __forceinline__ void copy4_async(float* dst, const float* src) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(src) : "memory");
}

__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// A thread's share of a tile copy: units (float4 or float) of vector rows, kThreads apart, walked
// without divisions: the thread starts at (vector, unit) and steps by (step_vectors, step_units).
struct Walk {
  bool wide;
  int units;  // per vector
  int vector, unit;
  int step_vectors, step_units;
};

__device__ Walk make_walk(bool wide, int dim4) {
  const int units = wide ? dim4 / 4 : dim4;
  const int t = int(threadIdx.x);
  return {wide, units, t / units, t % units, kThreads / units, kThreads % units};
}

// Stages vectors [0, vectors) of a tile into rows `pitch` floats apart: vector v from source(v)
// (head_dim floats), or zeros where source(v) is null; dims [head_dim, dim4) are zero.
template <class Source>
__device__ __forceinline__ void stage_tile(float* tile, int vectors, const Walk& w,
                                           const Geometry& g, Source source) {
  int v = w.vector, u = w.unit;
  while (v < vectors) {
    const float* src = source(v);
    float* dst = tile + v * g.pitch;
    if (w.wide) {
      if (src) {
        copy16_async(dst + 4 * u, src + 4 * u);
      } else {
        *reinterpret_cast<float4*>(dst + 4 * u) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    } else if (src && u < g.head_dim) {
      copy4_async(dst + u, src + u);
    } else {
      dst[u] = 0.0f;
    }
    v += w.step_vectors;
    u += w.step_units;
    if (u >= w.units) {
      u -= w.units;
      ++v;
    }
  }
}

// ---- one row and KV head ----

struct HeadKeys {
  const float* prefix_k;  // null when the row has no prefix
  const float* prefix_v;
  const float* own_k;
  const float* own_v;
  int64_t prefix_len;
  int64_t token_key;  // key index of the row's token 0: prefix_len + own_before
  int64_t count;      // query rows: n G
  int64_t token0;     // token row of the row's token 0 in q and out
};

__device__ HeadKeys head_keys(const AttentionLaunch& a, int row, int64_t head) {
  const KvRow& kv = a.kv[row];
  const bool prefix = kv.prefix_len > 0;
  return {prefix ? kv.prefix_k + head * kv.prefix_stride : nullptr,
          prefix ? kv.prefix_v + head * kv.prefix_stride : nullptr,
          kv.own_k + head * kv.own_stride,
          kv.own_v + head * kv.own_stride,
          kv.prefix_len,
          kv.prefix_len + kv.own_before,
          a.rows.length[row] * a.group,
          (a.rows.first + row) * a.rows.tokens};
}

// Where the vectors of key block `block` come from: vector v < prefix_vectors is prefix key
// key0 + v, v < valid the own key key0 + v - prefix_len, and the rest (past the CTA's last key)
// are zeros. Offsets in floats from the prefix / own base (own_offset is negative while the
// block starts in the prefix; it is only used for own keys).
struct KeyBlock {
  int prefix_vectors, valid;
  int64_t prefix_offset, own_offset, dim;

  __device__ const float* vector(const float* prefix, const float* own, int v) const {
    if (v >= valid) return nullptr;
    return v < prefix_vectors ? prefix + (prefix_offset + v * dim) : own + (own_offset + v * dim);
  }
};

// n clamped to [0, kKeyBlock].
__device__ __forceinline__ int clamp_to_block(int64_t n) {
  return int(n < 0 ? 0 : n < kKeyBlock ? n : kKeyBlock);
}

__device__ KeyBlock key_block(const HeadKeys& hk, int64_t block, int64_t last_key, int64_t dim) {
  const int64_t key0 = block * kKeyBlock;
  return {clamp_to_block(hk.prefix_len - key0), clamp_to_block(last_key - key0 + 1), key0 * dim,
          (key0 - hk.prefix_len) * dim, dim};
}

// The keys query row f sees: [lo, hi] (hi = -1, none, past the row's query rows).
struct Reach {
  int64_t lo, hi;
};

__device__ Reach reach_of(const AttentionLaunch& a, const HeadKeys& hk, int64_t f) {
  if (f >= hk.count) return {0, -1};
  const int64_t hi = hk.token_key + f / a.group;
  const int64_t lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
  return {lo, hi};
}

// ---- the softmax step (shared by both kernels, so it is the same code for every query) ----

struct Running {
  float max, sum, alpha;
};

// One query row's step over a key block starting at key0. The row's scores are at
// scores[j * pitch] for key j of the block; they are replaced by the probabilities. The four
// lanes lane % 8 + 8 p (p = 0..3) of the warp run it together for one row. Returns the new max
// and sum, and alpha, the factor that rescales the row's earlier values.
__device__ __noinline__ Running softmax_step(float* scores, int pitch, int64_t key0, Reach reach,
                                             float max, float sum) {
  const int part = int(threadIdx.x % 32) / 8;
  const int64_t lo = reach.lo - key0, hi = reach.hi - key0;  // the seen keys, block-relative
  float s[kKeyBlock / 4];
  float block_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kKeyBlock / 4; ++i) {
    const int j = part + 4 * i;
    s[i] = scores[j * pitch];
    if (j >= lo && j <= hi) block_max = fmaxf(block_max, s[i]);
  }
  block_max = fmaxf(block_max, __shfl_xor_sync(kFullWarp, block_max, 8));
  block_max = fmaxf(block_max, __shfl_xor_sync(kFullWarp, block_max, 16));
  const float new_max = fmaxf(max, block_max);
  // Exactly 1 when the max stays (also while no key has been seen: -inf == -inf).
  const float alpha = new_max == max ? 1.0f : expf(__fsub_rn(max, new_max));
  float block_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kKeyBlock / 4; ++i) {
    const int j = part + 4 * i;
    const float p = j >= lo && j <= hi ? expf(__fsub_rn(s[i], new_max)) : 0.0f;
    scores[j * pitch] = p;
    block_sum = __fadd_rn(block_sum, p);
  }
  block_sum = __fadd_rn(block_sum, __shfl_xor_sync(kFullWarp, block_sum, 8));
  block_sum = __fadd_rn(block_sum, __shfl_xor_sync(kFullWarp, block_sum, 16));
  return {new_max, __fadd_rn(__fmul_rn(sum, alpha), block_sum), alpha};
}

// s = fma chains over 4 dims, in the order x, y, z, w (the same in both kernels).
__device__ __forceinline__ float dot4(float4 q, float4 k, float s) {
  s = __fmaf_rn(q.x, k.x, s);
  s = __fmaf_rn(q.y, k.y, s);
  s = __fmaf_rn(q.z, k.z, s);
  return __fmaf_rn(q.w, k.w, s);
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// Writes 4 values of an output vector from column col (those below head_dim); wide: one float4.
__device__ __forceinline__ void store_out(float* dst, int col, int head_dim, bool wide,
                                          const float (&v)[4]) {
  if (wide) {
    *reinterpret_cast<float4*>(dst + col) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (col + c < head_dim) dst[col + c] = v[c];
}

// ---- block kernel: 64 query rows per CTA ----
//
// Thread roles (warp w, lane l):
//   scores: rows sr + 16 i, keys sk + 16 k (i, k < 4), sr = 8 (w % 2) + l % 8,
//     sk = 4 (w / 2) + l / 8; a warp's loads hit 8 Q rows and 4 K rows, 4 banks apart;
//   softmax: row 8 w + l % 8, part l / 8;
//   values: rows vr + i and 32 + vr + i, columns vc + c and 128 + vc + c (i, c < 4), with
//     vr = 4 (4 (w % 2) + l / 8), vc = 4 (8 (w / 2) + l % 8): acc is [8 rows][8 columns].

// acc[i][c] = fma(p, v, acc) over the block's keys in order; columns 128.. when kHigh.
template <bool kHigh>
__device__ __forceinline__ void accumulate_values(float (&acc)[8][8], const float* probs,
                                                  const float* values, int pitch) {
#pragma unroll 4
  for (int j = 0; j < kKeyBlock; ++j) {
    const float4 p0 = load4(probs + j * kBlockProbPitch);
    const float4 p1 = load4(probs + j * kBlockProbPitch + 32);
    const float4 v0 = load4(values + j * pitch);
    const float4 v1 = kHigh ? load4(values + j * pitch + 128) : v0;
    const float p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < (kHigh ? 8 : 4); ++c) acc[i][c] = __fmaf_rn(p[i], v[c], acc[i][c]);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    attention_block_kernel(const __grid_constant__ AttentionLaunch a, const Geometry g) {
  extern __shared__ float4 shared[];
  float* const q_tile = reinterpret_cast<float*>(shared);     // [64 query rows][pitch]
  float* const k_tile = q_tile + kBlockQueries * g.pitch;     // [64 keys][pitch]
  float* const v_tile = k_tile + kKeyBlock * g.pitch;         // [64 keys][pitch]
  float* const probs = v_tile + kKeyBlock * g.pitch;          // [64 keys][kBlockProbPitch]
  float* const alphas = probs + kKeyBlock * kBlockProbPitch;  // [64 query rows]
  float* const sums = alphas + kBlockQueries;                 // [64 query rows]

  // blockIdx.x = (query block counted from the last, KV head): costly blocks (late queries) of
  // every head first.
  const int row = int(blockIdx.y);
  const int64_t head = blockIdx.x % a.kv_heads, G = a.group, D = g.head_dim;
  const HeadKeys hk = head_keys(a, row, head);
  const int64_t blocks = gridDim.x / a.kv_heads;
  const int64_t f0 = (blocks - 1 - blockIdx.x / a.kv_heads) * kBlockQueries;
  if (hk.count <= kFewLimit || f0 >= hk.count) return;
  const int64_t live = hk.count - f0 < kBlockQueries ? hk.count - f0 : kBlockQueries;
  const int64_t last_key = reach_of(a, hk, f0 + live - 1).hi;
  const int64_t first_block = reach_of(a, hk, f0).lo / kKeyBlock;
  const int64_t last_block = last_key / kKeyBlock;

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int score_row = 8 * (warp % 2) + lane % 8, score_key = 4 * (warp / 2) + lane / 8;
  const int soft_row = 8 * warp + lane % 8;
  const int value_row = 4 * (4 * (warp % 2) + lane / 8),
            value_col = 4 * (8 * (warp / 2) + lane % 8);
  const bool cols_low = value_col < g.dim4, cols_high = value_col + 128 < g.dim4;

  const Walk q_walk = make_walk(g.q_wide, g.dim4), kv_walk = make_walk(g.kv_wide, g.dim4);
  auto query = [&](int v) -> const float* {
    const int64_t f = f0 + v;
    return f < hk.count ? a.q + (hk.token0 + f / G) * a.ldq + (head * G + f % G) * D : nullptr;
  };
  auto stage_keys = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, last_key, D);
    stage_tile(k_tile, kKeyBlock, kv_walk, g,
               [&](int v) { return kb.vector(hk.prefix_k, hk.own_k, v); });
  };
  auto stage_values = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, last_key, D);
    stage_tile(v_tile, kKeyBlock, kv_walk, g,
               [&](int v) { return kb.vector(hk.prefix_v, hk.own_v, v); });
  };

  stage_tile(q_tile, kBlockQueries, q_walk, g, query);
  stage_keys(first_block);
  commit_copies();
  stage_values(first_block);
  commit_copies();

  const Reach reach = reach_of(a, hk, f0 + soft_row);
  Running run{-INFINITY, 0.0f, 1.0f};
  float acc[8][8] = {};

  for (int64_t block = first_block; block <= last_block; ++block) {
    const int64_t key0 = block * kKeyBlock;
    wait_copies<1>();  // this block's K (and, the first time, Q)
    __syncthreads();

    float score[4][4] = {};
#pragma unroll 2
    for (int d = 0; d < g.dim4; d += 4) {
      float4 q[4], k[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = load4(q_tile + (score_row + 16 * i) * g.pitch + d);
#pragma unroll
      for (int k4 = 0; k4 < 4; ++k4) k[k4] = load4(k_tile + (score_key + 16 * k4) * g.pitch + d);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int k4 = 0; k4 < 4; ++k4) score[i][k4] = dot4(q[i], k[k4], score[i][k4]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k4 = 0; k4 < 4; ++k4)
        probs[(score_key + 16 * k4) * kBlockProbPitch + score_row + 16 * i] =
            __fmul_rn(score[i][k4], g.scale);
    __syncthreads();  // scores complete; the K tile is free

    if (block < last_block) stage_keys(block + 1);
    commit_copies();
    run = softmax_step(probs + soft_row, kBlockProbPitch, key0, reach, run.max, run.sum);
    if (lane < 8) alphas[soft_row] = run.alpha;
    wait_copies<1>();  // this block's V
    __syncthreads();

    const float4 a0 = load4(alphas + value_row), a1 = load4(alphas + 32 + value_row);
    const float alpha[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[i][c] = __fmul_rn(acc[i][c], alpha[i]);
    if (cols_high) {
      accumulate_values<true>(acc, probs + value_row, v_tile + value_col, g.pitch);
    } else if (cols_low) {
      accumulate_values<false>(acc, probs + value_row, v_tile + value_col, g.pitch);
    }
    __syncthreads();  // the V tile and the probabilities are free

    if (block < last_block) stage_values(block + 1);
    commit_copies();
  }

  if (lane < 8) sums[soft_row] = run.sum;
  __syncthreads();
  if (!cols_low) return;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = i < 4 ? value_row + i : 32 + value_row + i - 4;
    const int64_t f = f0 + r;
    if (f >= hk.count) continue;
    float* dst = a.out + (hk.token0 + f / G) * a.ldo + (head * G + f % G) * D;
    const float sum = sums[r];
    const float low[4] = {__fdiv_rn(acc[i][0], sum), __fdiv_rn(acc[i][1], sum),
                          __fdiv_rn(acc[i][2], sum), __fdiv_rn(acc[i][3], sum)};
    store_out(dst, value_col, g.head_dim, g.out_wide, low);
    if (cols_high) {
      const float high[4] = {__fdiv_rn(acc[i][4], sum), __fdiv_rn(acc[i][5], sum),
                             __fdiv_rn(acc[i][6], sum), __fdiv_rn(acc[i][7], sum)};
      store_out(dst, value_col + 128, g.head_dim, g.out_wide, high);
    }
  }
}

// ---- few-query kernel: up to 8 query rows per CTA (decode) ----
//
// Thread roles: scores: threads < 128, key t % 64, rows 4 (t / 64) + i (i < 4), skipped when
// those rows hold no query; softmax: warp 0, row l % 8, part l / 8; values: column t (t < D),
// all rows of the CTA.

template <int kRows>
__device__ __forceinline__ void accumulate_few(float (&acc)[kFewQueries], const float* probs,
                                               const float* values, int pitch) {
#pragma unroll 8
  for (int j = 0; j < kKeyBlock; ++j) {
    const float4 p0 = load4(probs + j * kFewQueries);
    const float4 p1 = kRows > 4 ? load4(probs + j * kFewQueries + 4) : p0;
    const float v = values[j * pitch];
    const float p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = __fmaf_rn(p[i], v, acc[i]);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    attention_few_kernel(const __grid_constant__ AttentionLaunch a, const Geometry g) {
  extern __shared__ float4 shared[];
  float* const q_tile = reinterpret_cast<float*>(shared);  // [8 query rows][pitch]
  float* const k_tile = q_tile + kFewQueries * g.pitch;    // [64 keys][pitch]
  float* const v_tile = k_tile + kKeyBlock * g.pitch;      // [64 keys][pitch]
  float* const probs = v_tile + kKeyBlock * g.pitch;       // [64 keys][8 query rows]
  float* const alphas = probs + kKeyBlock * kFewQueries;   // [8 query rows]
  float* const sums = alphas + kFewQueries;                // [8 query rows]

  const int row = int(blockIdx.z);
  const int64_t head = blockIdx.y, G = a.group, D = g.head_dim;
  const HeadKeys hk = head_keys(a, row, head);
  const int64_t f0 = int64_t(blockIdx.x) * kFewQueries;
  if (hk.count > kFewLimit || f0 >= hk.count) return;
  const int live = int(hk.count - f0 < kFewQueries ? hk.count - f0 : kFewQueries);
  const int quads = (live + 3) / 4;
  const int64_t last_key = reach_of(a, hk, f0 + live - 1).hi;
  const int64_t first_block = reach_of(a, hk, f0).lo / kKeyBlock;
  const int64_t last_block = last_key / kKeyBlock;

  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const int score_key = t % kKeyBlock, score_quad = t / kKeyBlock;
  const bool scores_here = score_quad < quads;  // false for t >= 128
  const int soft_row = lane % 8;

  const Walk q_walk = make_walk(g.q_wide, g.dim4), kv_walk = make_walk(g.kv_wide, g.dim4);
  auto query = [&](int v) -> const float* {
    const int64_t f = f0 + v;
    return f < hk.count ? a.q + (hk.token0 + f / G) * a.ldq + (head * G + f % G) * D : nullptr;
  };
  auto stage_keys = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, last_key, D);
    stage_tile(k_tile, kKeyBlock, kv_walk, g,
               [&](int v) { return kb.vector(hk.prefix_k, hk.own_k, v); });
  };
  auto stage_values = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, last_key, D);
    stage_tile(v_tile, kKeyBlock, kv_walk, g,
               [&](int v) { return kb.vector(hk.prefix_v, hk.own_v, v); });
  };

  stage_tile(q_tile, kFewQueries, q_walk, g, query);
  stage_keys(first_block);
  commit_copies();
  stage_values(first_block);
  commit_copies();

  const Reach reach = reach_of(a, hk, f0 + soft_row);
  Running run{-INFINITY, 0.0f, 1.0f};
  float acc[kFewQueries] = {};

  for (int64_t block = first_block; block <= last_block; ++block) {
    const int64_t key0 = block * kKeyBlock;
    wait_copies<1>();  // this block's K (and, the first time, Q)
    __syncthreads();

    if (scores_here) {
      float score[4] = {};
      const float* k_row = k_tile + score_key * g.pitch;
      const float* q_rows = q_tile + 4 * score_quad * g.pitch;
#pragma unroll 4
      for (int d = 0; d < g.dim4; d += 4) {
        const float4 k = load4(k_row + d);
#pragma unroll
        for (int i = 0; i < 4; ++i) score[i] = dot4(load4(q_rows + i * g.pitch + d), k, score[i]);
      }
      *reinterpret_cast<float4*>(probs + score_key * kFewQueries + 4 * score_quad) =
          make_float4(__fmul_rn(score[0], g.scale), __fmul_rn(score[1], g.scale),
                      __fmul_rn(score[2], g.scale), __fmul_rn(score[3], g.scale));
    }
    __syncthreads();  // scores complete; the K tile is free

    if (block < last_block) stage_keys(block + 1);
    commit_copies();
    if (warp == 0) {
      run = softmax_step(probs + soft_row, kFewQueries, key0, reach, run.max, run.sum);
      if (lane < 8) alphas[soft_row] = run.alpha;
    }
    wait_copies<1>();  // this block's V
    __syncthreads();

    if (t < D) {
#pragma unroll
      for (int i = 0; i < kFewQueries; ++i) acc[i] = __fmul_rn(acc[i], alphas[i]);
      if (quads > 1) {
        accumulate_few<8>(acc, probs, v_tile + t, g.pitch);
      } else {
        accumulate_few<4>(acc, probs, v_tile + t, g.pitch);
      }
    }
    __syncthreads();  // the V tile and the probabilities are free

    if (block < last_block) stage_values(block + 1);
    commit_copies();
  }

  if (warp == 0 && lane < 8) sums[soft_row] = run.sum;
  __syncthreads();
  if (t >= D) return;
#pragma unroll
  for (int i = 0; i < kFewQueries; ++i) {
    const int64_t f = f0 + i;
    if (i >= live) break;
    a.out[(hk.token0 + f / G) * a.ldo + (head * G + f % G) * D + t] = __fdiv_rn(acc[i], sums[i]);
  }
}

// ---- padded tokens: out = 0 for every head ----

__global__ void zero_padding_kernel(const __grid_constant__ AttentionLaunch a, int64_t width) {
  const int row = int(blockIdx.y);
  const int64_t L = a.rows.tokens, token0 = (a.rows.first + row) * L;
  for (int64_t t = a.rows.length[row] + blockIdx.x; t < L; t += gridDim.x) {
    float* out = a.out + (token0 + t) * a.ldo;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) out[c] = 0.0f;
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

cudaError_t launch_attention(const AttentionLaunch& a, cudaStream_t stream) {
  const Rows& r = a.rows;
  if (r.count <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim || a.group <= 0 || a.kv_heads <= 0 ||
      a.kv_heads > 65535 || r.count > kRows)
    return cudaErrorInvalidValue;

  const int D = int(a.head_dim), dim4 = (D + 3) / 4 * 4;
  Geometry g{D, dim4, (D + 31) / 32 * 32 + 4, false, false, false, a.scale};
  const bool d4 = D % 4 == 0;
  g.q_wide = d4 && a.ldq % 4 == 0 && aligned16(a.q);
  g.out_wide = d4 && a.ldo % 4 == 0 && aligned16(a.out);
  g.kv_wide = d4;
  int64_t few_rows = 0, block_rows = 0, shortest = r.tokens;
  for (int i = 0; i < r.count; ++i) {
    const KvRow& kv = a.kv[i];
    const int64_t count = r.length[i] * a.group;
    if (count <= kFewLimit) {
      few_rows = count > few_rows ? count : few_rows;
    } else {
      block_rows = count > block_rows ? count : block_rows;
    }
    shortest = r.length[i] < shortest ? r.length[i] : shortest;
    if (kv.prefix_len > 0)
      g.kv_wide = g.kv_wide && kv.prefix_stride % 4 == 0 && aligned16(kv.prefix_k) &&
                  aligned16(kv.prefix_v);
    g.kv_wide = g.kv_wide && kv.own_stride % 4 == 0 && aligned16(kv.own_k) && aligned16(kv.own_v);
  }

  const dim3 threads(kThreads);
  if (block_rows > 0) {
    const size_t bytes = sizeof(float) * (size_t(2 * kKeyBlock + kBlockQueries) * g.pitch +
                                          kKeyBlock * kBlockProbPitch + 2 * kBlockQueries);
    cudaError_t e = cudaFuncSetAttribute(attention_block_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
    const int64_t blocks = (block_rows + kBlockQueries - 1) / kBlockQueries;
    const dim3 grid(unsigned(blocks * a.kv_heads), unsigned(r.count));
    attention_block_kernel<<<grid, threads, bytes, stream>>>(a, g);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (few_rows > 0) {
    const size_t bytes = sizeof(float) * (size_t(2 * kKeyBlock + kFewQueries) * g.pitch +
                                          kKeyBlock * kFewQueries + 2 * kFewQueries);
    cudaError_t e = cudaFuncSetAttribute(attention_few_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
    const dim3 grid(unsigned((few_rows + kFewQueries - 1) / kFewQueries), unsigned(a.kv_heads),
                    unsigned(r.count));
    attention_few_kernel<<<grid, threads, bytes, stream>>>(a, g);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (shortest < r.tokens) {
    const int64_t padded = r.tokens - shortest;
    const dim3 grid(unsigned(padded < 1024 ? padded : 1024), unsigned(r.count));
    zero_padding_kernel<<<grid, threads, 0, stream>>>(a, a.kv_heads * a.group * a.head_dim);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace deg::cuda
