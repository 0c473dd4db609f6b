// The CUDA backend's attention_f64 backward (AttendF64BackwardArgs of kernels/ops.h, launch.h
// AttentionF64BackwardLaunch): two kernels that recompute the forward's scores, each output
// element summed by one thread in a fixed order, so no result depends on the launch shape or on
// the other rows of the call (no atomics).
//  - queries: one block per (token, head), as the forward. The softmax's maximum and 1 / sum
//    (the forward's arithmetic) and D = sum_j p_j dp_j (dp_j = dout . v_j), kept per (token,
//    head) for the keys' kernel, then dq (each dim one thread's, keys in order).
//  - keys: one block per (key, K/V head). dK and dV summed over the queries that read the key,
//    in query order (each dim one thread's), added into the gradient once. A row's own keys are
//    its alone, so their blocks run over all rows at once; prefix keys (a fork call's rows read
//    their prefix call's keys, several rows the same ones) get one block per position that takes
//    the rows in order, so a shared key adds the rows' shares in row order.
//
// Virtual positions: with paired heads, heads slot and slot + H/2 read one interleaved sequence
// (head slot + e half at position p sits at 2 p + e, its queries and its keys alike); unpaired, a
// head's positions are the tokens' (step 1). A query at virtual position qv reads the keys
// [max(qv - window, its document's start), qv]. With the key offset a key's dims from
// offset_from on are read from the key one position before, so those dims of key p take the
// shares of the pairs that read key p + 1 (key 0 keeps its own as well, added first per query).
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

constexpr int kAttnThreads = 128;
constexpr int kMaxDim = 512;  // qk_dim and v_dim at most this
constexpr int kDimsPerThread = kMaxDim / kAttnThreads;
constexpr int kTile = 256;  // keys whose dq weights are staged at once

__device__ const float* kv_at(const KvRow& kv, bool v, int64_t g, int64_t p, int64_t D) {
  if (p < kv.prefix_len) return (v ? kv.prefix_v : kv.prefix_k) + g * kv.prefix_stride + p * D;
  return (v ? kv.own_v : kv.own_k) + g * kv.own_stride + (p - kv.prefix_len) * D;
}

// Key p's gradient row of K/V head g (null: that part's gradient is not wanted).
__device__ float* grad_at(const KvRow& kv, bool v, int64_t g, int64_t p, int64_t D) {
  float* base = p < kv.prefix_len ? const_cast<float*>(v ? kv.prefix_v : kv.prefix_k)
                                  : (v ? kv.own_v : kv.own_k);
  if (!base) return nullptr;
  return base + (p < kv.prefix_len ? g * kv.prefix_stride + p * D
                                   : g * kv.own_stride + (p - kv.prefix_len) * D);
}

// The geometry of one call's heads.
struct Heads {
  int64_t step, half;

  __device__ explicit Heads(const AttentionF64Launch& f)
      : step(f.paired_heads ? 2 : 1), half(f.heads / 2) {}
  // The slot of head h (the K/V heads a query of h reads are slot, and slot + half if paired).
  __device__ int64_t slot(const AttentionF64Launch& f, int64_t h) const {
    return f.paired_heads ? h % half : h;
  }
  // The head of virtual position j within slot s (query head or K/V head alike).
  __device__ int64_t head(const AttentionF64Launch& f, int64_t s, int64_t j) const {
    return f.paired_heads ? s + (j % 2) * half : s;
  }
  __device__ int64_t virtual_of(const AttentionF64Launch& f, int64_t h, int64_t p) const {
    return f.paired_heads ? 2 * p + h / half : p;
  }
};

// The first key (virtual) that token row n's query at virtual position qv reads.
__device__ int64_t first_key(const AttentionF64Launch& f, int64_t n, int64_t qv) {
  int64_t j0 = qv - f.window > 0 ? qv - f.window : 0;
  if (f.segment) {  // keys before the token's packed document are hidden
    const int64_t s = f.paired_heads ? 2 * int64_t(f.segment[n]) : int64_t(f.segment[n]);
    j0 = s > j0 ? s : j0;
  }
  return j0;
}

// scale * float(sum_d q[d] k[d]) in f64 for key p of K/V head g, with the key offset's dims
// from the previous key (the forward's score).
__device__ float score(const AttentionF64Launch& f, const KvRow& kv, const float* q, int64_t g,
                       int64_t p) {
  const float* k = kv_at(kv, false, g, p, f.kv_dim);
  double s = 0;
  if (f.key_offset && p > 0) {
    const float* prev = kv_at(kv, false, g, p - 1, f.kv_dim);
    for (int64_t d = 0; d < f.offset_from; ++d) s += double(q[d]) * double(k[d]);
    for (int64_t d = f.offset_from; d < f.qk_dim; ++d) s += double(q[d]) * double(prev[d]);
  } else {
    for (int64_t d = 0; d < f.qk_dim; ++d) s += double(q[d]) * double(k[d]);
  }
  return f.scale * float(s);
}

