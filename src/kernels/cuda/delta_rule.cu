// CUDA gated delta rule: the DeltaRuleOpArgs op of kernels/ops.h through launch_delta_rule
// (cuda/launch.h), with the algebra of kernels/delta_rule.h and kernels/cpu/delta_rule.cc. Per
// (row, value head h), S [Dk, Dv] starts at rec_in, each real token t does
//   S <- S e^(g_t);  S <- S + k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t
// and S ends in rec_out. Padded tokens get zero outputs; q, k come from key head h / (Hv / Hk).
//
// A row of n tokens splits into 64-token chunks from its token 0. Its full chunks run the chunked
// form (chunk_kernel); a last partial chunk of at most kRecurTokens tokens (today every partial
// chunk: kRecurTokens is 63) runs the plain recurrence (recur_kernel, after chunk_kernel has
// written the state to rec_out), and a longer one would run chunk_kernel, which zero-fills a
// chunk past the row's end. The choice depends on n only, and a row fed in 64-aligned pieces
// makes the same choices, chunk by chunk, as the whole row. Decode (n == 1) and short rows
// (n <= kRecurTokens: fork rows) are recurrence only; an empty row copies its state.
//
// * recur_kernel: one CTA per (row, head, 64 value columns), 4 warps of 16 columns each. A lane
//   holds 4 columns x R rows of S (8 R >= Dk, R 4, 16 or 32) in registers for all the row's
//   tokens (loaded once, stored once); the sums over Dk add each lane's rows in order, then the
//   8 lanes of a column group by an xor butterfly (every lane gets the same sum). No barrier
//   inside the token loop: each warp owns its columns. q, k, g, beta of the tokens are staged in
//   shared memory.
//
// * chunk_kernel: one CTA of 256 threads per (row, head, block of 16 value columns); the CTAs of
//   one (row, head) form a thread-block cluster (up to 8). A CTA keeps its 16 columns of S in
//   shared memory for the whole row. Per chunk, with cumulative log decay c_i (double),
//   Γ_ij = e^(c_i - c_j), A = diag(beta) (K Kᵀ ⊙ Γ) strictly lower, P = (Q Kᵀ ⊙ Γ) lower with
//   the diagonal and T = (I + A)^-1, the Dv-independent part (c, A, P, T) is prepared apart from
//   the state: the cluster's CTAs take the row's chunks in rounds of one chunk per CTA, each CTA
//   preparing its chunk of the round in parallel with the others:
//     a. g, beta of the round's chunks -> c, e^c, e^(c_last - c), e^(c_last) (a warp per chunk);
//     b. G = K Kᵀ and P: the 72 tiles of 8 x 8 on and below the diagonal (a thread per 8 x 4
//        half), scaled; A, P;
//     c. T: the 16 x 16 diagonal blocks by forward substitution, then the blocks below the
//        diagonal block row by block row, T_ij = -D_i Σ_k A_ik T_kj.
//   Then every CTA runs the round's chunks in order, copying each chunk's T and P (the blocks on
//   and below the diagonal) from the CTA that prepared it (distributed shared memory; the next
//   chunk's copy is in flight while this one runs):
//     1. [K; Q] S -> KS, QS (this CTA's columns); X = beta ⊙ (V - e^c ⊙ KS).
//     2. v' = T X (the UT transform of FLA / HF's torch_chunk_gated_delta_rule),
//        v'' = e^(c_last - c) ⊙ v'.
//     3. o = e^c ⊙ QS + P v' to the output; S <- e^(c_last) S + Kᵀ v''.
//   Four CTA barriers per chunk; cluster barriers only around a round's preparation. The next
//   chunk's q, k, v (and the next round's q, k, g, beta) load with cp.async, zero-filled past the
//   chunk's end, while steps 1-3 run; k is double-buffered when shared memory allows. With a
//   cluster of one CTA (or when the copies do not fit), the CTA prepares each chunk itself.
//   Steps 1-3 are bound by shared-memory reads (an H200 SM hands its threads 32 floats per
//   cycle, against 128 FMAs), so step 1 and the S update give a thread a 4 x 4 block of outputs
//   (128 threads; a CTA of 16 columns caps the block); the other 128 threads start the next
//   chunk's k, v loads meanwhile.
//
// Shared memory of chunk_kernel, in floats (L4 = ldk = round_up(Dk, 32) + 4, Dk4 = Dk rounded up
// to 4): q [64][L4], k [1 or 2][64][L4], T, P (the chunk being run), T, P (the chunk this CTA
// prepares; the same two without copies) and A (the first T with copies) [64][68] each, S
// [Dk4][16], X|QS [128][16], v' [64][16] (step c's scratch before that), v'' [64][16], v
// [2][64][16], g|beta [ctas][128], the decay factors [ctas][196], c [64] as doubles. Dk = Dv =
// 128: 206,880 bytes with clusters of 2, 214,656 with 8; one CTA per SM. Dk = 256 fits with
// clusters of one CTA and one k buffer (228,112 bytes).
//
// Batch invariance: each (row, head, column) result depends on that row's inputs and n only.
// Chunk boundaries count from the row's token 0; every sum runs in a fixed order (ascending
// index, one accumulator per element, or the butterfly above) set by Dk and Dv, never by the row
// count, L, the cluster size or which CTA or thread computes it: a chunk's c, A, P, T come from
// the same code in whichever CTA prepares them, and the cluster size (chosen per launch from
// what the device can co-schedule) only decides who does. Columns of S are independent, so
// splitting Dv over CTAs and warps is exact. Arithmetic is f32 (FMA) on CUDA cores, with the
// decay sums in double like the CPU form; no TF32.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/delta_rule_common.cuh"

