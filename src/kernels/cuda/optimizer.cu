// The CUDA backend's optimizer steps (launch.h "optimizer.cu"): Adam and Nesterov elementwise;
// the f64 sum of squares by the CPU's chunks (a chunk a block's fixed tree, the chunks in
// order); NorMuon's block step in three kernels (per row or column mean squares and second
// moments, one thread for the renormalising ratio, then the elementwise update), each sum in
// index order as the CPU's.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace deg::cuda {

namespace {

#include "kernels/cuda/grid.cuh"

__global__ void adam_kernel(AdamLaunch a) {
  DEG_GRID_LOOP(i, a.n) {
    const float g = a.g[i];
    a.m[i] = a.beta1 * a.m[i] + (1.0f - a.beta1) * g;
    a.v[i] = a.beta2 * a.v[i] + (1.0f - a.beta2) * g * g;
    float upd = a.m[i] / (sqrtf(a.v[i]) + a.eps) * a.step_size;
    if (upd * a.p[i] > 0.0f) upd += a.p[i] * a.wd;
    a.p[i] -= upd;
    a.g[i] = 0.0f;
  }
}

__global__ void nesterov_kernel(NesterovLaunch a) {
  DEG_GRID_LOOP(i, a.n) {
    a.buf[i] += (1.0f - a.momentum) * (a.g[i] - a.buf[i]);
    a.u[i] = a.g[i] + a.momentum * (a.buf[i] - a.g[i]);
  }
}

// A block per chunk: thread t squares elements t, t + kThreads, ... of the chunk, then
// block_sum's tree (the chunk's partial sum depends on its elements only). blockIdx.y: the
// vector of n at x + y n, its chunks' sums at partial + y chunks.
__global__ void __launch_bounds__(kThreads)
    sum_chunks_kernel(const float* x, int64_t n, int64_t chunk, int64_t chunks, double* partial) {
  __shared__ double red[kThreads];
  x += int64_t(blockIdx.y) * n;
  partial += int64_t(blockIdx.y) * chunks;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    double s = 0;
    for (int64_t i = b + threadIdx.x; i < e; i += kThreads) s += double(x[i]) * double(x[i]);
    const double total = block_sum(s, red);
    if (threadIdx.x == 0) partial[c] = total;
  }
}

__global__ void sum_partials_kernel(const double* partial, int64_t chunks, double* out) {
  double s = 0;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c];
  *out = s;
}

// frobenius_normalize: a thread per block, its chunks' sums in order, then its factor.
__global__ void normalize_factors_kernel(FrobeniusNormalizeLaunch a, const double* partial,
                                         int64_t chunks, float* factor) {
  DEG_GRID_LOOP(i, a.count) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[i * chunks + c];
    factor[i] = float(1.0 / (sqrt(s) * (1 + a.margin) + a.eps));
  }
}

__global__ void normalize_scale_kernel(FrobeniusNormalizeLaunch a, const float* factor) {
  DEG_GRID_LOOP(e, a.n * a.count) a.x[e] *= factor[e / a.n];
}

// work[s]: the mean square of row / column s, then work[nsec + s] its step; second updated.
__global__ void normuon_moments_kernel(NorMuonLaunch a) {
  const bool tall = a.rows >= a.cols;
  const int64_t red = tall ? a.cols : a.rows, nsec = tall ? a.rows : a.cols;
  DEG_GRID_LOOP(s, nsec) {
    float m = 0.0f;
    for (int64_t k = 0; k < red; ++k) {
      const float x = tall ? a.u[s * a.cols + k] : a.u[k * a.cols + s];
      m += x * x / float(red);
    }
    a.work[s] = m;
    a.second[s] += (1.0f - a.beta2) * (m - a.second[s]);
    a.work[nsec + s] = 1.0f / sqrtf(fmaxf(a.second[s], 1e-10f));
  }
}

__global__ void normuon_ratio_kernel(NorMuonLaunch a) {
  const bool tall = a.rows >= a.cols;
  const int64_t red = tall ? a.cols : a.rows, nsec = tall ? a.rows : a.cols;
  double vnorm_sq = 0, scaled = 0;
  for (int64_t s = 0; s < nsec; ++s) {
    const float st = a.work[nsec + s];
    vnorm_sq += double(a.work[s]) * double(red);
    scaled += double(a.work[s]) * double(red) * st * st;
  }
  const double den = sqrt(scaled) > 1e-10 ? sqrt(scaled) : 1e-10;
  a.work[2 * nsec] = float(sqrt(vnorm_sq) / den);
}

__global__ void normuon_update_kernel(NorMuonLaunch a) {
  const bool tall = a.rows >= a.cols;
  const int64_t nsec = tall ? a.rows : a.cols;
  const float ratio = a.work[2 * nsec];
  DEG_GRID_LOOP(e, a.rows * a.cols) {
    const int64_t i = e / a.cols, j = e % a.cols;
    const float v = a.u[e] * a.work[nsec + (tall ? i : j)] * ratio;
    const float decay = (v * a.p[e] >= 0.0f) ? a.p[e] * a.wd * a.lr : 0.0f;
    a.p[e] = a.p[e] - decay - v * a.lr;
  }
}

}  // namespace

cudaError_t launch_adam_step(const AdamLaunch& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  adam_kernel<<<grid_for(a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_nesterov(const NesterovLaunch& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  nesterov_kernel<<<grid_for(a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_sum_squares(const float* x, int64_t n, int64_t chunk, double* partial,
                               double* out, cudaStream_t stream) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks > 0) {
    sum_chunks_kernel<<<block_per_item(chunks), kThreads, 0, stream>>>(x, n, chunk, chunks,
                                                                       partial);
    if (cudaError_t e = launched(); e != cudaSuccess) return e;
  }
  sum_partials_kernel<<<1, 1, 0, stream>>>(partial, chunks, out);
  return launched();
}

cudaError_t launch_frobenius_normalize(const FrobeniusNormalizeLaunch& a, int64_t chunk,
                                       double* partial, float* factor, cudaStream_t stream) {
  if (a.n * a.count == 0) return cudaSuccess;
  const int64_t chunks = (a.n + chunk - 1) / chunk;
  if (a.count > 65535) return cudaErrorInvalidValue;
  sum_chunks_kernel<<<dim3(block_per_item(chunks), unsigned(a.count)), kThreads, 0, stream>>>(
      a.x, a.n, chunk, chunks, partial);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  normalize_factors_kernel<<<grid_for(a.count), kThreads, 0, stream>>>(a, partial, chunks, factor);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  normalize_scale_kernel<<<grid_for(a.n * a.count), kThreads, 0, stream>>>(a, factor);
  return launched();
}

cudaError_t launch_normuon_step(const NorMuonLaunch& a, cudaStream_t stream) {
  if (a.rows * a.cols == 0) return cudaSuccess;
  const int64_t nsec = a.rows >= a.cols ? a.rows : a.cols;
  normuon_moments_kernel<<<grid_for(nsec), kThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  normuon_ratio_kernel<<<1, 1, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  normuon_update_kernel<<<grid_for(a.rows * a.cols), kThreads, 0, stream>>>(a);
  return launched();
}

}  // namespace deg::cuda
