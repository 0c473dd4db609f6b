// Row norms: RMSNorm (HF Qwen3.5's `1 + w` form and the plain `w` form), the gated RMSNorm of
// Gated DeltaNet, and L2 normalisation. One row at a time with a fixed reduction order, so a
// row's result never depends on the other rows (batch invariance). Rows are `dim` contiguous
// floats at a stride; x and y may alias (in place).
#pragma once

#include <cstdint>

namespace deg {

enum class NormScale : uint8_t {
  one_plus_w,  // y = norm(x) * (1 + w)   (Qwen3.5 RMSNorm, zero-centred weight)
  w,           // y = norm(x) * w
};

struct RmsNormArgs {
  const float* x = nullptr;  // [rows, dim] at stride ldx
  int64_t ldx = 0;
  float* y = nullptr;  // [rows, dim] at stride ldy
  int64_t ldy = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  const float* w = nullptr;  // [dim]
  float eps = 1e-6f;
  NormScale scale = NormScale::one_plus_w;
};
// y = x * rsqrt(mean(x²) + eps) * scale(w)
void rms_norm(const RmsNormArgs& a);

// Gated DeltaNet output norm: y = w * (x * rsqrt(mean(x²) + eps)) * silu(gate). gate has the
// layout of x ([rows, dim] at stride ldg).
void gated_rms_norm(const RmsNormArgs& a, const float* gate, int64_t ldg);

// x = x * rsqrt(sum(x²) + eps) * post_scale, in place (q/k of the delta rule; HF's l2norm).
void l2_norm(float* x, int64_t ldx, int64_t rows, int64_t dim, float eps, float post_scale);

}  // namespace deg
