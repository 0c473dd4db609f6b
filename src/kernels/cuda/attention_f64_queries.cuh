// The query side of the f64-accumulated attention (AttendF64Args of kernels/ops.h), shared by
// attention_f64.cu (the forward) and attention_f64_backward.cu (each query's statistics and dq):
// the geometry of a call's heads and keys, and query tiles; attention_bf16.cu (the tensor-core
// kernels of the same op) takes the geometry. Internal to those .cu files: each includes it
// inside its own anonymous namespace, after kernels/cuda/launch.h.
//
// Query tiles: a block takes kQueries consecutive tokens of one row and one head, a warp per
// query, and walks the union of their visible keys in tiles of kKeys (a power of two set by the
// head width) staged in shared memory: the key rows (the key offset's dims already taken from
// the previous key) and, where a pass needs them, the value rows. So a key's row is read from
// global memory once per kQueries queries instead of once per query. Each score is one f64 dot
// product over qk_dim in index order (one lane's), rounded to f32 and scaled, as the CPU
// computes it; blocks whose keys span at most kCacheKeys keep each score in shared memory after
// the first pass (TileQuery below), longer spans recompute them in each pass (any window fits).
//
// Sum orders: lane l of a query's warp takes the keys j of the query's window with
// (j - j0) mod 32 = l, in increasing j (j0: the query's first visible key); f64 sums are each
// lane's in that order, then a butterfly over the 32 lanes (x + shfl_xor(x, o) for o = 16 ... 1:
// addition commutes, so every lane ends with the same bits). Sums over keys into a query's output
// dims (y, dq) are each one lane's, keys in index order. Every order is thus fixed by the
// query's own window; which other tokens or rows share the block, and where the key tiles start,
// change nothing (batch invariance, and chunked == dense).
#pragma once

constexpr int kTileThreads = 256;
constexpr int kQueries = kTileThreads / 32;  // a warp per query

// The K or V row of position p (prefix, then own keys) of K/V head g.
__device__ inline const float* kv_at(const KvRow& kv, bool v, int64_t g, int64_t p, int64_t D) {
  if (p < kv.prefix_len) return (v ? kv.prefix_v : kv.prefix_k) + g * kv.prefix_stride + p * D;
  return (v ? kv.own_v : kv.own_k) + g * kv.own_stride + (p - kv.prefix_len) * D;
}

// Key p's gradient row of K/V head g (null: that part's gradient is not wanted).
__device__ inline float* grad_at(const KvRow& kv, bool v, int64_t g, int64_t p, int64_t D) {
  float* base = p < kv.prefix_len ? const_cast<float*>(v ? kv.prefix_v : kv.prefix_k)
                                  : (v ? kv.own_v : kv.own_k);
  if (!base) return nullptr;
  return base + (p < kv.prefix_len ? g * kv.prefix_stride + p * D
                                   : g * kv.own_stride + (p - kv.prefix_len) * D);
}

// The geometry of one call's heads. Virtual positions: with paired heads, heads slot and
// slot + H/2 read one interleaved sequence (head slot + e half at position p sits at 2 p + e, its
// queries and its keys alike); unpaired, a head's positions are the tokens' (step 1).
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
    return f.paired_heads ? s + (j & 1) * half : s;
  }
  // The token of virtual position j (j >= 0).
  __device__ int64_t token(int64_t j) const { return step == 2 ? j >> 1 : j; }
  __device__ int64_t virtual_of(const AttentionF64Launch& f, int64_t h, int64_t p) const {
    return f.paired_heads ? 2 * p + h / half : p;
  }
};

// The first key (virtual) that token row n's query at virtual position qv reads.
__device__ inline int64_t first_key(const AttentionF64Launch& f, int64_t n, int64_t qv) {
  int64_t j0 = qv - f.window > 0 ? qv - f.window : 0;
  if (f.segment) {  // keys before the token's packed document are hidden
    const int64_t s = f.paired_heads ? 2 * int64_t(f.segment[n]) : int64_t(f.segment[n]);
    j0 = s > j0 ? s : j0;
  }
  return j0;
}

