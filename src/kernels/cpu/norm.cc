// CPU row norms and activations (kernels/norm.h, kernels/activation.h): scalar code whose
// reductions use the fixed 16-lane order of kernels/cpu/vec.h.
#include "kernels/norm.h"

#include <cmath>

#include "kernels/activation.h"
#include "kernels/cpu/vec.h"

namespace deg {

DEG_CPU_CLONES void rms_norm(const RmsNormArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.ldx;
    float* y = a.y + r * a.ldy;
    const float inv = 1.0f / std::sqrt(vec::sum_squares(x, a.dim) / float(a.dim) + a.eps);
    if (a.scale == NormScale::one_plus_w) {
      for (int64_t i = 0; i < a.dim; ++i) y[i] = (x[i] * inv) * (1.0f + a.w[i]);
    } else {
      for (int64_t i = 0; i < a.dim; ++i) y[i] = (x[i] * inv) * a.w[i];
    }
  }
}

DEG_CPU_CLONES void gated_rms_norm(const RmsNormArgs& a, const float* gate, int64_t ldg) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.ldx;
    const float* g = gate + r * ldg;
    float* y = a.y + r * a.ldy;
    const float inv = 1.0f / std::sqrt(vec::sum_squares(x, a.dim) / float(a.dim) + a.eps);
    for (int64_t i = 0; i < a.dim; ++i) y[i] = (a.w[i] * (x[i] * inv)) * vec::silu(g[i]);
  }
}

DEG_CPU_CLONES void l2_norm(float* x, int64_t ldx, int64_t rows, int64_t dim, float eps,
                            float post_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * ldx;
    const float inv = 1.0f / std::sqrt(vec::sum_squares(v, dim) + eps);
    for (int64_t i = 0; i < dim; ++i) v[i] = (v[i] * inv) * post_scale;
  }
}

DEG_CPU_CLONES void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = vec::silu(gate[i]) * up[i];
}

DEG_CPU_CLONES void sigmoid_gate(float* x, int64_t ldx, const float* gate, int64_t ldg,
                                 int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * ldx;
    const float* g = gate + r * ldg;
    for (int64_t i = 0; i < n; ++i) xr[i] *= vec::sigmoid(g[i]);
  }
}

}  // namespace deg
