// The bf16 tensor-core attention (AttentionLaunch::bf16, head dims up to 256): every job of such
// a launch runs here, so a query's bits never depend on which kernel its batch sends it to. The
// jobs, splits, folds and merge are attention.cu's (its top comment); what differs is how a CTA
// computes its 64 query rows over a key block.
//
// First the launch's K/V are rounded to bf16, once, into the workspace (attention_plan.cuh,
// KvCopy: a prefix shared by fork rows is copied once), so each key block is a 16-byte cp.async
// per 8 dims of a key, with no conversion in the attention kernel's loop.
//
// Then the FlashAttention-2 layout: 4 warps, each owning 16 whole query rows. Per key block:
//   1. scores: S = Q K^T by mma.sync m16n8k16 (bf16 operands, f32 accumulation), Q (rounded to
//      bf16 once per CTA) and K by ldmatrix;
//      then s = scale * S (one rounding, as attention.cu's kernels);
//   2. softmax step in registers: lane l holds query rows l / 4 and l / 4 + 8 of its warp, keys
//      8 n + 2 (l % 4) (+1), n < 8; the block max over the seen keys (max: order-free), reduced
//      over the row's four lanes; alpha = 1 when the max stays, else exp(m - m'); p = exp(s - m')
//      for seen keys, exactly 0 otherwise; the block sum is each lane's 16 terms in (n, c) order,
//      then lanes (0 + 1) + (2 + 3) (every lane of the row gets the same bits: f32 addition is
//      commutative); l = l alpha + sum;
//   3. values: acc = acc alpha, then acc += P V by mma.sync, P (rounded to bf16) taken straight
//      from the score registers as the A operand, V by ldmatrix.trans;
//   4. rows whose split ends at this block store (or fold) their acc and start afresh
//      (row_end: attention_common.cuh).
// Each element of a product depends only on its own row of A and column of B, in an order fixed
// by the hardware and the k loop (dims and keys always walked from 0), never on the CTA's other
// rows; zero-filled keys (past the CTA's last key) and masked keys add exact zeros. So a query's
// output depends on its q, its keys and D only: batch invariant, and the same in a prefill, a
// chunked read, a packed fork job or a decode step.
//
// Shared memory: K, V and Q tiles [64][dims + 8] bf16 (rows 16 bytes apart in bank terms, so
// ldmatrix reads 8 rows without conflicts) and the CTA's query rows' reach and split: 105,984
// bytes at D = 256, two CTAs (8 warps) per SM. (Q fragments held in registers instead would
// spill at D = 256: the accumulator alone is 128 registers.) K of block b + 1 loads during the
// softmax and values of b, V of b + 1 during the scores of b + 1.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace deg::cuda::att {

constexpr int kMmaThreads = 128;  // 4 warps x 16 query rows = kBlockQueries
constexpr int kTilePad = 8;       // bf16 per tile row past the dims
constexpr int kCopyThreads = 256;
static_assert(kMmaThreads / 32 * 16 == kBlockQueries, "a warp per 16 of a CTA's query rows");
static_assert(sizeof(AttentionLaunch) + sizeof(Plan) + sizeof(KvCopy) + sizeof(Geometry) <= 32000,
              "kernel parameters past sm_90's 32 KB");

// ---- the bf16 copy ----

// Thread t of a CTA takes 8 dims of one key vector (K and V): the CTA covers kCopyThreads /
// (dims / 8) vectors of the regions' concatenation.
__global__ void __launch_bounds__(kCopyThreads)
    kv_copy_kernel(const __grid_constant__ KvCopy c, int64_t kv_heads, int64_t head_dim) {
  const int parts = c.dims / 8, per_cta = kCopyThreads / parts;
  const int64_t vector = int64_t(blockIdx.x) * per_cta + threadIdx.x / parts;
  const int part = int(threadIdx.x) % parts;
  if (threadIdx.x >= per_cta * parts || vector >= c.vectors_end[c.regions - 1]) return;
  int r = 0;
  while (c.vectors_end[r] <= vector) ++r;
  const KvRegion& g = c.region[r];
  const int64_t local = vector - (r > 0 ? c.vectors_end[r - 1] : 0);
  const int64_t head = local / g.keys, key = local % g.keys;
  const int64_t src = head * g.stride + key * head_dim, d0 = 8 * int64_t(part);
  __nv_bfloat16* const dst = static_cast<__nv_bfloat16*>(c.data) + g.offset + local * c.dims + d0;
  const int64_t v_offset = kv_heads * g.keys * c.dims;
  for (int kv = 0; kv < 2; ++kv) {
    const float* s = (kv == 0 ? g.k : g.v) + src;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = d0 + i < head_dim ? s[d0 + i] : 0.0f;
    uint4 packed;
    __nv_bfloat162 h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    packed.x = *reinterpret_cast<const uint32_t*>(&h[0]);
    packed.y = *reinterpret_cast<const uint32_t*>(&h[1]);
    packed.z = *reinterpret_cast<const uint32_t*>(&h[2]);
    packed.w = *reinterpret_cast<const uint32_t*>(&h[3]);
    *reinterpret_cast<uint4*>(dst + kv * v_offset) = packed;
  }
}

