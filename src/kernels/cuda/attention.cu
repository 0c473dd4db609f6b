// The CUDA backend's causal softmax attention (launch.h's AttentionLaunch; AttendArgs of
// kernels/ops.h): flash-style with the key sequence cut into splits (flash-decoding), f32 on the
// CUDA cores, bitwise batch invariant. A bf16 launch with D <= 256 runs the same jobs, splits,
// folds and merge with its own kernel (attention_mma.cu: K/V rounded to bf16 once, tensor-core
// products, the FlashAttention-2 layout); the block and few-query kernels below are f32 only.
//
// Letters: G query heads per KV head (group), D head dim (at most 512; past 256 every job
// runs in the few-query kernel's wide form), a row's "query rows" are
// its n real tokens times G heads of one KV head, flattened as f = t G + g; a query row's key
// index is that of its token (prefix_len + own_before + t), its "reach" the keys it sees.
//
// Splits. Keys are read in blocks of 64 aligned at key index 0. A query row whose key index is k
// cuts its reach into splits of split_blocks(k) blocks, aligned at key index 0: 1 block (64 keys)
// while k < 1024, 16 blocks (1024 keys) while k < 16384, then 32 blocks, twice as many per
// doubling of k (at most 32 splits). The geometry depends on the query's own key index only, so it
// is the same whatever batch, L, row chunk or prefill chunk the query comes in. Per split the query
// runs the flash recurrence from scratch over the split's blocks:
//   1. scores: S = scale (Q K^T), each score one dot product summed over d = 0, 1, ... with f32
//      FMAs (dims padded to a multiple of 4 with zeros);
//   2. softmax step, per query row, by 4 lanes (lane / 8 is the part): part p reads keys
//      p, p + 4, ..., p + 60 of the block; the block max over the keys the query sees (exact, so
//      order-free); new max m' = max(m, block max); alpha = 1 when m' == m, else exp(m - m');
//      p_j = exp(s_j - m') for seen keys and exactly 0 for the others; the block sum is each
//      part's 16 terms in key order, then (part0 + part1) + (part2 + part3); l = l alpha + sum;
//   3. values: acc = acc alpha, then acc = fma(p_j, v_j, acc) for j = 0 .. 63 in order.
// A query whose reach lies in one split stores out = acc / l at that split's end. Otherwise its
// splits are folded in index order, starting from the first split's (m, l, acc): for split s,
// m' = max(m, m_s), x = exp(m - m'), y = exp(m_s - m'), l = fma(l, x, l_s y), acc likewise,
// then out = acc / l. A CTA that walks all of a query's splits (a "local" row: not packed, its
// own job one chunk, as in a long prefill) folds each split in as it ends, keeping m and l in
// registers and the running acc in one workspace record; otherwise each split's partial
// (m, l, acc) goes to the workspace and the merge kernel folds them.
//
// Decomposition. Work comes as jobs (planned on the host from the rows alone): a job is a list
// of query rows of one or more rows (for each KV head) and a range of key blocks, cut into
// chunks of whole splits; a CTA (256 threads) takes one job, KV head, block of the job's query
// rows and chunk, walks the chunk's key blocks that its queries can see, and at each block that
// ends a split of one of its queries stores that query's partial or output and restarts it.
//   * Rows that share a prefix (the same prefix K/V buffers and length: fork rows over one
//     trunk) and have 16 query rows or more together form one packed job over the prefix keys
//     that whole splits of all of them cover: their query rows are flattened into blocks of 64
//     and each prefix key block is read once per query block, not once per row.
//   * Each row then has its own job over its remaining keys: 64 query rows per CTA in the block
//     kernel, 8 per CTA in the few-query kernel when its n G is at most 16 (decode).
//   * Head dims past 256 (Gemma 4's global layers): nothing is packed, and every row's job runs
//     in the few-query kernel's wide form, 32 query rows per CTA, f32 even for bf16 launches.
//   * The chunk size is a multiple of every query's split of the job; a job's range is cut when
//     the kernel would otherwise have fewer than about four CTAs' worth of work per SM (decode,
//     fork passes, short prefill chunks), and left whole otherwise (long prefill). CTAs run
//     costliest first.
//
// Shared memory (floats; P = D rounded up to 32, plus 4, so rows of a tile start 4 banks apart):
//   block kernel: Q [64][P], K [64][P], V [64][P], probabilities [64 keys][72], alpha, split
//     ends (RowEnd) and query rows [64] each: 220,928 bytes at D = 256 (one CTA per SM);
//   few kernel:   Q [8][P],  K [64][P], V [64][P], probabilities [64 keys][8], alpha and split
//     ends [8]: 143,776 bytes at D = 256;
//   its wide form: Q [32][P], one K-then-V tile [64][P], probabilities [64 keys][32], alpha and
//     split ends [32]: 207,488 bytes at D = 512.
// K and V tiles arrive with cp.async, each overlapping the other half of the previous block's
// work: V of block b + 1 loads during scores and softmax of b + 1, K of block b + 1 during the
// softmax and values of b (the wide form waits for each: its one tile holds K, then V). Keys past
// the CTA's last query's key are zero-filled, never read (a row's spare capacity may hold
// anything).
//
// Workspace: per row with a query past key 63, per token t, per query head, split_slots(k)
// records of D rounded up to 4, plus 4, floats (acc, then m and l; a local row uses the record
// of each query's first split only); attention_workspace_floats.
//
// Batch invariance. A query's output depends only on its own q, the key sequence it sees and D:
//   * its split geometry depends on its key index only (above), and every split it sees is
//     computed by exactly one CTA, from scratch, over the split's key blocks in order;
//   * every dot product and every value sum runs in one fixed order (explicit _rn intrinsics, so
//     no contraction choice can differ between the kernels);
//   * key blocks are aligned at key index 0, so the key sequence alone fixes the blocks a query
//     sees, whichever CTA computes it, whether its keys lie in the prefix or in own, whatever
//     rows share its CTA;
//   * a block holding no key the query sees leaves its state bitwise unchanged (block max -inf,
//     so m' == m and alpha is exactly 1; every p is exactly 0, and fma(0, v, acc) == acc for the
//     finite v of the row's real keys and the zeros of the zero-filled ones); so do the masked
//     keys inside a block. The blocks a CTA walks beyond a query's reach change nothing for it;
//   * the softmax step is one function, called by both kernels with the same lane layout, and
//     the score and value chains are the same sequence of operations in both kernels, so the
//     block and few-query kernels give the same bits for a query (a batch may pack a row that
//     runs alone in the few-query kernel);
//   * the fold is one sequence of operations on the splits in index order, the same whether the
//     CTA (local rows) or the merge kernel runs it; which one does is the batch's choice, the
//     bits are not.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace deg::cuda {

