// The bf16 training attention (AttendF64Args::bf16 of kernels/ops.h) on tensor cores: the
// positions, windows, segments, paired heads and key offset of attention_f64, with q, k, v and
// the output gradient rounded to bf16, products by mma.sync m16n8k16 summed in f32, and the
// probabilities (the backward's dS) rounded to bf16 where they multiply values (keys, queries):
// FlashAttention-2's forward and backward. The CPU keeps the f64 form: it is this file's
// reference (tests/ops_backward_test.cc, the op table's attention_f64_bf16_* cases).
//
// Packing. Each (row, slot) of a launch becomes one plain sequence of virtual positions (a slot
// is a head, or with paired heads the pair slot, slot + H/2 whose positions interleave:
// attention_f64_queries.cuh's Heads). The pack kernels write, in bf16 with the dims zero-padded
// to the kernel's width kDims:
//   Q [row][slot][lq][kDims]: the row's queries by local index qi = qv - step * position;
//   K, V [row][slot][lk][kDims]: keys by virtual position (prefix, then own), the key offset's
//     dims [offset_from, qk_dim) taken from the previous token of the same K/V head;
//   first [row][lq]: each query's first visible key (window, document), kNoQuery for padding.
// Everything past a row's tokens or keys is zero. Key j is then visible to query qv when
// first <= j <= qv: the one mask every kernel applies.
//
// Forward: a CTA per 64 queries of a (row, slot), 4 warps of 16 query rows, over key tiles of 64
// from the tile holding its first visible key: S = Q K^T, s = scale S, an online softmax in
// registers, O += P V with P rounded to bf16 as the A operand; O / l to `out`, or (backward)
// the log-sum-exp m + log l and D = rowsum(dO O) per query.
// Backward: that forward, then
//   dkv_kernel: a CTA per 64 keys, over the query tiles that see them: S^T = K Q^T,
//     P^T = exp(s - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q;
//   dq_kernel: a CTA per 64 queries, over their key tiles: dS as above, dq += scale dS K;
//   unpack_kernel: dK (scaled) and dV added into the gradient views, the key offset's dims to the
//     previous token, rows in order (rows that share a prefix add their shares in row order).
// No atomics in the sums: each output element is one thread's, in a fixed order, so results are
// deterministic, and a query's output depends on its own keys only (the key tiles are aligned to
// virtual positions, fully masked tiles change nothing).
//
// Fragments (mma.cuh): lane l holds C rows g = l / 4 and g + 8 of its warp's 16, columns
// 8 n + 2 t and + 1 (t = l % 4) of each 8-column tile n.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"

