// Scalar kernels of the ops without a vector kernel (kernels/cpu/scalar_ops.h).
// Every output element is computed by one expression in a fixed order: products rounded to f32,
// sums left to right, dot products accumulated in f64 where the op says so.
#include "kernels/cpu/scalar_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace deg {

namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// f64-accumulated dot product rounded to f32.
float dot_f64(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return float(s);
}

int32_t wrap_mul(int32_t m, int32_t x) {
  return int32_t(uint32_t(m) * uint32_t(x));
}

int32_t py_mod(int32_t a, int32_t m) {  // Python's % for m > 0
  const int32_t r = a % m;
  return r < 0 ? r + m : r;
}

bool is_real(const RowTable& r, int64_t i) {
  return i % r.tokens < r.lengths[i / r.tokens];
}

float activate(const ActivationArgs& a, float x) {
  switch (a.act) {
    case Activation::relu_squared: {
      const float r = x > 0 ? x : 0.0f;
      return r * r;
    }
    case Activation::gelu_erf: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::scaled_sigmoid: return a.a * sigmoid((x + a.b) / a.c);
    case Activation::sigmoid: return sigmoid(x);
    case Activation::silu: return x / (1.0f + std::exp(-x));
    case Activation::gelu_tanh: {
      const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + std::tanh(inner));
    }
  }
  return x;
}

// y[j] = c[0] x[0][j] + ... + c[K-1] x[K-1][j] over [0, n), summed left to right.
template <int K>
void combine_span(float* y, const float* const* x, const float* c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    float acc = c[0] * x[0][j];
    for (int k = 1; k < K; ++k) acc += c[k] * x[k][j];
    y[j] = acc;
  }
}

}  // namespace

float term_coef(const CombineTerm& t, int64_t r, int64_t g) {
  if (!t.lane) return t.s;
  float c = t.s * t.lane[r * t.ldl + g * t.gl];
  if (t.add) c += t.add[r * t.lda + g * t.ga];
  if (t.offset != 0.0f) c = t.offset + c;
  return c;
}

void activation_range(const ActivationArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * a.ldx;
    float* y = a.y + r * a.ldy;
    switch (a.act) {  // the switch outside the loop: each kind's loop compiles on its own
      case Activation::relu_squared:
        for (int64_t j = 0; j < a.n; ++j) {
          const float v = x[j] > 0 ? x[j] : 0.0f;
          y[j] = v * v;
        }
        break;
      case Activation::gelu_erf:
        for (int64_t j = 0; j < a.n; ++j)
          y[j] = 0.5f * x[j] * (1.0f + std::erf(x[j] * 0.70710678118654752f));
        break;
      default:
        for (int64_t j = 0; j < a.n; ++j) y[j] = activate(a, x[j]);
    }
  }
}

void bias_scale_range(const BiasScaleArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * a.ldx;
    float* y = a.y + r * a.ldy;
    if (a.bias) {
      for (int64_t j = 0; j < a.n; ++j) y[j] = (x[j] + a.bias[j]) * a.s;
    } else {
      for (int64_t j = 0; j < a.n; ++j) y[j] = x[j] * a.s;
    }
  }
}

void combine_range(const CombineArgs& a, int64_t r0, int64_t r1) {
  constexpr size_t kMaxTerms = 6;
  const size_t K = a.terms.size();
  DEG_CHECK(K >= 1 && K <= kMaxTerms, "combine: {} terms (1 to {})", K, kMaxTerms);
  const int64_t group = a.group > 0 ? a.group : a.n;
  for (int64_t r = r0; r < r1; ++r) {
    float* y = a.y + r * a.ldy;
    for (int64_t j0 = 0; j0 < a.n; j0 += group) {
      const int64_t g = j0 / group, w = std::min(group, a.n - j0);
      float c[kMaxTerms] = {};
      const float* x[kMaxTerms] = {};
      for (size_t k = 0; k < K; ++k) {
        const CombineTerm& t = a.terms[k];
        c[k] = term_coef(t, r, g);
        x[k] = (t.x ? t.x + r * t.ldx : y) + j0;
      }
      switch (K) {
        case 1: combine_span<1>(y + j0, x, c, w); break;
        case 2: combine_span<2>(y + j0, x, c, w); break;
        case 3: combine_span<3>(y + j0, x, c, w); break;
        case 4: combine_span<4>(y + j0, x, c, w); break;
        case 5: combine_span<5>(y + j0, x, c, w); break;
        default: combine_span<6>(y + j0, x, c, w);
      }
    }
  }
}