namespace att {

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
    attention_block_kernel(const __grid_constant__ AttentionLaunch a,
                           const __grid_constant__ Plan p, const Geometry g) {
  extern __shared__ float4 shared[];
  float* const q_tile = reinterpret_cast<float*>(shared);     // [64 query rows][pitch]
  float* const k_tile = q_tile + kBlockQueries * g.pitch;     // [64 keys][pitch]
  float* const v_tile = k_tile + kKeyBlock * g.pitch;         // [64 keys][pitch]
  float* const probs = v_tile + kKeyBlock * g.pitch;          // [64 keys][kBlockProbPitch]
  float* const alphas = probs + kKeyBlock * kBlockProbPitch;  // [64 query rows]
  RowEnd* const ends = reinterpret_cast<RowEnd*>(alphas + kBlockQueries);  // [64 query rows]
  int2* const queries = reinterpret_cast<int2*>(ends + kBlockQueries);     // [64 query rows]

  const Job& job = find_job(p, 0, p.block_jobs, int(blockIdx.x));
  const Task task = task_of(a, p, job, int(blockIdx.x), kBlockQueries);
  if (task.first_block > task.last_block) return;
  const int64_t head = task.head, G = a.group, D = g.head_dim;
  const int64_t first_block = task.first_block, last_block = task.last_block;
  const HeadKeys hk = head_keys(a, task.row0, head);

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int score_row = 8 * (warp % 2) + lane % 8, score_key = 4 * (warp / 2) + lane / 8;
  const int soft_row = 8 * warp + lane % 8;
  const int value_row = 4 * (4 * (warp % 2) + lane / 8),
            value_col = 4 * (8 * (warp / 2) + lane % 8);
  const bool cols_low = value_col < g.dim4, cols_high = value_col + 128 < g.dim4;

  if (threadIdx.x < kBlockQueries)
    queries[threadIdx.x] = query_of(p, job, task.x0 + int64_t(threadIdx.x));
  __syncthreads();

  const Walk q_walk = make_walk(g.q_wide, g.dim4), kv_walk = make_walk(g.kv_wide, g.dim4);
  auto query = [&](int v) -> const float* {
    const int2 q = queries[v];
    if (q.x < 0) return nullptr;
    return a.q + ((a.rows.first + q.x) * a.rows.tokens + q.y / G) * a.ldq +
           (head * G + q.y % G) * D;
  };
  auto stage_keys = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, task.last_key, D);
    stage_keys_tile(k_tile, kb, hk.prefix_k, hk.own_k, kv_walk, g);
  };
  auto stage_values = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, task.last_key, D);
    stage_keys_tile(v_tile, kb, hk.prefix_v, hk.own_v, kv_walk, g);
  };

  stage_tile(q_tile, kBlockQueries, q_walk, g, query);
  stage_keys(first_block);
  commit_copies();
  stage_values(first_block);
  commit_copies();

  const int2 soft_query = queries[soft_row];
  const Reach reach =
      soft_query.x < 0 ? Reach{0, -1} : reach_of(a, head_keys(a, soft_query.x, head), soft_query.y);
  const Split split = split_of(reach);
  const bool local = soft_query.x >= 0 && p.row_local[soft_query.x];
  const Places places = places_of(a, p, g, soft_query, head, split);
  Running run{-INFINITY, 0.0f, 1.0f};
  Fold fold{-INFINITY, 0.0f};
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
    end_step(run, fold, g, places, split, local, block, last_block, alphas + soft_row,
             ends + soft_row);
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

    // Rows whose split ends here store their partial or output and start afresh.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = i < 4 ? value_row + i : 32 + value_row + i - 4;
      const RowEnd e = ends[r];
      if (e.end == kGoOn) continue;
      float v[8] = {acc[i][0], acc[i][1], acc[i][2], acc[i][3],
                    acc[i][4], acc[i][5], acc[i][6], acc[i][7]};
      if (e.end == kFold || e.end == kFoldOutput) {
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 f0 = cols_low ? load4(e.fold + value_col) : zero;
        const float4 f1 = cols_high ? load4(e.fold + value_col + 128) : zero;
        const float f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
        for (int c = 0; c < 8; ++c) v[c] = fold_value(f[c], v[c], e.w);
      }
      if (e.end == kOutput || e.end == kFoldOutput) {
        const float low[4] = {__fdiv_rn(v[0], e.sum), __fdiv_rn(v[1], e.sum),
                              __fdiv_rn(v[2], e.sum), __fdiv_rn(v[3], e.sum)};
        if (cols_low) store_out(e.dest, value_col, g.head_dim, g.out_wide, low);
        const float high[4] = {__fdiv_rn(v[4], e.sum), __fdiv_rn(v[5], e.sum),
                               __fdiv_rn(v[6], e.sum), __fdiv_rn(v[7], e.sum)};
        if (cols_high) store_out(e.dest, value_col + 128, g.head_dim, g.out_wide, high);
      } else {
        if (cols_low)
          *reinterpret_cast<float4*>(e.dest + value_col) = make_float4(v[0], v[1], v[2], v[3]);
        if (cols_high)
          *reinterpret_cast<float4*>(e.dest + value_col + 128) =
              make_float4(v[4], v[5], v[6], v[7]);
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[i][c] = 0.0f;
    }
    __syncthreads();  // the V tile, the probabilities and the row states are free

    if (block < last_block) stage_values(block + 1);
    commit_copies();
  }
}