// A CTA query row: which (row, f) it is, what it sees and how its splits fall.
struct MmaQuery {
  int2 query;  // row -1: past the job's query rows
  int local;
  Reach reach;
  Split split;
  Places at;
};

// ---- split ends ----
//
// A query row's acc (the lane's columns 8 j + 2 t4 and + 1 of row h) at its split's end: folded
// into the running result (kFold), divided by l (kOut), stored and zeroed. Records (dim4 + 4
// floats) are 8-byte aligned, and so is an output row when g.out_wide: column pairs go as one
// float2. Without kChecked every column is below D (D == the kernel's dims) and pairs are
// allowed; the fold record's columns are loaded 16 pairs at a time before any is used.
template <int kTiles, bool kFold, bool kOut>
__device__ __forceinline__ void store_split(float (&acc)[kTiles][4], int h, int t4,
                                            const RowEnd& e) {
  constexpr int kHalf = kTiles / 2;
#pragma unroll
  for (int j0 = 0; j0 < kTiles; j0 += kHalf) {
    float2 f[kHalf];
    if constexpr (kFold) {
#pragma unroll
      for (int j = 0; j < kHalf; ++j)
        f[j] = *reinterpret_cast<const float2*>(e.fold + 8 * (j0 + j) + 2 * t4);
    }
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      float* const v = acc[j0 + j] + 2 * h;
      float r0 = v[0], r1 = v[1];
      if constexpr (kFold) {
        r0 = fold_value(f[j].x, r0, e.w);
        r1 = fold_value(f[j].y, r1, e.w);
      }
      if constexpr (kOut) {
        r0 = __fdiv_rn(r0, e.sum);
        r1 = __fdiv_rn(r1, e.sum);
      }
      *reinterpret_cast<float2*>(e.dest + 8 * (j0 + j) + 2 * t4) = make_float2(r0, r1);
      v[0] = 0.0f;
      v[1] = 0.0f;
    }
  }
}

// The same with the columns checked against D (a head dim below the kernel's dims, or an output
// row that takes no float2).
template <int kTiles>
__device__ __forceinline__ void store_split_checked(float (&acc)[kTiles][4], int h, int t4,
                                                    const RowEnd& e, int D, bool pairs) {
  const bool folds = e.end == kFold || e.end == kFoldOutput;
  const bool output = e.end == kOutput || e.end == kFoldOutput;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int col = 8 * j + 2 * t4;
    float* const v = acc[j] + 2 * h;
    float r0 = v[0], r1 = v[1];
    if (folds && col < D) {
      const float2 f = *reinterpret_cast<const float2*>(e.fold + col);
      r0 = fold_value(f.x, r0, e.w);
      r1 = fold_value(f.y, r1, e.w);
    }
    if (output) {
      r0 = __fdiv_rn(r0, e.sum);
      r1 = __fdiv_rn(r1, e.sum);
    }
    if (pairs) {
      if (col < D) *reinterpret_cast<float2*>(e.dest + col) = make_float2(r0, r1);
    } else {
      if (col < D) e.dest[col] = r0;
      if (col + 1 < D) e.dest[col + 1] = r1;
    }
    v[0] = 0.0f;
    v[1] = 0.0f;
  }
}

// ---- the kernel ----

