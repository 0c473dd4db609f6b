// The launch shape the elementwise-style kernels share (mixing.cu, backward.cu, optimizer.cu):
// 256-thread blocks, a capped grid, and a grid-stride loop over the rest; and a fixed-tree block
// sum (backward.cu, optimizer.cu, attention_f64_backward.cu). Internal to those .cu files: each
// includes it inside its own anonymous namespace, after kernels/cuda/launch.h (which brings
// <cstdint> and the CUDA runtime).
#pragma once

constexpr int kThreads = 256;

// Blocks for n threads' worth of work, capped (the kernels loop over the rest).
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// A loop over [0, n) spread over the whole grid.
#define DEG_GRID_LOOP(i, n)                                                 \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__device__ inline float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// f64-accumulated dot product.
__device__ inline double dot_f64(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// The sum of x over the block by a fixed tree (blockDim.x a power of two, `red` a shared array of
// blockDim.x): every thread gets the same bits, and `red` may be reused at once.
__device__ inline double block_sum(double x, double* red) {
  const int tid = int(threadIdx.x);
  red[tid] = x;
  __syncthreads();
  for (int s = int(blockDim.x) / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  const double r = red[0];
  __syncthreads();
  return r;
}

// Blocks for one block per item, capped (the kernels loop over the rest).
inline unsigned block_per_item(int64_t n) {
  return unsigned(n < 65535 ? n : 65535);
}

inline cudaError_t launched() {
  return cudaGetLastError();
}