namespace deg::cuda {

namespace {

#include "kernels/cuda/attention_f64_queries.cuh"
#include "kernels/cuda/grid.cuh"

using bf16 = __nv_bfloat16;

constexpr int kBlock = 64;        // the queries of a query tile, the keys of a key tile
constexpr int kCtaThreads = 128;  // 4 warps of 16 rows (the packing kernels: grid.cuh kThreads)
constexpr int kPad = 8;           // bf16 past the dims in a shared row: ldmatrix's rows miss banks
// `first` of a position without a query (it sees no key); also what a byte fill of 0x7f writes.
constexpr int32_t kNoQuery = 0x7f7f7f7f;
static_assert(kCtaThreads / 32 * 16 == kBlock, "a warp per 16 rows of a tile");

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

// A launch's packed sequences and scratch, carved from its workspace.
struct Packed {
  int slots = 0, step = 1;
  int64_t lq = 0, lk = 0;  // query and key positions per (row, slot): multiples of kBlock
  bf16 *q, *k, *v, *dout;  // [row][slot][lq or lk][kDims]
  int32_t* first;          // [row][lq]
  int32_t* tile_first;     // [row][lq / kBlock]: the least `first` of a query tile
  float *lse, *dsum;       // [row][slot][lq]: log-sum-exp of the scaled scores; rowsum(dO O)
  float *dk, *dv;          // [row][slot][lk][kDims]: unscaled dK, dV of the virtual keys
};

// The kernels' width for f's heads: 64 or 128 dims, 0 when wider.
int kernel_dims(const AttentionF64Launch& f) {
  const int64_t dims = f.qk_dim > f.v_dim ? f.qk_dim : f.v_dim;
  return dims <= 64 ? 64 : dims <= 128 ? 128 : 0;
}

// The workspace's layout (base null: offsets only); *bytes its size.
Packed layout(const AttentionF64Launch& f, bool backward, char* base, size_t* bytes) {
  Packed p{};
  const int64_t dims = kernel_dims(f);
  p.step = f.paired_heads ? 2 : 1;
  p.slots = int(f.paired_heads ? f.heads / 2 : f.heads);
  int64_t keys = 1;
  for (int i = 0; i < f.rows.count; ++i) {
    const int64_t end = f.rows.position[i] + f.rows.length[i];
    keys = end > keys ? end : keys;
  }
  p.lq = round_up(p.step * f.rows.tokens, kBlock);
  p.lk = round_up(p.step * keys, kBlock);
  const int64_t rows = f.rows.count, queries = rows * p.slots * p.lq,
                vectors = rows * p.slots * p.lk;
  size_t at = 0;
  auto carve = [&](auto*& ptr, int64_t count) {
    using T = std::remove_reference_t<decltype(*ptr)>;
    ptr = base ? reinterpret_cast<T*>(base + at) : nullptr;
    at += size_t(round_up(count * int64_t(sizeof(T)), 256));
  };
  carve(p.q, queries * dims);
  carve(p.k, vectors * dims);
  carve(p.v, vectors * dims);
  carve(p.first, rows * p.lq);
  carve(p.tile_first, rows * p.lq / kBlock);
  p.dout = nullptr;
  p.lse = p.dsum = p.dk = p.dv = nullptr;
  if (backward) {
    carve(p.dout, queries * dims);
    carve(p.lse, queries);
    carve(p.dsum, queries);
    carve(p.dk, vectors * dims);
    carve(p.dv, vectors * dims);
  }
  *bytes = at;
  return p;
}

// ---- packing ----

// Eight dims from d0 of the f32 vector x (null: zeros), those past `width` zero, as bf16.
__device__ __forceinline__ void store8(bf16* dst, const float* x, int d0, int64_t width) {
  uint32_t u[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int d = d0 + 2 * c;
    u[c] = pack_bf16(x && d < width ? x[d] : 0.0f, x && d + 1 < width ? x[d + 1] : 0.0f);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(u[0], u[1], u[2], u[3]);
}

// Query-side vectors: src's row n, head h (ld and hs apart, `width` dims) into dst[row][slot][qi],
// a thread per 8 dims; with `firsts`, each position's first visible key and its tile's least.
template <int kDims>
__global__ void __launch_bounds__(kThreads)
    pack_queries_kernel(const __grid_constant__ AttentionF64Launch f, const Packed p,
                        const float* src, int64_t ld, int64_t hs, int64_t width, bf16* dst,
                        bool firsts) {
  constexpr int kParts = kDims / 8;
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= f.rows.count * p.slots * p.lq * kParts) return;
  const int part = int(e % kParts);
  const int64_t vector = e / kParts, qi = vector % p.lq, slot = vector / p.lq % p.slots;
  const int i = int(vector / p.lq / p.slots);
  const Heads heads(f);
  const int64_t t = qi / p.step, h = heads.head(f, slot, qi);  // qi and qv share their parity
  const bool active = t < f.rows.length[i];
  const int64_t n = (f.rows.first + i) * f.rows.tokens + t;
  store8(dst + vector * kDims + 8 * part, active ? src + n * ld + h * hs : nullptr, 8 * part,
         width);
  if (firsts && slot == 0 && part == 0) {
    const int32_t j0 =
        active ? int32_t(first_key(f, n, heads.virtual_of(f, h, f.rows.position[i] + t)))
               : kNoQuery;
    p.first[i * p.lq + qi] = j0;
    if (active) atomicMin(p.tile_first + i * (p.lq / kBlock) + qi / kBlock, j0);
  }
}

// K and V rows by virtual position, a thread per 8 dims of both.
template <int kDims>
__global__ void __launch_bounds__(kThreads)
    pack_keys_kernel(const __grid_constant__ AttentionF64Launch f, const Packed p) {
  constexpr int kParts = kDims / 8;
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= f.rows.count * p.slots * p.lk * kParts) return;
  const int d0 = 8 * int(e % kParts);
  const int64_t vector = e / kParts, j = vector % p.lk, slot = vector / p.lk % p.slots;
  const int i = int(vector / p.lk / p.slots);
  const Heads heads(f);
  const int64_t token = heads.token(j), g = heads.head(f, slot, j);
  const bool valid = token < f.rows.position[i] + f.rows.length[i];
  const KvRow& kv = f.kv[i];
  const int64_t split = f.key_offset ? f.offset_from : f.qk_dim;
  const float* k = valid ? kv_at(kv, false, g, token, f.kv_dim) : nullptr;
  const float* prev =
      valid && token > 0 && split < f.qk_dim ? kv_at(kv, false, g, token - 1, f.kv_dim) : k;
  uint32_t u[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float x[2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int d = d0 + 2 * c + b;
      x[b] = valid && d < f.qk_dim ? (d < split ? k : prev)[d] : 0.0f;
    }
    u[c] = pack_bf16(x[0], x[1]);
  }
  *reinterpret_cast<uint4*>(p.k + vector * kDims + d0) = make_uint4(u[0], u[1], u[2], u[3]);
  store8(p.v + vector * kDims + d0, valid ? kv_at(kv, true, g, token, f.kv_dim) : nullptr, d0,
         f.v_dim);
}

// ---- tiles and products ----

// Starts copying kBlock packed rows (kDims each) into a shared tile (rows kDims + kPad apart).
template <int kDims>
__device__ __forceinline__ void stage(bf16* tile, const bf16* rows) {
  constexpr int kParts = kDims / 8, kPitch = kDims + kPad;
  for (int e = int(threadIdx.x); e < kBlock * kParts; e += kCtaThreads) {
    const int r = e / kParts, c = 8 * (e % kParts);
    copy16_or_zero(tile + r * kPitch + c, rows + int64_t(r) * kDims + c, 16);
  }
  commit_copies();
}

// c = A B^T for the warp's 16 rows `a` of one tile and the kBlock rows of tile `b` (both
// kDims wide): a row-by-row dot product, 16 x 64.
template <int kDims>
__device__ __forceinline__ void rows_dot_rows(float (&c)[8][4], const bf16* a, const bf16* b,
                                              int lane) {
  constexpr int kPitch = kDims + kPad;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[n][e] = 0.0f;
  const int m = lane / 8, r = lane % 8;
#pragma unroll
  for (int ks = 0; ks < kDims / 16; ++ks) {
    uint32_t af[4];
    load_matrices(af, a + (lane % 16) * kPitch + 16 * ks + 8 * (lane / 16));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      load_matrices(bf, b + (16 * np + 8 * (m / 2) + r) * kPitch + 16 * ks + 8 * (m % 2));
      mma_bf16(c[2 * np], af, bf[0], bf[1]);
      mma_bf16(c[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// c += W B for weights W (16 x 64, in C fragments, rounded to bf16 here) and the kBlock rows of
// tile `b` (the product's k index), kDims wide.
template <int kDims>
__device__ __forceinline__ void weights_times_rows(float (&c)[kDims / 8][4], const float (&w)[8][4],
                                                   const bf16* b, int lane) {
  constexpr int kPitch = kDims + kPad;
  const int m = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t af[4] = {pack_bf16(w[2 * kk][0], w[2 * kk][1]),
                            pack_bf16(w[2 * kk][2], w[2 * kk][3]),
                            pack_bf16(w[2 * kk + 1][0], w[2 * kk + 1][1]),
                            pack_bf16(w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kDims / 16; ++dp) {
      uint32_t bf[4];
      load_matrices_transposed(bf,
                               b + (16 * kk + 8 * (m % 2) + r) * kPitch + 16 * dp + 8 * (m / 2));
      mma_bf16(c[2 * dp], af, bf[0], bf[1]);
      mma_bf16(c[2 * dp + 1], af, bf[2], bf[3]);
    }
  }
}

// The sum of x over the four lanes of a fragment row (every lane gets the same bits).
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float row_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// A query tile's CTA (blockIdx: tile, slot, row) and the lane's two query rows.
struct QueryTile {
  int i, slot, warp, lane, t4;
  int64_t seq;         // the (row, slot) sequence: i * slots + slot
  int64_t q0;          // the tile's first query (local index)
  int64_t local[2];    // the lane's rows (local indices)
  int64_t qv[2];       // their virtual positions
  int32_t first[2];    // their first visible keys
  int64_t kmin, kmax;  // the keys any of the tile's queries sees (none: kmin > kmax)
};

__device__ QueryTile query_tile(const AttentionF64Launch& f, const Packed& p) {
  QueryTile c;
  c.i = int(blockIdx.z);
  c.slot = int(blockIdx.y);
  c.seq = int64_t(c.i) * p.slots + c.slot;
  c.q0 = int64_t(blockIdx.x) * kBlock;
  c.warp = int(threadIdx.x) / 32;
  c.lane = int(threadIdx.x) % 32;
  c.t4 = c.lane % 4;
  const int64_t base = p.step * f.rows.position[c.i];
  for (int r = 0; r < 2; ++r) {
    c.local[r] = c.q0 + 16 * c.warp + c.lane / 4 + 8 * r;
    c.qv[r] = base + c.local[r];
    c.first[r] = p.first[c.i * p.lq + c.local[r]];
  }
  const int64_t end = p.step * f.rows.length[c.i];  // local queries [0, end) are tokens'
  const int64_t last = (c.q0 + kBlock < end ? c.q0 + kBlock : end) - 1;
  c.kmin = p.tile_first[c.i * (p.lq / kBlock) + blockIdx.x];
  c.kmax = last >= c.q0 && c.kmin != kNoQuery ? base + last : -1;
  return c;
}

// Whether the lane's query row r sees key j.
__device__ __forceinline__ bool sees(const QueryTile& c, int r, int64_t j) {
  return j >= c.first[r] && j <= c.qv[r];
}

// The key of column e of fragment tile n at key tile k0.
__device__ __forceinline__ int64_t key_of(const QueryTile& c, int64_t k0, int n, int e) {
  return k0 + 8 * n + 2 * c.t4 + (e & 1);
}

// ---- forward ----

// Shared memory: the Q tile, then the K and V tiles.
template <int kDims>
constexpr int forward_bytes() {
  return 3 * kBlock * (kDims + kPad) * int(sizeof(bf16));
}

// kStats false: O / l into f.out (padding zeroed). kStats: each query's log-sum-exp (infinite
// without a query) and D = rowsum(dO O) with the packed dO.
template <int kDims, bool kStats>
__global__ void __launch_bounds__(kCtaThreads)
    forward_kernel(const __grid_constant__ AttentionF64Launch f, const Packed p) {
  constexpr int kPitch = kDims + kPad, kTiles = kDims / 8;
  extern __shared__ float4 shared_memory[];
  bf16* const q_tile = reinterpret_cast<bf16*>(shared_memory);
  bf16* const k_tile = q_tile + kBlock * kPitch;
  bf16* const v_tile = k_tile + kBlock * kPitch;
  const QueryTile c = query_tile(f, p);
  float o[kTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (c.kmin <= c.kmax) stage<kDims>(q_tile, p.q + (c.seq * p.lq + c.q0) * kDims);
  for (int64_t kb = c.kmin / kBlock; c.kmin <= c.kmax && kb <= c.kmax / kBlock; ++kb) {
    const int64_t k0 = kb * kBlock;
    stage<kDims>(k_tile, p.k + (c.seq * p.lk + k0) * kDims);
    stage<kDims>(v_tile, p.v + (c.seq * p.lk + k0) * kDims);
    wait_copies<0>();
    __syncthreads();
    float s[8][4];
    rows_dot_rows<kDims>(s, q_tile + 16 * c.warp * kPitch, k_tile, c.lane);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        s[n][e] = sees(c, r, key_of(c, k0, n, e)) ? __fmul_rn(f.scale, s[n][e]) : -INFINITY;
        mx[r] = fmaxf(mx[r], s[n][e]);
      }
    float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float next = fmaxf(m[r], row_max(mx[r]));
      alpha[r] = next == -INFINITY ? 1.0f : __expf(m[r] - next);
      m[r] = next;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        s[n][e] = m[r] == -INFINITY ? 0.0f : __expf(s[n][e] - m[r]);
        sum[r] += s[n][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + row_sum(sum[r]);
#pragma unroll
    for (int d = 0; d < kTiles; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
    weights_times_rows<kDims>(o, s, v_tile, c.lane);
    __syncthreads();  // the tiles are used up
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t t = c.local[r] / p.step;
    const bool active = t < f.rows.length[c.i] && l[r] > 0.0f;
    const float inv = active ? 1.0f / l[r] : 0.0f;
    if constexpr (kStats) {
      const bf16* go = p.dout + (c.seq * p.lq + c.local[r]) * kDims;
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const float2 g =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(go + 8 * j + 2 * c.t4));
        d += g.x * (o[j][2 * r] * inv) + g.y * (o[j][2 * r + 1] * inv);
      }
      d = row_sum(d);
      if (c.t4 == 0) {
        p.lse[c.seq * p.lq + c.local[r]] = active ? m[r] + __logf(l[r]) : INFINITY;
        p.dsum[c.seq * p.lq + c.local[r]] = d;
      }
    } else {
      if (t >= f.rows.tokens) continue;
      const int64_t n = (f.rows.first + c.i) * f.rows.tokens + t;
      const int64_t h = Heads(f).head(f, c.slot, c.local[r]);
      float* y = f.out + n * f.ldo + h * f.ho;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int col = 8 * j + 2 * c.t4;
        if (col < f.v_dim) y[col] = o[j][2 * r] * inv;
        if (col + 1 < f.v_dim) y[col + 1] = o[j][2 * r + 1] * inv;
      }
    }
  }
}

// ---- backward ----

// The probabilities exp(s - lse) of the visible pairs (0 elsewhere) in place of the products S.
// Row r, column e of tile n is the pair (query, key) that `pair` names.
template <class Pair>
__device__ __forceinline__ void probabilities(float (&s)[8][4], float scale, Pair&& pair) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float lse;
      s[n][e] = pair(n, e, &lse) ? __expf(__fmul_rn(scale, s[n][e]) - lse) : 0.0f;
    }
}

// dP (products of dO and V) becomes dS = P (dP - D), D of the pair's query.
template <class Dsum>
__device__ __forceinline__ void score_grads(float (&dp)[8][4], const float (&pr)[8][4],
                                            Dsum&& dsum) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[n][e] = pr[n][e] * (dp[n][e] - dsum(n, e));
}

template <int kDims>
constexpr int grad_bytes() {
  return 4 * kBlock * (kDims + kPad) * int(sizeof(bf16)) + kBlock * 3 * 4;
}

// dq += scale dS K for the tile's real queries.
template <int kDims>
__global__ void __launch_bounds__(kCtaThreads)
    dq_kernel(const __grid_constant__ AttentionF64BackwardLaunch a, const Packed p) {
  const AttentionF64Launch& f = a.forward;
  constexpr int kPitch = kDims + kPad, kTiles = kDims / 8;
  extern __shared__ float4 shared_memory[];
  bf16* const q_tile = reinterpret_cast<bf16*>(shared_memory);
  bf16* const do_tile = q_tile + kBlock * kPitch;
  bf16* const k_tile = do_tile + kBlock * kPitch;
  bf16* const v_tile = k_tile + kBlock * kPitch;
  const QueryTile c = query_tile(f, p);
  if (c.kmin > c.kmax) return;
  float lse[2], dsum[2];
  for (int r = 0; r < 2; ++r) {
    lse[r] = p.lse[c.seq * p.lq + c.local[r]];
    dsum[r] = p.dsum[c.seq * p.lq + c.local[r]];
  }
  stage<kDims>(q_tile, p.q + (c.seq * p.lq + c.q0) * kDims);
  stage<kDims>(do_tile, p.dout + (c.seq * p.lq + c.q0) * kDims);
  float dq[kTiles][4] = {};
  for (int64_t kb = c.kmin / kBlock; kb <= c.kmax / kBlock; ++kb) {
    const int64_t k0 = kb * kBlock;
    stage<kDims>(k_tile, p.k + (c.seq * p.lk + k0) * kDims);
    stage<kDims>(v_tile, p.v + (c.seq * p.lk + k0) * kDims);
    wait_copies<0>();
    __syncthreads();
    float s[8][4], dp[8][4];
    rows_dot_rows<kDims>(s, q_tile + 16 * c.warp * kPitch, k_tile, c.lane);
    probabilities(s, f.scale, [&](int n, int e, float* x) {
      *x = lse[e / 2];
      return sees(c, e / 2, key_of(c, k0, n, e));
    });
    rows_dot_rows<kDims>(dp, do_tile + 16 * c.warp * kPitch, v_tile, c.lane);
    score_grads(dp, s, [&](int, int e) { return dsum[e / 2]; });
    weights_times_rows<kDims>(dq, dp, k_tile, c.lane);
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t t = c.local[r] / p.step;
    if (t >= f.rows.length[c.i]) continue;
    const int64_t n = (f.rows.first + c.i) * f.rows.tokens + t;
    float* g = a.dq + n * a.lddq + Heads(f).head(f, c.slot, c.local[r]) * a.hdq;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int col = 8 * j + 2 * c.t4;
      if (col < f.qk_dim) g[col] += f.scale * dq[j][2 * r];
      if (col + 1 < f.qk_dim) g[col + 1] += f.scale * dq[j][2 * r + 1];
    }
  }
}

