// The CUDA backend's optimizer steps (launch.h "optimizer.cu"): Adam and Nesterov elementwise;
// the f64 sum of squares by the CPU's chunks (a chunk a block's fixed tree, the chunks in
// order); NorMuon's step of a batch of blocks in three kernels (per row or column mean squares and
// second moments, a thread per block for its renormalising ratio, then the elementwise update),
// each sum in index order as the CPU's.
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
  DEG_GRID_LOOP(e, a.n * a.count) {
    const int64_t v = e / a.n, i = e % a.n;
    float* g = a.gs ? a.gs[v] : a.g;
    float* buf = a.bufs ? a.bufs[v] : a.buf;
    buf[i] += (1.0f - a.momentum) * (g[i] - buf[i]);
    a.u[e] = g[i] + a.momentum * (buf[i] - g[i]);
    g[i] = 0.0f;
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

// Block b's (a batch's block b) second moments, parameters, work ([2 nsec + 1] floats) and rate.
struct NorMuonBlock {
  const float* u;
  float* p;
  float* second;
  float* work;
  float lr;
  __device__ NorMuonBlock(const NorMuonLaunch& a, int64_t b, int64_t nsec)
      : u(a.u + b * a.rows * a.cols),
        p(a.ps ? a.ps[b] : a.p),
        second(a.seconds ? a.seconds[b] : a.second),
        work(a.work + b * (2 * nsec + 1)),
        lr(a.lr_muls ? a.lr * a.lr_muls[b] : a.lr) {}
};

// A thread per (block, section s): work[s] the mean square of row / column s, then work[nsec + s]
// its step; second updated.
__global__ void normuon_moments_kernel(NorMuonLaunch a) {
  const bool tall = a.rows >= a.cols;
  const int64_t red = tall ? a.cols : a.rows, nsec = tall ? a.rows : a.cols;
  DEG_GRID_LOOP(e, nsec * a.count) {
    const int64_t s = e % nsec;
    const NorMuonBlock b(a, e / nsec, nsec);
    float m = 0.0f;
    for (int64_t k = 0; k < red; ++k) {
      const float x = tall ? b.u[s * a.cols + k] : b.u[k * a.cols + s];
      m += x * x / float(red);
    }
    b.work[s] = m;
    b.second[s] += (1.0f - a.beta2) * (m - b.second[s]);
    b.work[nsec + s] = 1.0f / sqrtf(fmaxf(b.second[s], 1e-10f));
  }
}

// A thread per block: its renormalising ratio, the sections in order.
__global__ void normuon_ratio_kernel(NorMuonLaunch a) {
  const bool tall = a.rows >= a.cols;
  const int64_t red = tall ? a.cols : a.rows, nsec = tall ? a.rows : a.cols;
  DEG_GRID_LOOP(blk, a.count) {
    const NorMuonBlock b(a, blk, nsec);
    double vnorm_sq = 0, scaled = 0;
    for (int64_t s = 0; s < nsec; ++s) {
      const float st = b.work[nsec + s];
      vnorm_sq += double(b.work[s]) * double(red);
      scaled += double(b.work[s]) * double(red) * st * st;
    }
    const double den = sqrt(scaled) > 1e-10 ? sqrt(scaled) : 1e-10;
    b.work[2 * nsec] = float(sqrt(vnorm_sq) / den);
  }
}

__global__ void normuon_update_kernel(NorMuonLaunch a) {
  const bool tall = a.rows >= a.cols;
  const int64_t nsec = tall ? a.rows : a.cols, n = a.rows * a.cols;
  DEG_GRID_LOOP(f, n * a.count) {
    const int64_t e = f % n, i = e / a.cols, j = e % a.cols;
    const NorMuonBlock b(a, f / n, nsec);
    const float v = b.u[e] * b.work[nsec + (tall ? i : j)] * b.work[2 * nsec];
    const float decay = (v * b.p[e] >= 0.0f) ? b.p[e] * a.wd * b.lr : 0.0f;
    b.p[e] = b.p[e] - decay - v * b.lr;
  }
}

}  // namespace

cudaError_t launch_adam_step(const AdamLaunch& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  adam_kernel<<<grid_for(a.n), kThreads, 0, stream>>>(a);
  return launched();
}

cudaError_t launch_nesterov(const NesterovLaunch& a, cudaStream_t stream) {
  if (a.n * a.count == 0) return cudaSuccess;
  nesterov_kernel<<<grid_for(a.n * a.count), kThreads, 0, stream>>>(a);
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
  if (a.rows * a.cols * a.count == 0) return cudaSuccess;
  const int64_t nsec = a.rows >= a.cols ? a.rows : a.cols;
  normuon_moments_kernel<<<grid_for(nsec * a.count), kThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  normuon_ratio_kernel<<<grid_for(a.count), kThreads, 0, stream>>>(a);
  if (cudaError_t e = launched(); e != cudaSuccess) return e;
  normuon_update_kernel<<<grid_for(a.rows * a.cols * a.count), kThreads, 0, stream>>>(a);
  return launched();
}

}  // namespace deg::cuda
