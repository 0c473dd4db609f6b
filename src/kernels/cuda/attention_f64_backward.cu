// The CUDA backend's attention_f64 backward (AttendF64BackwardArgs of kernels/ops.h, launch.h
// AttentionF64BackwardLaunch): kernels that recompute the forward's scores, each output element
// summed by one thread in a fixed order, so no result depends on the launch shape or on the
// other rows of the call (no atomics).
//  - queries: query tiles (attention_f64_queries.cuh: a warp per query, the keys staged in
//    shared memory). The softmax's maximum and 1 / sum (the forward's arithmetic) and
//    D = sum_j p_j dp_j (dp_j = dout . v_j), kept per (token, head) for the keys' kernels, then
//    dq (each dim one lane's, keys in order).
//  - keys, head dims up to kFastDim: one block per (tile of kKeyTile keys, K/V head), the
//    queries that read the tile staged kQueryTile at a time with the tile's K/V rows in shared
//    memory; each visible (query, key) share computed once, dK and dV of each key summed over
//    its queries in query order (each (key, dim) one thread's), added into the gradient once.
//  - keys, wider heads: one block per (key, K/V head), the same sums (add_key_grads).
//  Both key kernels take a row's own keys (its alone) for all rows at once, and prefix keys (a
//  fork call's rows read their prefix call's keys, several rows the same ones) by position,
//  each block taking the rows in order, so a shared key adds the rows' shares in row order.
//
// Virtual positions (attention_f64_queries.cuh's Heads): a query at virtual position qv reads
// the keys [max(qv - window, its document's start), qv]. With the key offset a key's dims from
// offset_from on are read from the key one position before, so those dims of key p take the
// shares of the pairs that read key p + 1 (key 0 keeps its own as well, added first per query).
#include <cstdint>
#include <utility>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/attention_f64_queries.cuh"
#include "kernels/cuda/grid.cuh"

constexpr int kAttnThreads = 128;
constexpr int kMaxDim = 512;  // qk_dim and v_dim at most this
constexpr int kDimsPerThread = kMaxDim / kAttnThreads;
constexpr int kFastDim = 64;  // head dims at most this: the tiled keys' kernels

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
  return scaled(f, s);
}

// ---- queries: statistics and dq, in query tiles (attention_f64_queries.cuh) ----

// The softmax's maximum and 1 / sum (the forward's arithmetic) and D = sum_j p_j dp_j
// (dp_j = dout . v_j; each lane's keys in f64, then the butterfly), kept per (token, head) for
// the keys' kernels; then dq[d] = sum over keys in order of p_j (dp_j - D) scale k_j[d] (the
// previous key's dims from offset_from on, with the key offset), each dim one lane's.
template <int kDim>
__global__ void __launch_bounds__(kTileThreads)
    attention_f64_dq_kernel(AttentionF64BackwardLaunch a) {
  const AttentionF64Launch& f = a.forward;
  extern __shared__ double tile_memory[];
  auto& sm = *reinterpret_cast<QueryTileShared<kDim, true>*>(tile_memory);
  const TileQuery c = tile_query(f, sm, a.dout, a.lddo, a.hdo);
  float mx, inv;
  softmax_stats(c, sm, &mx, &inv);
  double dsum = 0;
  for_key_tiles(c, sm, !c.cached, true, [&](int64_t base, int count) {
    for_lane_keys(c, base, count, [&](int r) {
      const float p = expf(score_at(c, sm, base, r) - mx) * inv, dp = tile_dp(c, sm, r);
      if (c.cached) sm.dp[c.warp][base + r - c.kmin] = dp;
      dsum += double(p) * dp;
    });
  });
  const float D = float(warp_sum(dsum));
  if (c.active && c.lane == 0) {
    float* st = a.stats + (c.n * f.heads + c.h) * 3;
    st[0] = mx;
    st[1] = inv;
    st[2] = D;
  }
  if (!a.dq) return;  // the same for the whole block
  float acc[kDim / 32] = {};
  for_key_tiles(c, sm, true, !c.cached, [&](int64_t base, int count) {
    for_lane_keys(c, base, count, [&](int r) {
      const float p = expf(score_at(c, sm, base, r) - mx) * inv;
      const float dp = c.cached ? sm.dp[c.warp][base + r - c.kmin] : tile_dp(c, sm, r);
      sm.w[c.warp][r] = p * (dp - D) * f.scale;
    });
    accumulate_rows(c, sm, sm.k, base, count, f.qk_dim, acc);
  });
  if (!c.active) return;
  float* dq = a.dq + c.n * a.lddq + c.h * a.hdq;
#pragma unroll
  for (int k = 0; k < kDim / 32; ++k) {
    const int d = c.lane + 32 * k;
    if (d < f.qk_dim) dq[d] += acc[k];
  }
}

