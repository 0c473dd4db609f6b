// The CUDA backend's logit_picks (launch.h): greedy decoding's reading of LM logits, so a decode
// step copies back a few numbers per row instead of the row's whole vocabulary.
//
// A row is cut into parts of kPickChunk columns, a block of kPickThreads threads each (a row
// alone fills the GPU: one block per row read 248,320 logits in 0.7 ms); thread i of a part takes
// its columns i, i + kPickThreads, ... in order. The best and second-best (value, first index) of
// each thread combine in a fixed tree (the larger value wins, the smaller index on a tie: the
// same result in any order), and the part's sum of exp(l - part max) in f64 per thread, then a
// fixed tree; a second kernel meets the parts in part order. The parts depend on n alone, so a
// row's figures depend on its own logits and n only. The CPU backends sum in index order, so
// `sum` agrees with theirs to rounding.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

constexpr int kPickThreads = 256;
constexpr int kPickChunk = 4096;  // columns of a row one block reads (a 248,320 vocabulary: 61)
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

// One part of a row: its best two, the maximum and Σ exp(l - maximum) in f64 over its columns.
struct Part {
  Top2 top;
  double max, sum;
  int bad;
};

// Block (p, r) reads columns [p kPickChunk, (p + 1) kPickChunk) of row r.
__global__ void logit_parts_kernel(const LogitPicksLaunch a, Part* parts, int nparts) {
  __shared__ Top2 tops[kPickThreads];
  __shared__ double red[kPickThreads];
  __shared__ int bads[kPickThreads];
  const int tid = int(threadIdx.x);
  const int64_t lo = int64_t(blockIdx.x) * kPickChunk;
  const int64_t hi = lo + kPickChunk < a.n ? lo + kPickChunk : a.n;
  for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
    const float* l = a.logits + r * a.ld;
    Top2 t{0.0f, 0.0f, -1, -1};
    int bad = 0;
    for (int64_t i = lo + tid; i < hi; i += kPickThreads) {
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
    const Top2 best = tops[0];
    const int any_bad = bads[0];
    __syncthreads();
    const double mx = best.i1 < 0 ? 0.0 : double(best.v1);
    double s = 0;
    if (best.i1 >= 0)
      for (int64_t i = lo + tid; i < hi; i += kPickThreads)
        if (isfinite(l[i])) s += exp(double(l[i]) - mx);
    s = block_sum(s, red);
    if (tid == 0) parts[r * nparts + blockIdx.x] = {best, mx, s, any_bad};
  }
}

// A thread per row meets its parts in part order: the best two of all, the row's maximum, and
// Σ_p sum_p exp(max_p - max) in f64.
__global__ void logit_merge_kernel(const LogitPicksLaunch a, const Part* parts, int nparts) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < a.rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const Part* pr = parts + r * nparts;
    Top2 t{0.0f, 0.0f, -1, -1};
    int bad = 0;
    for (int p = 0; p < nparts; ++p) {
      offer(t, pr[p].top.v1, pr[p].top.i1);
      offer(t, pr[p].top.v2, pr[p].top.i2);
      bad |= pr[p].bad;
    }
    const double mx = t.i1 < 0 ? 0.0 : double(t.v1);
    double s = 0;
    if (t.i1 >= 0)
      for (int p = 0; p < nparts; ++p)
        if (pr[p].top.i1 >= 0) s += pr[p].sum * exp(pr[p].max - mx);
    a.best[r] = t.i1;
    a.second[r] = t.i2;
    a.best_logit[r] = t.i1 < 0 ? 0.0f : t.v1;
    a.second_logit[r] = t.i2 < 0 ? 0.0f : t.v2;
    a.max[r] = mx;
    a.sum[r] = s;
    a.bad[r] = bad;
  }
}

int parts_of(int64_t n) {  // at least one (an empty row has no best)
  return n > 0 ? int((n + kPickChunk - 1) / kPickChunk) : 1;
}

}  // namespace

size_t logit_picks_workspace(int64_t rows, int64_t n) {
  return size_t(rows) * size_t(parts_of(n)) * sizeof(Part);
}

cudaError_t launch_logit_picks(const LogitPicksLaunch& a, void* workspace, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.n > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  const int nparts = parts_of(a.n);
  auto* parts = static_cast<Part*>(workspace);
  const dim3 grid(unsigned(nparts), block_per_item(a.rows));
  logit_parts_kernel<<<grid, kPickThreads, 0, stream>>>(a, parts, nparts);
  constexpr int kRowsPerBlock = 128;
  logit_merge_kernel<<<block_per_item((a.rows + kRowsPerBlock - 1) / kRowsPerBlock), kRowsPerBlock,
                       0, stream>>>(a, parts, nparts);
  return launched();
}

}  // namespace deg::cuda
