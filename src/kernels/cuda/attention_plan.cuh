// What the CUDA attention's kernels (attention.cu) and its host-made plan (attention_plan.cu)
// share: the sizes, the split geometry (host and device), and the plan of jobs passed to the
// kernels by value. attention.cu's top comment says how the pieces fit.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda::att {

constexpr int kThreads = 256;
constexpr int kKeyBlock = 64;         // keys per softmax block, aligned at key index 0
constexpr int kBlockQueries = 64;     // query rows per block-kernel CTA
constexpr int kFewQueries = 8;        // query rows per few-query CTA
constexpr int kWideQueries = 32;      // query rows per CTA of the few kernel's wide form
constexpr int64_t kFewLimit = 16;     // a row's own job with n G <= this runs in the few kernel
                                      // (every job when D > kMaxHeadDim: its wide form)
constexpr int64_t kPackQueries = 16;  // rows sharing a prefix pack from this many query rows
constexpr int kMaxHeadDim = 256;      // the block kernel's and the narrow few kernel's
constexpr int kMaxWideHeadDim = 512;  // the few kernel's wide form (every job past kMaxHeadDim)
constexpr int kBlockProbPitch = 72;   // floats per key of the block kernel's probabilities
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kMaxJobs = 2 * kRows;  // a packed job per group (>= 2 rows) and one per row
constexpr int kMergeWarps = kThreads / 32;
constexpr int kCtasPerSm = 4;  // the chunking aims at this many CTAs per SM, when needed

// ---- the split geometry (host and device) ----

constexpr int64_t kFineKeys = 1024;   // below: splits of 1 key block
constexpr int64_t kMidBlocks = 16;    // then splits of 16 blocks (1024 keys)
constexpr int64_t kWideKeys = 16384;  // from here: 32 blocks, doubling per doubling of the key
constexpr int64_t kMaxSplits = 32;

// Key blocks per split of a query row with key index `key` (a power of 2, never smaller for a
// larger key).
__host__ __device__ inline int64_t split_blocks(int64_t key) {
  if (key < kFineKeys) return 1;
  if (key < kWideKeys) return kMidBlocks;
  int64_t blocks = 2 * kMidBlocks;
  for (int64_t k = key / kWideKeys; k > 1; k /= 2) blocks *= 2;
  return blocks;
}

// Workspace records of a query row with key index `key`: its last split + 1 (at most 32).
__host__ __device__ inline int64_t split_slots(int64_t key) {
  if (key < kFineKeys) return key / kKeyBlock + 1;
  if (key < kWideKeys) return key / (kMidBlocks * kKeyBlock) + 1;
  return kMaxSplits;
}

// sum of k / w (rounded down) over k in [0, x).
__host__ __device__ inline int64_t floor_sum(int64_t x, int64_t w) {
  const int64_t q = x / w, r = x % w;
  return w * (q * (q - 1) / 2) + r * q;
}

// sum of split_slots(k) over k in [0, x).
__host__ __device__ inline int64_t slot_prefix(int64_t x) {
  const int64_t fine = x < kFineKeys ? x : kFineKeys;
  int64_t s = fine + floor_sum(fine, kKeyBlock);
  if (x > kFineKeys) {
    const int64_t mid = x < kWideKeys ? x : kWideKeys;
    s += mid - kFineKeys + floor_sum(mid, kMidBlocks * kKeyBlock) -
         floor_sum(kFineKeys, kMidBlocks * kKeyBlock);
  }
  if (x > kWideKeys) s += kMaxSplits * (x - kWideKeys);
  return s;
}

// ---- the plan: jobs (host-made, passed by value) ----

// Query rows [0, queries) of the job are its members' query rows in member order; key blocks
// [key_begin, key_end) are cut into chunks of chunk_blocks aligned at block 0 (chunk0 is the
// first chunk holding a block of the range). CTAs: (query block from the last, KV head, chunk),
// the chunk fastest.
struct Job {
  int32_t cta_begin;                 // the job's first CTA in its kernel's grid
  int16_t member_begin, member_end;  // Plan::member[member_begin, member_end)
  int32_t queries, query_blocks;
  int32_t key_begin, key_end;
  int32_t chunk_blocks, chunk0, chunks;
  int32_t shared;  // nonzero: the keys are the members' common prefix (a packed job)
};

