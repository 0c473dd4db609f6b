// CUDA gated delta rule: the DeltaRuleOpArgs op of kernels/ops.h through launch_delta_rule
// (cuda/launch.h), with the algebra of kernels/delta_rule.h and kernels/cpu/delta_rule.cc. Per
// (row, value head h), S [Dk, Dv] starts at rec_in, each real token t does
//   S <- S e^(g_t);  S <- S + k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t
// and S ends in rec_out. Padded tokens get zero outputs; q, k come from key head h / (Hv / Hk).
//
// Two kernels, each launched over the rows it owns (rows are independent):
//
// * decode_kernel, rows with n <= 1: the plain recurrence (n == 1) or a copy of the state
//   (n == 0). One CTA per (row, head, 32 value columns); lane = column, warp w owns a fixed
//   slice of Dk; the two dot products over Dk add the 8 warps' partial sums in warp order.
//
// * chunk_kernel, rows with n >= 2: the chunked form, chunks of 64 tokens from the row's token 0,
//   the last one shorter (zero-filled to 64 rows, which adds exact zeros). One CTA per (row,
//   head, block of 16 value columns); the CTAs of one (row, head) form a thread-block cluster
//   (up to 8). A CTA keeps its 16 columns of S in shared memory for the whole row. Per chunk,
//   with cumulative log decay c_i (double), Γ_ij = e^(c_i - c_j), A = diag(beta) (K Kᵀ ⊙ Γ)
//   strictly lower, P = (Q Kᵀ ⊙ Γ) lower with the diagonal, T = (I + A)^-1:
//     1. [K; Q] S -> KS, QS (this CTA's columns), and warp 0 scans g into c.
//     2. G = K Kᵀ and P: 72 tiles of 8 x 8 on and below the diagonal, split over the cluster's
//        CTAs; each CTA scales its tiles and stores them into every CTA's A and P (distributed
//        shared memory), so the Dv-independent products are computed once per (row, head).
//     3. X = beta ⊙ (V - e^c ⊙ KS); the 16 x 16 diagonal blocks of T by forward substitution.
//     4. the blocks below the diagonal, block row by block row: T_ij = -D_i Σ_k A_ik T_kj.
//     5. v' = T X (the UT transform of FLA / HF's torch_chunk_gated_delta_rule), v'' = e^(c_last
//        - c) ⊙ v'.
//     6. o = e^c ⊙ QS + P v' to the output; S <- e^(c_last) S + Kᵀ v''.
//   The next chunk's q, k, v, g, beta load with cp.async (zero-filled past the row's end) while
//   steps 3-6 run; k is double-buffered when shared memory allows (Dk <= 128 or so).
//
// Shared memory of chunk_kernel, in floats (L4 = ldk = round_up(Dk, 32) + 4, Dk4 = Dk rounded
// up to 4): q [64][L4], k [1 or 2][64][L4], A, P, T [64][68] each, S [Dk4][16], KS|QS [128][16]
// (X overwrites KS), v' [64][16] (step 4's scratch before that), v'' [64][16], v [2][64][16],
// g|beta [2][128], e^c, e^(c_last - c), beta [64] each, e^(c_last), c [64] as doubles. Dk = Dv
// = 128: 188,688 bytes, one CTA of 256 threads per SM; Dk = 256: 228,624 bytes with one k
// buffer.
//
// Batch invariance: each (row, head, column) result depends on that row's inputs and n only.
// Chunk boundaries count from the row's token 0; every sum runs in a fixed order (ascending
// index, one accumulator per element) set by Dk and Dv, never by the row count, L, the cluster
// size or which CTA or thread computes it: a G / P element is computed by the same code in
// whichever CTA of the cluster owns its tile, and the cluster size (chosen per launch from what
// the device can co-schedule) only decides who computes it. Columns of S are independent, so
// splitting Dv over CTAs is exact. Arithmetic is f32 (FMA) on CUDA cores, with the decay sums
// in double like the CPU form; no TF32.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {
namespace {

constexpr int kChunk = 64;      // tokens per chunk (kDeltaRuleChunk)
constexpr int kThreads = 256;   // both kernels
constexpr int kCols = 16;       // value columns of S per chunk_kernel CTA
constexpr int kLdm = 68;        // row stride of A, P, T (float4 rows, 4 banks apart)
constexpr int kMaxDim = 256;    // largest Dk, Dv
constexpr int kMaxCluster = 8;  // portable cluster size
constexpr int kHalfTiles = 36;  // 8 x 8 tiles on and below the diagonal of a 64 x 64 matrix
constexpr int kDecodeWarps = kThreads / 32;

static_assert(kCols == 16 && kChunk == 64 && kThreads == 256, "index arithmetic assumes these");

// The rows of the launch one kernel handles.
struct RowList {
  int count;
  int index[kRows];
};

struct ChunkPlan {
  int dkp;         // Dk rounded up to 4: the reduction length over Dk (zero-padded)
  int ldk;         // row stride of the q, k tiles, 4 mod 32
  int col_blocks;  // ceil(Dv / kCols): CTAs per (row, head)
  int k_buffers;   // 2: the next chunk's k loads during this one; 1 when 2 do not fit
  int vec4;        // q, k, v rows 16-byte aligned: 16-byte cp.async
};

struct ChunkSmem {
  float* q;     // [64][ldk]
  float* k;     // [k_buffers][64][ldk]
  int k_step;   // floats from one k buffer to the next (0 with one buffer)
  float* a;     // [64][kLdm] A (strictly lower)
  float* p;     // [64][kLdm] P (lower, zero above the diagonal)
  float* t;     // [64][kLdm] T (block lower)
  float* s;     // [dkp][16] this CTA's columns of S
  float* kqs;   // [128][16] KS (then X) over QS
  float* vn;    // [64][16] v' (before it: the block-row scratch of T)
  float* vd;    // [64][16] v'' = e^(c_last - c) v'
  float* v;     // [2][64][16]
  float* gb;    // [2][128]: g, then beta
  float* ec;    // [64] e^c
  float* el;    // [64] e^(c_last - c)
  float* beta;  // [64]
  float* misc;  // [4]: e^(c_last)
  double* cum;  // [64] c
};

// Carves the shared memory of chunk_kernel from base (null: only counts); returns its size in
// floats. Every piece is a multiple of 4 floats, so each starts 16-byte aligned.
__host__ __device__ inline int chunk_smem_layout(const ChunkPlan& p, float* base, ChunkSmem* m) {
  int off = 0;
  auto take = [&](int floats) {
    float* at = base ? base + off : nullptr;
    off += floats;
    return at;
  };
  ChunkSmem x;
  x.q = take(kChunk * p.ldk);
  x.k = take(p.k_buffers * kChunk * p.ldk);
  x.k_step = p.k_buffers == 2 ? kChunk * p.ldk : 0;
  x.a = take(kChunk * kLdm);  // a then p: zeroed as one range
  x.p = take(kChunk * kLdm);
  x.t = take(kChunk * kLdm);
  x.s = take(p.dkp * kCols);
  x.kqs = take(2 * kChunk * kCols);
  x.vn = take(kChunk * kCols);
  x.vd = take(kChunk * kCols);
  x.v = take(2 * kChunk * kCols);
  x.gb = take(2 * 2 * kChunk);
  x.ec = take(kChunk);
  x.el = take(kChunk);
  x.beta = take(kChunk);
  x.misc = take(4);
  x.cum = reinterpret_cast<double*>(take(2 * kChunk));
  if (m) *m = x;
  return off;
}

// ---- PTX helpers: cp.async, cluster barriers, distributed shared memory ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 4 or 16 bytes global -> shared, zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ int cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}
__device__ __forceinline__ int cluster_ctas() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}
// Every thread of the CTA calls these at the same points, arrive and wait alternating.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Stores two floats at shared address addr (of this CTA's layout) in cluster CTA `rank`.
__device__ __forceinline__ void store_cluster2(uint32_t addr, int rank, float x, float y) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(addr), "r"(static_cast<uint32_t>(rank)));
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(remote), "f"(x), "f"(y)
               : "memory");
}

