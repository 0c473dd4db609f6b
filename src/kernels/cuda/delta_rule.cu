// CUDA gated delta rule: the DeltaRuleOpArgs op of kernels/ops.h through launch_delta_rule
// (cuda/launch.h), with the algebra of kernels/delta_rule.h and kernels/cpu/delta_rule.cc. Per
// (row, value head h), S [Dk, Dv] starts at rec_in, each real token t does
//   S <- S e^(g_t);  S <- S + k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t
// and S ends in rec_out. Padded tokens get zero outputs; q, k come from key head h / (Hv / Hk).
//
// A row of n tokens splits into 64-token chunks from its token 0. Its full chunks run the chunked
// form below; a last partial chunk (1-63 tokens) runs the plain recurrence (recur_kernel in
// delta_rule_recurrent.cu, after the chunked form has written the state to rec_out). The choice
// depends on n only, and a row fed in 64-aligned pieces makes the same choices, chunk by chunk, as
// the whole row. Decode (n == 1) and short rows (fork rows) are recurrence only; an empty row
// copies its state. A row with a history (DeltaRuleHistory) starts from rec_in with the history
// replayed in recur_kernel; where its chunked form runs, a replay-only launch of recur_kernel
// first stores that state to rec_out and the rest of the launch reads it there.
//
// The chunked form. Per chunk, with cumulative log decay c_i (double), e_i = e^(c_i),
// f_i = e^(c_last - c_i), E = e^(c_last), Γ_ij = e^(c_i - c_j), A = diag(beta) (K Kᵀ ⊙ Γ) strictly
// lower, T = (I + A)^-1 and P = (Q Kᵀ ⊙ Γ) lower with the diagonal, the chunk's step is
//   v' = U - W S,   o = e ⊙ (Q S) + P v',   S <- E S + K̃ᵀ v'
// with W = T diag(beta e) K, U = T diag(beta) V (the UT transform of FLA / HF's
// torch_chunk_gated_delta_rule) and K̃ = diag(f) K. Only the middle of that is a walk over the
// chunks in order; three kernels split it so that the walk does as little as it can:
//   1. prep_kernel, a CTA per (row, head, chunk), all chunks at once: c (a double scan), A, P,
//      T (forward substitution by 16 x 16 blocks), then W, U, K̃ and P, e, E to the workspace.
//   2. state_kernel, a CTA per (row, head, 16 value columns), the row's chunks in order, S (its
//      columns) in shared memory: S to the workspace (the state before the chunk), v' = U - W S
//      (over U in the workspace), S <- E S + K̃ᵀ v'. The next chunk's W, K̃, U load with cp.async
//      while this one runs (when two buffers fit).
//   3. out_kernel, a CTA per (row, head, chunk, 64 value columns), all chunks at once:
//      o = e ⊙ (Q S) + P v' from the state before the chunk and v'.
// Work is cut into segments of chunks (the same chunk range of every row of the launch) so that
// the workspace stays bounded (delta_rule_workspace_floats: 256 MB); state_kernel carries S from
// one segment to the next through rec_out, in f32 as it holds it, so segments change no bit.
//
// Shared memory (floats; ldk = round_up(Dk, 32) + 4, so 16 consecutive rows start 4 banks apart;
// Dk4 = Dk rounded up to 4, Dv16 = Dv rounded up to 16):
//   prep:  q then v [64][ldx], k [64][ldx] (ldx = round_up(max(Dk4, Dv16), 32) + 4), A, T
//          [64][68], T's block-row scratch [1024], decay factors [196], c [64] doubles, g|beta
//          [128]: 107,792 bytes at Dk = Dv = 128 (two CTAs per SM);
//   state: W, K̃ [buffers][64][ldk], U [buffers][64][16], S [Dk4][16], v' [64][16], partial sums
//          [max(4 x 64, 2 Dk4)][16], e|E [buffers][68]: 172,576 bytes at 128 with two buffers;
//   out:   q [64][ldk], S [Dk4][68], P [64][68], v' [64][68], e [64]: 103,936 bytes at 128.
// The workspace of a (row, head, chunk): W [64][Dk4], K̃ [64][Dk4], U then v' [64][Dv16],
// P [64][64], e|E [68], S [Dk4][Dv16]: 180,496 bytes at 128.
//
// Batch invariance. Each (row, head, column) result depends on that row's inputs and n only.
// Chunk boundaries count from the row's token 0; every sum runs in a fixed order (ascending
// index with one accumulator per element, or a fixed split into parts met in a fixed order) set
// by Dk and Dv, never by the row count, L, the segment or which CTA or thread computes it. Columns
// of S are independent, so splitting Dv over CTAs is exact. Arithmetic is f32 (FMA) on CUDA
// cores, with the decay sums in double like the CPU form; no TF32.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/delta_rule_common.cuh"

