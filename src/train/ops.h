// Plain f32 CPU kernels for the training core (forward and backward): GEMMs in the three
// orientations a linear layer's forward/backward needs, row RMS norm, GELU, and small helpers.
// Every output element is accumulated by one thread in a fixed order, so results do not depend
// on the thread count. These live in src/train/ until they merge with src/kernels/.
//
// Letters: N rows, K reduction, M output columns.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace deg::train {

// y[N, M] (+)= x[N, K] . w[M, K]^T   (nn.Linear forward)
void matmul_nt(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate = false);
// y[N, M] (+)= x[N, K] . w[K, M]
void matmul_nn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate = false);
// y[K, M] (+)= x[N, K]^T . w[N, M]   (weight gradients)
void matmul_tn(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t M,
               bool accumulate = false);

// Linear layer y = x W^T with W [M, K]: backward adds dx += dy W and dW += dy^T x.
inline void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                            int64_t N, int64_t K, int64_t M) {
  if (dx) matmul_nn(dy, w, dx, N, M, K, true);
  if (dw) matmul_tn(dy, x, dw, N, M, K, true);
}

// Row RMS norm without weight: y = x / sqrt(mean(x^2) + eps); rstd[N] is kept for backward.
void rmsnorm_forward(const float* x, float* y, float* rstd, int64_t N, int64_t C, float eps);
// dx (+)= rstd * (dy - y * mean(dy * y)).
void rmsnorm_backward(const float* y, const float* rstd, const float* dy, float* dx, int64_t N,
                      int64_t C, bool accumulate = true);

inline float gelu(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}
inline float gelu_grad(float x) {
  return 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) +
         x * 0.39894228040143268f * std::exp(-0.5f * x * x);
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
inline float dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return float(s);
}

// A vector of zeros, the scratch type of the training core.
using Buf = std::vector<float>;
inline Buf zeros(int64_t n) {
  return Buf(size_t(n), 0.0f);
}

}  // namespace deg::train
