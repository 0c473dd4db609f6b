// Plain f32 training kernels (see ops.h). The products run the CPU's product kernels
// (kernels/gemm.h) over chunks of rows; other inner loops are contiguous axpys so the compiler
// vectorizes them without reassociating any sum.
#include "train/ops.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/thread_pool.h"
#include "kernels/gemm.h"

namespace deg::train {
namespace {

// Rows of y in chunks of enough work that tiny products stay on one thread; each chunk one call
// of the single-threaded product kernels (kernels/gemm.h), whose every element's order depends
// on K only, so the chunking never changes a bit.
void rows_in_chunks(int64_t N, int64_t work_per_row,
                    const std::function<void(int64_t, int64_t)>& f) {
  parallel_for(N, f, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_row)));
}

}  // namespace

void matmul_nn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  rows_in_chunks(N, K * M, [&](int64_t b, int64_t e) {
    deg::matmul_nn({.a = x + b * K,
                    .lda = K,
                    .b = w,
                    .ldb = M,
                    .m = e - b,
                    .n = M,
                    .k = K,
                    .c = y + b * M,
                    .ldc = M,
                    .accumulate = accumulate});
  });
}

void matmul_nt(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate) {
  rows_in_chunks(N, K * M, [&](int64_t b, int64_t e) {
    deg::matmul_nt({.a = x + b * K,
                    .lda = K,
                    .b = w,
                    .ldb = K,
                    .m = e - b,
                    .n = M,
                    .k = K,
                    .c = y + b * M,
                    .ldc = M,
                    .accumulate = accumulate});
  });
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
