// The CUDA backend's logit_picks (launch.h): greedy decoding's reading of LM logits, so a decode
// step copies back a few numbers per row instead of the row's whole vocabulary.
//
// A row splits into up to kChunks chunks of at least kPickThreads columns (the split set by n
// alone), a block each: thread i takes the chunk's columns i, i + kPickThreads, ... in order;
// the threads' best and second-best (value, first index) combine in a fixed tree (the larger
// value wins, the smaller index on a tie: the same result in any order), the chunk's Σ exp(l -
// m) (m its largest logit) in f64 per thread, then a fixed tree. A second kernel takes a row's
// chunks in order: the top two, and sum = Σ s_c exp(m_c - max). A row's figures depend on its own
// logits and n only; the CPU backends sum in index order, so `sum` agrees with theirs to rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

constexpr int kPickThreads = 256;
constexpr int64_t kChunks = 64;  // blocks per row (at most)
static_assert(kPickThreads == kThreads, "block_sum's shared array is kThreads long");

struct Top2 {
  float v1, v2;  // best and second-best finite values (v2 <= v1)
  int i1, i2;    // their first indices, -1 when none
};

// a ranks before b: the larger value, then the smaller index; an empty slot (-1) last.
__device__ bool before(float va, int ia, float vb, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  return va > vb || (va == vb && ia < ib);
}

__device__ void offer(Top2& t, float v, int i) {
  if (before(v, i, t.v1, t.i1)) {
    t.v2 = t.v1;
    t.i2 = t.i1;
    t.v1 = v;
    t.i1 = i;
  } else if (before(v, i, t.v2, t.i2)) {
    t.v2 = v;
    t.i2 = i;
  }
}

// One chunk's figures: its top two, a non-finite flag, its largest logit m and Σ exp(l - m).
struct Part {
  Top2 top;
  int bad;
  double m, s;
};

// Block (row r, chunk c): columns [c0, c1) of the row, thread i taking c0 + i, c0 + i +
// kPickThreads, ... in order; then fixed trees over the block.
__global__ void logit_picks_parts(const LogitPicksLaunch a, int64_t chunk, Part* parts) {
  __shared__ Top2 tops[kPickThreads];
  __shared__ double red[kPickThreads];
  __shared__ int bads[kPickThreads];
  const int tid = int(threadIdx.x);
  const int64_t r = blockIdx.y, c = blockIdx.x;
  const float* l = a.logits + r * a.ld;
  const int64_t c0 = c * chunk, c1 = c0 + chunk < a.n ? c0 + chunk : a.n;
  Top2 t{0.0f, 0.0f, -1, -1};
  int bad = 0;
  for (int64_t i = c0 + tid; i < c1; i += kPickThreads) {
    const float v = l[i];
    if (isfinite(v)) {
      offer(t, v, int(i));
    } else if (!(v < 0.0f)) {
      bad = 1;  // NaN or +inf
    }
  }
  tops[tid] = t;
  bads[tid] = bad;
  __syncthreads();
  for (int s = kPickThreads / 2; s > 0; s >>= 1) {
    if (tid < s) {
      Top2 m = tops[tid];
      const Top2 o = tops[tid + s];
      offer(m, o.v1, o.i1);
      offer(m, o.v2, o.i2);
      tops[tid] = m;
      bads[tid] |= bads[tid + s];
    }
    __syncthreads();
  }
  const Top2 top = tops[0];
  const int any_bad = bads[0];
  const double m = top.i1 < 0 ? 0.0 : double(top.v1);
  double s = 0;
  if (top.i1 >= 0)
    for (int64_t i = c0 + tid; i < c1; i += kPickThreads)
      if (isfinite(l[i])) s += exp(double(l[i]) - m);
  s = block_sum(s, red);
  if (tid == 0) parts[r * gridDim.x + c] = Part{top, any_bad, m, s};
}

// Thread r: row r's chunks in order.
__global__ void logit_picks_rows(const LogitPicksLaunch a, int chunks, const Part* parts) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= a.rows) return;
  const Part* p = parts + r * chunks;
  Top2 top{0.0f, 0.0f, -1, -1};
  int bad = 0;
  for (int c = 0; c < chunks; ++c) {
    offer(top, p[c].top.v1, p[c].top.i1);
    offer(top, p[c].top.v2, p[c].top.i2);
    bad |= p[c].bad;
  }
  const double mx = top.i1 < 0 ? 0.0 : double(top.v1);
  double sum = 0;
  for (int c = 0; c < chunks; ++c)
    if (p[c].top.i1 >= 0) sum += p[c].s * exp(p[c].m - mx);
  a.best[r] = top.i1;
  a.second[r] = top.i2;
  a.best_logit[r] = top.i1 < 0 ? 0.0f : top.v1;
  a.second_logit[r] = top.i2 < 0 ? 0.0f : top.v2;
  a.max[r] = mx;
  a.sum[r] = sum;
  a.bad[r] = bad;
}

}  // namespace

cudaError_t launch_logit_picks(const LogitPicksLaunch& a, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.n > int64_t(INT32_MAX) || a.rows > 65535) return cudaErrorInvalidValue;
  // A row in kChunks chunks (fewer for short rows), each a block: a decode step of one row
  // fills the GPU. The split depends on n only, never on the rows.
  const int64_t chunk = std::max<int64_t>(kPickThreads, (a.n + kChunks - 1) / kChunks);
  const int chunks = int((a.n + chunk - 1) / chunk > 0 ? (a.n + chunk - 1) / chunk : 1);
  Part* parts = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&parts),
                                    size_t(a.rows) * size_t(chunks) * sizeof(Part), stream);
  if (err != cudaSuccess) return err;
  logit_picks_parts<<<dim3(unsigned(chunks), unsigned(a.rows)), kPickThreads, 0, stream>>>(a, chunk,
                                                                                           parts);
  err = launched();
  if (err == cudaSuccess) {
    logit_picks_rows<<<unsigned((a.rows + 127) / 128), 128, 0, stream>>>(a, chunks, parts);
    err = launched();
  }
  const cudaError_t freed = cudaFreeAsync(parts, stream);
  return err != cudaSuccess ? err : freed;
}

}  // namespace deg::cuda
