// Small gpt blocks shared by the forward and the backward: n-gram hashes, the two-layer MUDD
// heads, the ReLU^2 MLP.
#include <cstring>

#include "core/error.h"
#include "train/gpt_step.h"

namespace deg::train {
namespace {

int32_t wrap_mul(int32_t m, int32_t x) {
  return int32_t(uint32_t(m) * uint32_t(x));
}
// Python's % (non-negative for a positive modulus).
int32_t py_mod(int32_t a, int32_t m) {
  int32_t r = a % m;
  return r < 0 ? r + m : r;
}

}  // namespace

void ngram_hash(const GptConfig& c, const GptBatch& b, int32_t* rows, int32_t* signs) {
  const int32_t half = int32_t(c.ngram_vocab / 2);
  const int32_t bmod = half - 1, tmod = int32_t(c.ngram_vocab) - half - 1;
  const int32_t mask = int32_t(c.ngram_sign_rows - 1);
  const auto& br = c.bigram_row_muls;
  const auto& tr = c.trigram_row_muls;
  const auto& bs = c.bigram_sign_muls;
  const auto& ts = c.trigram_sign_muls;
  const int64_t T = b.size();
  const int32_t* x = b.inputs.data();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = b.pos_of(t);
    const int32_t x1 = pos >= 1 ? x[b.prev_of(t)] : 0;  // one and two tokens back
    const int32_t x2 = pos >= 2 ? x[b.prev_of(b.prev_of(t))] : 0;
    // Bigram row: position 0 takes the reserved last row; position 1 hashes the reserved id as
    // its previous token (the seed computes the hash in place after setting out[0]).
    if (pos == 0) {
      rows[t] = bmod;
    } else {
      const int32_t prev = pos == 1 ? bmod : x1;
      rows[t] = py_mod(wrap_mul(br[0], x[t]) ^ wrap_mul(br[1], prev), bmod);
    }
    rows[T + t] =
        pos < 2 ? half + tmod
                : py_mod(wrap_mul(tr[0], x[t]) ^ wrap_mul(tr[1], x1) ^ wrap_mul(tr[2], x2), tmod) +
                      half;
    signs[t] = pos < 1 ? 0 : (wrap_mul(bs[1], x1) ^ wrap_mul(bs[0], x[t])) & mask;
    signs[T + t] =
        pos < 2 ? 0 : (wrap_mul(ts[2], x2) ^ wrap_mul(ts[1], x1) ^ wrap_mul(ts[0], x[t])) & mask;
  }
}

void head_forward(const HeadWeights& w, const float* x, int64_t T, int64_t C, HeadActs& a) {
  a.pre = zeros(T * w.M);
  matmul_nt(x, w.w1, a.pre.data(), T, C, w.M);
  a.h = zeros(T * w.M);
  for (size_t i = 0; i < a.h.size(); ++i) a.h[i] = gelu(a.pre[i]);
  a.unscaled = zeros(T * w.n);
  matmul_nt(a.h.data(), w.w2, a.unscaled.data(), T, w.M, w.n);
  a.out = zeros(T * w.n);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < w.n; ++k) {
      float& u = a.unscaled[size_t(t * w.n + k)];
      u += w.b2[k];
      a.out[size_t(t * w.n + k)] = u * w.scale;
    }
  if (w.w2g) {
    a.deltas = zeros(T * w.n * w.G);
    matmul_nt(a.h.data(), w.w2g, a.deltas.data(), T, w.M, w.n * w.G);
    for (auto& d : a.deltas) d *= w.scale;
  }
}

void head_backward(const HeadWeights& w, const float* x, int64_t T, int64_t C, const HeadActs& a,
                   const float* dout, const float* ddeltas, float* dx, const HeadGrads& g) {
  DEG_CHECK(!(g.scale && w.w2g), "a learned scale is only supported on heads without deltas");
  Buf du = zeros(T * w.n);
  for (int64_t i = 0; i < T * w.n; ++i) {
    du[size_t(i)] = dout[i] * w.scale;
    if (g.scale) *g.scale += dout[i] * a.unscaled[size_t(i)];
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < w.n; ++k) g.b2[k] += du[size_t(t * w.n + k)];
  Buf dh = zeros(T * w.M);
  linear_backward(a.h.data(), w.w2, du.data(), dh.data(), g.w2, T, w.M, w.n);
  if (w.w2g && ddeltas) {
    Buf dd = zeros(T * w.n * w.G);
    for (size_t i = 0; i < dd.size(); ++i) dd[i] = ddeltas[i] * w.scale;
    linear_backward(a.h.data(), w.w2g, dd.data(), dh.data(), g.w2g, T, w.M, w.n * w.G);
  }
  for (size_t i = 0; i < dh.size(); ++i) dh[i] *= gelu_grad(a.pre[i]);
  linear_backward(x, w.w1, dh.data(), dx, g.w1, T, C, w.M);
}

void mlp_forward(const float* x, const float* fc, const float* proj, int64_t T, int64_t C,
                 int64_t F, MlpActs& a) {
  a.pre = zeros(T * F);
  matmul_nt(x, fc, a.pre.data(), T, C, F);
  a.act = zeros(T * F);
  for (size_t i = 0; i < a.act.size(); ++i) {
    const float r = a.pre[i] > 0 ? a.pre[i] : 0.0f;
    a.act[i] = r * r;
  }
  a.out = zeros(T * C);
  matmul_nn(a.act.data(), proj, a.out.data(), T, F, C);
}

void mlp_backward(const float* x, const float* fc, const float* proj, int64_t T, int64_t C,
                  int64_t F, const MlpActs& a, const float* dout, float* dx, float* dfc,
                  float* dproj) {
  Buf dact = zeros(T * F);
  matmul_nt(dout, proj, dact.data(), T, C, F);
  if (dproj) matmul_tn(a.act.data(), dout, dproj, T, F, C, true);
  for (size_t i = 0; i < dact.size(); ++i) dact[i] *= a.pre[i] > 0 ? 2.0f * a.pre[i] : 0.0f;
  linear_backward(x, fc, dact.data(), dx, dfc, T, C, F);
}

}  // namespace deg::train