template <int kSteps>
__global__ void __launch_bounds__(kMmaThreads, 2)
    attention_mma_kernel(const __grid_constant__ AttentionLaunch a, const __grid_constant__ Plan p,
                         const __grid_constant__ KvCopy c, const Geometry g) {
  constexpr int kDims = 16 * kSteps, kPitch = kDims + kTilePad, kValueTiles = 2 * kSteps;
  constexpr int kParts = kDims / 8;  // 16-byte parts of a key vector
  extern __shared__ float4 shared[];
  __nv_bfloat16* const k_tile = reinterpret_cast<__nv_bfloat16*>(shared);  // [64 keys][kPitch]
  __nv_bfloat16* const v_tile = k_tile + kKeyBlock * kPitch;               // [64 keys][kPitch]
  __nv_bfloat16* const q_tile = v_tile + kKeyBlock * kPitch;  // [64 query rows][kPitch]
  MmaQuery* const queries = reinterpret_cast<MmaQuery*>(q_tile + kBlockQueries * kPitch);

  const Job& job = find_job(p, 0, p.block_jobs, int(blockIdx.x));
  const Task task = task_of(a, p, job, int(blockIdx.x), kBlockQueries);
  if (task.first_block > task.last_block) return;
  const int64_t head = task.head, G = a.group, D = g.head_dim;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, t4 = lane % 4;
  const int row0 = 16 * warp + lane / 4;  // the lane's query rows: row0 and row0 + 8

  if (threadIdx.x < kBlockQueries) {
    MmaQuery q;
    q.query = query_of(p, job, task.x0 + int64_t(threadIdx.x));
    q.reach = q.query.x < 0 ? Reach{0, -1} : reach_of(a, head_keys(a, q.query.x, head), q.query.y);
    q.split = split_of(q.reach);
    q.local = q.query.x >= 0 && p.row_local[q.query.x];
    q.at = places_of(a, p, g, q.query, head, q.split);
    queries[threadIdx.x] = q;
  }

  // Keys come from row0's copies (a packed job's members share the prefix).
  const __nv_bfloat16* const data = static_cast<const __nv_bfloat16*>(c.data);
  const int key_row = task.row0;
  const int64_t prefix_len = a.kv[key_row].prefix_len;
  const int64_t prefix_k = c.prefix_base[key_row] + head * c.prefix_head[key_row];
  const int64_t own_k = c.own_base[key_row] + head * c.own_head[key_row];
  // A thread copies 16 bytes (part) of keys v0, v0 + kStride, ... of a block: pointer steps
  // from the block's first such key in the prefix and in own, the two limits as block offsets.
  constexpr int kStride = kMmaThreads / kParts;
  const int v0 = int(threadIdx.x) / kParts, part = int(threadIdx.x) % kParts;
  auto stage = [&](__nv_bfloat16* tile, int64_t block, bool values) {
    const int64_t first = block * kKeyBlock + v0;
    const __nv_bfloat16* const from_prefix =
        data + (prefix_k + (values ? c.prefix_v[key_row] : 0) + first * kDims + 8 * part);
    const __nv_bfloat16* const from_own =
        data + (own_k + (values ? c.own_v[key_row] : 0) + (first - prefix_len) * kDims + 8 * part);
    auto clamp = [](int64_t x) { return int(x < -1 ? -1 : x > kKeyBlock ? kKeyBlock : x); };
    const int in_prefix = clamp(prefix_len - first), valid = clamp(task.last_key - first + 1);
    __nv_bfloat16* const dst = tile + v0 * kPitch + 8 * part;
    if (valid >= kKeyBlock && (in_prefix <= 0 || in_prefix >= kKeyBlock)) {  // one buffer
      const __nv_bfloat16* const src = in_prefix <= 0 ? from_own : from_prefix;
#pragma unroll
      for (int i = 0; i < kKeyBlock / kStride; ++i)
        copy16_or_zero(dst + kStride * i * kPitch, src + kStride * i * kDims, 16);
      return;
    }
#pragma unroll
    for (int i = 0; i < kKeyBlock / kStride; ++i) {
      const int dk = kStride * i;
      const __nv_bfloat16* src = dk < in_prefix ? from_prefix + dk * kDims : from_own + dk * kDims;
      copy16_or_zero(dst + dk * kPitch, dk < valid ? src : data, dk < valid ? 16 : 0);
    }
  };

  const int64_t first_block = task.first_block, last_block = task.last_block;
  stage(k_tile, first_block, false);
  commit_copies();
  stage(v_tile, first_block, true);
  commit_copies();
  __syncthreads();  // the query rows

  // The Q tile, rounded to bf16 once (zeros past D and past the job's query rows).
  for (int e = int(threadIdx.x); e < kBlockQueries * kParts; e += kMmaThreads) {
    const int v = e / kParts, d0 = 8 * (e % kParts);
    const int2 q = queries[v].query;
    const float* src = q.x < 0 ? nullptr
                               : a.q + ((a.rows.first + q.x) * a.rows.tokens + q.y / G) * a.ldq +
                                     (head * G + q.y % G) * D;
    uint32_t packed[4];
    if (src && g.q_wide && d0 + 8 <= D) {
      const float4 x = *reinterpret_cast<const float4*>(src + d0);
      const float4 y = *reinterpret_cast<const float4*>(src + d0 + 4);
      packed[0] = pack_bf16(x.x, x.y);
      packed[1] = pack_bf16(x.z, x.w);
      packed[2] = pack_bf16(y.x, y.y);
      packed[3] = pack_bf16(y.z, y.w);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = d0 + 2 * i;
        packed[i] = pack_bf16(src && d < D ? src[d] : 0.0f, src && d + 1 < D ? src[d + 1] : 0.0f);
      }
    }
    *reinterpret_cast<uint4*>(q_tile + v * kPitch + d0) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }

  Running run[2] = {{-INFINITY, 0.0f, 1.0f}, {-INFINITY, 0.0f, 1.0f}};
  Fold fold[2] = {{-INFINITY, 0.0f}, {-INFINITY, 0.0f}};
  float acc[kValueTiles][4] = {};
  // ldmatrix row addresses: Q (the warp's rows g and g + 8, dims of a k step's halves), K (keys
  // of n-tiles 2 np and 2 np + 1, dims of a k step's halves) and V (keys of a k step's halves,
  // value tiles 2 j and 2 j + 1).
  const __nv_bfloat16* const q_rows =
      q_tile + (16 * warp + ((lane / 8) % 2) * 8 + lane % 8) * kPitch + (lane / 16) * 8;
  const int k_key = (lane / 16) * 8 + lane % 8, k_dim = ((lane / 8) % 2) * 8;
  const int v_key = ((lane / 8) % 2) * 8 + lane % 8, v_dim = (lane / 16) * 8;

  for (int64_t block = first_block; block <= last_block; ++block) {
    wait_copies<1>();  // this block's K
    __syncthreads();   // (and, the first time, the Q tile)

    float s[8][4] = {};
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      uint32_t qf[4];
      load_matrices(qf, q_rows + 16 * k);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        load_matrices(b, k_tile + (16 * np + k_key) * kPitch + 16 * k + k_dim);
        mma_bf16(s[2 * np], qf, b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp's scores: the K tile is free

    if (block < last_block) stage(k_tile, block + 1, false);
    commit_copies();

    // The softmax step of the lane's two rows.
    const int64_t key0 = block * kKeyBlock;
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Reach r = queries[row0 + 8 * h].reach;
      auto clamp = [](int64_t x) { return int(x < -1 ? -1 : x > kKeyBlock ? kKeyBlock : x); };
      const int lo = clamp(r.lo - key0), hi = clamp(r.hi - key0);  // the seen keys of the block
      // Every key of the block seen (blocks before the diagonal and inside a window): no
      // tests, the same operations.
      const bool whole = lo <= 0 && hi >= kKeyBlock - 1;
      float block_max = -INFINITY;
      if (whole) {
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[n][2 * h + e];
            x = __fmul_rn(x, g.scale);
            block_max = fmaxf(block_max, x);
          }
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = 8 * n + 2 * t4 + e;
            float& x = s[n][2 * h + e];
            x = __fmul_rn(x, g.scale);
            if (j >= lo && j <= hi) block_max = fmaxf(block_max, x);
          }
      }
      block_max = fmaxf(block_max, __shfl_xor_sync(kFullWarp, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(kFullWarp, block_max, 2));
      const float max = run[h].max, new_max = fmaxf(max, block_max);
      alpha[h] = new_max == max ? 1.0f : expf(__fsub_rn(max, new_max));
      float block_sum = 0.0f;
      if (whole) {
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[n][2 * h + e];
            x = expf(__fsub_rn(x, new_max));
            block_sum = __fadd_rn(block_sum, x);
          }
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = 8 * n + 2 * t4 + e;
            float& x = s[n][2 * h + e];
            x = j >= lo && j <= hi ? expf(__fsub_rn(x, new_max)) : 0.0f;
            block_sum = __fadd_rn(block_sum, x);
          }
      }
      block_sum = __fadd_rn(block_sum, __shfl_xor_sync(kFullWarp, block_sum, 1));
      block_sum = __fadd_rn(block_sum, __shfl_xor_sync(kFullWarp, block_sum, 2));
      run[h] = {new_max, __fadd_rn(__fmul_rn(run[h].sum, alpha[h]), block_sum), alpha[h]};
    }

    wait_copies<1>();  // this block's V
    __syncthreads();