__device__ __forceinline__ float4 ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
// acc[0..3] += x * (b.x, b.y, b.z, b.w)
__device__ __forceinline__ void fma4(float* acc, float x, float4 b) {
  acc[0] = fmaf(x, b.x, acc[0]);
  acc[1] = fmaf(x, b.y, acc[1]);
  acc[2] = fmaf(x, b.z, acc[2]);
  acc[3] = fmaf(x, b.w, acc[3]);
}
// acc += a · b over 4 terms, in order.
__device__ __forceinline__ float dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// ---- decode: n <= 1 ----

__global__ void __launch_bounds__(kThreads)
    decode_kernel(const DeltaRuleLaunch a, const RowList list) {
  __shared__ float part[2][kDecodeWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int col_blocks = (dv + 31) / 32;
  const int cb = static_cast<int>(blockIdx.x % col_blocks);
  const int rest = static_cast<int>(blockIdx.x / col_blocks);
  const int h = rest % hv, row = list.index[rest / hv];
  const int kh = h / (hv / static_cast<int>(a.k_heads));
  const int64_t n = a.rows.length[row], len = a.rows.tokens;
  const int64_t tok0 = (a.rows.first + row) * len;
  const int j = cb * 32 + lane;
  const bool active = j < dv;

  for (int64_t t = n + warp; t < len; t += kDecodeWarps)
    if (active) a.out[(tok0 + t) * a.ldo + h * dv + j] = 0.0f;

  const int64_t head = static_cast<int64_t>(h) * dk * dv;
  const float* s_in = a.state[row].rec_in + head;
  float* s_out = a.state[row].rec_out + head;
  const int per = (dk + kDecodeWarps - 1) / kDecodeWarps;
  const int k0 = warp * per, cnt = max(0, min(dk, k0 + per) - k0);  // cnt <= 32

  if (n == 0) {
    if (active && s_in != s_out)
      for (int x = 0; x < cnt; ++x) s_out[(k0 + x) * dv + j] = s_in[(k0 + x) * dv + j];
    return;
  }
  const float* q = a.q + tok0 * a.ld + kh * dk;
  const float* k = a.k + tok0 * a.ld + kh * dk;
  const float decay = expf(a.g[tok0 * a.ldg + h]);
  const float beta = a.beta[tok0 * a.ldg + h];

  // This thread's slice of column j, decayed, in registers: loaded once, so rec_out may alias
  // rec_in without forcing the loads behind the stores.
  float s[32];
  float mem = 0.0f;
#pragma unroll
  for (int x = 0; x < 32; ++x) {
    s[x] = 0.0f;
    if (active && x < cnt) {
      s[x] = s_in[(k0 + x) * dv + j] * decay;
      mem = fmaf(k[k0 + x], s[x], mem);
    }
  }
  part[0][warp][lane] = mem;
  __syncthreads();
  mem = part[0][0][lane];
  for (int w = 1; w < kDecodeWarps; ++w) mem += part[0][w][lane];
  const float u = active ? (a.v[tok0 * a.ld + h * dv + j] - mem) * beta : 0.0f;

  float o = 0.0f;
#pragma unroll
  for (int x = 0; x < 32; ++x) {
    if (active && x < cnt) {
      const float sx = fmaf(k[k0 + x], u, s[x]);
      s_out[(k0 + x) * dv + j] = sx;
      o = fmaf(q[k0 + x], sx, o);
    }
  }
  part[1][warp][lane] = o;
  __syncthreads();
  if (warp == 0 && active) {
    o = part[1][0][lane];
    for (int w = 1; w < kDecodeWarps; ++w) o += part[1][w][lane];
    a.out[tok0 * a.ldo + h * dv + j] = o;
  }
}

// ---- chunked: n >= 2 ----

// cp.async of a [64][width] tile (width a multiple of 4) from global rows src + i * ld: rows
// i < m and columns < valid are read, the rest zero-filled. With vec4, valid is a multiple of 4
// and src, ld are 16-byte aligned. safe: a mapped address for the zero-filled copies.
__device__ void load_tile(float* dst, int ldd, const float* src, int64_t ld, int m, int width,
                          int valid, bool vec4, const float* safe) {
  if (vec4) {
    const int w4 = width >> 2;
    for (int w = threadIdx.x; w < kChunk * w4; w += kThreads) {
      const int i = w / w4, x = 4 * (w - i * w4);
      const bool ok = i < m && x < valid;
      cp_async16(dst + i * ldd + x, ok ? src + i * ld + x : safe, ok);
    }
  } else {
    for (int w = threadIdx.x; w < kChunk * width; w += kThreads) {
      const int i = w / width, x = w - i * width;
      const bool ok = i < m && x < valid;
      cp_async4(dst + i * ldd + x, ok ? src + i * ld + x : safe, ok);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    chunk_kernel(const DeltaRuleLaunch a, const RowList list, const ChunkPlan p) {
  extern __shared__ float4 smem4[];
  ChunkSmem sm;
  chunk_smem_layout(p, reinterpret_cast<float*>(smem4), &sm);

  const int tid = threadIdx.x;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int cb = static_cast<int>(blockIdx.x % p.col_blocks);
  const int rest = static_cast<int>(blockIdx.x / p.col_blocks);
  const int h = rest % hv, row = list.index[rest / hv];
  const int kh = h / (hv / static_cast<int>(a.k_heads));
  const int j0 = cb * kCols, ncols = min(kCols, dv - j0);
  const int64_t n = a.rows.length[row], len = a.rows.tokens;
  const int64_t tok0 = (a.rows.first + row) * len;
  const bool vec4 = p.vec4 != 0;
  const int nchunks = static_cast<int>((n + kChunk - 1) / kChunk);

  // Padded tokens: zero outputs (this CTA's columns).
  for (int64_t w = tid; w < (len - n) * kCols; w += kThreads) {
    const int64_t t = n + w / kCols;
    const int j = static_cast<int>(w % kCols);
    if (j < ncols) a.out[(tok0 + t) * a.ldo + h * dv + j0 + j] = 0.0f;
  }
  // A and P start at zero: entries no tile writes (above the diagonal) stay zero.
  for (int w = tid; w < 2 * kChunk * kLdm; w += kThreads) sm.a[w] = 0.0f;
  const int64_t head = static_cast<int64_t>(h) * dk * dv;
  const float* s_in = a.state[row].rec_in + head;
  for (int w = tid; w < p.dkp * kCols; w += kThreads) {
    const int x = w / kCols, j = w % kCols;
    sm.s[w] = x < dk && j < ncols ? s_in[x * dv + j0 + j] : 0.0f;
  }

  auto load_qk = [&](float* dst, const float* base, int c) {
    const int64_t s0 = static_cast<int64_t>(c) * kChunk;
    const int m = static_cast<int>(n - s0 < kChunk ? n - s0 : kChunk);
    load_tile(dst, p.ldk, base + (tok0 + s0) * a.ld + kh * dk, a.ld, m, p.dkp, dk, vec4, base);
  };
  auto load_vgb = [&](int c) {
    const int64_t s0 = static_cast<int64_t>(c) * kChunk;
    const int m = static_cast<int>(n - s0 < kChunk ? n - s0 : kChunk);
    load_tile(sm.v + (c & 1) * kChunk * kCols, kCols, a.v + (tok0 + s0) * a.ld + h * dv + j0, a.ld,
              m, kCols, ncols, vec4, a.v);
    for (int w = tid; w < 2 * kChunk; w += kThreads) {
      const int i = w & (kChunk - 1);
      const float* base = w < kChunk ? a.g : a.beta;
      cp_async4(sm.gb + (c & 1) * 2 * kChunk + w, i < m ? base + (tok0 + s0 + i) * a.ldg + h : base,
                i < m);
    }
  };
  load_qk(sm.q, a.q, 0);
  load_qk(sm.k, a.k, 0);
  load_vgb(0);

  // The first "readers done" arrival; its wait (before the first remote store) also makes sure
  // every CTA of the cluster has started.
  cluster_arrive();

  for (int c = 0; c < nchunks; ++c) {
    const int buf = c & 1;
    const float* kt = sm.k + buf * sm.k_step;
    const int64_t left = n - static_cast<int64_t>(c) * kChunk;
    const int m = static_cast<int>(left < kChunk ? left : kChunk);
    if (p.k_buffers == 1 && c > 0) {  // the previous chunk's S update read k to the end
      __syncthreads();
      load_qk(sm.k, a.k, c);
    }
    cp_async_wait_all();
    __syncthreads();

    // 1. c by warp 0 (a double scan; padded g are 0, so c_63 = c_last), then KS and QS.
    if (tid < 32) {
      const float* g = sm.gb + buf * 2 * kChunk;
      const float g0 = g[2 * tid], g1 = g[2 * tid + 1];
      double incl = static_cast<double>(g0) + static_cast<double>(g1);
      for (int off = 1; off < 32; off <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, incl, off);
        if (tid >= off) incl += y;
      }
      double excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (tid == 0) excl = 0.0;
      const double c0 = excl + g0, c1 = c0 + g1;
      const double last = __shfl_sync(0xffffffffu, c1, 31);
      sm.cum[2 * tid] = c0;
      sm.cum[2 * tid + 1] = c1;
      sm.ec[2 * tid] = expf(static_cast<float>(c0));
      sm.ec[2 * tid + 1] = expf(static_cast<float>(c1));
      sm.el[2 * tid] = expf(static_cast<float>(last - c0));
      sm.el[2 * tid + 1] = expf(static_cast<float>(last - c1));
      sm.beta[2 * tid] = g[kChunk + 2 * tid];
      sm.beta[2 * tid + 1] = g[kChunk + 2 * tid + 1];
      if (tid == 0) sm.misc[0] = expf(static_cast<float>(last));
    }
    {  // thread: rows K[rg], Q[rg] x columns 4 jg .. 4 jg + 3
      const int jg = tid & 3, rg = tid >> 2;
      const float* kr = kt + rg * p.ldk;
      const float* qr = sm.q + rg * p.ldk;
      const float* sc = sm.s + 4 * jg;
      float ak[4] = {0.0f, 0.0f, 0.0f, 0.0f}, aq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
      for (int x = 0; x < p.dkp; x += 4) {
        const float4 kv = ld4(kr + x), qv = ld4(qr + x);
        const float4 s0 = ld4(sc + (x + 0) * kCols), s1 = ld4(sc + (x + 1) * kCols);
        const float4 s2 = ld4(sc + (x + 2) * kCols), s3 = ld4(sc + (x + 3) * kCols);
        fma4(ak, kv.x, s0);
        fma4(ak, kv.y, s1);
        fma4(ak, kv.z, s2);
        fma4(ak, kv.w, s3);
        fma4(aq, qv.x, s0);
        fma4(aq, qv.y, s1);
        fma4(aq, qv.z, s2);
        fma4(aq, qv.w, s3);
      }
      *reinterpret_cast<float4*>(sm.kqs + rg * kCols + 4 * jg) =
          make_float4(ak[0], ak[1], ak[2], ak[3]);
      *reinterpret_cast<float4*>(sm.kqs + (kChunk + rg) * kCols + 4 * jg) =
          make_float4(aq[0], aq[1], aq[2], aq[3]);
    }
    __syncthreads();

    // 2. This CTA's share of the G and P tiles, scaled, into A and P of every CTA. The wait
    // pairs with the previous chunk's "readers done" arrival.
    cluster_wait();
    {
      const int rank = cluster_rank(), ctas = cluster_ctas();
      const int items = (2 * kHalfTiles - rank + ctas - 1) / ctas * 16;
      for (int w = tid; w < items; w += kThreads) {
        const int tile = rank + ctas * (w >> 4), sub = w & 15;
        const bool is_p = tile >= kHalfTiles;
        const int u = is_p ? tile - kHalfTiles : tile;
        int bi = 0;
        while ((bi + 1) * (bi + 2) / 2 <= u) ++bi;
        const int bj = u - bi * (bi + 1) / 2;
        const int i0 = 8 * bi + 2 * (sub >> 2), j0t = 8 * bj + 2 * (sub & 3);
        const float* xa = (is_p ? sm.q : kt) + i0 * p.ldk;
        const float* xb = xa + p.ldk;
        const float* ya = kt + j0t * p.ldk;
        const float* yb = ya + p.ldk;
        float c00 = 0.0f, c01 = 0.0f, c10 = 0.0f, c11 = 0.0f;
#pragma unroll 2
        for (int x = 0; x < p.dkp; x += 4) {
          const float4 x0 = ld4(xa + x), x1 = ld4(xb + x), y0 = ld4(ya + x), y1 = ld4(yb + x);
          c00 = dot4(c00, x0, y0);
          c01 = dot4(c01, x0, y1);
          c10 = dot4(c10, x1, y0);
          c11 = dot4(c11, x1, y1);
        }
        const float prod[2][2] = {{c00, c01}, {c10, c11}};
        float* dst = is_p ? sm.p : sm.a;
#pragma unroll
        for (int di = 0; di < 2; ++di) {
          const int i = i0 + di;
          float val[2];
#pragma unroll
          for (int dj = 0; dj < 2; ++dj) {
            const int jj = j0t + dj;
            const bool keep = is_p ? jj <= i : jj < i;
            const float e = keep ? expf(static_cast<float>(sm.cum[i] - sm.cum[jj])) : 0.0f;
            const float x = is_p ? prod[di][dj] : sm.beta[i] * prod[di][dj];
            val[dj] = keep ? x * e : 0.0f;
          }
          const uint32_t addr = smem_u32(dst + i * kLdm + j0t);
          for (int r = 0; r < ctas; ++r) store_cluster2(addr, r, val[0], val[1]);
        }
      }
    }
    cluster_arrive();
    cluster_wait();

    // q and this chunk's v, g, beta buffers are free now: start the next chunk's loads.
    if (c + 1 < nchunks) {
      load_qk(sm.q, a.q, c + 1);
      if (p.k_buffers == 2) load_qk(sm.k + (buf ^ 1) * sm.k_step, a.k, c + 1);
      load_vgb(c + 1);
    }

    // 3. Diagonal blocks D_b = (I + A_bb)^-1 (threads 0-63: column m of block b), and X.
    if (tid < 64) {
      const int o = 16 * (tid >> 4), col = tid & 15;
      float d[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const float* ar = sm.a + (o + r) * kLdm + o;
        float acc = 0.0f;
#pragma unroll
        for (int x4 = 0; x4 < r; x4 += 4) {
          const float4 av = ld4(ar + x4);
          acc = fmaf(av.x, d[x4], acc);
          if (x4 + 1 < r) acc = fmaf(av.y, d[x4 + 1], acc);
          if (x4 + 2 < r) acc = fmaf(av.z, d[x4 + 2], acc);
          if (x4 + 3 < r) acc = fmaf(av.w, d[x4 + 3], acc);
        }
        d[r] = r < col ? 0.0f : (r == col ? 1.0f : -acc);
      }
#pragma unroll
      for (int r = 0; r < 16; ++r) sm.t[(o + r) * kLdm + o + col] = d[r];
    } else {
      const float* v = sm.v + buf * kChunk * kCols;
      for (int w = tid - 64; w < kChunk * kCols; w += kThreads - 64) {
        const int i = w >> 4;
        sm.kqs[w] = sm.beta[i] * fmaf(-sm.ec[i], sm.kqs[w], v[w]);
      }
    }
    __syncthreads();

    // 4. Block rows 1-3 of T: Y_ij = Σ_{k=j}^{i-1} A_ik T_kj into the scratch, T_ij = -D_i Y_ij.
    float* scratch = sm.vn;
    for (int bi = 1; bi < 4; ++bi) {
      for (int w = tid; w < bi * 256; w += kThreads) {
        const int bj = w >> 8, r = (w >> 4) & 15, col = w & 15;
        const float* ar = sm.a + (16 * bi + r) * kLdm;
        float acc = 0.0f;
        for (int kb = bj; kb < bi; ++kb) {
          const float* tc = sm.t + 16 * kb * kLdm + 16 * bj + col;
#pragma unroll
          for (int x4 = 0; x4 < 16; x4 += 4) {
            const float4 av = ld4(ar + 16 * kb + x4);
            acc = fmaf(av.x, tc[(x4 + 0) * kLdm], acc);
            acc = fmaf(av.y, tc[(x4 + 1) * kLdm], acc);
            acc = fmaf(av.z, tc[(x4 + 2) * kLdm], acc);
            acc = fmaf(av.w, tc[(x4 + 3) * kLdm], acc);
          }
        }
        scratch[w] = acc;
      }
      __syncthreads();
      for (int w = tid; w < bi * 256; w += kThreads) {
        const int bj = w >> 8, r = (w >> 4) & 15, col = w & 15;
        const float* dr = sm.t + (16 * bi + r) * kLdm + 16 * bi;
        const float* yc = scratch + bj * 256 + col;
        float acc = 0.0f;
#pragma unroll
        for (int x4 = 0; x4 < 16; x4 += 4) {
          const float4 dv4 = ld4(dr + x4);
          acc = fmaf(dv4.x, yc[(x4 + 0) * 16], acc);
          acc = fmaf(dv4.y, yc[(x4 + 1) * 16], acc);
          acc = fmaf(dv4.z, yc[(x4 + 2) * 16], acc);
          acc = fmaf(dv4.w, yc[(x4 + 3) * 16], acc);
        }
        sm.t[(16 * bi + r) * kLdm + 16 * bj + col] = -acc;
      }
      __syncthreads();
    }

    // 5. v' = T X (row r sums over the blocks up to its own), v'' = e^(c_last - c) v'. Thread:
    // column j, rows rr + 16 b.
    const int j = tid & 15, rr = tid >> 4;
    {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int x4 = 0; x4 < 16; x4 += 4) {
          const int x = 16 * kb + x4;
          const float4 xv = make_float4(sm.kqs[(x + 0) * kCols + j], sm.kqs[(x + 1) * kCols + j],
                                        sm.kqs[(x + 2) * kCols + j], sm.kqs[(x + 3) * kCols + j]);
#pragma unroll
          for (int b = kb; b < 4; ++b)
            acc[b] = dot4(acc[b], ld4(sm.t + (rr + 16 * b) * kLdm + x), xv);
        }
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int r = rr + 16 * b;
        sm.vn[r * kCols + j] = acc[b];
        sm.vd[r * kCols + j] = acc[b] * sm.el[r];
      }
    }
    __syncthreads();

    // 6. o = e^c QS + P v' to the output; S <- e^(c_last) S + Kᵀ v''.
    {
      float acc[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int r = rr + 16 * b;
        acc[b] = sm.ec[r] * sm.kqs[(kChunk + r) * kCols + j];
      }
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int x4 = 0; x4 < 16; x4 += 4) {
          const int x = 16 * kb + x4;
          const float4 vv = make_float4(sm.vn[(x + 0) * kCols + j], sm.vn[(x + 1) * kCols + j],
                                        sm.vn[(x + 2) * kCols + j], sm.vn[(x + 3) * kCols + j]);
#pragma unroll
          for (int b = kb; b < 4; ++b)
            acc[b] = dot4(acc[b], ld4(sm.p + (rr + 16 * b) * kLdm + x), vv);
        }
      const int64_t s0 = static_cast<int64_t>(c) * kChunk;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int r = rr + 16 * b;
        if (r < m && j < ncols) a.out[(tok0 + s0 + r) * a.ldo + h * dv + j0 + j] = acc[b];
      }
    }
    {  // thread: S rows k0 .. k0 + 3 x columns jj, jj + 1
      const float eg = sm.misc[0];
      for (int w = tid; w < 2 * p.dkp; w += kThreads) {
        const int k0 = 4 * (w >> 3), jj = 2 * (w & 7);
        float acc[4][2];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float2 sv = ld2(sm.s + (k0 + u) * kCols + jj);
          acc[u][0] = eg * sv.x;
          acc[u][1] = eg * sv.y;
        }
#pragma unroll 4
        for (int i = 0; i < m; ++i) {
          const float4 kv = ld4(kt + i * p.ldk + k0);
          const float2 vv = ld2(sm.vd + i * kCols + jj);
          const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            acc[u][0] = fmaf(kk[u], vv.x, acc[u][0]);
            acc[u][1] = fmaf(kk[u], vv.y, acc[u][1]);
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
          *reinterpret_cast<float2*>(sm.s + (k0 + u) * kCols + jj) =
              make_float2(acc[u][0], acc[u][1]);
      }
    }
    // This CTA has read A and P for the last time this chunk.
    cluster_arrive();
  }

  __syncthreads();
  float* s_out = a.state[row].rec_out + head;
  for (int w = tid; w < dk * kCols; w += kThreads) {
    const int x = w / kCols, jc = w % kCols;
    if (jc < ncols) s_out[x * dv + j0 + jc] = sm.s[w];
  }
  cluster_wait();  // pairs with the last arrival: no CTA leaves while others may still write
}

