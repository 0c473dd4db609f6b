// The launch shape the elementwise-style kernels share (mixing.cu, backward.cu, optimizer.cu):
// 256-thread blocks, a capped grid, and a grid-stride loop over the rest. Internal to those .cu
// files: each includes it inside its own anonymous namespace, after kernels/cuda/launch.h (which
// brings <cstdint> and the CUDA runtime).
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

inline cudaError_t launched() {
  return cudaGetLastError();
}