#pragma unroll
    for (int j = 0; j < kValueTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = __fmul_rn(acc[j][e], alpha[e / 2]);
#pragma unroll
    for (int k = 0; k < kKeyBlock / 16; ++k) {
      const uint32_t pa[4] = {
          pack_bf16(s[2 * k][0], s[2 * k][1]), pack_bf16(s[2 * k][2], s[2 * k][3]),
          pack_bf16(s[2 * k + 1][0], s[2 * k + 1][1]), pack_bf16(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
      for (int jp = 0; jp < kSteps; ++jp) {
        uint32_t b[4];
        load_matrices_transposed(b, v_tile + (16 * k + v_key) * kPitch + 16 * jp + v_dim);
        mma_bf16(acc[2 * jp], pa, b[0], b[1]);
        mma_bf16(acc[2 * jp + 1], pa, b[2], b[3]);
      }
    }

    // Rows whose split ends here store (or fold) their acc and start afresh.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const MmaQuery& q = queries[row0 + 8 * h];
      if (split_end(q.split, block, last_block) == kGoOn) continue;
      const RowEnd e =
          row_end(run[h], fold[h], g, q.at, q.split, q.local != 0, block, last_block, t4 == 0);
      const bool output = e.end == kOutput || e.end == kFoldOutput;
      if (D != kDims || (output && !g.out_wide)) {
        store_split_checked(acc, h, t4, e, int(D), !output || g.out_wide);
      } else if (e.end == kOutput) {
        store_split<kValueTiles, false, true>(acc, h, t4, e);
      } else if (e.end == kFold) {
        store_split<kValueTiles, true, false>(acc, h, t4, e);
      } else if (e.end == kFoldOutput) {
        store_split<kValueTiles, true, true>(acc, h, t4, e);
      } else {  // kPartial, kFoldFirst
        store_split<kValueTiles, false, false>(acc, h, t4, e);
      }
    }
    __syncthreads();  // every warp's values: the V tile is free

    if (block < last_block) stage(v_tile, block + 1, true);
    commit_copies();
  }
}

