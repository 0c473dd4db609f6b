// The CUDA backend's logit_picks (launch.h): greedy decoding's reading of LM logits, so a decode
// step copies back a few numbers per row instead of the row's whole vocabulary.
//
// A row is one block of kPickThreads threads; thread i takes columns i, i + kPickThreads, ... in
// order. The best and second-best (value, first index) of each thread combine in a fixed tree
// (the larger value wins, the smaller index on a tie: the same result in any order), and the
// sum of exp(l - max) in f64 per thread, then a fixed tree: a row's figures depend on its own
// logits and n only. The CPU backends sum in index order, so `sum` agrees with theirs to rounding.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

constexpr int kPickThreads = 256;
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

__global__ void logit_picks_kernel(const LogitPicksLaunch a) {
  __shared__ Top2 tops[kPickThreads];
  __shared__ double red[kPickThreads];
  __shared__ int bads[kPickThreads];
  const int tid = int(threadIdx.x);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float* l = a.logits + r * a.ld;
    Top2 t{0.0f, 0.0f, -1, -1};
    int bad = 0;
    for (int64_t i = tid; i < a.n; i += kPickThreads) {
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
      for (int64_t i = tid; i < a.n; i += kPickThreads)
        if (isfinite(l[i])) s += exp(double(l[i]) - mx);
    s = block_sum(s, red);
    if (tid == 0) {
      a.best[r] = best.i1;
      a.second[r] = best.i2;
      a.best_logit[r] = best.i1 < 0 ? 0.0f : best.v1;
      a.second_logit[r] = best.i2 < 0 ? 0.0f : best.v2;
      a.max[r] = mx;
      a.sum[r] = s;
      a.bad[r] = any_bad;
    }
  }
}

}  // namespace

cudaError_t launch_logit_picks(const LogitPicksLaunch& a, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.n > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  logit_picks_kernel<<<block_per_item(a.rows), kPickThreads, 0, stream>>>(a);
  return launched();
}

}  // namespace deg::cuda