// dK (unscaled) and dV of a key tile (blockIdx: tile, slot, row) over the query tiles that see
// it, into p.dk and p.dv.
template <int kDims>
__global__ void __launch_bounds__(kCtaThreads)
    dkv_kernel(const __grid_constant__ AttentionF64Launch f, const Packed p) {
  constexpr int kPitch = kDims + kPad, kTiles = kDims / 8;
  extern __shared__ float4 shared_memory[];
  bf16* const k_tile = reinterpret_cast<bf16*>(shared_memory);
  bf16* const v_tile = k_tile + kBlock * kPitch;
  bf16* const q_tile = v_tile + kBlock * kPitch;
  bf16* const do_tile = q_tile + kBlock * kPitch;
  float* const lse = reinterpret_cast<float*>(do_tile + kBlock * kPitch);
  float* const dsum = lse + kBlock;
  int32_t* const first = reinterpret_cast<int32_t*>(dsum + kBlock);
  const int i = int(blockIdx.z);
  const int64_t seq = int64_t(i) * p.slots + blockIdx.y, k0 = int64_t(blockIdx.x) * kBlock;
  const int64_t base = p.step * f.rows.position[i];
  if (k0 >= p.step * (f.rows.position[i] + f.rows.length[i])) return;  // no key read here
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, t4 = lane % 4;
  stage<kDims>(k_tile, p.k + (seq * p.lk + k0) * kDims);
  stage<kDims>(v_tile, p.v + (seq * p.lk + k0) * kDims);
  float dk[kTiles][4] = {}, dv[kTiles][4] = {};
  const int64_t q_begin = k0 > base ? k0 - base : 0, q_end = p.step * f.rows.length[i];
  for (int64_t qb = q_begin / kBlock; qb * kBlock < q_end; ++qb) {
    if (p.tile_first[i * (p.lq / kBlock) + qb] > k0 + kBlock - 1) continue;
    const int64_t q0 = qb * kBlock;
    stage<kDims>(q_tile, p.q + (seq * p.lq + q0) * kDims);
    stage<kDims>(do_tile, p.dout + (seq * p.lq + q0) * kDims);
    if (threadIdx.x < kBlock) {
      lse[threadIdx.x] = p.lse[seq * p.lq + q0 + threadIdx.x];
      dsum[threadIdx.x] = p.dsum[seq * p.lq + q0 + threadIdx.x];
      first[threadIdx.x] = p.first[i * p.lq + q0 + threadIdx.x];
    }
    wait_copies<0>();
    __syncthreads();
    float s[8][4], dp[8][4];
    rows_dot_rows<kDims>(s, k_tile + 16 * warp * kPitch, q_tile, lane);  // S^T
    auto query = [&](int n, int e) { return 8 * n + 2 * t4 + (e & 1); };
    probabilities(s, f.scale, [&](int n, int e, float* x) {
      const int qc = query(n, e);
      const int64_t key = k0 + 16 * warp + lane / 4 + 8 * (e / 2);
      *x = lse[qc];
      return key >= first[qc] && key <= base + q0 + qc;
    });
    weights_times_rows<kDims>(dv, s, do_tile, lane);                       // dV += P^T dO
    rows_dot_rows<kDims>(dp, v_tile + 16 * warp * kPitch, do_tile, lane);  // dP^T = V dO^T
    score_grads(dp, s, [&](int n, int e) { return dsum[query(n, e)]; });
    weights_times_rows<kDims>(dk, dp, q_tile, lane);  // dK += dS^T Q
    __syncthreads();
  }
  wait_copies<0>();  // (when no query tile sees the keys)
  for (int r = 0; r < 2; ++r) {
    const int64_t row = (seq * p.lk + k0 + 16 * warp + lane / 4 + 8 * r) * kDims;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int col = 8 * j + 2 * t4;
      *reinterpret_cast<float2*>(p.dk + row + col) = make_float2(dk[j][2 * r], dk[j][2 * r + 1]);
      *reinterpret_cast<float2*>(p.dv + row + col) = make_float2(dv[j][2 * r], dv[j][2 * r + 1]);
    }
  }
}

