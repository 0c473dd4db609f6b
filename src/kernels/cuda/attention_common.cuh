// The device pieces that the CUDA attention's kernels (attention.cu) share: asynchronous tile
// copies, a row's keys and key blocks, reaches and split ends, the softmax step and the split
// fold. attention.cu's top comment says how they fit; attention.cu and attention_mma.cu (the
// bf16 tensor-core kernel) include this header.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_plan.cuh"
#include "kernels/cuda/mma.cuh"

namespace deg::cuda::att {

// ---- asynchronous copies into shared memory ----

__device__ __forceinline__ void copy16_async(float* dst, const float* src) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src) : "memory");
}

__device__ __forceinline__ void copy4_async(float* dst, const float* src) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(src) : "memory");
}

// A thread's share of a tile copy: units (float4 or float) of vector rows, kThreads apart, walked
// without divisions: the thread starts at (vector, unit) and steps by (step_vectors, step_units).
struct Walk {
  bool wide;
  int units;  // per vector
  int vector, unit;
  int step_vectors, step_units;
};

__device__ inline Walk make_walk(bool wide, int dim4) {
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

// Stages key block `kb` (its kKeyBlock vectors from the prefix / own buffers, zeros past its
// last valid key) into a K or V tile. With float4 copies and a vector's units dividing the CTA
// (D a multiple of 4 that divides 1024: 256, 128, 64, ...), each thread keeps one column of
// float4s and walks the vectors kThreads / units apart with one pointer step each; otherwise the
// generic walk. The bytes copied are the same either way.
template <class Block>
__device__ __forceinline__ void stage_keys_tile(float* tile, const Block& kb, const float* prefix,
                                                const float* own, const Walk& w,
                                                const Geometry& g) {
  if (!w.wide || kThreads % w.units != 0) {
    stage_tile(tile, kKeyBlock, w, g, [&](int v) { return kb.vector(prefix, own, v); });
    return;
  }
  // Three runs of vectors: from the prefix, from own, zeros; each a pointer step per vector.
  const int col = 4 * w.unit, step = w.step_vectors;
  const int prefix_end = kb.prefix_vectors < kb.valid ? kb.prefix_vectors : kb.valid;
  const int64_t src_step = int64_t(step) * kb.dim;
  const int dst_step = step * g.pitch;
  int v = w.vector;
  float* dst = tile + v * g.pitch + col;
  if (v < prefix_end) {
    const float* src = prefix + kb.prefix_offset + col + v * kb.dim;
#pragma unroll 4
    for (; v < prefix_end; v += step, src += src_step, dst += dst_step) copy16_async(dst, src);
  }
  if (v < kb.valid) {
    const float* src = own + kb.own_offset + col + v * kb.dim;
#pragma unroll 4
    for (; v < kb.valid; v += step, src += src_step, dst += dst_step) copy16_async(dst, src);
  }
  for (; v < kKeyBlock; v += step, dst += dst_step)
    *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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

__host__ __device__ inline HeadKeys head_keys(const AttentionLaunch& a, int row, int64_t head) {
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

__device__ inline KeyBlock key_block(const HeadKeys& hk, int64_t block, int64_t last_key,
                                     int64_t dim) {
  const int64_t key0 = block * kKeyBlock;
  return {clamp_to_block(hk.prefix_len - key0), clamp_to_block(last_key - key0 + 1), key0 * dim,
          (key0 - hk.prefix_len) * dim, dim};
}

// The keys query row f sees: [lo, hi] (hi = -1, none, past the row's query rows).
struct Reach {
  int64_t lo, hi;
};

__host__ __device__ inline Reach reach_of(const AttentionLaunch& a, const HeadKeys& hk, int64_t f) {
  if (f >= hk.count) return {0, -1};
  const int64_t hi = hk.token_key + f / a.group;
  const int64_t lo = a.window > 0 && hi - a.window + 1 > 0 ? hi - a.window + 1 : 0;
  return {lo, hi};
}

// A query row's splits: `blocks` key blocks each; first / last hold its first and last seen key
// (last < first: it sees none).
struct Split {
  int64_t blocks, first, last;
};

__host__ __device__ inline Split split_of(Reach r) {
  if (r.hi < r.lo) return {1, 0, -1};
  const int64_t blocks = split_blocks(r.hi);
  return {blocks, r.lo / kKeyBlock / blocks, r.hi / kKeyBlock / blocks};
}

// What a query row stores after key block `block` of a walk ending at `walk_last`.
// Local rows (one CTA walks all of a query row's splits) fold each split into a running
// result in the workspace instead: kFoldFirst stores the first split's acc, kFold folds a split
// in, kFoldOutput folds the last one in and stores the output.
enum SplitEnd : int {
  kGoOn = 0,
  kPartial = 1,
  kOutput = 2,
  kFoldFirst = 3,
  kFold = 4,
  kFoldOutput = 5
};

__host__ __device__ inline int split_end(const Split& s, int64_t block, int64_t walk_last) {
  if (s.last < s.first || (((block + 1) & (s.blocks - 1)) != 0 && block != walk_last)) return kGoOn;
  const int64_t split = block / s.blocks;
  if (split < s.first || split > s.last) return kGoOn;
  return s.first == s.last ? kOutput : kPartial;
}

// The workspace record of query row f of `row`, KV head `head`, split `split`.
__host__ __device__ inline int64_t record_index(const AttentionLaunch& a, const Plan& p, int row,
                                                int64_t head, int64_t f, int64_t split) {
  const KvRow& kv = a.kv[row];
  const int64_t G = a.group, key0 = kv.prefix_len + kv.own_before, key = key0 + f / G;
  return p.row_records[row] + (slot_prefix(key) - slot_prefix(key0)) * a.kv_heads * G +
         (head * G + f % G) * split_slots(key) + split;
}

__device__ inline float* record_of(const AttentionLaunch& a, const Plan& p, const Geometry& g,
                                   int row, int64_t head, int64_t f, int64_t split) {
  return a.workspace + record_index(a, p, row, head, f, split) * g.record;
}

__device__ inline float* output_of(const AttentionLaunch& a, int row, int64_t head, int64_t f) {
  const int64_t G = a.group;
  return a.out + ((a.rows.first + row) * a.rows.tokens + f / G) * a.ldo +
         (head * G + f % G) * a.head_dim;
}

// The job of CTA `cta` among jobs [first, first + count) (the last whose cta_begin <= cta).
__host__ __device__ inline const Job& find_job(const Plan& p, int first, int count, int cta) {
  int lo = first, hi = first + count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.jobs[mid].cta_begin <= cta) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return p.jobs[lo];
}

// What CTA `cta` of `job` does: KV head, query rows [x0, x0 + live) of the job, key blocks
// [first_block, last_block] (none when first_block > last_block), zeros past last_key, the
// keys coming from row0's buffers.
struct Task {
  int64_t head, x0;
  int live, row0;
  int64_t first_block, last_block, last_key;
};

__host__ __device__ inline Task task_of(const AttentionLaunch& a, const Plan& p, const Job& job,
                                        int cta, int block_queries) {
  const int64_t local = cta - job.cta_begin;
  const int64_t chunk = job.chunk0 + local % job.chunks, rest = local / job.chunks;
  Task t;
  t.head = rest % a.kv_heads;
  t.x0 = (job.query_blocks - 1 - rest / a.kv_heads) * block_queries;
  t.live = int(job.queries - t.x0 < block_queries ? job.queries - t.x0 : block_queries);
  t.row0 = p.member[job.member_begin];
  const int64_t chunk_first = chunk * job.chunk_blocks, chunk_end = chunk_first + job.chunk_blocks;
  t.first_block = chunk_first > job.key_begin ? chunk_first : job.key_begin;
  t.last_block = (chunk_end < job.key_end ? chunk_end : job.key_end) - 1;
  if (job.shared) {
    t.last_key = int64_t(job.key_end) * kKeyBlock - 1;  // within every member's prefix
  } else {
    const HeadKeys hk = head_keys(a, t.row0, t.head);
    const Reach first = reach_of(a, hk, t.x0), last = reach_of(a, hk, t.x0 + t.live - 1);
    if (first.lo / kKeyBlock > t.first_block) t.first_block = first.lo / kKeyBlock;
    if (last.hi / kKeyBlock < t.last_block) t.last_block = last.hi / kKeyBlock;
    t.last_key = last.hi;
  }
  return t;
}

// Query row x of the job as (row, f); row -1 past the job's query rows.
__host__ __device__ inline int2 query_of(const Plan& p, const Job& job, int64_t x) {
  if (x >= job.queries) return make_int2(-1, 0);
  const int32_t base = p.member_query[job.member_begin];
  int lo = job.member_begin, hi = job.member_end - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.member_query[mid] - base <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return make_int2(p.member[lo], int(x - (p.member_query[lo] - base)));
}

// ---- the softmax step (shared by both kernels, so it is the same code for every query) ----

struct Running {
  float max, sum, alpha;
};

// One query row's step over a key block starting at key0. The row's scores are at
// scores[j * pitch] for key j of the block; they are replaced by the probabilities. The four
// lanes lane % 8 + 8 p (p = 0..3) of the warp run it together for one row. Returns the new max
// and sum, and alpha, the factor that rescales the row's earlier values.
__device__ __noinline__ inline Running softmax_step(float* scores, int pitch, int64_t key0,
                                                    Reach reach, float max, float sum) {
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

// The running result of a query row's splits folded in index order, the same in the kernels
// (local rows) and in the merge kernel: max and l.
struct Fold {
  float max, sum;
};

// Folds a split's (m, l) in; returns the factors of the running acc (x) and of the split's (y).
__device__ __forceinline__ float2 fold_step(Fold& f, float m, float l) {
  const float max = fmaxf(f.max, m);
  const float x = expf(__fsub_rn(f.max, max)), y = expf(__fsub_rn(m, max));
  f.sum = __fmaf_rn(f.sum, x, __fmul_rn(l, y));
  f.max = max;
  return make_float2(x, y);
}

__device__ __forceinline__ float fold_value(float running, float split, float2 w) {
  return __fmaf_rn(running, w.x, __fmul_rn(split, w.y));
}

// What a query row does with its acc at the end of the current key block (shared memory).
struct RowEnd {
  float* dest;  // its partial or fold record, or its output row
  float* fold;  // its fold record (kFold, kFoldOutput)
  float2 w;     // fold factors (kFold, kFoldOutput)
  float sum;    // l of the output (kOutput, kFoldOutput)
  int end;      // SplitEnd
};

// Where a query row's results go: the workspace record of its first split (its splits' records
// follow it; null when it has one split) and its output row (null past a job's query rows).
struct Places {
  float* first_record;
  float* out;
};

__device__ inline Places places_of(const AttentionLaunch& a, const Plan& p, const Geometry& g,
                                   int2 query, int64_t head, const Split& split) {
  if (query.x < 0) return {nullptr, nullptr};
  return {
      split.last > split.first ? record_of(a, p, g, query.x, head, query.y, split.first) : nullptr,
      output_of(a, query.x, head, query.y)};
}

// A query row's RowEnd after its softmax step over key block `block`: folds a local row's split
// in, stores a partial's m and l (when `writer`: one lane per row) and restarts the row's state
// at a split's end.
__device__ __forceinline__ RowEnd row_end(Running& run, Fold& fold, const Geometry& g,
                                          const Places& at, const Split& split, bool local,
                                          int64_t block, int64_t walk_last, bool writer) {
  RowEnd e{nullptr, nullptr, make_float2(0.0f, 0.0f), run.sum, split_end(split, block, walk_last)};
  const int64_t index = block / split.blocks;
  if (e.end == kPartial && local) {
    e.fold = at.first_record;
    if (index == split.first) {
      e.end = kFoldFirst;
      e.dest = e.fold;
      fold = {run.max, run.sum};
    } else {
      e.w = fold_step(fold, run.max, run.sum);
      e.sum = fold.sum;
      e.end = index == split.last ? kFoldOutput : kFold;
      e.dest = e.end == kFold ? e.fold : at.out;
    }
  } else if (e.end == kPartial) {
    e.dest = at.first_record + (index - split.first) * g.record;
    if (writer) {
      e.dest[g.dim4] = run.max;
      e.dest[g.dim4 + 1] = run.sum;
    }
  } else if (e.end == kOutput) {
    e.dest = at.out;
  }
  if (e.end != kGoOn) run = {-INFINITY, 0.0f, 1.0f};
  return e;
}

// The same, published in shared memory for the value step (alpha and the RowEnd; lane < 8 of
// the row's four writes).
__device__ __forceinline__ void end_step(Running& run, Fold& fold, const Geometry& g,
                                         const Places& at, const Split& split, bool local,
                                         int64_t block, int64_t walk_last, float* alpha,
                                         RowEnd* row_end_out) {
  const bool writer = threadIdx.x % 32 < 8;
  const float run_alpha = run.alpha;
  const RowEnd e = row_end(run, fold, g, at, split, local, block, walk_last, writer);
  if (writer) {
    *alpha = run_alpha;
    *row_end_out = e;
  }
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

}  // namespace deg::cuda::att
