// The CUDA backend's f64-accumulated attention (AttendF64Args of kernels/ops.h): the scalar
// trainer's arithmetic per (token, head), one block each. Every score is one f64 dot product
// over qk_dim (one thread's, in index order) rounded to f32 and scaled; exp in f32; the
// normaliser is summed in f64 (each thread's keys in order, then a fixed tree over the block);
// the output sums its keys in index order (each output dim one thread's), y += p_j inv v_j.
// Three passes over the keys (the maximum, the normaliser, the output in tiles of weights in
// shared memory); windows of up to kCache keys compute each score once and keep it in shared
// memory for the later passes, longer windows recompute them in each pass (so any window fits).
//
// Batch invariance: a (token, head)'s result depends on its query, its keys and the block's
// fixed shape only.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxDim = 512;                        // qk_dim and v_dim at most this
constexpr int kDimsPerThread = kMaxDim / kThreads;  // output dims a thread accumulates
constexpr int kTile = 256;                          // keys whose weights are staged at once
constexpr int kCache = 4096;                        // keys whose scores are kept
constexpr int kFastDim = 64;  // head dims at most this read K / V rows staged in shared memory
constexpr int kRows = 64;     // rows staged at once
static_assert(kThreads % kRows == 0 && kTile % kRows == 0);

struct Query {
  const AttentionF64Launch* a;
  const KvRow* kv;
  int64_t slot, half;
};

// The K or V row of position p (prefix, then own keys) of K/V head g.
__device__ const float* kv_at(const KvRow& kv, bool v, int64_t g, int64_t p, int64_t D) {
  if (p < kv.prefix_len) return (v ? kv.prefix_v : kv.prefix_k) + g * kv.prefix_stride + p * D;
  return (v ? kv.own_v : kv.own_k) + g * kv.own_stride + (p - kv.prefix_len) * D;
}

__device__ int64_t token_of(const AttentionF64Launch& a, int64_t j) {
  return a.paired_heads ? j / 2 : j;
}

__device__ int64_t head_of(const AttentionF64Launch& a, const Query& q, int64_t j) {
  return a.paired_heads ? q.slot + (j % 2) * q.half : q.slot;
}

// scale * float(sum_d q[d] k_j[d]) in f64; with the key offset, dims [offset_from, qk_dim) of
// the key come from the previous position's.
__device__ float score(const Query& q, const float* qs, int64_t j) {
  const AttentionF64Launch& a = *q.a;
  const int64_t p = token_of(a, j), g = head_of(a, q, j), dq = a.qk_dim;
  const float* kj = kv_at(*q.kv, false, g, p, a.kv_dim);
  double s = 0;
  if (a.key_offset && p > 0) {
    const float* kp = kv_at(*q.kv, false, g, p - 1, a.kv_dim);
    for (int64_t d = 0; d < a.offset_from; ++d) s += double(qs[d]) * double(kj[d]);
    for (int64_t d = a.offset_from; d < dq; ++d) s += double(qs[d]) * double(kp[d]);
  } else {
    for (int64_t d = 0; d < dq; ++d) s += double(qs[d]) * double(kj[d]);
  }
  return __fmul_rn(a.scale, float(s));  // never fused with the subtraction that follows
}