namespace deg::cuda {
namespace dr {

// ---- the chunked form ----

struct ChunkPlan {
  int dkp;         // Dk rounded up to 4: the reduction length over Dk (zero-padded)
  int ldk;         // row stride of the q, k tiles, 4 mod 32
  int col_blocks;  // ceil(Dv / kCols): CTAs per (row, head)
  int k_buffers;   // 2: the next chunk's k loads during this one; 1 when 2 do not fit
  int vec4;        // q, k, v rows 16-byte aligned: 16-byte cp.async
  int copies;      // 1: the cluster's CTAs share the preparation (cluster of more than one)
  int slots;       // the cluster size: chunks per round
};

struct ChunkSmem {
  float* q;      // [64][ldk]
  float* k;      // [k_buffers][64][ldk]
  int k_step;    // floats from one k buffer to the next (0 with one buffer)
  float* t;      // [64][kLdm] T of the chunk being run (block lower)
  float* p;      // [64][kLdm] P of the chunk being run (lower, zero above the diagonal)
  float* t_own;  // T of the chunk this CTA prepares (== t without copies)
  float* p_own;  // P of the chunk this CTA prepares (== p without copies)
  float* a;      // A while preparing (strictly lower; == t with copies)
  float* s;      // [dkp][16] this CTA's columns of S
  float* kqs;    // [128][16] X over QS
  float* vn;     // [64][16] v' (while preparing: the block-row scratch of T)
  float* vd;     // [64][16] v'' = e^(c_last - c) v'
  float* v;      // [2][64][16]
  float* gb;     // [slots][128]: g, then beta, of the round's chunks
  float* dec;    // [slots][kDecStride]: the round's decay factors and beta
  double* cum;   // [64] c of the chunk this CTA prepares
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
  x.t = take(kChunk * kLdm);
  x.p = take(kChunk * kLdm);
  if (p.copies) {
    x.t_own = take(kChunk * kLdm);
    x.p_own = take(kChunk * kLdm);
    x.a = x.t;
  } else {
    x.t_own = x.t;
    x.p_own = x.p;
    x.a = take(kChunk * kLdm);
  }
  x.s = take(p.dkp * kCols);
  x.kqs = take(2 * kChunk * kCols);
  x.vn = take(kChunk * kCols);
  x.vd = take(kChunk * kCols);
  x.v = take(2 * kChunk * kCols);
  x.gb = take(p.slots * 2 * kChunk);
  x.dec = take(p.slots * kDecStride);
  x.cum = reinterpret_cast<double*>(take(2 * kChunk));
  if (m) *m = x;
  return off;
}

// cp.async of a [64][width] tile (width a multiple of 4) from global rows src + i * ld: rows
// i < m and columns < valid are read, the rest zero-filled. With vec4, valid is a multiple of 4
// and src, ld are 16-byte aligned. safe: a mapped address for the zero-filled copies. Threads
// lo .. lo + threads - 1 issue the copies.
__device__ void load_tile(float* dst, int ldd, const float* src, int64_t ld, int m, int width,
                          int valid, bool vec4, const float* safe, int lo, int threads) {
  const int first = static_cast<int>(threadIdx.x) - lo;
  if (vec4) {
    const int w4 = width >> 2;
    for (int w = first; w < kChunk * w4; w += threads) {
      const int i = w / w4, x = 4 * (w - i * w4);
      const bool ok = i < m && x < valid;
      cp_async16(dst + i * ldd + x, ok ? src + i * ld + x : safe, ok);
    }
  } else {
    for (int w = first; w < kChunk * width; w += threads) {
      const int i = w / width, x = w - i * width;
      const bool ok = i < m && x < valid;
      cp_async4(dst + i * ldd + x, ok ? src + i * ld + x : safe, ok);
    }
  }
}

// Offset in a [64][kLdm] matrix of float4 number f (< kLowerQuads) of the 16 x 16 blocks on and
// below the diagonal.
__device__ __forceinline__ int lower_quad_offset(int f) {
  const int b = f >> 6, r = (f >> 2) & 15, q = f & 3;
  const int bi = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3;
  const int bj = b - bi * (bi + 1) / 2;
  return (16 * bi + r) * kLdm + 16 * bj + 4 * q;
}
// This thread's share of those blocks of `own` (this CTA's layout) in cluster CTA `rank`.
struct Quads {
  float4 x[kQuadsPerThread];
};
__device__ __forceinline__ void fetch_lower(const float* own, int rank, Quads& q) {
#pragma unroll
  for (int j = 0; j < kQuadsPerThread; ++j) {
    const int f = threadIdx.x + j * kThreads;
    if (f < kLowerQuads) q.x[j] = load_cluster4(smem_u32(own + lower_quad_offset(f)), rank);
  }
}
__device__ __forceinline__ void store_lower(float* dst, const Quads& q) {
#pragma unroll
  for (int j = 0; j < kQuadsPerThread; ++j) {
    const int f = threadIdx.x + j * kThreads;
    if (f < kLowerQuads) *reinterpret_cast<float4*>(dst + lower_quad_offset(f)) = q.x[j];
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    chunk_kernel(const DeltaRuleLaunch a, const RowList list, const ChunkPlan p) {
  extern __shared__ float4 smem4[];
  ChunkSmem sm;
  chunk_smem_layout(p, reinterpret_cast<float*>(smem4), &sm);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int hv = static_cast<int>(a.v_heads);
  const int cb = static_cast<int>(blockIdx.x % p.col_blocks);
  const int rest = static_cast<int>(blockIdx.x / p.col_blocks);
  const int h = rest % hv, row = list.index[rest / hv];
  const int kh = h / (hv / static_cast<int>(a.k_heads));
  const int j0 = cb * kCols, ncols = min(kCols, dv - j0);
  const int64_t n = a.rows.length[row], len = a.rows.tokens;
  const int64_t nc = chunked_tokens(n);
  const int64_t tok0 = (a.rows.first + row) * len;
  const bool vec4 = p.vec4 != 0, two_k = p.k_buffers == 2;
  const int nchunks = static_cast<int>((nc + kChunk - 1) / kChunk);
  const int rank = cluster_rank(), ctas = cluster_ctas();

  // Padded tokens: zero outputs (this CTA's columns).
  for (int64_t w = tid; w < (len - n) * kCols; w += kThreads) {
    const int64_t t = n + w / kCols;
    const int j = static_cast<int>(w % kCols);
    if (j < ncols) a.out[(tok0 + t) * a.ldo + h * dv + j0 + j] = 0.0f;
  }
  // P starts at zero: the entries above the diagonal no tile writes stay zero.
  for (int w = tid; w < kChunk * kLdm; w += kThreads) sm.p_own[w] = 0.0f;
  const int64_t head = static_cast<int64_t>(h) * dk * dv;
  const float* s_in = a.state[row].rec_in + head;
  for (int w = tid; w < p.dkp * kCols; w += kThreads) {
    const int x = w / kCols, j = w % kCols;
    sm.s[w] = x < dk && j < ncols ? s_in[x * dv + j0 + j] : 0.0f;
  }

  auto rows_of = [&](int c) {
    const int64_t left = nc - static_cast<int64_t>(c) * kChunk;
    return static_cast<int>(left < kChunk ? left : kChunk);
  };
  auto k_buf = [&](int b) { return sm.k + b * sm.k_step; };
  auto load_qk = [&](float* dst, const float* base, int c, int lo = 0, int threads = kThreads) {
    const int64_t s0 = static_cast<int64_t>(c) * kChunk;
    load_tile(dst, p.ldk, base + (tok0 + s0) * a.ld + kh * dk, a.ld, rows_of(c), p.dkp, dk, vec4,
              base, lo, threads);
  };
  auto load_v = [&](int c, int b, int lo = 0, int threads = kThreads) {
    const int64_t s0 = static_cast<int64_t>(c) * kChunk;
    load_tile(sm.v + b * kChunk * kCols, kCols, a.v + (tok0 + s0) * a.ld + h * dv + j0, a.ld,
              rows_of(c), kCols, ncols, vec4, a.v, lo, threads);
  };
  // g, beta of the chunks base .. base + ctas - 1 (zero past the row's chunked tokens).
  auto load_gb = [&](int base) {
    for (int w = tid; w < ctas * 2 * kChunk; w += kThreads) {
      const int slot = w >> 7, i = w & (kChunk - 1), c = base + slot;
      const float* src = (w >> 6) & 1 ? a.beta : a.g;
      const bool ok = c < nchunks && i < rows_of(c);
      const int64_t t = static_cast<int64_t>(c) * kChunk + i;
      cp_async4(sm.gb + w, ok ? src + (tok0 + t) * a.ldg + h : src, ok);
    }
  };

  int kb = 0, vb = 0;  // the k and v buffers of the next chunk to run
  if (rank < nchunks) {
    load_qk(sm.q, a.q, rank);
    load_qk(k_buf(kb), a.k, rank);
  }
  load_gb(0);
  // The first "done reading" arrival; its wait (before the first preparation writes what other
  // CTAs read) also makes sure every CTA of the cluster has started.
  cluster_arrive();

  Quads t_next, p_next;
  for (int base = 0; base < nchunks; base += ctas) {
    const int round = min(ctas, nchunks - base), pc = base + rank;
    const bool own = pc < nchunks;
    cp_async_wait_all();
    __syncthreads();

    // a. Decay factors of the round's chunks (warp w: chunk base + w; a double scan; padded g
    // are 0, so c_63 = c_last).
    if (warp < round) {
      const float* g = sm.gb + warp * 2 * kChunk;
      float* d = sm.dec + warp * kDecStride;
      const float g0 = g[2 * lane], g1 = g[2 * lane + 1];
      double incl = static_cast<double>(g0) + static_cast<double>(g1);
      for (int off = 1; off < 32; off <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      double excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane == 0) excl = 0.0;
      const double c0 = excl + g0, c1 = c0 + g1;
      const double last = __shfl_sync(0xffffffffu, c1, 31);
      d[2 * lane] = expf(static_cast<float>(c0));
      d[2 * lane + 1] = expf(static_cast<float>(c1));
      d[kChunk + 2 * lane] = expf(static_cast<float>(last - c0));
      d[kChunk + 2 * lane + 1] = expf(static_cast<float>(last - c1));
      d[2 * kChunk + 2 * lane] = g[kChunk + 2 * lane];
      d[2 * kChunk + 2 * lane + 1] = g[kChunk + 2 * lane + 1];
      if (lane == 0) d[3 * kChunk] = expf(static_cast<float>(last));
      if (warp == rank) {
        sm.cum[2 * lane] = c0;
        sm.cum[2 * lane + 1] = c1;
      }
    }
    __syncthreads();
    // Every CTA is done reading the previous round's T and P of this one.
    cluster_wait();

    // b. G and P tiles of chunk pc, scaled, into A and P. Thread: an 8 x 4 half of an 8 x 8
    // tile (threads 0-143), its rows and columns visited in an order rotated by the tile's
    // place in its quarter warp (so the quarter's loads hit distinct banks; no sum changes).
    if (own && tid < 4 * kHalfTiles) {
      const float* kt = k_buf(kb);
      const float* beta = sm.dec + rank * kDecStride + 2 * kChunk;
      const int tile = tid >> 1, rot = tile & 3;
      const bool is_p = tile >= kHalfTiles;
      const int u = is_p ? tile - kHalfTiles : tile;
      int bi = 0;
      while ((bi + 1) * (bi + 2) / 2 <= u) ++bi;
      const int bj = u - bi * (bi + 1) / 2;
      const int i0 = 8 * bi, j0t = 8 * bj + 4 * (tid & 1);
      const float* xs = (is_p ? sm.q : kt) + i0 * p.ldk;
      const float* ys = kt + j0t * p.ldk;
      float acc[8][4];
#pragma unroll
      for (int di = 0; di < 8; ++di)
#pragma unroll
        for (int dj = 0; dj < 4; ++dj) acc[di][dj] = 0.0f;
      for (int x = 0; x < p.dkp; x += 4) {
        float4 yv[4];
#pragma unroll
        for (int dj = 0; dj < 4; ++dj) yv[dj] = ld4(ys + ((dj + rot) & 3) * p.ldk + x);
#pragma unroll
        for (int di = 0; di < 8; ++di) {
          const float4 xv = ld4(xs + ((di + rot) & 7) * p.ldk + x);
#pragma unroll
          for (int dj = 0; dj < 4; ++dj) acc[di][dj] = dot4(acc[di][dj], xv, yv[dj]);
        }
      }
      float* dst = is_p ? sm.p_own : sm.a;
#pragma unroll
      for (int di = 0; di < 8; ++di) {
        const int i = i0 + ((di + rot) & 7);
#pragma unroll
        for (int dj = 0; dj < 4; ++dj) {
          const int jj = j0t + ((dj + rot) & 3);
          const bool keep = is_p ? jj <= i : jj < i;
          const float e = keep ? expf(static_cast<float>(sm.cum[i] - sm.cum[jj])) : 0.0f;
          const float x = is_p ? acc[di][dj] : beta[i] * acc[di][dj];
          dst[i * kLdm + jj] = keep ? x * e : 0.0f;
        }
      }
    }
    __syncthreads();

    // The round's first chunk: its q, k (unless they are the tiles just used) and v.
    if (pc != base) {
      load_qk(sm.q, a.q, base);
      load_qk(k_buf(kb), a.k, base);
    }
    load_v(base, vb);

    // c. T = (I + A)^-1 of chunk pc.
    if (own) {
      // Diagonal blocks D_b = (I + A_bb)^-1 (threads 0-63: column col of block b).
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
        for (int r = 0; r < 16; ++r) sm.t_own[(o + r) * kLdm + o + col] = d[r];
      }
      __syncthreads();
      // Block rows 1-3: Y_ij = Σ_{k=j}^{i-1} A_ik T_kj into the scratch, T_ij = -D_i Y_ij.
      float* scratch = sm.vn;
      for (int bi = 1; bi < 4; ++bi) {
        for (int w = tid; w < bi * 256; w += kThreads) {
          const int bj = w >> 8, r = (w >> 4) & 15, col = w & 15;
          const float* ar = sm.a + (16 * bi + r) * kLdm;
          float acc = 0.0f;
          for (int kb2 = bj; kb2 < bi; ++kb2) {
            const float* tc = sm.t_own + 16 * kb2 * kLdm + 16 * bj + col;
#pragma unroll
            for (int x4 = 0; x4 < 16; x4 += 4) {
              const float4 av = ld4(ar + 16 * kb2 + x4);
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
          const float* dr = sm.t_own + (16 * bi + r) * kLdm + 16 * bi;
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
          sm.t_own[(16 * bi + r) * kLdm + 16 * bj + col] = -acc;
        }
        __syncthreads();
      }
    }
    // This CTA's T and P are ready; wait for every CTA's.
    cluster_arrive();
    cluster_wait();

    // Run the round's chunks in order.
    for (int slot = 0; slot < round; ++slot) {
      const int c = base + slot, m = rows_of(c);
      const float* d = sm.dec + slot * kDecStride;
      const float* kt = k_buf(kb);
      const bool fetch_next = p.copies && slot + 1 < round;
      if (p.copies) {
        if (slot == 0) {
          fetch_lower(sm.t_own, slot, t_next);
          fetch_lower(sm.p_own, slot, p_next);
          store_lower(sm.t, t_next);
        }
        store_lower(sm.p, p_next);  // P of the previous chunk was last read before the barrier
      }
      cp_async_wait_all();
      __syncthreads();

      // 1. KS, QS, then X = beta (V - e^c KS). Thread (0-127): rows rg, rg + 32 of K and of Q
      // x columns 4 jg .. 4 jg + 3 (a 4 x 4 block per thread: fewer shared-memory reads per
      // FMA). Meanwhile threads 128-255 start the next chunk's k and v into the free buffers.
      const bool next_in_round = slot + 1 < round, early = next_in_round && two_k;
      const int next_pc = base + ctas + rank;
      if (tid < 128) {
        const int jg = tid & 3, rg = tid >> 2;
        const float* kr = kt + rg * p.ldk;
        const float* qr = sm.q + rg * p.ldk;
        const float* sc = sm.s + 4 * jg;
        float acc[4][4];  // K[rg], K[rg + 32], Q[rg], Q[rg + 32]
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[r][e] = 0.0f;
#pragma unroll 2
        for (int x = 0; x < p.dkp; x += 4) {
          const float4 xv[4] = {ld4(kr + x), ld4(kr + 32 * p.ldk + x), ld4(qr + x),
                                ld4(qr + 32 * p.ldk + x)};
          const float4 s0 = ld4(sc + (x + 0) * kCols), s1 = ld4(sc + (x + 1) * kCols);
          const float4 s2 = ld4(sc + (x + 2) * kCols), s3 = ld4(sc + (x + 3) * kCols);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            fma4(acc[r], xv[r].x, s0);
            fma4(acc[r], xv[r].y, s1);
            fma4(acc[r], xv[r].z, s2);
            fma4(acc[r], xv[r].w, s3);
          }
        }
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = rg + 32 * h2;
          const float* ak = acc[h2];
          const float ec = d[r], beta = d[2 * kChunk + r];
          const float4 vv = ld4(sm.v + vb * kChunk * kCols + r * kCols + 4 * jg);
          *reinterpret_cast<float4*>(sm.kqs + r * kCols + 4 * jg) =
              make_float4(beta * fmaf(-ec, ak[0], vv.x), beta * fmaf(-ec, ak[1], vv.y),
                          beta * fmaf(-ec, ak[2], vv.z), beta * fmaf(-ec, ak[3], vv.w));
          *reinterpret_cast<float4*>(sm.kqs + (kChunk + r) * kCols + 4 * jg) =
              make_float4(acc[2 + h2][0], acc[2 + h2][1], acc[2 + h2][2], acc[2 + h2][3]);
        }
      } else if (early) {
        load_qk(k_buf(kb ^ 1), a.k, c + 1, 128, kThreads - 128);
        load_v(c + 1, vb ^ 1, 128, kThreads - 128);
      }
      __syncthreads();

      // q is free now: the rest of the next loads (the round's next chunk, or the next round's
      // tiles and g, beta). With one k buffer, k waits for step 3.
      if (next_in_round) {
        load_qk(sm.q, a.q, c + 1);
        if (!early) load_v(c + 1, vb ^ 1);
      } else if (base + ctas < nchunks) {
        if (next_pc < nchunks) {
          load_qk(sm.q, a.q, next_pc);
          if (two_k) load_qk(k_buf(kb ^ 1), a.k, next_pc);
        }
        load_gb(base + ctas);
      }
      if (fetch_next) {
        fetch_lower(sm.t_own, slot + 1, t_next);
        fetch_lower(sm.p_own, slot + 1, p_next);
      }

      // 2. v' = T X (row r sums over the blocks up to its own), v'' = e^(c_last - c) v'.
      // Thread: column j, rows rr + 16 b.
      const int j = tid & 15, rr = tid >> 4;
      {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kb2 = 0; kb2 < 4; ++kb2)
#pragma unroll
          for (int x4 = 0; x4 < 16; x4 += 4) {
            const int x = 16 * kb2 + x4;
            const float4 xv = make_float4(sm.kqs[(x + 0) * kCols + j], sm.kqs[(x + 1) * kCols + j],
                                          sm.kqs[(x + 2) * kCols + j], sm.kqs[(x + 3) * kCols + j]);
#pragma unroll
            for (int b = kb2; b < 4; ++b)
              acc[b] = dot4(acc[b], ld4(sm.t + (rr + 16 * b) * kLdm + x), xv);
          }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int r = rr + 16 * b;
          sm.vn[r * kCols + j] = acc[b];
          sm.vd[r * kCols + j] = acc[b] * d[kChunk + r];
        }
      }
      __syncthreads();
      if (fetch_next) store_lower(sm.t, t_next);  // T of this chunk was last read above

      // 3. o = e^c QS + P v' to the output; S <- e^(c_last) S + Kᵀ v''.
      {
        float acc[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int r = rr + 16 * b;
          acc[b] = d[r] * sm.kqs[(kChunk + r) * kCols + j];
        }
#pragma unroll
        for (int kb2 = 0; kb2 < 4; ++kb2)
#pragma unroll
          for (int x4 = 0; x4 < 16; x4 += 4) {
            const int x = 16 * kb2 + x4;
            const float4 vv = make_float4(sm.vn[(x + 0) * kCols + j], sm.vn[(x + 1) * kCols + j],
                                          sm.vn[(x + 2) * kCols + j], sm.vn[(x + 3) * kCols + j]);
#pragma unroll
            for (int b = kb2; b < 4; ++b)
              acc[b] = dot4(acc[b], ld4(sm.p + (rr + 16 * b) * kLdm + x), vv);
          }
        const int64_t s0 = static_cast<int64_t>(c) * kChunk;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int r = rr + 16 * b;
          if (r < m && j < ncols) a.out[(tok0 + s0 + r) * a.ldo + h * dv + j0 + j] = acc[b];
        }
      }
      {  // thread: S rows k0 .. k0 + 3 x columns jj .. jj + 3
        const float eg = d[3 * kChunk];
        for (int w = tid; w < p.dkp; w += kThreads) {
          const int k0 = 4 * (w >> 2), jj = 4 * (w & 3);
          float acc[4][4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float4 sv = ld4(sm.s + (k0 + u) * kCols + jj);
            acc[u][0] = eg * sv.x;
            acc[u][1] = eg * sv.y;
            acc[u][2] = eg * sv.z;
            acc[u][3] = eg * sv.w;
          }
#pragma unroll 4
          for (int i = 0; i < m; ++i) {
            const float4 kv = ld4(kt + i * p.ldk + k0);
            const float4 vv = ld4(sm.vd + i * kCols + jj);
            const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int u = 0; u < 4; ++u) fma4(acc[u], kk[u], vv);
          }
#pragma unroll
          for (int u = 0; u < 4; ++u)
            *reinterpret_cast<float4*>(sm.s + (k0 + u) * kCols + jj) =
                make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
        }
      }
      __syncthreads();
      if (!two_k) {  // the single k buffer is free only now
        if (next_in_round) {
          load_qk(k_buf(0), a.k, c + 1);
        } else if (base + ctas < nchunks && next_pc < nchunks) {
          load_qk(k_buf(0), a.k, next_pc);
        }
      } else {
        kb ^= 1;
      }
      vb ^= 1;
    }
    // This CTA has read the round's T and P of other CTAs for the last time.
    cluster_arrive();
  }

  float* s_out = a.state[row].rec_out + head;
  for (int w = tid; w < dk * kCols; w += kThreads) {
    const int x = w / kCols, jc = w % kCols;
    if (jc < ncols) s_out[x * dv + j0 + jc] = sm.s[w];
  }
  cluster_wait();  // pairs with the last arrival: no CTA leaves while others may still read
}