// ---- few-query kernel: up to kQ query rows of one row per CTA (decode; kQ = 8) ----
//
// Thread roles: scores: key t % 64, rows 4 (t / 64 + 4 u) + i (i < 4, u < kQ / 16 rounded up),
// skipped where those rows hold no query; softmax: warps w < kQ / 8, row 8 w + l % 8, part l / 8;
// values: columns t + 256 c (c < kCols, below D), all rows of the CTA.
//
// The wide form (kCols = 2, kQ = kWideQueries) takes every job of a launch whose head dim is past
// kMaxHeadDim (Gemma 4's global layers, D = 512). Its one tile holds a block's K, then its V (two
// would not fit in shared memory beside 32 query rows), so the copies do not overlap the
// arithmetic; 32 query rows (four tokens of eight heads) share each tile read. The arithmetic per
// query row and column is the narrow form's.

// acc[i] = fma(p_i, v, acc[i]) over the block's keys in order, for the first kRows of kQ rows.
template <int kRows, int kQ>
__device__ __forceinline__ void accumulate_few(float (&acc)[kQ], const float* probs,
                                               const float* values, int pitch) {
#pragma unroll 8
  for (int j = 0; j < kKeyBlock; ++j) {
    const float v = values[j * pitch];
#pragma unroll
    for (int m = 0; m < kRows / 4; ++m) {
      const float4 p = load4(probs + j * kQ + 4 * m);
      acc[4 * m] = __fmaf_rn(p.x, v, acc[4 * m]);
      acc[4 * m + 1] = __fmaf_rn(p.y, v, acc[4 * m + 1]);
      acc[4 * m + 2] = __fmaf_rn(p.z, v, acc[4 * m + 2]);
      acc[4 * m + 3] = __fmaf_rn(p.w, v, acc[4 * m + 3]);
    }
  }
}