int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

cudaError_t launch_chunked(const DeltaRuleLaunch& a, const RowList& rows, cudaStream_t stream) {
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  ChunkPlan p{};
  p.dkp = round_up(dk, 4);
  p.ldk = round_up(dk, 32) + 4;
  p.col_blocks = (dv + kCols - 1) / kCols;
  p.vec4 = aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && a.ld % 4 == 0 && dk % 4 == 0 &&
           dv % 4 == 0;
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  p.k_buffers = 2;
  if (chunk_smem_layout(p, nullptr, nullptr) * int(sizeof(float)) > optin) p.k_buffers = 1;
  const int bytes = chunk_smem_layout(p, nullptr, nullptr) * int(sizeof(float));
  if (bytes > optin) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;

  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(p.col_blocks * a.v_heads * rows.count));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(bytes);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  // The largest cluster (a divisor of col_blocks, at most 8) the device can co-schedule; the
  // results do not depend on it.
  for (int ctas = kMaxCluster; ctas >= 1; --ctas) {
    if (p.col_blocks % ctas != 0) continue;
    attr.val.clusterDim.x = static_cast<unsigned>(ctas);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    if (ctas == 1) break;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, chunk_kernel, &cfg) == cudaSuccess &&
        clusters > 0)
      break;
    cudaGetLastError();  // a refused size is not this launch's error
  }
  err = cudaLaunchKernelEx(&cfg, chunk_kernel, a, rows, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_delta_rule(const DeltaRuleLaunch& a, cudaStream_t stream) {
  if (a.rows.count <= 0 || a.v_heads <= 0) return cudaSuccess;
  if (a.dk < 1 || a.dk > kMaxDim || a.dv < 1 || a.dv > kMaxDim || a.k_heads < 1 ||
      a.v_heads % a.k_heads != 0 || a.rows.count > kRows)
    return cudaErrorInvalidValue;
  RowList chunked{}, single{};
  for (int i = 0; i < a.rows.count; ++i) {
    RowList& list = a.rows.length[i] > 1 ? chunked : single;
    list.index[list.count++] = i;
  }
  if (single.count > 0) {
    const int col_blocks = static_cast<int>((a.dv + 31) / 32);
    const unsigned grid = static_cast<unsigned>(col_blocks * a.v_heads * single.count);
    decode_kernel<<<grid, kThreads, 0, stream>>>(a, single);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (chunked.count > 0) return launch_chunked(a, chunked, stream);
  return cudaSuccess;
}

}  // namespace deg::cuda