// dK (scaled) and dV into the gradient views: a thread per (K/V head g, position, dim), the
// rows in order. With the key offset, a key's dims from offset_from on take the next key's
// share (and key 0 its own as well).
__global__ void __launch_bounds__(kThreads)
    unpack_kernel(const __grid_constant__ AttentionF64BackwardLaunch a, const Packed p, int kDims,
                  int64_t positions) {
  const AttentionF64Launch& f = a.forward;
  const int64_t dims = f.qk_dim > f.v_dim ? f.qk_dim : f.v_dim;
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= f.heads * positions * dims) return;
  const int64_t d = e % dims, pos = e / dims % positions, g = e / dims / positions;
  const Heads heads(f);
  const int64_t slot = heads.slot(f, g), j = heads.virtual_of(f, g, pos);
  const int64_t split = f.key_offset ? f.offset_from : f.qk_dim;
  for (int i = 0; i < f.rows.count; ++i) {
    const int64_t end = f.rows.position[i] + f.rows.length[i];
    if (pos >= end) continue;
    const int64_t seq = int64_t(i) * p.slots + slot;
    const float* dk = p.dk + (seq * p.lk + j) * kDims + d;
    if (float* dv = d < f.v_dim ? grad_at(a.grad[i], true, g, pos, f.kv_dim) : nullptr)
      dv[d] += p.dv[(seq * p.lk + j) * kDims + d];
    float* gk = d < f.qk_dim ? grad_at(a.grad[i], false, g, pos, f.kv_dim) : nullptr;
    if (!gk) continue;
    float x = 0.0f;
    if (d < split || pos == 0) x = dk[0];
    if (d >= split && pos + 1 < end) x += dk[int64_t(p.step) * kDims];
    gk[d] += f.scale * x;
  }
}