void shift_ids_range(const ShiftIdsArgs& a, int64_t i0, int64_t i1) {
  const RowTable& r = a.rows;
  const int64_t L = r.tokens, k = a.back;
  DEG_CHECK(k == 0 || (k > 0 && k <= a.history_len), "shift_ids: {} back with {} history", k,
            a.history_len);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t b = i / L, t = i % L, pos = r.positions[b] + t;
    int32_t id = -1;
    if (pos >= k) {
      id = t >= k ? a.ids[i - k] : a.history[b * a.history_len + a.history_len - (k - t)];
    }
    if (a.out) a.out[i] = id;
    if (a.lane) a.lane[i * a.ld_lane] = float(id);
  }
}

void ngram_embed_range(const NgramEmbedArgs& a, int64_t i0, int64_t i1) {
  const Tensor& tab = *a.table;
  const int64_t V = tab.dim(0), Dn = tab.dim(1), L = a.rows.tokens;
  const int32_t half = int32_t(V / 2), bmod = half - 1, tmod = int32_t(V) - half - 1;
  const int32_t mask = int32_t(a.sign_rows - 1);
  const int32_t *br = a.bigram_rows.data(), *tr = a.trigram_rows.data();
  const int32_t *bs = a.bigram_signs.data(), *ts = a.trigram_signs.data();
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t pos = a.rows.positions[i / L] + i % L;
    const int32_t x = a.ids[i], p1 = a.prev1[i], p2 = a.prev2[i];
    // Position 0 takes the reserved bigram row; position 1 hashes the reserved id as its
    // previous token (the seed hashes in place after setting row 0).
    const int32_t prev = pos == 1 ? bmod : p1;
    const int32_t rows[2] = {
        pos == 0 ? bmod : py_mod(wrap_mul(br[0], x) ^ wrap_mul(br[1], prev), bmod),
        pos < 2
            ? half + tmod
            : py_mod(wrap_mul(tr[0], x) ^ wrap_mul(tr[1], p1) ^ wrap_mul(tr[2], p2), tmod) + half};
    const int32_t signs[2] = {
        pos < 1 ? 0 : (wrap_mul(bs[1], p1) ^ wrap_mul(bs[0], x)) & mask,
        pos < 2 ? 0 : (wrap_mul(ts[2], p2) ^ wrap_mul(ts[1], p1) ^ wrap_mul(ts[0], x)) & mask};
    float* out = a.y + i * a.ldy;
    std::fill(out, out + Dn, 0.0f);
    for (int ch = 0; ch < 2; ++ch) {
      const float* sign = a.sign_pool + int64_t(signs[ch]) * Dn;
      if (tab.dtype() == DType::f32) {
        const float* row = tab.data<float>() + int64_t(rows[ch]) * Dn;
        for (int64_t d = 0; d < Dn; ++d) out[d] += row[d] * sign[d];
      } else {
        const bf16* row = tab.data<bf16>() + int64_t(rows[ch]) * Dn;
        for (int64_t d = 0; d < Dn; ++d) out[d] += bf16_to_f32(row[d]) * sign[d];
      }
    }
  }
}

void sigmoid_gates_range(const SigmoidGateArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const float* w = a.w + h * a.ldw;
      float z = dot_f64(w, a.x + r * a.ldx, a.n);
      if (a.x2) z += dot_f64(w + a.n, a.x2 + r * a.ldx2, a.n);
      a.out[r * a.ldo + h] = a.s * sigmoid(z);
    }
  }
}

void rope_pairs_range(const RopePairsArgs& a, int64_t i0, int64_t i1) {
  const RowTable& r = a.rows;
  for (int64_t i = i0; i < i1; ++i) {
    if (!is_real(r, i)) continue;
    const int64_t pos = r.positions[i / r.tokens] + i % r.tokens;
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t p = a.paired_heads ? 2 * pos + h % 2 : pos;
      float* x = a.x + i * a.ldx + h * a.hs;
      for (int64_t d = 0; d + 1 < a.dims; d += 2) {
        const double th = double(p) * double(a.freq[d]);
        const float c = float(std::cos(th)),
                    s = a.inverse ? -float(std::sin(th)) : float(std::sin(th));
        const float x0 = x[d], x1 = x[d + 1];
        x[d] = c * x0 + s * x1;
        x[d + 1] = c * x1 - s * x0;
      }
    }
  }
}

void subtract_projection_range(const ProjectionArgs& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    if (!is_real(a.rows, i)) continue;
    for (int64_t h = 0; h < a.heads; ++h) {
      float* y = a.y + i * a.ldy + h * a.hy;
      const float* v = a.v + i * a.ldv + h * a.hv;
      const float den = std::max(dot_f64(v, v, a.dim), a.eps);
      const float coef = std::tanh(a.strength[i * a.lds + h]) * dot_f64(y, v, a.dim) / den;
      const float m = -coef;
      for (int64_t d = 0; d < a.dim; ++d) y[d] += m * v[d];
    }
  }
}

}  // namespace deg