template <int kDim>
cudaError_t launch_dq_tiles(const AttentionF64BackwardLaunch& a, cudaStream_t stream) {
  return launch_query_tiles(attention_f64_dq_kernel<kDim>, a, a.forward,
                            int(sizeof(QueryTileShared<kDim, true>)), stream);
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
                    n = (f.rows.first + i) * f.rows.tokens + hs.token(qv) - pos0;
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

// The rows of a launch by the prefix gradient they add into: rows whose prefix gradients are
// the same buffers (forks of one document) form a group, taken by one block in row order; groups
// write disjoint memory, so their blocks run side by side. Rows without prefix gradients: -1.
struct PrefixGroups {
  int count = 0;
  signed char of[kRows];
};

// Prefix keys: block (x, group, g) takes position first + x of the group's rows' prefix, rows in
// order.
__global__ void __launch_bounds__(kAttnThreads)
    attention_f64_dkv_prefix_kernel(AttentionF64BackwardLaunch a, int64_t first,
                                    PrefixGroups groups) {
  const AttentionF64Launch& f = a.forward;
  const int64_t p = first + blockIdx.x, g = blockIdx.z, D = f.kv_dim;
  for (int i = 0; i < f.rows.count; ++i) {
    if (groups.of[i] != int(blockIdx.y)) continue;
    if (p >= f.kv[i].prefix_len || p < lowest_key(f, i)) continue;
    float* dk = grad_at(a.grad[i], false, g, p, D);
    float* dv = grad_at(a.grad[i], true, g, p, D);
    if (dk || dv) add_key_grads(a, i, p, g, dk, dv);
  }
}

// ---- keys, tiled: dK and dV, one block per (tile of kKeyTile keys, K/V head) ----
//
// The same sums as add_key_grads, key by key and query by query in the same order, with the
// same expressions: a block takes kKeyTile consecutive keys of one K/V head and walks the
// queries that can read any of them in chunks of kQueryTile, their q and dout rows staged in
// shared memory with the tile's K/V rows, so a query's row is read once per tile instead of once
// per key, and each (query, key) share is one thread's two f64 dot products from shared memory.
// Only a share whose pair is visible is computed or added, so each key's gradient gets exactly
// the additions add_key_grads makes, in query order (bitwise the same results).

constexpr int kKeyTile = 32;           // keys per block
constexpr int kQueryTile = 32;         // queries staged at once
constexpr int kRowPad = kFastDim + 1;  // shared rows padded: a warp's keys fall in distinct banks
constexpr int kShares = kKeyTile + 1;  // the tile's keys and the next (the key offset's pairs)
constexpr int kKeysPerThread = kKeyTile * kFastDim / kAttnThreads;
static_assert(kAttnThreads % kFastDim == 0 && kKeyTile % (kAttnThreads / kFastDim) == 0 &&
              kFastDim >= 4);

struct KeyTileShared {
  float q[kQueryTile][kRowPad];    // the chunk's queries
  float go[kQueryTile][kRowPad];   // and their output gradients
  float k[kKeyTile + 2][kRowPad];  // keys p0 - 1 .. p0 + kKeyTile (zeros where none)
  float v[kShares][kRowPad];       // values p0 .. p0 + kKeyTile
  float p[kQueryTile][kShares];    // p of each visible (query, key) pair
  float ds[kQueryTile][kShares];   // p (dp - D) scale of each visible pair
  float st[kQueryTile][3];         // the queries' statistics (max, 1 / sum, D)
  int64_t j0[kQueryTile];          // and their first visible keys (virtual)
  int reads[kQueryTile];           // whether the query reads any of the tile's keys
};

// Adds row i's queries' shares into keys [lo, hi) of K/V head g, all within the tile
// [p0, p0 + kKeyTile). Every thread of the block calls it with the same arguments.
__device__ void add_tile_grads(const AttentionF64BackwardLaunch& a, KeyTileShared& sm, int i,
                               int64_t g, int64_t p0, int64_t lo, int64_t hi) {
  const AttentionF64Launch& f = a.forward;
  const Heads hs(f);
  const int64_t tid = threadIdx.x, step = hs.step, slot = hs.slot(f, g);
  const int64_t pos0 = f.rows.position[i], len = f.rows.length[i], end = pos0 + len;
  const int64_t q_lo = step * pos0, q_hi = step * (pos0 + len) - 1;
  const int64_t extra = f.key_offset ? step : 0;
  // The queries that can read a key of [lo, hi) (or, with the key offset, the key after it).
  const int64_t first = hs.virtual_of(f, g, lo) > q_lo ? hs.virtual_of(f, g, lo) : q_lo;
  const int64_t reach = hs.virtual_of(f, g, hi - 1) + f.window + extra;
  const int64_t last = reach < q_hi ? reach : q_hi;
  if (len == 0 || first > last) return;
  // The last key (virtual) whose pairs the tile takes: hi - 1, or hi with the key offset.
  const int64_t jv_last = hs.virtual_of(f, g, f.key_offset ? hi : hi - 1);
  const KvRow& kv = f.kv[i];

  // The tile's K/V rows (keys p0 - 1 .. p0 + kKeyTile that exist; zeros elsewhere, never read).
  for (int64_t e = tid; e < (kKeyTile + 2) * kFastDim; e += kAttnThreads) {
    const int64_t r = e / kFastDim, d = e % kFastDim, key = p0 - 1 + r;
    const bool have = key >= 0 && key < end && d < f.qk_dim;
    sm.k[r][d] = have ? kv_at(kv, false, g, key, f.kv_dim)[d] : 0.0f;
  }
  for (int64_t e = tid; e < kShares * kFastDim; e += kAttnThreads) {
    const int64_t r = e / kFastDim, d = e % kFastDim, key = p0 + r;
    const bool have = key < end && d < f.v_dim;
    sm.v[r][d] = have ? kv_at(kv, true, g, key, f.kv_dim)[d] : 0.0f;
  }

  const int64_t d_own = tid % kFastDim, key_group = tid / kFastDim;
  float adk[kKeysPerThread] = {}, adv[kKeysPerThread] = {};
  for (int64_t base = first; base <= last; base += kQueryTile) {
    const int64_t count = last - base + 1 < kQueryTile ? last - base + 1 : kQueryTile;
    __syncthreads();  // the previous chunk's shares are used up (and the K/V rows written)
    for (int64_t e = tid; e < kQueryTile * kFastDim; e += kAttnThreads) {
      const int64_t r = e / kFastDim, d = e % kFastDim, qv = base + r;
      float qx = 0.0f, gx = 0.0f;
      if (r < count) {
        const int64_t h = hs.head(f, slot, qv),
                      n = (f.rows.first + i) * f.rows.tokens + hs.token(qv) - pos0;
        if (d < f.qk_dim) qx = f.q[n * f.ldq + h * f.hq + d];
        if (d < f.v_dim) gx = a.dout[n * a.lddo + h * a.hdo + d];
        if (d < 3) sm.st[r][d] = a.stats[(n * f.heads + h) * 3 + d];
        if (d == 3) sm.j0[r] = first_key(f, n, qv);
      }
      if (d == 4) sm.reads[r] = 0;
      sm.q[r][d] = qx;
      sm.go[r][d] = gx;
    }
    __syncthreads();
    // A query's first key never decreases along the row: when the chunk's first query reads
    // none of the tile's keys for being past them (a later document, or the window), no later
    // query does either, and the tile is done.
    if (sm.j0[0] > jv_last) break;
    for (int64_t e = tid; e < kQueryTile * kShares; e += kAttnThreads) {
      const int64_t r = e / kShares, c = e % kShares, qv = base + r, key = p0 + c;
      const int64_t jv = hs.virtual_of(f, g, key);
      bool in = false;
      float pk = 0.0f, ds = 0.0f;
      if (r < count && key < end && jv <= qv) {
        in = sm.j0[r] <= jv;
        if (in) {  // the share of add_key_grads, from the staged rows
          const float* st = sm.st[r];
          const float* qr = sm.q[r];
          const float* kr = sm.k[c + 1];
          const float* prev = sm.k[c];
          const float* go = sm.go[r];
          const float* vr = sm.v[c];
          // The score's and dp's f64 sums, each in index order, interleaved (two independent
          // chains); the score's dims from `split` on are the previous key's.
          const int qk = int(f.qk_dim), vd = int(f.v_dim), both = qk < vd ? qk : vd;
          const int split = f.key_offset && key > 0 ? int(f.offset_from) : qk;
          double s = 0, sdp = 0;
          for (int d = 0; d < both; ++d) {
            s += double(qr[d]) * double((d < split ? kr : prev)[d]);
            sdp += double(go[d]) * double(vr[d]);
          }
          for (int d = both; d < qk; ++d) s += double(qr[d]) * double((d < split ? kr : prev)[d]);
          for (int d = both; d < vd; ++d) sdp += double(go[d]) * double(vr[d]);
          const float dp = float(sdp);
          pk = expf(scaled(f, s) - st[0]) * st[1];
          ds = pk * (dp - st[2]) * f.scale;
        }
      }
      sm.p[r][c] = pk;  // 0 for a pair the query does not read
      sm.ds[r][c] = ds;
      if (in) sm.reads[r] = 1;
    }
    __syncthreads();
    // Thread (key group, dim) sums keys key_group, key_group + 2, ... of the tile at its dim,
    // the chunk's queries in order (add_key_grads' loop body per key). A pair the query does
    // not read adds p = ds = 0: +-0 added to a sum that starts at +0 changes no bit of it (for
    // finite q and dout), so only queries that read none of the tile are skipped.
    for (int64_t r = 0; r < count; ++r) {
      if (!sm.reads[r]) continue;
      const float qd = sm.q[r][d_own], gd = sm.go[r][d_own];
#pragma unroll
      for (int c = 0; c < kKeysPerThread; ++c) {
        const int64_t kk = key_group + int64_t(c) * (kAttnThreads / kFastDim), key = p0 + kk;
        if (d_own < f.v_dim) adv[c] += sm.p[r][kk] * gd;
        if (d_own >= f.qk_dim) continue;
        if (d_own < f.offset_from || !f.key_offset) {
          adk[c] += sm.ds[r][kk] * qd;
        } else {
          if (key == 0) adk[c] += sm.ds[r][kk] * qd;  // key 0 keeps its own share
          adk[c] += sm.ds[r][kk + 1] * qd;
        }
      }
    }
  }
  // Into the gradients, for the keys add_key_grads would have added to (some query in reach).
#pragma unroll
  for (int c = 0; c < kKeysPerThread; ++c) {
    const int64_t key = p0 + key_group + int64_t(c) * (kAttnThreads / kFastDim);
    if (key < lo || key >= hi) continue;
    const int64_t jv = hs.virtual_of(f, g, key);
    const int64_t kfirst = jv > q_lo ? jv : q_lo;
    const int64_t kreach = jv + f.window + extra, klast = kreach < q_hi ? kreach : q_hi;
    if (kfirst > klast) continue;
    float* dk = grad_at(a.grad[i], false, g, key, f.kv_dim);
    float* dv = grad_at(a.grad[i], true, g, key, f.kv_dim);
    if (dk && d_own < f.qk_dim) dk[d_own] += adk[c];
    if (dv && d_own < f.v_dim) dv[d_own] += adv[c];
  }
  __syncthreads();  // the shared rows are free for the next call
}

// Own keys: block (x, i, g) takes row i's own keys from max(prefix_len, lowest key) + x kKeyTile.
__global__ void __launch_bounds__(kAttnThreads, 4)
    attention_f64_dkv_own_tiled_kernel(AttentionF64BackwardLaunch a) {
  const AttentionF64Launch& f = a.forward;
  const int i = blockIdx.y;
  const int64_t g = blockIdx.z, lowest = lowest_key(f, i);
  const int64_t from = f.kv[i].prefix_len > lowest ? f.kv[i].prefix_len : lowest;
  const int64_t p0 = from + int64_t(blockIdx.x) * kKeyTile,
                end = f.rows.position[i] + f.rows.length[i];
  if (p0 >= end) return;
  __shared__ KeyTileShared sm;
  add_tile_grads(a, sm, i, g, p0, p0, p0 + kKeyTile < end ? p0 + kKeyTile : end);
}

// Prefix keys: block (x, group, g) takes positions first + x kKeyTile on of the group's rows'
// prefix, rows in order (a key shared by rows adds their shares in row order, as the per-key
// kernel).
__global__ void __launch_bounds__(kAttnThreads)
    attention_f64_dkv_prefix_tiled_kernel(AttentionF64BackwardLaunch a, int64_t first,
                                          PrefixGroups groups) {
  const AttentionF64Launch& f = a.forward;
  const int64_t p0 = first + int64_t(blockIdx.x) * kKeyTile, g = blockIdx.z;
  __shared__ KeyTileShared sm;
  for (int i = 0; i < f.rows.count; ++i) {
    if (groups.of[i] != int(blockIdx.y)) continue;
    const int64_t lowest = lowest_key(f, i), prefix = f.kv[i].prefix_len;
    const int64_t lo = p0 > lowest ? p0 : lowest;
    const int64_t hi = p0 + kKeyTile < prefix ? p0 + kKeyTile : prefix;
    if (lo < hi) add_tile_grads(a, sm, i, g, p0, lo, hi);
  }
}

// The launch's prefix groups: rows by their prefix gradient buffers (equal pointers and strides).
// Should two groups' buffers overlap anyway, every row joins one group (one block in row order).
PrefixGroups prefix_groups(const AttentionF64BackwardLaunch& a) {
  const AttentionF64Launch& f = a.forward;
  PrefixGroups out;
  int first_row[kRows];  // each group's first row
  for (int i = 0; i < f.rows.count; ++i) {
    const KvRow& gi = a.grad[i];
    out.of[i] = -1;
    if (!gi.prefix_k && !gi.prefix_v) continue;
    for (int k = 0; k < out.count && out.of[i] < 0; ++k) {
      const KvRow& gk = a.grad[first_row[k]];
      if (gk.prefix_k == gi.prefix_k && gk.prefix_v == gi.prefix_v &&
          gk.prefix_stride == gi.prefix_stride)
        out.of[i] = static_cast<signed char>(k);
    }
    if (out.of[i] < 0) {
      first_row[out.count] = i;
      out.of[i] = static_cast<signed char>(out.count++);
    }
  }
  // Each group's extent in each buffer (up to the last dim of its last key of its last head);
  // any overlap between groups: one group.
  auto span = [&](const float* base, int i, int64_t dim) {
    const int64_t longest = a.grad[i].prefix_len;
    const float* end = longest > 0 ? base + (f.heads - 1) * a.grad[i].prefix_stride +
                                         (longest - 1) * f.kv_dim + dim
                                   : base;
    return std::pair<const float*, const float*>{base, end};
  };
  bool overlap = false;
  for (int x = 0; x < out.count && !overlap; ++x)
    for (int y = x + 1; y < out.count && !overlap; ++y)
      for (int kv = 0; kv < 2 && !overlap; ++kv) {
        const KvRow& gx = a.grad[first_row[x]];
        const KvRow& gy = a.grad[first_row[y]];
        const float* bx = kv ? gx.prefix_v : gx.prefix_k;
        const float* by = kv ? gy.prefix_v : gy.prefix_k;
        if (!bx || !by) continue;
        const int64_t dim = kv ? f.v_dim : f.qk_dim;
        const auto sx = span(bx, first_row[x], dim), sy = span(by, first_row[y], dim);
        overlap = sx.first < sy.second && sy.first < sx.second;
      }
  if (overlap) {
    for (int i = 0; i < f.rows.count; ++i)
      if (out.of[i] >= 0) out.of[i] = 0;
    out.count = out.count > 0 ? 1 : 0;
  }
  return out;
}

}  // namespace