// ---- launches ----

template <class Kernel>
cudaError_t allow_shared(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

unsigned blocks(int64_t threads) {
  return unsigned((threads + kThreads - 1) / kThreads);
}

// Packs q (and dout, when given) and the keys.
template <int kDims>
cudaError_t pack(const AttentionF64Launch& f, const Packed& p, const float* dout, int64_t lddo,
                 int64_t hdo, cudaStream_t stream) {
  if (cudaError_t e = cudaMemsetAsync(
          p.tile_first, 0x7f, size_t(f.rows.count * (p.lq / kBlock)) * sizeof(int32_t), stream);
      e != cudaSuccess)
    return e;
  const int64_t queries = f.rows.count * p.slots * p.lq * (kDims / 8);
  pack_queries_kernel<kDims>
      <<<blocks(queries), kThreads, 0, stream>>>(f, p, f.q, f.ldq, f.hq, f.qk_dim, p.q, true);
  if (dout)
    pack_queries_kernel<kDims>
        <<<blocks(queries), kThreads, 0, stream>>>(f, p, dout, lddo, hdo, f.v_dim, p.dout, false);
  pack_keys_kernel<kDims>
      <<<blocks(f.rows.count * p.slots * p.lk * (kDims / 8)), kThreads, 0, stream>>>(f, p);
  return launched();
}

dim3 query_grid(const AttentionF64Launch& f, const Packed& p) {
  return dim3(unsigned(p.lq / kBlock), unsigned(p.slots), unsigned(f.rows.count));
}

template <int kDims>
cudaError_t forward(const AttentionF64Launch& f, const Packed& p, cudaStream_t stream) {
  if (cudaError_t e = pack<kDims>(f, p, nullptr, 0, 0, stream); e != cudaSuccess) return e;
  auto* kernel = forward_kernel<kDims, false>;
  if (cudaError_t e = allow_shared(kernel, forward_bytes<kDims>()); e != cudaSuccess) return e;
  kernel<<<query_grid(f, p), kCtaThreads, forward_bytes<kDims>(), stream>>>(f, p);
  return launched();
}

template <int kDims>
cudaError_t backward(const AttentionF64BackwardLaunch& a, const Packed& p, cudaStream_t stream) {
  const AttentionF64Launch& f = a.forward;
  if (cudaError_t e = pack<kDims>(f, p, a.dout, a.lddo, a.hdo, stream); e != cudaSuccess) return e;
  auto* stats = forward_kernel<kDims, true>;
  auto* keys = dkv_kernel<kDims>;
  auto* queries = dq_kernel<kDims>;
  for (cudaError_t e :
       {allow_shared(stats, forward_bytes<kDims>()), allow_shared(keys, grad_bytes<kDims>()),
        allow_shared(queries, grad_bytes<kDims>())})
    if (e != cudaSuccess) return e;
  stats<<<query_grid(f, p), kCtaThreads, forward_bytes<kDims>(), stream>>>(f, p);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  if (a.dq) {
    queries<<<query_grid(f, p), kCtaThreads, grad_bytes<kDims>(), stream>>>(a, p);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  }
  keys<<<dim3(unsigned(p.lk / kBlock), unsigned(p.slots), unsigned(f.rows.count)), kCtaThreads,
         grad_bytes<kDims>(), stream>>>(f, p);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  const int64_t positions = p.lk / p.step, dims = f.qk_dim > f.v_dim ? f.qk_dim : f.v_dim;
  unpack_kernel<<<blocks(f.heads * positions * dims), kThreads, 0, stream>>>(a, p, kDims,
                                                                             positions);
  return launched();
}

bool empty(const AttentionF64Launch& f) {
  return f.rows.count == 0 || f.rows.tokens == 0 || f.heads == 0;
}

}  // namespace