template <int kSteps>
cudaError_t launch_mma(const AttentionLaunch& a, const Plan& p, const KvCopy& c, const Geometry& g,
                       cudaStream_t stream) {
  const size_t bytes =
      sizeof(__nv_bfloat16) * (2 * kKeyBlock + kBlockQueries) * (16 * kSteps + kTilePad) +
      sizeof(MmaQuery) * kBlockQueries;
  auto* kernel = attention_mma_kernel<kSteps>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  kernel<<<unsigned(p.block_ctas), dim3(kMmaThreads), bytes, stream>>>(a, p, c, g);
  return cudaGetLastError();
}

cudaError_t run_mma_kernels(const AttentionLaunch& a, const Plan& p, const KvCopy& c,
                            const Geometry& g, cudaStream_t stream) {
  if (p.block_ctas <= 0) return cudaSuccess;
  if (c.regions > 0) {
    const int64_t per_cta = kCopyThreads / (c.dims / 8);
    const int64_t vectors = c.vectors_end[c.regions - 1];
    kv_copy_kernel<<<unsigned(ceil_div(vectors, per_cta)), dim3(kCopyThreads), 0, stream>>>(
        c, a.kv_heads, a.head_dim);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  switch (c.dims) {
    case 64: return launch_mma<4>(a, p, c, g, stream);
    case 128: return launch_mma<8>(a, p, c, g, stream);
    default: return launch_mma<16>(a, p, c, g, stream);
  }
}

}  // namespace deg::cuda::att