cudaError_t launch_attention_f64_backward(const AttentionF64BackwardLaunch& a,
                                          cudaStream_t stream) {
  const AttentionF64Launch& f = a.forward;
  if (f.rows.count == 0 || f.rows.tokens == 0 || f.heads == 0) return cudaSuccess;
  if (f.qk_dim > kMaxDim || f.v_dim > kMaxDim || (f.paired_heads && f.heads % 2))
    return cudaErrorInvalidValue;
  const int64_t dims = f.qk_dim > f.v_dim ? f.qk_dim : f.v_dim;
  if (cudaError_t e = dims <= 64    ? launch_dq_tiles<64>(a, stream)
                      : dims <= 128 ? launch_dq_tiles<128>(a, stream)
                                    : launch_dq_tiles<512>(a, stream);
      e != cudaSuccess)
    return e;
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
  const bool tiled = f.qk_dim <= kFastDim && f.v_dim <= kFastDim;
  if (own > 0 && tiled) {
    attention_f64_dkv_own_tiled_kernel<<<dim3(unsigned((own + kKeyTile - 1) / kKeyTile),
                                              unsigned(f.rows.count), unsigned(f.heads)),
                                         kAttnThreads, 0, stream>>>(a);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  } else if (own > 0) {
    attention_f64_dkv_own_kernel<<<dim3(unsigned(own), unsigned(f.rows.count), unsigned(f.heads)),
                                   kAttnThreads, 0, stream>>>(a);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  }
  const PrefixGroups groups = prefix_to > prefix_from ? prefix_groups(a) : PrefixGroups{};
  if (prefix_to > prefix_from && tiled) {
    attention_f64_dkv_prefix_tiled_kernel<<<dim3(unsigned((prefix_to - prefix_from + kKeyTile - 1) /
                                                          kKeyTile),
                                                 unsigned(groups.count), unsigned(f.heads)),
                                            kAttnThreads, 0, stream>>>(a, prefix_from, groups);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  } else if (prefix_to > prefix_from) {
    attention_f64_dkv_prefix_kernel<<<dim3(unsigned(prefix_to - prefix_from),
                                           unsigned(groups.count), unsigned(f.heads)),
                                      kAttnThreads, 0, stream>>>(a, prefix_from, groups);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace deg::cuda