// A score from its f64 dot product: scale * float(s), rounded as written (never fused with the
// subtraction of the maximum that follows, so a score has the CPU's bits).
__device__ inline float scaled(const AttentionF64Launch& f, double s) {
  return __fmul_rn(f.scale, float(s));
}

// ---- query tiles ----

constexpr int kCacheKeys = 1024 + 2 * kQueries;  // block key ranges whose scores are kept

// The shared memory of a block for heads up to kDim wide (qk_dim and v_dim); kGrad: the
// backward's (output gradients and dp_j too).
template <int kDim, bool kGrad>
struct QueryTileShared {
  static constexpr int kKeys = 2048 / kDim > 8 ? 2048 / kDim : 8;  // keys staged at once
  // Key rows (the key offset's dims from the previous key) and value rows, as doubles (each
  // element converted once per block, not once per product); padded so that the lanes of a
  // half warp, reading different keys, hit different banks.
  double k[kKeys][kDim + 1];
  double v[kKeys][kDim + 1];
  double q[kQueries][kDim];                                // each warp's query,
  double go[kGrad ? kQueries : 1][kGrad ? kDim : 1];       // its output gradient,
  float w[kQueries][kKeys];                                // its weights of the staged keys,
  float score[kQueries][kCacheKeys];                       // its scores (cached blocks: below)
  float dp[kGrad ? kQueries : 1][kGrad ? kCacheKeys : 1];  // and dout . v_j
  int64_t first[kQueries], last[kQueries];  // each query's window (empty: first > last)
};

// One warp's query and the block's key range. A block whose key range has at most kCacheKeys
// keys is `cached`: the first pass keeps each score (and the backward each dp_j) in shared
// memory, the later passes read them back (the same values, from the same lanes); longer
// ranges recompute them in each pass.
struct TileQuery {
  const AttentionF64Launch* f;
  const KvRow* kv;
  Heads hs;
  int64_t h, slot;  // the query's head and its slot
  int warp, lane;
  int64_t t, n;  // the token in its row, and its row of the call's [N, ...] tensors
  bool in_call;  // t < rows.tokens (a token, real or padding)
  bool active;   // a real token: a query with keys [j0, qv]
  int64_t qv, j0;
  int64_t kmin, kmax;  // the keys any of the block's queries read
  bool cached;
};

// Sets up block (x, i, h)'s warp: its query (q, and dout when given, staged as doubles) and the
// block's key range. Every thread calls it.
template <int kDim, bool kGrad>
__device__ TileQuery tile_query(const AttentionF64Launch& f, QueryTileShared<kDim, kGrad>& sm,
                                const float* dout = nullptr, int64_t lddo = 0, int64_t hdo = 0) {
  const int i = int(blockIdx.y);
  TileQuery c{&f, &f.kv[i], Heads(f)};
  c.h = blockIdx.z;
  c.slot = c.hs.slot(f, c.h);
  c.warp = int(threadIdx.x) / 32;
  c.lane = int(threadIdx.x) % 32;
  c.t = int64_t(blockIdx.x) * kQueries + c.warp;
  c.in_call = c.t < f.rows.tokens;
  c.active = c.in_call && c.t < f.rows.length[i];
  c.n = (f.rows.first + i) * f.rows.tokens + c.t;
  c.qv = -1;
  c.j0 = 0;
  if (c.active) {
    c.qv = c.hs.virtual_of(f, c.h, f.rows.position[i] + c.t);
    c.j0 = first_key(f, c.n, c.qv);
    const float* q = f.q + c.n * f.ldq + c.h * f.hq;
    for (int64_t d = c.lane; d < f.qk_dim; d += 32) sm.q[c.warp][d] = q[d];
    if constexpr (kGrad) {
      const float* go = dout + c.n * lddo + c.h * hdo;
      for (int64_t d = c.lane; d < f.v_dim; d += 32) sm.go[c.warp][d] = go[d];
    }
  }
  if (c.lane == 0) {
    sm.first[c.warp] = c.active ? c.j0 : INT64_MAX;
    sm.last[c.warp] = c.active ? c.qv : -1;
  }
  __syncthreads();
  c.kmin = INT64_MAX;
  c.kmax = -1;
  for (int w = 0; w < kQueries; ++w) {
    c.kmin = sm.first[w] < c.kmin ? sm.first[w] : c.kmin;
    c.kmax = sm.last[w] > c.kmax ? sm.last[w] : c.kmax;
  }
  c.cached = c.kmax - c.kmin < kCacheKeys;
  return c;
}

