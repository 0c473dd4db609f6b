// Plain f32 training kernels (see ops.h). The products run the CPU's product kernels
// (kernels/gemm.h) over chunks of rows; other inner loops are contiguous axpys so the compiler
// vectorizes them without reassociating any sum.
#include "train/ops.h"

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/gemm.h"

namespace deg::train {
namespace {

// y[N, M] (+)= x[N, K] . B by `kernel` (kernels/gemm.h's matmul_nn or matmul_nt, B's rows ldb
// apart) over chunks of rows of enough work that tiny products stay on one thread. Every
// element's order depends on K only, so the chunking never changes a bit.
void product(void (*kernel)(const MatmulArgs&), const float* x, const float* b, int64_t ldb,
             float* y, int64_t N, int64_t K, int64_t M, bool accumulate) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, K * M));
  parallel_for(
      N,
      [&](int64_t r0, int64_t r1) {
        kernel({.a = x + r0 * K,
                .lda = K,
                .b = b,
                .ldb = ldb,
                .m = r1 - r0,
                .n = M,
                .k = K,
                .c = y + r0 * M,
                .ldc = M,
                .accumulate = accumulate});
      },
      grain);
}

}  // namespace

void matmul_nn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  product(deg::matmul_nn, x, w, M, y, N, K, M, accumulate);
}

void matmul_nt(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  product(deg::matmul_nt, x, w, K, y, N, K, M, accumulate);
}

void matmul_tn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  // x^T [K, N] once, then the nn form.
  std::vector<float> xt(size_t(K * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) xt[size_t(k * N + n)] = x[n * K + k];
  matmul_nn(xt.data(), w, y, K, N, M, accumulate);
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