size_t few_shared_bytes(const Geometry& g, bool wide) {
  const int rows = wide ? kWideQueries : kFewQueries;
  return sizeof(float) *
             (size_t((wide ? 1 : 2) * kKeyBlock + rows) * g.pitch + kKeyBlock * rows + rows) +
         rows * sizeof(RowEnd);
}

template <int kCols, int kQ>
__global__ void __launch_bounds__(kThreads, 1)
    attention_few_kernel(const __grid_constant__ AttentionLaunch a, const __grid_constant__ Plan p,
                         const Geometry g) {
  constexpr bool kWide = kCols > 1;
  constexpr int kScoreQuads = kThreads / kKeyBlock;                     // 4 quads of rows at once
  constexpr int kQuadSteps = (kQ / 4 + kScoreQuads - 1) / kScoreQuads;  // 1 (kQ = 8) or 2 (32)
  static_assert(kQ % 8 == 0 && kQ / 8 <= kThreads / 32, "a softmax warp per 8 rows");
  extern __shared__ float4 shared[];
  float* const q_tile = reinterpret_cast<float*>(shared);               // [kQ query rows][pitch]
  float* const k_tile = q_tile + kQ * g.pitch;                          // [64 keys][pitch]
  float* const v_tile = kWide ? k_tile : k_tile + kKeyBlock * g.pitch;  // [64 keys][pitch]
  float* const probs = v_tile + kKeyBlock * g.pitch;                    // [64 keys][kQ rows]
  float* const alphas = probs + kKeyBlock * kQ;                         // [kQ query rows]
  RowEnd* const ends = reinterpret_cast<RowEnd*>(alphas + kQ);          // [kQ query rows]

  const Job& job = find_job(p, p.block_jobs, p.few_jobs, int(blockIdx.x));
  const Task task = task_of(a, p, job, int(blockIdx.x), kQ);
  if (task.first_block > task.last_block) return;
  const int64_t head = task.head, G = a.group, D = g.head_dim;
  const int64_t first_block = task.first_block, last_block = task.last_block;
  const int row = task.row0;
  const HeadKeys hk = head_keys(a, row, head);
  const int64_t f0 = task.x0;  // a row's own job: query row x is f = x
  const int live = task.live;
  const int quads = (live + 3) / 4;

  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const int score_key = t % kKeyBlock, score_quad = t / kKeyBlock;
  const bool soft_here = warp < kQ / 8;
  const int soft_row = 8 * (warp % (kQ / 8)) + lane % 8;

  const Walk q_walk = make_walk(g.q_wide, g.dim4), kv_walk = make_walk(g.kv_wide, g.dim4);
  auto query = [&](int v) -> const float* {
    const int64_t f = f0 + v;
    return f < hk.count ? a.q + (hk.token0 + f / G) * a.ldq + (head * G + f % G) * D : nullptr;
  };
  auto stage_keys = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, task.last_key, D);
    stage_keys_tile(k_tile, kb, hk.prefix_k, hk.own_k, kv_walk, g);
  };
  auto stage_values = [&](int64_t block) {
    const KeyBlock kb = key_block(hk, block, task.last_key, D);
    stage_keys_tile(v_tile, kb, hk.prefix_v, hk.own_v, kv_walk, g);
  };

  stage_tile(q_tile, kQ, q_walk, g, query);
  stage_keys(first_block);
  commit_copies();
  if constexpr (!kWide) stage_values(first_block);
  commit_copies();

  const int2 soft_query = make_int2(row, int(f0 + soft_row));
  const Reach reach = reach_of(a, hk, f0 + soft_row);
  const Split split = split_of(reach);
  const bool local = p.row_local[row];
  const Places places =
      places_of(a, p, g, reach.hi < reach.lo ? make_int2(-1, 0) : soft_query, head, split);
  Running run{-INFINITY, 0.0f, 1.0f};
  Fold fold{-INFINITY, 0.0f};
  float acc[kCols][kQ] = {};

  for (int64_t block = first_block; block <= last_block; ++block) {
    const int64_t key0 = block * kKeyBlock;
    if constexpr (kWide) {
      wait_copies<0>();  // this block's K (and, the first time, Q)
    } else {
      wait_copies<1>();  // the same; this block's V may still arrive
    }
    __syncthreads();

#pragma unroll
    for (int u = 0; u < kQuadSteps; ++u) {
      const int quad = score_quad + kScoreQuads * u;
      if (quad >= quads) break;
      float score[4] = {};
      const float* k_row = k_tile + score_key * g.pitch;
      const float* q_rows = q_tile + 4 * quad * g.pitch;
#pragma unroll 4
      for (int d = 0; d < g.dim4; d += 4) {
        const float4 k = load4(k_row + d);
#pragma unroll
        for (int i = 0; i < 4; ++i) score[i] = dot4(load4(q_rows + i * g.pitch + d), k, score[i]);
      }
      *reinterpret_cast<float4*>(probs + score_key * kQ + 4 * quad) =
          make_float4(__fmul_rn(score[0], g.scale), __fmul_rn(score[1], g.scale),
                      __fmul_rn(score[2], g.scale), __fmul_rn(score[3], g.scale));
    }
    __syncthreads();  // scores complete; the K tile is free

    if constexpr (kWide) {
      stage_values(block);
    } else if (block < last_block) {
      stage_keys(block + 1);
    }
    commit_copies();
    if (soft_here) {
      run = softmax_step(probs + soft_row, kQ, key0, reach, run.max, run.sum);
      end_step(run, fold, g, places, split, local, block, last_block, alphas + soft_row,
               ends + soft_row);
    }
    if constexpr (kWide) {
      wait_copies<0>();  // this block's V
    } else {
      wait_copies<1>();
    }
    __syncthreads();

#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = t + kThreads * c;
      if (col >= D) break;
      float(&cacc)[kQ] = acc[c];
#pragma unroll
      for (int i = 0; i < kQ; ++i) cacc[i] = __fmul_rn(cacc[i], alphas[i]);
      // Over the rows that hold queries, rounded up to 4, 8, 16 or 32 (decode: G rows).
      if (kQ > 16 && quads > 4) {
        accumulate_few<kQ, kQ>(cacc, probs, v_tile + col, g.pitch);
      } else if (kQ > 8 && quads > 2) {
        accumulate_few<(kQ > 16 ? 16 : kQ), kQ>(cacc, probs, v_tile + col, g.pitch);
      } else if (quads > 1) {
        accumulate_few<8, kQ>(cacc, probs, v_tile + col, g.pitch);
      } else {
        accumulate_few<4, kQ>(cacc, probs, v_tile + col, g.pitch);
      }
      // Rows whose split ends here store their partial or output and start afresh.
#pragma unroll
      for (int i = 0; i < kQ; ++i) {
        const RowEnd e = ends[i];
        if (e.end == kGoOn) continue;
        float v = cacc[i];
        if (e.end == kFold || e.end == kFoldOutput) v = fold_value(e.fold[col], v, e.w);
        e.dest[col] = e.end == kOutput || e.end == kFoldOutput ? __fdiv_rn(v, e.sum) : v;
        cacc[i] = 0.0f;
      }
    }
    __syncthreads();  // the V tile, the probabilities and the row states are free

    if (block < last_block) {
      if constexpr (kWide) {
        stage_keys(block + 1);
      } else {
        stage_values(block + 1);
      }
    }
    commit_copies();
  }
}