cudaError_t launch_chunked(const DeltaRuleLaunch& a, const RowList& rows, cudaStream_t stream,
                           int force_ctas = 0) {
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

  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  const int total = p.col_blocks * static_cast<int>(a.v_heads) * rows.count;
  cfg.gridDim = dim3(static_cast<unsigned>(total));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;

  // Per chunk, a CTA runs the chunk (~1 unit) and prepares 1 / ctas of one (~1.3 units); the
  // waves count how many times the grid's clusters fill the device.
  ChunkPlan best{};
  int best_ctas = 0, best_bytes = 0;
  double best_cost = 0.0;
  for (int ctas = kMaxCluster; ctas >= 1; --ctas) {
    if (p.col_blocks % ctas != 0 || (force_ctas && ctas != force_ctas)) continue;
    ChunkPlan q = p;
    q.copies = ctas > 1;
    q.slots = ctas;
    q.k_buffers = 2;
    if (chunk_smem_layout(q, nullptr, nullptr) * int(sizeof(float)) > optin) q.k_buffers = 1;
    const int bytes = chunk_smem_layout(q, nullptr, nullptr) * int(sizeof(float));
    if (bytes > optin) continue;
    err = cudaFuncSetAttribute(chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
    attr.val.clusterDim.x = static_cast<unsigned>(ctas);
    cfg.dynamicSmemBytes = static_cast<size_t>(bytes);
    int fit = 0;
    if (cudaOccupancyMaxActiveClusters(&fit, chunk_kernel, &cfg) != cudaSuccess || fit <= 0) {
      cudaGetLastError();  // a refused size is not this launch's error
      if (ctas > 1) continue;
      fit = 1;
    }
    const int clusters = total / ctas, waves = (clusters + fit - 1) / fit;
    const double cost = waves * (1.0 + 1.3 / ctas);
    if (best_ctas == 0 || cost < best_cost) {
      best = q;
      best_ctas = ctas;
      best_bytes = bytes;
      best_cost = cost;
    }
  }
  if (best_ctas == 0) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, best_bytes);
  if (err != cudaSuccess) return err;
  attr.val.clusterDim.x = static_cast<unsigned>(best_ctas);
  cfg.dynamicSmemBytes = static_cast<size_t>(best_bytes);
  err = cudaLaunchKernelEx(&cfg, chunk_kernel, a, rows, best);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace dr

using namespace dr;

cudaError_t launch_delta_rule(const DeltaRuleLaunch& a, cudaStream_t stream) {
  if (a.rows.count <= 0 || a.v_heads <= 0) return cudaSuccess;
  if (a.dk < 1 || a.dk > kMaxDim || a.dv < 1 || a.dv > kMaxDim || a.k_heads < 1 ||
      a.v_heads % a.k_heads != 0 || a.rows.count > kRows)
    return cudaErrorInvalidValue;
  // chunk_kernel first: a row with both parts continues in recur_kernel from its rec_out.
  RowList chunked{}, recur{};
  int tmax = 0;
  for (int i = 0; i < a.rows.count; ++i) {
    const int64_t n = a.rows.length[i], nc = chunked_tokens(n);
    if (nc > 0) chunked.index[chunked.count++] = i;
    if (n - nc > 0 || n == 0) {
      recur.index[recur.count++] = i;
      tmax = n - nc > tmax ? static_cast<int>(n - nc) : tmax;
    }
  }
  if (chunked.count > 0) {
    const cudaError_t err = launch_chunked(a, chunked, stream);
    if (err != cudaSuccess) return err;
  }
  if (recur.count > 0) return launch_recurrent(a, recur, tmax, stream);
  return cudaSuccess;
}

}  // namespace deg::cuda