__global__ void attention_f64_kernel(AttentionF64Launch a) {
  const int i = blockIdx.y;
  const int64_t t = blockIdx.x, h = blockIdx.z, tid = threadIdx.x;
  const int64_t n = (a.rows.first + i) * a.rows.tokens + t;
  float* y = a.out + n * a.ldo + h * a.ho;
  if (t >= a.rows.length[i]) {  // padding: zeroed
    for (int64_t d = tid; d < a.v_dim; d += kThreads) y[d] = 0.0f;
    return;
  }
  const int64_t pos = a.rows.position[i] + t, half = a.heads / 2;
  const int64_t qpos = a.paired_heads ? 2 * pos + h / half : pos;
  int64_t j0 = qpos - a.window > 0 ? qpos - a.window : 0;
  if (a.segment) {  // keys before the token's packed document are hidden
    const int64_t s = a.paired_heads ? 2 * int64_t(a.segment[n]) : int64_t(a.segment[n]);
    j0 = s > j0 ? s : j0;
  }
  const Query q{&a, &a.kv[i], a.paired_heads ? h % half : h, half};

  __shared__ float qs[kMaxDim];
  __shared__ float w[kTile];
  __shared__ float sc[kCache];                 // the scores of up to kCache keys, computed once
  __shared__ float rows[kRows][kFastDim + 1];  // staged K or V rows (staged: see below)
  __shared__ double sums[kThreads];
  __shared__ float maxes[kThreads];
  const float* qh = a.q + n * a.ldq + h * a.hq;
  for (int64_t d = tid; d < a.qk_dim; d += kThreads) qs[d] = qh[d];
  __syncthreads();

  // Windows of up to kCache keys keep their scores (each thread its own keys', so the values
  // and their order are those of recomputing them); longer ones recompute in every pass. Heads
  // up to kFastDim wide read the key rows (the key offset's dims taken from the previous key)
  // and value rows through shared memory, kRows keys at a time loaded coalesced; thread tid
  // still takes keys tid, tid + kThreads, ... of the window.
  const int64_t nk = qpos - j0 + 1;
  const bool cached = nk <= kCache, staged = a.qk_dim <= kFastDim && a.v_dim <= kFastDim;
  auto stage_rows = [&](int64_t lo, int64_t m, bool v) {  // keys [lo, lo + m) of the window
    __syncthreads();                                      // the previous rows are used up
    for (int64_t e = tid; e < kRows * kFastDim; e += kThreads) {
      const int64_t r = e / kFastDim, d = e % kFastDim;
      if (r >= m || d >= (v ? a.v_dim : a.qk_dim)) continue;
      const int64_t j = j0 + lo + r, p = token_of(a, j), g = head_of(a, q, j);
      const bool from_prev = !v && a.key_offset && p > 0 && d >= a.offset_from;
      rows[r][d] = kv_at(*q.kv, v, g, from_prev ? p - 1 : p, a.kv_dim)[d];
    }
    __syncthreads();
  };
  float mx = -INFINITY;
  if (cached && staged) {
    for (int64_t b = 0; b < nk; b += kThreads)
      for (int64_t part = 0; part < kThreads / kRows; ++part) {
        const int64_t lo = b + part * kRows;
        stage_rows(lo, nk - lo < kRows ? nk - lo : kRows, false);
        if (tid / kRows != part || b + tid >= nk) continue;
        const float* kr = rows[tid % kRows];
        double s = 0;  // score()'s sum: the key offset's dims are already the previous key's
        for (int64_t d = 0; d < a.qk_dim; ++d) s += double(qs[d]) * double(kr[d]);
        sc[b + tid] = __fmul_rn(a.scale, float(s));
        mx = fmaxf(mx, sc[b + tid]);
      }
  } else {
    for (int64_t j = j0 + tid; j <= qpos; j += kThreads) {
      const float s = score(q, qs, j);
      if (cached) sc[j - j0] = s;
      mx = fmaxf(mx, s);
    }
  }
  maxes[tid] = mx;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s) maxes[tid] = fmaxf(maxes[tid], maxes[tid + s]);
    __syncthreads();
  }
  mx = maxes[0];

  double sum = 0;
  for (int64_t j = j0 + tid; j <= qpos; j += kThreads)
    sum += double(expf((cached ? sc[j - j0] : score(q, qs, j)) - mx));
  sums[tid] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s) sums[tid] += sums[tid + s];
    __syncthreads();
  }
  const float inv = float(1.0 / sums[0]);

  float acc[kDimsPerThread] = {};
  for (int64_t base = j0; base <= qpos; base += kTile) {
    const int64_t count = qpos - base + 1 < kTile ? qpos - base + 1 : kTile;
    for (int64_t jj = tid; jj < count; jj += kThreads)
      w[jj] = expf((cached ? sc[base + jj - j0] : score(q, qs, base + jj)) - mx) * inv;
    __syncthreads();
    if (staged) {  // the values' rows through shared memory (the same sums)
      for (int64_t sub = 0; sub < count; sub += kRows) {
        const int64_t m = count - sub < kRows ? count - sub : kRows;
        stage_rows(base - j0 + sub, m, true);
        if (tid < a.v_dim)
          for (int64_t r = 0; r < m; ++r) acc[0] += w[sub + r] * rows[r][tid];
      }
      __syncthreads();
      continue;
    }
    for (int64_t jj = 0; jj < count; ++jj) {
      const int64_t j = base + jj;
      const float* vj = kv_at(*q.kv, true, head_of(a, q, j), token_of(a, j), a.kv_dim);
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        const int64_t d = tid + int64_t(k) * kThreads;
        if (d < a.v_dim) acc[k] += w[jj] * vj[d];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int64_t d = tid + int64_t(k) * kThreads;
    if (d < a.v_dim) y[d] = acc[k];
  }
}

}  // namespace

cudaError_t launch_attention_f64(const AttentionF64Launch& a, cudaStream_t stream) {
  if (a.rows.count == 0 || a.rows.tokens == 0 || a.heads == 0) return cudaSuccess;
  if (a.qk_dim > kMaxDim || a.v_dim > kMaxDim || (a.paired_heads && a.heads % 2))
    return cudaErrorInvalidValue;
  attention_f64_kernel<<<dim3(unsigned(a.rows.tokens), unsigned(a.rows.count), unsigned(a.heads)),
                         kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace deg::cuda