// ---- merge: a query row's split partials, in split order; one warp per query row ----

__global__ void __launch_bounds__(kThreads)
    attention_merge_kernel(const __grid_constant__ AttentionLaunch a,
                           const __grid_constant__ Plan p, const Geometry g) {
  const int row = int(blockIdx.y);
  if (p.row_records[row] < 0 || p.row_local[row]) return;
  const int64_t G = a.group, HG = a.kv_heads * G;
  const int64_t x = int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  if (x >= a.rows.length[row] * HG) return;
  const int64_t token = x / HG, query_head = x % HG, head = query_head / G;
  const int64_t f = token * G + query_head % G;
  const Split s = split_of(reach_of(a, head_keys(a, row, head), f));
  if (s.first >= s.last) return;  // one split: its CTA stored the output
  const float* rec = record_of(a, p, g, row, head, f, s.first);
  const int lane = int(threadIdx.x % 32), D = g.head_dim;
  Fold fold{rec[g.dim4], rec[g.dim4 + 1]};
  float acc[kMaxWideHeadDim / 32] = {};
#pragma unroll
  for (int c = 0; c < kMaxWideHeadDim / 32; ++c)
    if (lane + 32 * c < D) acc[c] = rec[lane + 32 * c];
  for (int64_t k = 1; k <= s.last - s.first; ++k) {
    const float* r = rec + k * g.record;
    const float2 w = fold_step(fold, r[g.dim4], r[g.dim4 + 1]);
#pragma unroll
    for (int c = 0; c < kMaxWideHeadDim / 32; ++c)
      if (lane + 32 * c < D) acc[c] = fold_value(acc[c], r[lane + 32 * c], w);
  }
  float* out = output_of(a, row, head, f);
#pragma unroll
  for (int c = 0; c < kMaxWideHeadDim / 32; ++c)
    if (lane + 32 * c < D) out[lane + 32 * c] = __fdiv_rn(acc[c], fold.sum);
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

cudaError_t run_kernels(const AttentionLaunch& a, const Plan& p, const KvCopy& c, const Geometry& g,
                        cudaStream_t stream) {
  const dim3 threads(kThreads);
  if (uses_copy(a)) {
    const cudaError_t e = run_mma_kernels(a, p, c, g, stream);
    if (e != cudaSuccess) return e;
  } else if (p.block_ctas > 0) {
    const size_t bytes = sizeof(float) * (size_t(2 * kKeyBlock + kBlockQueries) * g.pitch +
                                          kKeyBlock * kBlockProbPitch + kBlockQueries) +
                         kBlockQueries * (sizeof(RowEnd) + sizeof(int2));
    auto* kernel = attention_block_kernel;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
    kernel<<<unsigned(p.block_ctas), threads, bytes, stream>>>(a, p, g);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (p.few_ctas > 0) {
    const bool wide = g.head_dim > kMaxHeadDim;
    const size_t bytes = few_shared_bytes(g, wide);
    auto* kernel =
        wide ? attention_few_kernel<2, kWideQueries> : attention_few_kernel<1, kFewQueries>;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
    kernel<<<unsigned(p.few_ctas), threads, bytes, stream>>>(a, p, g);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (p.merge_rows > 0) {
    const dim3 grid(unsigned(ceil_div(p.merge_queries, kMergeWarps)), unsigned(a.rows.count));
    attention_merge_kernel<<<grid, threads, 0, stream>>>(a, p, g);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace att

using namespace att;

cudaError_t launch_attention(const AttentionLaunch& a, cudaStream_t stream) {
  const Rows& r = a.rows;
  if (r.count <= 0) return cudaSuccess;
  if (!valid_launch(a)) return cudaErrorInvalidValue;

  const Geometry g = geometry_of(a);
  int64_t shortest = r.tokens;
  for (int i = 0; i < r.count; ++i) shortest = std::min(shortest, r.length[i]);

  static thread_local Plan p;  // 6 KB: off the stack
  if (!make_plan(a, p)) return cudaErrorInvalidConfiguration;
  static thread_local KvCopy c;  // 9 KB
  plan_kv_copy(a, c);
  AttentionLaunch l = a;
  const int64_t before_copy = records_floats(a, p);
  const int64_t need = before_copy + (c.elements + 7) / 8 * 4;
  bool pooled = false;
  if (need > 0) {
    if (l.workspace) {
      if (l.workspace_floats < need || !aligned16(l.workspace)) return cudaErrorInvalidValue;
    } else {
      void* w = nullptr;
      const cudaError_t e = cudaMallocAsync(&w, size_t(need) * sizeof(float), stream);
      if (e != cudaSuccess) return e;
      l.workspace = static_cast<float*>(w);
      pooled = true;
    }
  }
  if (c.elements > 0) c.data = l.workspace + before_copy;
  cudaError_t e = run_kernels(l, p, c, g, stream);
  if (pooled) {
    const cudaError_t freed = cudaFreeAsync(l.workspace, stream);
    if (e == cudaSuccess) e = freed;
  }
  if (e != cudaSuccess) return e;

  if (shortest < r.tokens) {
    const int64_t padded = r.tokens - shortest;
    const dim3 grid(unsigned(padded < 1024 ? padded : 1024), unsigned(r.count));
    zero_padding_kernel<<<grid, dim3(kThreads), 0, stream>>>(a, a.kv_heads * a.group * a.head_dim);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace deg::cuda