bool attention_bf16_fits(const AttentionF64Launch& f) {
  return kernel_dims(f) != 0 && (!f.paired_heads || f.heads % 2 == 0);
}

size_t attention_bf16_workspace(const AttentionF64Launch& f, bool backward) {
  size_t bytes = 0;
  layout(f, backward, nullptr, &bytes);
  return bytes;
}

cudaError_t launch_attention_bf16(const AttentionF64Launch& f, void* workspace,
                                  cudaStream_t stream) {
  if (empty(f)) return cudaSuccess;
  if (!attention_bf16_fits(f)) return cudaErrorInvalidValue;
  size_t bytes = 0;
  const Packed p = layout(f, false, static_cast<char*>(workspace), &bytes);
  return kernel_dims(f) == 64 ? forward<64>(f, p, stream) : forward<128>(f, p, stream);
}

cudaError_t launch_attention_bf16_backward(const AttentionF64BackwardLaunch& a, void* workspace,
                                           cudaStream_t stream) {
  const AttentionF64Launch& f = a.forward;
  if (empty(f)) return cudaSuccess;
  if (!attention_bf16_fits(f)) return cudaErrorInvalidValue;
  size_t bytes = 0;
  const Packed p = layout(f, true, static_cast<char*>(workspace), &bytes);
  return kernel_dims(f) == 64 ? backward<64>(a, p, stream) : backward<128>(a, p, stream);
}

}  // namespace deg::cuda
