// CPU causal conv (kernels/conv.h) and rotary embedding (kernels/rope.h).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/conv.h"
#include "kernels/cpu/vec.h"
#include "kernels/rope.h"
#include "kernels/scratch.h"

namespace deg {

namespace {

template <bool kSilu>
__attribute__((always_inline)) inline void causal_conv_rows(const CausalConvArgs& a) {
  const int64_t K = a.kernel, C = a.channels, K1 = K - 1;
  DEG_CHECK(K >= 1 && C > 0 && a.n >= 0, "conv: K {} C {} n {}", K, C, a.n);
  // ext row r (0 <= r < K-1+n): the tail for r < K-1, else x[r - (K-1)].
  const int64_t ldt = a.ldt > 0 ? a.ldt : C;
  auto ext = [&](int64_t r) { return r < K1 ? a.tail_in + r * ldt : a.x + (r - K1) * a.ldx; };
  for (int64_t t = 0; t < a.n; ++t) {
    float* y = a.y + t * a.ldy;
    const float* e0 = ext(t);
    for (int64_t c = 0; c < C; ++c) y[c] = e0[c] * a.w[c * K];
    for (int64_t k = 1; k < K; ++k) {
      const float* e = ext(t + k);
      for (int64_t c = 0; c < C; ++c) y[c] += e[c] * a.w[c * K + k];
    }
    if constexpr (kSilu) {
      for (int64_t c = 0; c < C; ++c) y[c] = vec::silu(y[c]);
    }
  }
  if (a.tail_out && K1 > 0) {
    // The last K-1 ext rows; copied through a buffer because tail_out may alias tail_in.
    float* buf = scratch_floats(kKernelSlots + 11, size_t(K1 * C));
    for (int64_t r = 0; r < K1; ++r) std::memcpy(buf + r * C, ext(a.n + r), size_t(C) * 4);
    for (int64_t r = 0; r < K1; ++r) std::memcpy(a.tail_out + r * ldt, buf + r * C, size_t(C) * 4);
  }
}

}  // namespace

DEG_CPU_CLONES void causal_conv_silu(const CausalConvArgs& a) {
  causal_conv_rows<true>(a);
}

DEG_CPU_CLONES void causal_conv(const CausalConvArgs& a) {
  causal_conv_rows<false>(a);
}

RopeTable rope_table(int64_t head_dim, double partial_factor, double theta) {
  RopeTable t;
  t.rot = int64_t(double(head_dim) * partial_factor);  // HF: int(head_dim * factor)
  t.rot -= t.rot % 2;
  for (int64_t i = 0; i < t.rot; i += 2) {
    // HF: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=float32) / dim)) in f32.
    float expo = float(i) / float(t.rot);
    t.inv_freq.push_back(1.0f / std::pow(float(theta), expo));
  }
  return t;
}

DEG_CPU_CLONES void rope_apply(const RopeTable& table, int64_t pos, float* x, int64_t heads,
                               int64_t stride) {
  const int64_t half = table.rot / 2;
  float cs[256], sn[256];
  DEG_CHECK(half <= 256, "rope: {} rotary dims", table.rot);
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(pos) * table.inv_freq[size_t(i)];
    cs[i] = std::cos(angle);
    sn[i] = std::sin(angle);
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * stride;
    for (int64_t i = 0; i < half; ++i) {
      float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace deg
