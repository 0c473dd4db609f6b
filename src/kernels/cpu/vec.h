// Inline vector helpers for the CPU kernels (internal to kernels/cpu). Reductions keep 16
// independent partial sums, combined in one fixed order at the end: the compiler can map them to
// SIMD lanes without reassociating anything, and the result depends on n only — never on which
// row, batch or thread computes it.
#pragma once

#include <cmath>
#include <cstdint>

// Hot loop kernels are compiled three times (AVX-512, AVX2+FMA, baseline x86-64) and the loader
// picks one per process (GCC function multi-versioning), so the plain loops below vectorise to
// the CPU at hand. One process always runs the same version: results stay bitwise reproducible.
#define DEG_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace deg::vec {

inline constexpr int kLanes = 16;

inline float combine(const float* acc) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = acc[i] + acc[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  return combine(acc);
}

inline float sum_squares(const float* a, int64_t n) {
  return dot(a, a, n);
}

// y += s * x
inline void axpy(float* y, float s, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

inline void scale(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
// torch.nn.functional.softplus with beta 1, threshold 20.
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

}  // namespace deg::vec