__device__ float block_max(float x, float* red) {
  const int tid = threadIdx.x;
  red[tid] = x;
  __syncthreads();
  for (int s = kAttnThreads / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

__device__ double block_sum(double x, double* red) {
  const int tid = threadIdx.x;
  red[tid] = x;
  __syncthreads();
  for (int s = kAttnThreads / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  const double r = red[0];
  __syncthreads();
  return r;
}

// ---- queries: statistics and dq, one block per (token, head) ----

__global__ void __launch_bounds__(kAttnThreads)
    attention_f64_dq_kernel(AttentionF64BackwardLaunch a) {
  const AttentionF64Launch& f = a.forward;
  const int i = blockIdx.y;
  const int64_t t = blockIdx.x, h = blockIdx.z, tid = threadIdx.x;
  if (t >= f.rows.length[i]) return;
  const Heads hs(f);
  const int64_t n = (f.rows.first + i) * f.rows.tokens + t;
  const int64_t qv = hs.virtual_of(f, h, f.rows.position[i] + t), j0 = first_key(f, n, qv);
  const int64_t nk = qv - j0 + 1, slot = hs.slot(f, h);
  const KvRow& kv = f.kv[i];

  __shared__ float qs[kMaxDim], gos[kMaxDim], w[kTile], maxes[kAttnThreads];
  __shared__ double sums[kAttnThreads];
  const float* qh = f.q + n * f.ldq + h * f.hq;
  const float* goh = a.dout + n * a.lddo + h * a.hdo;
  for (int64_t d = tid; d < f.qk_dim; d += kAttnThreads) qs[d] = qh[d];
  for (int64_t d = tid; d < f.v_dim; d += kAttnThreads) gos[d] = goh[d];
  __syncthreads();
  auto key_score = [&](int64_t j) { return score(f, kv, qs, hs.head(f, slot, j), j / hs.step); };

  float mx = -INFINITY;
  for (int64_t jj = tid; jj < nk; jj += kAttnThreads) mx = fmaxf(mx, key_score(j0 + jj));
  mx = block_max(mx, maxes);
  double sum = 0;
  for (int64_t jj = tid; jj < nk; jj += kAttnThreads) sum += double(expf(key_score(j0 + jj) - mx));
  const float inv = float(1.0 / block_sum(sum, sums));
  // p_j and dp_j of key j (the keys' kernel computes the same from the same inputs).
  auto p_dp = [&](int64_t j, float* dp) {
    const int64_t g = hs.head(f, slot, j), p = j / hs.step;
    *dp = float(dot_f64(gos, kv_at(kv, true, g, p, f.kv_dim), f.v_dim));
    return expf(score(f, kv, qs, g, p) - mx) * inv;
  };
  double dsum = 0;
  for (int64_t jj = tid; jj < nk; jj += kAttnThreads) {
    float dp;
    const float p = p_dp(j0 + jj, &dp);
    dsum += double(p) * dp;
  }
  const float D = float(block_sum(dsum, sums));
  if (tid == 0) {
    float* st = a.stats + (n * f.heads + h) * 3;
    st[0] = mx;
    st[1] = inv;
    st[2] = D;
  }
  if (!a.dq) return;

  // dq[d] = sum over keys in order of p_j (dp_j - D) scale k_j[d] (the previous key's dims from
  // offset_from on, with the key offset).
  float acc[kDimsPerThread] = {};
  for (int64_t base = j0; base <= qv; base += kTile) {
    const int64_t count = qv - base + 1 < kTile ? qv - base + 1 : kTile;
    for (int64_t jj = tid; jj < count; jj += kAttnThreads) {
      float dp;
      const float p = p_dp(base + jj, &dp);
      w[jj] = p * (dp - D) * f.scale;
    }
    __syncthreads();
    for (int64_t jj = 0; jj < count; ++jj) {
      const int64_t j = base + jj, g = hs.head(f, slot, j), p = j / hs.step;
      const float* k = kv_at(kv, false, g, p, f.kv_dim);
      const float* prev = f.key_offset && p > 0 ? kv_at(kv, false, g, p - 1, f.kv_dim) : k;
#pragma unroll
      for (int c = 0; c < kDimsPerThread; ++c) {
        const int64_t d = tid + int64_t(c) * kAttnThreads;
        if (d < f.qk_dim) acc[c] += w[jj] * (d >= f.offset_from ? prev : k)[d];
      }
    }
    __syncthreads();
  }
  float* dq = a.dq + n * a.lddq + h * a.hdq;
#pragma unroll
  for (int c = 0; c < kDimsPerThread; ++c) {
    const int64_t d = tid + int64_t(c) * kAttnThreads;
    if (d < f.qk_dim) dq[d] += acc[c];
  }
}

// ---- keys: dK and dV, one block per (key, K/V head) ----

// The lowest key position row i's queries can read (with the key offset, one before: the lowest
// visible key reads its dims from offset_from on there).
__host__ __device__ int64_t lowest_key(const AttentionF64Launch& f, int i) {
  const int64_t step = f.paired_heads ? 2 : 1, q0 = step * f.rows.position[i];
  const int64_t k = (q0 - f.window > 0 ? q0 - f.window : 0) / step;
  return f.key_offset && k > 0 ? k - 1 : k;
}

// Adds row i's queries' shares into key p of K/V head g (dk, dv: its gradient rows, or null).
// Every thread of the block calls it with the same arguments.
__device__ void add_key_grads(const AttentionF64BackwardLaunch& a, int i, int64_t p, int64_t g,
                              float* dk, float* dv) {
  const AttentionF64Launch& f = a.forward;
  const Heads hs(f);
  const int64_t tid = threadIdx.x, step = hs.step, slot = hs.slot(f, g);
  const int64_t jv = hs.virtual_of(f, g, p);
  const int64_t pos0 = f.rows.position[i], len = f.rows.length[i];
  // The row's queries that can read key p (or, with the key offset, key p + 1).
  const int64_t q_lo = step * pos0, q_hi = step * (pos0 + len) - 1;
  const int64_t reach = jv + f.window + (f.key_offset ? step : 0);
  const int64_t first = jv > q_lo ? jv : q_lo, last = reach < q_hi ? reach : q_hi;
  if (len == 0 || first > last) return;
  const KvRow& kv = f.kv[i];
  const bool own_share = !f.key_offset || p == 0;  // dims from offset_from on: the pair (q, p)

  __shared__ float s_p[kAttnThreads], s_ds[kAttnThreads], s_ds2[kAttnThreads];
  __shared__ int s_in[kAttnThreads];
  __shared__ int64_t s_q[kAttnThreads], s_go[kAttnThreads];
  float adk[kDimsPerThread] = {}, adv[kDimsPerThread] = {};
  for (int64_t base = first; base <= last; base += kAttnThreads) {
    const int64_t qv = base + tid;
    float pk = 0.0f, ds = 0.0f, ds2 = 0.0f;
    int in = 0;
    int64_t qo = 0, goo = 0;
    if (qv <= last) {
      const int64_t h = hs.head(f, slot, qv),
                    n = (f.rows.first + i) * f.rows.tokens + qv / step - pos0;
      const int64_t j0 = first_key(f, n, qv);
      const float* st = a.stats + (n * f.heads + h) * 3;
      qo = n * f.ldq + h * f.hq;
      goo = n * a.lddo + h * a.hdo;
      const float* q = f.q + qo;
      const float* go = a.dout + goo;
      auto share = [&](int64_t key, float* p_out) {  // p (dp - D) scale of the pair (q, key)
        const float dp = float(dot_f64(go, kv_at(kv, true, g, key, f.kv_dim), f.v_dim));
        const float pr = expf(score(f, kv, q, g, key) - st[0]) * st[1];
        if (p_out) *p_out = pr;
        return pr * (dp - st[2]) * f.scale;
      };
      if (j0 <= jv && jv <= qv) {
        in |= 1;
        ds = share(p, &pk);
      }
      if (f.key_offset && j0 <= jv + step && jv + step <= qv) {
        in |= 2;
        ds2 = share(p + 1, nullptr);
      }
    }
    s_p[tid] = pk;
    s_ds[tid] = ds;
    s_ds2[tid] = ds2;
    s_in[tid] = in;
    s_q[tid] = qo;
    s_go[tid] = goo;
    __syncthreads();
    const int64_t count = last - base + 1 < kAttnThreads ? last - base + 1 : kAttnThreads;
    for (int64_t qq = 0; qq < count; ++qq) {
      const int flags = s_in[qq];
      if (!flags) continue;
      const float* q = f.q + s_q[qq];
      const float* go = a.dout + s_go[qq];
#pragma unroll
      for (int c = 0; c < kDimsPerThread; ++c) {
        const int64_t d = tid + int64_t(c) * kAttnThreads;
        if (d < f.v_dim && (flags & 1)) adv[c] += s_p[qq] * go[d];
        if (d >= f.qk_dim) continue;
        if (d < f.offset_from || !f.key_offset) {
          if (flags & 1) adk[c] += s_ds[qq] * q[d];
        } else {
          if (own_share && (flags & 1)) adk[c] += s_ds[qq] * q[d];
          if (flags & 2) adk[c] += s_ds2[qq] * q[d];
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int c = 0; c < kDimsPerThread; ++c) {
    const int64_t d = tid + int64_t(c) * kAttnThreads;
    if (dk && d < f.qk_dim) dk[d] += adk[c];
    if (dv && d < f.v_dim) dv[d] += adv[c];
  }
}

// Own keys: block (x, i, g) takes row i's own key max(prefix_len, lowest key) + x.
__global__ void __launch_bounds__(kAttnThreads)
    attention_f64_dkv_own_kernel(AttentionF64BackwardLaunch a) {
  const AttentionF64Launch& f = a.forward;
  const int i = blockIdx.y;
  const int64_t g = blockIdx.z, D = f.kv_dim;
  const int64_t lowest = lowest_key(f, i);
  const int64_t p = (f.kv[i].prefix_len > lowest ? f.kv[i].prefix_len : lowest) + blockIdx.x;
  if (p >= f.rows.position[i] + f.rows.length[i]) return;
  add_key_grads(a, i, p, g, grad_at(a.grad[i], false, g, p, D), grad_at(a.grad[i], true, g, p, D));
}

// Prefix keys: block (x, g) takes position first + x of every row's prefix, rows in order.
__global__ void __launch_bounds__(kAttnThreads)
    attention_f64_dkv_prefix_kernel(AttentionF64BackwardLaunch a, int64_t first) {
  const AttentionF64Launch& f = a.forward;
  const int64_t p = first + blockIdx.x, g = blockIdx.z, D = f.kv_dim;
  for (int i = 0; i < f.rows.count; ++i) {
    if (p >= f.kv[i].prefix_len || p < lowest_key(f, i)) continue;
    float* dk = grad_at(a.grad[i], false, g, p, D);
    float* dv = grad_at(a.grad[i], true, g, p, D);
    if (dk || dv) add_key_grads(a, i, p, g, dk, dv);
  }
}

}  // namespace

cudaError_t launch_attention_f64_backward(const AttentionF64BackwardLaunch& a,
                                          cudaStream_t stream) {
  const AttentionF64Launch& f = a.forward;
  if (f.rows.count == 0 || f.rows.tokens == 0 || f.heads == 0) return cudaSuccess;
  if (f.qk_dim > kMaxDim || f.v_dim > kMaxDim || (f.paired_heads && f.heads % 2))
    return cudaErrorInvalidValue;
  attention_f64_dq_kernel<<<dim3(unsigned(f.rows.tokens), unsigned(f.rows.count),
                                 unsigned(f.heads)),
                            kAttnThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  // Own keys per row, and the prefix positions any row can read.
  int64_t own = 0, prefix_from = INT64_MAX, prefix_to = 0;
  for (int i = 0; i < f.rows.count; ++i) {
    if (f.rows.length[i] == 0) continue;
    const int64_t lowest = lowest_key(f, i), prefix = f.kv[i].prefix_len;
    const int64_t from = prefix > lowest ? prefix : lowest;
    const int64_t end = f.rows.position[i] + f.rows.length[i];
    own = end - from > own ? end - from : own;
    const bool wanted = a.grad[i].prefix_k || a.grad[i].prefix_v;
    if (wanted && lowest < prefix) {
      prefix_from = lowest < prefix_from ? lowest : prefix_from;
      prefix_to = prefix > prefix_to ? prefix : prefix_to;
    }
  }
  if (own > 0) {
    attention_f64_dkv_own_kernel<<<dim3(unsigned(own), unsigned(f.rows.count), unsigned(f.heads)),
                                   kAttnThreads, 0, stream>>>(a);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  }
  if (prefix_to > prefix_from) {
    attention_f64_dkv_prefix_kernel<<<
        dim3(unsigned(prefix_to - prefix_from), 1u, unsigned(f.heads)), kAttnThreads, 0, stream>>>(
        a, prefix_from);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace deg::cuda