struct Plan {
  int32_t block_jobs, few_jobs;  // jobs[0, block_jobs), then the few kernel's
  int32_t block_ctas, few_ctas;
  int64_t records;        // workspace records
  int64_t merge_queries;  // the most query rows (n kv_heads G) of a row with records
  Job jobs[kMaxJobs];
  uint8_t member[kRows];        // rows, each once, a packed group's rows side by side
  int32_t member_query[kRows];  // query rows of the group's members before this one
  int64_t row_records[kRows];   // row i's first record; -1: the row has none
  uint8_t row_local[kRows];     // 1: one CTA walks every split of each of the row's query rows
  int32_t merge_rows;           // rows with records that are not local
};

// Launch-wide sizes and layout choices (host-computed).
struct Geometry {
  int head_dim;   // D
  int dim4;       // D rounded up to 4: the dot products run over dim4 dims (zeros past D)
  int pitch;      // floats per Q / K / V row in shared memory
  int record;     // floats per workspace record: acc [dim4], m, l, 2 spare
  bool q_wide;    // Q rows are 16-byte aligned with D % 4 == 0: float4 copies
  bool kv_wide;   // the same for every K / V row of the chunk
  bool out_wide;  // the same for the output rows: float4 stores
  float scale;
};

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---- the bf16 copy of the keys a tensor-core launch reads (attention_mma.cu) ----
//
// A bf16 launch (AttentionLaunch::bf16, D <= kMaxHeadDim) first rounds the K/V its jobs read to
// bf16, once, into the workspace after the split records: one region per distinct prefix (rows
// sharing a trunk share it) and one per row's own keys, each [kv_heads][keys][dims] of K, then
// the same of V, dims = D rounded up to the tensor-core kernel's (64, 128 or 256; zeros past D).
// A region holds keys [first, end) of its buffer: from the earliest key block any of its rows'
// jobs reads (a sliding window reads only the tail) to the buffer's last key the launch sees.

constexpr int kMaxRegions = 2 * kRows;

struct KvRegion {
  const float* k;  // the source's key `first`, head 0 (head h at + h stride, key j at + j D)
  const float* v;
  int64_t stride;  // source floats per head
  int64_t keys;    // keys copied per head
  int64_t offset;  // bf16 elements from the copy's start to the region's K (its V follows)
};

struct KvCopy {
  void* data;  // the copy (bf16), 16-byte aligned; null when the launch makes none
  int dims;    // bf16 elements per key: D rounded up to 64, 128 or 256
  int regions;
  int64_t elements;                  // bf16 elements of the copy
  int64_t vectors_end[kMaxRegions];  // vectors (kv_heads keys) of regions [0, r], cumulative
  KvRegion region[kMaxRegions];
  // Row i's keys in the copy (elements from `data`): key j < prefix_len of KV head h at
  // prefix_base + h prefix_head + j dims, own key j at own_base + h own_head + j dims; V at
  // + prefix_v / own_v from K. Bases are virtual (a region's offset less first * dims), used
  // only for keys the region holds.
  int64_t prefix_base[kRows], prefix_head[kRows], prefix_v[kRows];
  int64_t own_base[kRows], own_head[kRows], own_v[kRows];
};

// True when the launch runs in the tensor-core kernel (and so makes a bf16 copy).
bool uses_copy(const AttentionLaunch& a);
// The copy's dims for head dim D.
int copy_dims(int64_t head_dim);
// The regions and row bases of a launch's copy (data left null); elements 0 when it makes none.
void plan_kv_copy(const AttentionLaunch& a, KvCopy& c);
// Floats of workspace before the copy: the split records, rounded up to 16 bytes.
int64_t records_floats(const AttentionLaunch& a, const Plan& p);
// The copy and the tensor-core kernel of a launch's jobs (attention_mma.cu).
cudaError_t run_mma_kernels(const AttentionLaunch& a, const Plan& p, const KvCopy& c,
                            const Geometry& g, cudaStream_t stream);

// ---- the host side (attention_plan.cu) ----

bool aligned16(const void* p);
// The launch is within what the kernels handle (head dim, group, KV heads, rows).
bool valid_launch(const AttentionLaunch& a);
// Floats per workspace record: acc [D rounded up to 4], m, l, 2 spare.
int record_floats(const AttentionLaunch& a);
// Each row's workspace records (row_records, records, merge_queries of the plan).
void plan_records(const AttentionLaunch& a, Plan& p);
// Sizes and copy widths of a launch (alignment of every Q, K, V and output row).
Geometry geometry_of(const AttentionLaunch& a);
// The jobs and CTAs of a launch; false past the grid's limits.
bool make_plan(const AttentionLaunch& a, Plan& p);

}  // namespace deg::cuda::att
