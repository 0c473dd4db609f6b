// Plain f32 training kernels (see ops.h). Inner loops are contiguous axpys so the compiler
// vectorizes them without reassociating any sum.
#include "train/ops.h"

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"

namespace deg::train {
namespace {

// Enough work per chunk that tiny matrices stay on one thread.
int64_t grain_for(int64_t work_per_row) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_row));
}

}  // namespace

void matmul_nn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  parallel_for(
      N,
      [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          float* yr = y + n * M;
          if (!accumulate) std::memset(yr, 0, sizeof(float) * size_t(M));
          const float* xr = x + n * K;
          for (int64_t k = 0; k < K; ++k) {
            const float a = xr[k];
            if (a == 0.0f) continue;
            const float* wr = w + k * M;
            for (int64_t m = 0; m < M; ++m) yr[m] += a * wr[m];
          }
        }
      },
      grain_for(K * M));
}

void matmul_nt(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  // y = x . (w^T): transpose w once into [K, M], then the axpy form.
  std::vector<float> wt(size_t(K * M));
  parallel_for(
      M,
      [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m)
          for (int64_t k = 0; k < K; ++k) wt[size_t(k * M + m)] = w[m * K + k];
      },
      grain_for(K));
  matmul_nn(x, wt.data(), y, N, K, M, accumulate);
}

void matmul_tn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  parallel_for(
      K,
      [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          float* yr = y + k * M;
          if (!accumulate) std::memset(yr, 0, sizeof(float) * size_t(M));
          for (int64_t n = 0; n < N; ++n) {
            const float a = x[n * K + k];
            if (a == 0.0f) continue;
            const float* wr = w + n * M;
            for (int64_t m = 0; m < M; ++m) yr[m] += a * wr[m];
          }
        }
      },
      grain_for(N * M));
}

void rmsnorm_forward(const float* x, float* y, float* rstd, int64_t N, int64_t C, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    const float r = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
    if (rstd) rstd[n] = r;
    float* yr = y + n * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r;
  }
}

void rmsnorm_backward(const float* y, const float* rstd, const float* dy, float* dx, int64_t N,
                      int64_t C, bool accumulate) {
  for (int64_t n = 0; n < N; ++n) {
    const float* yr = y + n * C;
    const float* dyr = dy + n * C;
    const float m = dot(dyr, yr, C) / float(C);
    float* dxr = dx + n * C;
    const float r = rstd[n];
    for (int64_t c = 0; c < C; ++c) {
      const float g = r * (dyr[c] - yr[c] * m);
      dxr[c] = accumulate ? dxr[c] + g : g;
    }
  }
}

}  // namespace deg::train