// Stages keys [base, base + count) (virtual) into sm.k when `keys`, into sm.v when `values`.
template <int kDim, bool kGrad>
__device__ void stage_keys(const TileQuery& c, QueryTileShared<kDim, kGrad>& sm, int64_t base,
                           int count, bool keys, bool values) {
  const AttentionF64Launch& f = *c.f;
  const int qk = int(f.qk_dim), vd = int(f.v_dim);
  const int split = f.key_offset ? int(f.offset_from) : qk;  // dims from here: the previous key's
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  __syncthreads();                                         // the previous tile is used up
  for (int r = warp; r < count; r += kTileThreads / 32) {  // a warp per row
    const int64_t j = base + r, g = c.hs.head(f, c.slot, j), p = c.hs.token(j);
    if (keys) {
      const float* k = kv_at(*c.kv, false, g, p, f.kv_dim);
      const float* prev = p > 0 && split < qk ? kv_at(*c.kv, false, g, p - 1, f.kv_dim) : k;
      for (int d = lane; d < qk; d += 32) sm.k[r][d] = (d < split ? k : prev)[d];
    }
    if (values) {
      const float* v = kv_at(*c.kv, true, g, p, f.kv_dim);
      for (int d = lane; d < vd; d += 32) sm.v[r][d] = v[d];
    }
  }
  __syncthreads();
}

// Runs body(base, count) for each tile of the block's keys after staging what it reads (key
// rows when `keys`, value rows when `values`); every thread of the block calls it (the staging
// synchronises the block), body runs for the active queries.
template <int kDim, bool kGrad, class Body>
__device__ void for_key_tiles(const TileQuery& c, QueryTileShared<kDim, kGrad>& sm, bool keys,
                              bool values, Body&& body) {
  constexpr int kKeys = QueryTileShared<kDim, kGrad>::kKeys;
  for (int64_t base = c.kmin; base <= c.kmax; base += kKeys) {
    const int count = c.kmax - base + 1 < kKeys ? int(c.kmax - base + 1) : kKeys;
    stage_keys(c, sm, base, count, keys, values);
    if (c.active) body(base, count);
  }
}

// The staged keys [lo, hi] (tile indices) of the query's window in tile [base, base + count);
// lo > hi when none.
__device__ inline void window_in_tile(const TileQuery& c, int64_t base, int count, int* lo,
                                      int* hi) {
  const int64_t a = c.j0 > base ? c.j0 : base,
                b = c.qv < base + count - 1 ? c.qv : base + count - 1;
  *lo = int(a - base);
  *hi = int(b - base);
}

// Calls key(r) for the lane's keys of the tile (r: tile index), in increasing order.
template <class Key>
__device__ void for_lane_keys(const TileQuery& c, int64_t base, int count, Key&& key) {
  int lo, hi;
  window_in_tile(c, base, count, &lo, &hi);
  if (lo > hi) return;
  const int offset = int((base + lo - c.j0) % 32);  // the lane of key lo
  for (int r = lo + ((c.lane - offset + 32) % 32); r <= hi; r += 32) key(r);
}