namespace deg::cuda {
namespace dr {

// ---- sizes shared by the three kernels ----

constexpr int kOutCols = 64;            // value columns per out_kernel CTA
constexpr int kDecFloats = kChunk + 4;  // e [64], E, pad: per chunk in the workspace

static_assert(kRecurTokens == kChunk - 1, "the chunked form runs full chunks only");

struct Plan {
  int dkp;         // Dk rounded up to 4: the reduction length over Dk (zero-padded)
  int dvq;         // Dv rounded up to 16: columns of U, v' and S in the workspace
  int ldk;         // row stride of [64][Dk4] tiles, 4 mod 32
  int ldx;         // row stride of prep_kernel's q / v and k tiles
  int col_blocks;  // dvq / kCols: state_kernel CTAs per (row, head)
  int out_blocks;  // ceil(dvq / kOutCols): out_kernel CTAs per (row, head, chunk)
  int buffers;     // state_kernel: 2 when the next chunk's tiles fit beside this one's
  int vec4;        // q, k, v rows 16-byte aligned: 16-byte cp.async
  int64_t unit;    // workspace floats per (row, head, chunk)
};

// Offsets of a unit's pieces in the workspace, in floats from the unit's start.
struct UnitLayout {
  int64_t w, kt, u, p, dec, s;
};
__host__ __device__ inline UnitLayout unit_layout(const Plan& p) {
  UnitLayout l{};
  l.w = 0;
  l.kt = l.w + int64_t(kChunk) * p.dkp;
  l.u = l.kt + int64_t(kChunk) * p.dkp;
  l.p = l.u + int64_t(kChunk) * p.dvq;
  l.dec = l.p + int64_t(kChunk) * kChunk;
  l.s = l.dec + kDecFloats;
  return l;
}
__host__ __device__ inline int64_t unit_floats(const Plan& p) {
  return unit_layout(p).s + int64_t(p.dkp) * p.dvq;
}

// A segment: chunks first .. first + chunks - 1 of every row of the launch.
struct Segment {
  int first, chunks;
};

// Full chunks of a row of n tokens.
__host__ __device__ inline int full_chunks(int64_t n) {
  return static_cast<int>(chunked_tokens(n) / kChunk);
}

// cp.async of a [rows][width] tile (width a multiple of 4) from global rows src + i * ld: columns
// < valid are read, the rest zero-filled. With vec4, valid is a multiple of 4 and src, ld are
// 16-byte aligned. safe: a mapped address for the zero-filled copies.
__device__ void load_tile(float* dst, int ldd, const float* src, int64_t ld, int rows, int width,
                          int valid, bool vec4, const float* safe) {
  if (vec4) {
    const int w4 = width >> 2;
    for (int w = threadIdx.x; w < rows * w4; w += kThreads) {
      const int i = w / w4, x = 4 * (w - i * w4);
      const bool ok = x < valid;
      cp_async16(dst + i * ldd + x, ok ? src + i * ld + x : safe, ok);
    }
  } else {
    for (int w = threadIdx.x; w < rows * width; w += kThreads) {
      const int i = w / width, x = w - i * width;
      const bool ok = x < valid;
      cp_async4(dst + i * ldd + x, ok ? src + i * ld + x : safe, ok);
    }
  }
}

// ---- 1. prep_kernel ----

struct PrepSmem {
  float *qv, *k, *a, *t, *scratch, *dec, *gb;
  double* cum;
};
__host__ __device__ inline int prep_smem_floats(const Plan& p, float* base, PrepSmem* m) {
  int off = 0;
  auto take = [&](int floats) {
    float* at = base ? base + off : nullptr;
    off += floats;
    return at;
  };
  PrepSmem x;
  x.qv = take(kChunk * p.ldx);
  x.k = take(kChunk * p.ldx);
  x.a = take(kChunk * kLdm);
  x.t = take(kChunk * kLdm);
  x.scratch = take(1024);
  x.dec = take(kDecStride);
  x.cum = reinterpret_cast<double*>(take(2 * kChunk));
  x.gb = take(2 * kChunk);
  if (m) *m = x;
  return off;
}

// out[r][x] = Σ_{j <= r} t[r][j] b[j][x] for the chunk's 64 rows and columns x < width (a
// multiple of 4), j ascending; t is lower by 16 x 16 blocks (zero above the diagonal inside the
// diagonal blocks; blocks above them are not read). Thread: rows rq + 16 u (u < 4) x 4 columns.
__device__ __forceinline__ void lower_product(const float* t, const float* b, int ldb, int width,
                                              float* out, int64_t ldo) {
  for (int w = threadIdx.x; w < 16 * (width >> 2); w += kThreads) {
    const int rq = w & 15, x = 4 * (w >> 4);
    float acc[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[u][e] = 0.0f;
#pragma unroll 2
    for (int j = 0; j < kChunk; j += 4) {
      const float4 b0 = ld4(b + (j + 0) * ldb + x), b1 = ld4(b + (j + 1) * ldb + x);
      const float4 b2 = ld4(b + (j + 2) * ldb + x), b3 = ld4(b + (j + 3) * ldb + x);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (j >= 16 * (u + 1)) continue;
        const float4 tv = ld4(t + (rq + 16 * u) * kLdm + j);
        fma4(acc[u], tv.x, b0);
        fma4(acc[u], tv.y, b1);
        fma4(acc[u], tv.z, b2);
        fma4(acc[u], tv.w, b3);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      *reinterpret_cast<float4*>(out + (rq + 16 * u) * ldo + x) =
          make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    prep_kernel(const DeltaRuleLaunch a, const RowList list, const Plan p, const Segment seg,
                float* ws) {
  extern __shared__ float4 smem4[];
  PrepSmem sm;
  prep_smem_floats(p, reinterpret_cast<float*>(smem4), &sm);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int ci = static_cast<int>(blockIdx.x % seg.chunks);
  const int rest = static_cast<int>(blockIdx.x / seg.chunks);
  const int h = rest % hv, rl = rest / hv, row = list.index[rl];
  const int kh = h / (hv / static_cast<int>(a.k_heads));
  const int c = seg.first + ci;
  if (c >= full_chunks(a.rows.length[row])) return;
  const int64_t t0 = (a.rows.first + row) * a.rows.tokens + int64_t(c) * kChunk;
  const bool vec4 = p.vec4 != 0;
  const UnitLayout ul = unit_layout(p);
  float* unit = ws + ((int64_t(rl) * hv + h) * seg.chunks + ci) * p.unit;

  load_tile(sm.qv, p.ldx, a.q + t0 * a.ld + kh * dk, a.ld, kChunk, p.dkp, dk, vec4, a.q);
  load_tile(sm.k, p.ldx, a.k + t0 * a.ld + kh * dk, a.ld, kChunk, p.dkp, dk, vec4, a.k);
  if (tid < 2 * kChunk) {
    const float* src = tid < kChunk ? a.g : a.beta;
    cp_async4(sm.gb + tid, src + (t0 + (tid & (kChunk - 1))) * a.ldg + h, true);
  }
  cp_async_wait_all();
  __syncthreads();

  // Decay factors (warp 0; a double scan): dec = e [64], f [64], beta [64], E.
  if (warp == 0) {
    const float g0 = sm.gb[2 * lane], g1 = sm.gb[2 * lane + 1];
    double incl = static_cast<double>(g0) + static_cast<double>(g1);
    for (int off = 1; off < 32; off <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    const double c0 = excl + g0, c1 = c0 + g1;
    const double last = __shfl_sync(0xffffffffu, c1, 31);
    float* d = sm.dec;
    d[2 * lane] = expf(static_cast<float>(c0));
    d[2 * lane + 1] = expf(static_cast<float>(c1));
    d[kChunk + 2 * lane] = expf(static_cast<float>(last - c0));
    d[kChunk + 2 * lane + 1] = expf(static_cast<float>(last - c1));
    d[2 * kChunk + 2 * lane] = sm.gb[kChunk + 2 * lane];
    d[2 * kChunk + 2 * lane + 1] = sm.gb[kChunk + 2 * lane + 1];
    if (lane == 0) d[3 * kChunk] = expf(static_cast<float>(last));
    sm.cum[2 * lane] = c0;
    sm.cum[2 * lane + 1] = c1;
  }
  __syncthreads();

  // G and P: the 8 x 8 tiles on and below the diagonal, a thread per 8 x 4 half (threads
  // 0-143), its rows and columns visited in an order rotated by the tile's place in its quarter
  // warp (so the quarter's loads hit distinct banks; no sum changes). A (scaled by beta) to
  // shared memory, P to the workspace; threads 144-255 write P's zeros above those tiles.
  float* pw = unit + ul.p;
  if (tid < 4 * kHalfTiles) {
    const float* beta = sm.dec + 2 * kChunk;
    const int tile = tid >> 1, rot = tile & 3;
    const bool is_p = tile >= kHalfTiles;
    const int u = is_p ? tile - kHalfTiles : tile;
    int bi = 0;
    while ((bi + 1) * (bi + 2) / 2 <= u) ++bi;
    const int bj = u - bi * (bi + 1) / 2;
    const int i0 = 8 * bi, j0t = 8 * bj + 4 * (tid & 1);
    const float* xs = (is_p ? sm.qv : sm.k) + i0 * p.ldx;
    const float* ys = sm.k + j0t * p.ldx;
    float acc[8][4];
#pragma unroll
    for (int di = 0; di < 8; ++di)
#pragma unroll
      for (int dj = 0; dj < 4; ++dj) acc[di][dj] = 0.0f;
    for (int x = 0; x < p.dkp; x += 4) {
      float4 yv[4];
#pragma unroll
      for (int dj = 0; dj < 4; ++dj) yv[dj] = ld4(ys + ((dj + rot) & 3) * p.ldx + x);
#pragma unroll
      for (int di = 0; di < 8; ++di) {
        const float4 xv = ld4(xs + ((di + rot) & 7) * p.ldx + x);
#pragma unroll
        for (int dj = 0; dj < 4; ++dj) acc[di][dj] = dot4(acc[di][dj], xv, yv[dj]);
      }
    }
#pragma unroll
    for (int di = 0; di < 8; ++di) {
      const int i = i0 + ((di + rot) & 7);
#pragma unroll
      for (int dj = 0; dj < 4; ++dj) {
        const int jj = j0t + ((dj + rot) & 3);
        const bool keep = is_p ? jj <= i : jj < i;
        const float e = keep ? expf(static_cast<float>(sm.cum[i] - sm.cum[jj])) : 0.0f;
        const float x = is_p ? acc[di][dj] : beta[i] * acc[di][dj];
        const float y = keep ? x * e : 0.0f;
        if (is_p) {
          pw[i * kChunk + jj] = y;
        } else {
          sm.a[i * kLdm + jj] = y;
        }
      }
    }
  } else {
    for (int w = tid - 4 * kHalfTiles; w < kChunk * kChunk; w += kThreads - 4 * kHalfTiles) {
      const int i = w >> 6, j = w & (kChunk - 1);
      if ((j >> 3) > (i >> 3)) pw[w] = 0.0f;
    }
  }
  __syncthreads();

  // q is read: v loads into its tile. K̃ = f ⊙ K to the workspace, K <- (beta e) ⊙ K in place;
  // e, E to the workspace.
  load_tile(sm.qv, p.ldx, a.v + t0 * a.ld + h * dv, a.ld, kChunk, p.dvq, dv, vec4, a.v);
  {
    float* kt = unit + ul.kt;
    const int w4 = p.dkp >> 2;
    for (int w = tid; w < kChunk * w4; w += kThreads) {
      const int i = w / w4, x = 4 * (w - i * w4);
      const float4 kv = ld4(sm.k + i * p.ldx + x);
      const float f = sm.dec[kChunk + i], s = sm.dec[2 * kChunk + i] * sm.dec[i];
      *reinterpret_cast<float4*>(kt + i * p.dkp + x) =
          make_float4(f * kv.x, f * kv.y, f * kv.z, f * kv.w);
      *reinterpret_cast<float4*>(sm.k + i * p.ldx + x) =
          make_float4(s * kv.x, s * kv.y, s * kv.z, s * kv.w);
    }
    if (tid < kDecFloats) unit[ul.dec + tid] = tid < kChunk ? sm.dec[tid] : sm.dec[3 * kChunk];
  }

  // T = (I + A)^-1: the diagonal blocks D_b = (I + A_bb)^-1 (threads 0-63: column col of block
  // b), then block rows 1-3: Y_ij = Σ_{k=j}^{i-1} A_ik T_kj into the scratch, T_ij = -D_i Y_ij.
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
  }
  __syncthreads();
  for (int bi = 1; bi < 4; ++bi) {
    for (int w = tid; w < bi * 256; w += kThreads) {
      const int bj = w >> 8, r = (w >> 4) & 15, col = w & 15;
      const float* ar = sm.a + (16 * bi + r) * kLdm;
      float acc = 0.0f;
      for (int kb2 = bj; kb2 < bi; ++kb2) {
        const float* tc = sm.t + 16 * kb2 * kLdm + 16 * bj + col;
#pragma unroll
        for (int x4 = 0; x4 < 16; x4 += 4) {
          const float4 av = ld4(ar + 16 * kb2 + x4);
          acc = fmaf(av.x, tc[(x4 + 0) * kLdm], acc);
          acc = fmaf(av.y, tc[(x4 + 1) * kLdm], acc);
          acc = fmaf(av.z, tc[(x4 + 2) * kLdm], acc);
          acc = fmaf(av.w, tc[(x4 + 3) * kLdm], acc);
        }
      }
      sm.scratch[w] = acc;
    }
    __syncthreads();
    for (int w = tid; w < bi * 256; w += kThreads) {
      const int bj = w >> 8, r = (w >> 4) & 15, col = w & 15;
      const float* dr = sm.t + (16 * bi + r) * kLdm + 16 * bi;
      const float* yc = sm.scratch + bj * 256 + col;
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

  // W = T ((beta e) ⊙ K); v <- beta ⊙ v, then U = T v.
  lower_product(sm.t, sm.k, p.ldx, p.dkp, unit + ul.w, p.dkp);
  cp_async_wait_all();
  __syncthreads();
  {
    const int w4 = p.dvq >> 2;
    for (int w = tid; w < kChunk * w4; w += kThreads) {
      const int i = w / w4, x = 4 * (w - i * w4);
      const float4 vv = ld4(sm.qv + i * p.ldx + x);
      const float b = sm.dec[2 * kChunk + i];
      *reinterpret_cast<float4*>(sm.qv + i * p.ldx + x) =
          make_float4(b * vv.x, b * vv.y, b * vv.z, b * vv.w);
    }
  }
  __syncthreads();
  lower_product(sm.t, sm.qv, p.ldx, p.dvq, unit + ul.u, p.dvq);
}

// ---- 2. state_kernel ----

struct StateSmem {
  float *w, *kt, *u, *s, *vn, *part, *dec;
  int w_step, u_step;  // floats from one buffer to the next (0 with one buffer)
};
__host__ __device__ inline int state_part_floats(const Plan& p) {
  return (4 * kChunk > 2 * p.dkp ? 4 * kChunk : 2 * p.dkp) * kCols;
}
__host__ __device__ inline int state_smem_floats(const Plan& p, float* base, StateSmem* m) {
  int off = 0;
  auto take = [&](int floats) {
    float* at = base ? base + off : nullptr;
    off += floats;
    return at;
  };
  StateSmem x;
  x.w = take(p.buffers * kChunk * p.ldk);
  x.kt = take(p.buffers * kChunk * p.ldk);
  x.u = take(p.buffers * kChunk * kCols);
  x.w_step = p.buffers == 2 ? kChunk * p.ldk : 0;
  x.u_step = p.buffers == 2 ? kChunk * kCols : 0;
  x.s = take(p.dkp * kCols);
  x.vn = take(kChunk * kCols);
  x.part = take(state_part_floats(p));
  x.dec = take(p.buffers * kDecFloats);
  if (m) *m = x;
  return off;
}

__global__ void __launch_bounds__(kThreads, 1)
    state_kernel(const DeltaRuleLaunch a, const RowList list, const Plan p, const Segment seg,
                 float* ws) {
  extern __shared__ float4 smem4[];
  StateSmem sm;
  state_smem_floats(p, reinterpret_cast<float*>(smem4), &sm);

  const int tid = threadIdx.x;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int cb = static_cast<int>(blockIdx.x % p.col_blocks);
  const int rest = static_cast<int>(blockIdx.x / p.col_blocks);
  const int h = rest % hv, rl = rest / hv, row = list.index[rl];
  const int j0 = cb * kCols, ncols = min(kCols, dv - j0);
  const int64_t n = a.rows.length[row], len = a.rows.tokens;
  const int64_t tok0 = (a.rows.first + row) * len;
  const int c_end = min(seg.first + seg.chunks, full_chunks(n));
  if (seg.first >= c_end) return;
  const UnitLayout ul = unit_layout(p);
  auto unit_of = [&](int c) {
    return ws + ((int64_t(rl) * hv + h) * seg.chunks + (c - seg.first)) * p.unit;
  };

  if (seg.first == 0) {  // padded tokens: zero outputs (this CTA's columns)
    for (int64_t w = tid; w < (len - n) * kCols; w += kThreads) {
      const int64_t t = n + w / kCols;
      const int j = static_cast<int>(w % kCols);
      if (j < ncols) a.out[(tok0 + t) * a.ldo + h * dv + j0 + j] = 0.0f;
    }
  }
  const int64_t head = static_cast<int64_t>(h) * dk * dv;
  const float* s_in = (seg.first == 0 ? a.state[row].rec_in : a.state[row].rec_out) + head;
  for (int w = tid; w < p.dkp * kCols; w += kThreads) {
    const int x = w / kCols, j = w % kCols;
    sm.s[w] = x < dk && j < ncols ? s_in[x * dv + j0 + j] : 0.0f;
  }

  auto load = [&](int c, int b) {
    const float* src = unit_of(c);
    load_tile(sm.w + b * sm.w_step, p.ldk, src + ul.w, p.dkp, kChunk, p.dkp, p.dkp, true, src);
    load_tile(sm.kt + b * sm.w_step, p.ldk, src + ul.kt, p.dkp, kChunk, p.dkp, p.dkp, true, src);
    load_tile(sm.u + b * sm.u_step, kCols, src + ul.u + j0, p.dvq, kChunk, kCols, kCols, true, src);
    if (tid < kDecFloats / 4)
      cp_async16(sm.dec + b * kDecFloats + 4 * tid, src + ul.dec + 4 * tid, true);
  };
  const bool two = p.buffers == 2;
  if (two) load(seg.first, 0);

  // Thread roles. v' partials: k part kq = tid / 64 of the Dk4 reduction, rows rq + 16 u
  // (u < 4), columns 4 cq .. + 3. S update: the i half (tokens 32 half ..) of rows 4 xq .. + 3
  // and columns 4 cq .. + 3 (a loop: Dk4 rows take Dk4 / 2 threads per half).
  const int kq = tid >> 6, rq = (tid & 63) >> 2, cq = tid & 3;
  const int klen = (p.dkp / 4 + 3) / 4 * 4;
  const int k_lo = kq * klen, k_hi = min(p.dkp, k_lo + klen);
  for (int c = seg.first; c < c_end; ++c) {
    const int b = two ? (c - seg.first) & 1 : 0;
    if (!two) load(c, 0);
    cp_async_wait_all();
    __syncthreads();
    if (two && c + 1 < c_end) load(c + 1, b ^ 1);
    float* unit = unit_of(c);
    const float* w = sm.w + b * sm.w_step;
    const float* kt = sm.kt + b * sm.w_step;
    const float* u = sm.u + b * sm.u_step;
    const float* dec = sm.dec + b * kDecFloats;

    // S before the chunk to the workspace (out_kernel's Q S).
    for (int x = tid; x < p.dkp * (kCols / 4); x += kThreads) {
      const int r = x >> 2, q4 = 4 * (x & 3);
      *reinterpret_cast<float4*>(unit + ul.s + int64_t(r) * p.dvq + j0 + q4) =
          ld4(sm.s + r * kCols + q4);
    }

    // Partial sums of W S over the k parts.
    {
      float acc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
      for (int k = k_lo; k < k_hi; k += 4) {
        const float4 s0 = ld4(sm.s + (k + 0) * kCols + 4 * cq);
        const float4 s1 = ld4(sm.s + (k + 1) * kCols + 4 * cq);
        const float4 s2 = ld4(sm.s + (k + 2) * kCols + 4 * cq);
        const float4 s3 = ld4(sm.s + (k + 3) * kCols + 4 * cq);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 wv = ld4(w + (rq + 16 * i) * p.ldk + k);
          fma4(acc[i], wv.x, s0);
          fma4(acc[i], wv.y, s1);
          fma4(acc[i], wv.z, s2);
          fma4(acc[i], wv.w, s3);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(sm.part + (kq * kChunk + rq + 16 * i) * kCols + 4 * cq) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
    __syncthreads();

    // v' = U - ((W S)_0 + (W S)_1) + ((W S)_2 + (W S)_3): thread row tid / 4, columns 4 (tid % 4).
    {
      const int r = tid >> 2, x = 4 * (tid & 3), o = r * kCols + x;
      const float4 p0 = ld4(sm.part + o), p1 = ld4(sm.part + kChunk * kCols + o);
      const float4 p2 = ld4(sm.part + 2 * kChunk * kCols + o);
      const float4 p3 = ld4(sm.part + 3 * kChunk * kCols + o);
      const float4 uv = ld4(u + o);
      const float4 v = make_float4(
          uv.x - ((p0.x + p1.x) + (p2.x + p3.x)), uv.y - ((p0.y + p1.y) + (p2.y + p3.y)),
          uv.z - ((p0.z + p1.z) + (p2.z + p3.z)), uv.w - ((p0.w + p1.w) + (p2.w + p3.w)));
      *reinterpret_cast<float4*>(sm.vn + o) = v;
      *reinterpret_cast<float4*>(unit + ul.u + int64_t(r) * p.dvq + j0 + x) = v;
    }
    __syncthreads();

    // S <- (E S + Σ_{i < 32} K̃_i v'_i) + Σ_{i >= 32} K̃_i v'_i: the halves' sums to the partials.
    {
      const float eg = dec[kChunk];
      for (int wv = tid; wv < 2 * p.dkp; wv += kThreads) {
        const int half = wv >= p.dkp ? 1 : 0, v = wv - half * p.dkp;
        const int x0 = 4 * (v >> 2), c4 = 4 * (v & 3);
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 sv =
              half ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : ld4(sm.s + (x0 + i) * kCols + c4);
          acc[i][0] = eg * sv.x;
          acc[i][1] = eg * sv.y;
          acc[i][2] = eg * sv.z;
          acc[i][3] = eg * sv.w;
        }
#pragma unroll 4
        for (int i = 32 * half; i < 32 * half + 32; ++i) {
          const float4 kv = ld4(kt + i * p.ldk + x0);
          const float4 vv = ld4(sm.vn + i * kCols + c4);
          fma4(acc[0], kv.x, vv);
          fma4(acc[1], kv.y, vv);
          fma4(acc[2], kv.z, vv);
          fma4(acc[3], kv.w, vv);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
          *reinterpret_cast<float4*>(sm.part + (half * p.dkp + x0 + i) * kCols + c4) =
              make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      }
    }
    __syncthreads();
    for (int x = tid; x < p.dkp * kCols; x += kThreads)
      sm.s[x] = sm.part[x] + sm.part[p.dkp * kCols + x];
  }
  __syncthreads();

  float* s_out = a.state[row].rec_out + head;
  for (int w = tid; w < dk * kCols; w += kThreads) {
    const int x = w / kCols, jc = w % kCols;
    if (jc < ncols) s_out[x * dv + j0 + jc] = sm.s[w];
  }
}

// ---- 3. out_kernel ----

constexpr int kOutLd = kOutCols + 4;  // row stride of out_kernel's S, P and v' tiles

__host__ __device__ inline int out_smem_floats(const Plan& p) {
  return kChunk * p.ldk + p.dkp * kOutLd + 2 * kChunk * kOutLd + kChunk;
}

__global__ void __launch_bounds__(kThreads, 2)
    out_kernel(const DeltaRuleLaunch a, const RowList list, const Plan p, const Segment seg,
               const float* ws) {
  extern __shared__ float4 smem4[];
  float* q = reinterpret_cast<float*>(smem4);  // [64][ldk]
  float* s = q + kChunk * p.ldk;               // [dkp][kOutLd]
  float* pm = s + p.dkp * kOutLd;              // [64][kOutLd]
  float* vn = pm + kChunk * kOutLd;            // [64][kOutLd]
  float* e = vn + kChunk * kOutLd;             // [64]

  const int tid = threadIdx.x;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int ob = static_cast<int>(blockIdx.x % p.out_blocks);
  int rest = static_cast<int>(blockIdx.x / p.out_blocks);
  const int ci = rest % seg.chunks;
  rest /= seg.chunks;
  const int h = rest % hv, rl = rest / hv, row = list.index[rl];
  const int kh = h / (hv / static_cast<int>(a.k_heads));
  const int c = seg.first + ci;
  if (c >= full_chunks(a.rows.length[row])) return;
  const int64_t t0 = (a.rows.first + row) * a.rows.tokens + int64_t(c) * kChunk;
  const int j0 = ob * kOutCols, width = min(kOutCols, p.dvq - j0);
  const UnitLayout ul = unit_layout(p);
  const float* unit = ws + ((int64_t(rl) * hv + h) * seg.chunks + ci) * p.unit;

  load_tile(q, p.ldk, a.q + t0 * a.ld + kh * dk, a.ld, kChunk, p.dkp, dk, p.vec4 != 0, a.q);
  load_tile(s, kOutLd, unit + ul.s + j0, p.dvq, p.dkp, width, width, true, unit);
  load_tile(pm, kOutLd, unit + ul.p, kChunk, kChunk, kChunk, kChunk, true, unit);
  load_tile(vn, kOutLd, unit + ul.u + j0, p.dvq, kChunk, width, width, true, unit);
  if (tid < kChunk / 4) cp_async16(e + 4 * tid, unit + ul.dec + 4 * tid, true);
  cp_async_wait_all();
  __syncthreads();

  // Thread: rows rq + 16 u (u < 4) x columns 4 cq .. + 3.
  const int rq = tid & 15, x = 4 * (tid >> 4);
  if (x >= width) return;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[i][k] = 0.0f;
#pragma unroll 2
  for (int k = 0; k < p.dkp; k += 4) {
    const float4 s0 = ld4(s + (k + 0) * kOutLd + x), s1 = ld4(s + (k + 1) * kOutLd + x);
    const float4 s2 = ld4(s + (k + 2) * kOutLd + x), s3 = ld4(s + (k + 3) * kOutLd + x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 qv = ld4(q + (rq + 16 * i) * p.ldk + k);
      fma4(acc[i], qv.x, s0);
      fma4(acc[i], qv.y, s1);
      fma4(acc[i], qv.z, s2);
      fma4(acc[i], qv.w, s3);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float er = e[rq + 16 * i];
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[i][k] *= er;
  }
  // + P v', j ascending up to the end of the row's 16-row block (P is zero past the diagonal).
#pragma unroll 2
  for (int j = 0; j < kChunk; j += 4) {
    const float4 v0 = ld4(vn + (j + 0) * kOutLd + x), v1 = ld4(vn + (j + 1) * kOutLd + x);
    const float4 v2 = ld4(vn + (j + 2) * kOutLd + x), v3 = ld4(vn + (j + 3) * kOutLd + x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (j >= 16 * (i + 1)) continue;
      const float4 pv = ld4(pm + (rq + 16 * i) * kOutLd + j);
      fma4(acc[i], pv.x, v0);
      fma4(acc[i], pv.y, v1);
      fma4(acc[i], pv.z, v2);
      fma4(acc[i], pv.w, v3);
    }
  }
  const int col = j0 + x;
  const bool vec = p.vec4 != 0 && a.ldo % 4 == 0 && (reinterpret_cast<uintptr_t>(a.out) % 16 == 0);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float* o = a.out + (t0 + rq + 16 * i) * a.ldo + h * dv + col;
    store_cols(o, col, dv, vec, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
  }
}

// ---- the launch ----

Plan make_plan(const DeltaRuleLaunch& a) {
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  Plan p{};
  p.dkp = round_up(dk, 4);
  p.dvq = round_up(dv, kCols);
  p.ldk = round_up(p.dkp, 32) + 4;
  p.ldx = round_up(p.dkp > p.dvq ? p.dkp : p.dvq, 32) + 4;
  p.col_blocks = p.dvq / kCols;
  p.out_blocks = (p.dvq + kOutCols - 1) / kOutCols;
  p.vec4 = aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && a.ld % 4 == 0 && dk % 4 == 0 &&
           dv % 4 == 0;
  p.buffers = 2;
  p.unit = unit_floats(p);
  return p;
}

// Rows of the launch with full chunks, and the most chunks of one.
struct ChunkRows {
  RowList list;
  int most;
};
ChunkRows chunk_rows(const DeltaRuleLaunch& a) {
  ChunkRows r{};
  for (int i = 0; i < a.rows.count; ++i) {
    const int c = full_chunks(a.rows.length[i]);
    if (c == 0) continue;
    r.list.index[r.list.count++] = i;
    r.most = c > r.most ? c : r.most;
  }
  return r;
}

// Chunks per segment for a workspace of `floats`.
int segment_chunks(const Plan& p, const ChunkRows& r, int64_t v_heads, int64_t floats) {
  const int64_t per_chunk = int64_t(r.list.count) * v_heads * p.unit;
  const int64_t fit = per_chunk > 0 ? floats / per_chunk : 0;
  return static_cast<int>(fit < r.most ? fit : r.most);
}

cudaError_t launch_chunked(const DeltaRuleLaunch& a, const RowList& rows, int most,
                           cudaStream_t stream) {
  Plan p = make_plan(a);
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  if (int(sizeof(float)) * state_smem_floats(p, nullptr, nullptr) > optin) p.buffers = 1;
  const int prep_bytes = int(sizeof(float)) * prep_smem_floats(p, nullptr, nullptr);
  const int state_bytes = int(sizeof(float)) * state_smem_floats(p, nullptr, nullptr);
  const int out_bytes = int(sizeof(float)) * out_smem_floats(p);
  if (prep_bytes > optin || state_bytes > optin || out_bytes > optin) return cudaErrorInvalidValue;
  if ((err = cudaFuncSetAttribute(prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  prep_bytes)) != cudaSuccess ||
      (err = cudaFuncSetAttribute(state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  state_bytes)) != cudaSuccess ||
      (err = cudaFuncSetAttribute(out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  out_bytes)) != cudaSuccess)
    return err;
  ChunkRows r{rows, most};
  const int per_segment = segment_chunks(p, r, a.v_heads, a.workspace_floats);
  if (per_segment < 1 || a.workspace == nullptr) return cudaErrorInvalidValue;
  const unsigned heads = static_cast<unsigned>(rows.count * a.v_heads);
  for (int first = 0; first < most; first += per_segment) {
    const Segment seg{first, per_segment};
    const unsigned units = heads * static_cast<unsigned>(per_segment);
    prep_kernel<<<units, kThreads, prep_bytes, stream>>>(a, rows, p, seg, a.workspace);
    state_kernel<<<heads* static_cast<unsigned>(p.col_blocks), kThreads, state_bytes, stream>>>(
        a, rows, p, seg, a.workspace);
    out_kernel<<<units* static_cast<unsigned>(p.out_blocks), kThreads, out_bytes, stream>>>(
        a, rows, p, seg, a.workspace);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace dr

using namespace dr;

int64_t delta_rule_workspace_floats(const DeltaRuleLaunch& a, int64_t cap) {
  if (a.rows.count <= 0 || a.v_heads <= 0 || a.dk < 1 || a.dv < 1) return 0;
  const ChunkRows r = chunk_rows(a);
  if (r.list.count == 0) return 0;
  const Plan p = make_plan(a);
  const int64_t per_chunk = int64_t(r.list.count) * a.v_heads * p.unit;
  const int64_t fit = cap / per_chunk;
  return per_chunk * (fit < 1 ? 1 : fit < r.most ? fit : r.most);
}

cudaError_t launch_delta_rule(const DeltaRuleLaunch& a, cudaStream_t stream) {
  if (a.rows.count <= 0 || a.v_heads <= 0) return cudaSuccess;
  if (a.dk < 1 || a.dk > kMaxDim || a.dv < 1 || a.dv > kMaxDim || a.k_heads < 1 ||
      a.v_heads % a.k_heads != 0 || a.rows.count > kRows)
    return cudaErrorInvalidValue;
  // A row with a history whose chunked form runs first has its history folded into rec_out
  // first; the rest of the launch then reads it there as a row without one.
  RowList fold{};
  for (int i = 0; i < a.rows.count; ++i) {
    const HistRow& h = a.hist[i];
    const int64_t n = a.rows.length[i];
    if (h.len < 0 || h.len > kRecurTokens ||  // histories fit shared memory beside the tokens
        (h.append && (chunked_tokens(n) > 0 || h.len + n > h.cap))) {
      return cudaErrorInvalidValue;
    }
    if (h.len > 0 && chunked_tokens(n) > 0) fold.index[fold.count++] = i;
  }
  DeltaRuleLaunch b = a;
  if (fold.count > 0) {
    const cudaError_t err = launch_recurrent(a, fold, 0, true, stream);
    if (err != cudaSuccess) return err;
    for (int f = 0; f < fold.count; ++f) {
      const int i = fold.index[f];
      b.state[i].rec_in = b.state[i].rec_out;
      b.hist[i].len = 0;
    }
  }
  // The chunked form first: a row with both parts continues in recur_kernel from its rec_out.
  const ChunkRows chunked = chunk_rows(b);
  RowList recur{};
  int tmax = 0;
  for (int i = 0; i < b.rows.count; ++i) {
    const int64_t n = b.rows.length[i], nc = chunked_tokens(n);
    if (n - nc > 0 || n == 0) {
      recur.index[recur.count++] = i;
      tmax = n - nc > tmax ? static_cast<int>(n - nc) : tmax;
    }
  }
  if (chunked.list.count > 0) {
    const cudaError_t err = launch_chunked(b, chunked.list, chunked.most, stream);
    if (err != cudaSuccess) return err;
  }
  if (recur.count > 0) return launch_recurrent(b, recur, tmax, false, stream);
  return cudaSuccess;
}

}  // namespace deg::cuda