// The score of the warp's query against staged key r.
template <int kDim, bool kGrad>
__device__ float tile_score(const TileQuery& c, const QueryTileShared<kDim, kGrad>& sm, int r) {
  const double* q = sm.q[c.warp];
  const double* k = sm.k[r];
  double s = 0;
  for (int d = 0; d < int(c.f->qk_dim); ++d) s += q[d] * k[d];
  return scaled(*c.f, s);
}

// dout . v of staged value r, f64-accumulated, rounded to f32.
template <int kDim>
__device__ float tile_dp(const TileQuery& c, const QueryTileShared<kDim, true>& sm, int r) {
  const double* go = sm.go[c.warp];
  const double* v = sm.v[r];
  double s = 0;
  for (int d = 0; d < int(c.f->v_dim); ++d) s += go[d] * v[d];
  return float(s);
}

__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ inline double warp_sum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The warp's score of staged key r of the tile at `base`: computed from the staged key rows, or
// (cached, after softmax_stats) read back.
template <int kDim, bool kGrad>
__device__ float score_at(const TileQuery& c, QueryTileShared<kDim, kGrad>& sm, int64_t base,
                          int r) {
  return c.cached ? sm.score[c.warp][base + r - c.kmin] : tile_score(c, sm, r);
}

// The softmax of the warp's query: its maximum score and 1 / sum_j exp(s_j - max) (the sum in
// f64, in the lanes' order); cached blocks keep the scores. Every thread of the block calls it.
template <int kDim, bool kGrad>
__device__ void softmax_stats(const TileQuery& c, QueryTileShared<kDim, kGrad>& sm, float* mx_out,
                              float* inv_out) {
  float mx = -INFINITY;
  for_key_tiles(c, sm, true, false, [&](int64_t base, int count) {
    for_lane_keys(c, base, count, [&](int r) {
      const float s = tile_score(c, sm, r);
      if (c.cached) sm.score[c.warp][base + r - c.kmin] = s;
      mx = fmaxf(mx, s);
    });
  });
  mx = warp_max(mx);
  double sum = 0;
  for_key_tiles(c, sm, !c.cached, false, [&](int64_t base, int count) {
    for_lane_keys(c, base, count,
                  [&](int r) { sum += double(expf(score_at(c, sm, base, r) - mx)); });
  });
  *mx_out = mx;
  *inv_out = float(1.0 / warp_sum(sum));
}

// acc[c] += sum over the query's staged keys r in order of sm.w[warp][r] float(rows[r][lane +
// 32 c]) for the dims below `dims`, after the warp has written its weights.
template <int kDim, bool kGrad>
__device__ void accumulate_rows(const TileQuery& c, const QueryTileShared<kDim, kGrad>& sm,
                                const double (*rows)[kDim + 1], int64_t base, int count,
                                int64_t dims, float* acc) {
  __syncwarp();  // the lanes' weights are written
  int lo, hi;
  window_in_tile(c, base, count, &lo, &hi);
  for (int r = lo; r <= hi; ++r) {
    const float w = sm.w[c.warp][r];
#pragma unroll
    for (int k = 0; k < kDim / 32; ++k) {
      const int d = c.lane + 32 * k;
      if (d < dims) acc[k] += w * float(rows[r][d]);
    }
  }
}

// Launches kernel(args) over the query tiles of `f`'s call: a block per (kQueries tokens, row,
// head), `bytes` of shared memory.
template <class Args>
cudaError_t launch_query_tiles(void (*kernel)(Args), const Args& args, const AttentionF64Launch& f,
                               int bytes, cudaStream_t stream) {
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess)
    return e;
  const unsigned tiles = unsigned((f.rows.tokens + kQueries - 1) / kQueries);
  kernel<<<dim3(tiles, unsigned(f.rows.count), unsigned(f.heads)), kTileThreads, bytes, stream>>>(
      args);
  return cudaGetLastError();
}
