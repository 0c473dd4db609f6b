// CPU gated delta rule (kernels/delta_rule.h). The chunked form follows the algebra of HF's
// torch_chunk_gated_delta_rule (FLA's chunk_gated_delta_rule): within a chunk, with cumulative
// log decay c_t and A[i][j] = beta_i (k_i·k_j) e^(c_i - c_j) for j < i, solve (I + A) U = beta V
// and (I + A) W = beta K e^c by forward substitution; then v'_i = U_i - W_i S,
// o_i = e^(c_i) q_i S + Σ_{j<=i} (q_i·k_j) e^(c_i - c_j) v'_j and
// S <- e^(c_last) S + Σ_j e^(c_last - c_j) k_j ⊗ v'_j.
#include "kernels/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/scratch.h"

namespace deg {

DEG_CPU_CLONES void delta_rule_recurrent(const DeltaRuleArgs& a) {
  const int64_t dk = a.dk, dv = a.dv;
  std::vector<float> mem(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
  float* S = a.state;
  for (int64_t t = 0; t < a.n; ++t) {
    const float* q = a.q + t * a.ldqk;
    const float* k = a.k + t * a.ldqk;
    const float* v = a.v + t * a.ldv;
    const float decay = std::exp(a.g[t * a.ldgb]);
    const float beta = a.beta[t * a.ldgb];
    vec::scale(S, decay, dk * dv);
    for (int64_t j = 0; j < dv; ++j) mem[size_t(j)] = 0;
    for (int64_t i = 0; i < dk; ++i) vec::axpy(mem.data(), k[i], S + i * dv, dv);
    for (int64_t j = 0; j < dv; ++j) delta[size_t(j)] = (v[j] - mem[size_t(j)]) * beta;
    for (int64_t i = 0; i < dk; ++i) vec::axpy(S + i * dv, k[i], delta.data(), dv);
    if (a.delta) std::copy(delta.begin(), delta.end(), a.delta + t * a.ldd);
    float* o = a.out + t * a.ldo;
    for (int64_t j = 0; j < dv; ++j) o[j] = 0;
    for (int64_t i = 0; i < dk; ++i) vec::axpy(o, q[i], S + i * dv, dv);
  }
}

DEG_CPU_CLONES void delta_rule_replay(float* S, int64_t dk, int64_t dv, int64_t n, const float* k,
                                      int64_t ldk, const float* d, int64_t ldd, const float* g,
                                      int64_t ldg) {
  for (int64_t j = 0; j < n; ++j) {
    vec::scale(S, std::exp(g[j * ldg]), dk * dv);
    for (int64_t i = 0; i < dk; ++i) vec::axpy(S + i * dv, k[j * ldk + i], d + j * ldd, dv);
  }
}

DEG_CPU_CLONES void delta_rule_chunked(const DeltaRuleArgs& a, int64_t chunk) {
  const int64_t dk = a.dk, dv = a.dv, C = chunk, W = dv + dk;
  DEG_CHECK(C > 0, "delta rule chunk {}", C);
  // Scratch of one chunk: cumulative decay, C x C products, [U | W] rows, q e^c, k e^(c_last-c)
  // transposed, v', and a product buffer.
  float* cum = scratch_floats(kKernelSlots + 4, size_t(C));
  float* cc = scratch_floats(kKernelSlots + 5, size_t(C * C));
  float* uw = scratch_floats(kKernelSlots + 6, size_t(C * W));
  float* qe = scratch_floats(kKernelSlots + 7, size_t(C * dk));
  float* kdt = scratch_floats(kKernelSlots + 8, size_t(dk * C));
  float* vnew = scratch_floats(kKernelSlots + 9, size_t(C * dv));
  float* tmp = scratch_floats(kKernelSlots + 10, size_t(C * std::max(W, dv)));
  float* S = a.state;
  for (int64_t s = 0; s < a.n; s += C) {
    const int64_t c = std::min(C, a.n - s);
    const float* q = a.q + s * a.ldqk;
    const float* k = a.k + s * a.ldqk;
    const float* v = a.v + s * a.ldv;
    auto beta = [&](int64_t i) { return a.beta[(s + i) * a.ldgb]; };
    double run = 0;  // torch's CPU cumsum accumulates in double
    for (int64_t i = 0; i < c; ++i) {
      run += double(a.g[(s + i) * a.ldgb]);
      cum[i] = float(run);
    }
    // A[i][j] = beta_i (k_i·k_j) e^(c_i - c_j), j < i, in cc.
    matmul_nt(
        {.a = k, .lda = a.ldqk, .b = k, .ldb = a.ldqk, .m = c, .n = c, .k = dk, .c = cc, .ldc = C});
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < i; ++j)
        cc[i * C + j] = (beta(i) * cc[i * C + j]) * std::exp(cum[i] - cum[j]);
    // Forward substitution on [U | W]: row i = [beta_i v_i | beta_i e^(c_i) k_i] - A[i, :i] [U |
    // W].
    for (int64_t i = 0; i < c; ++i) {
      float* row = uw + i * W;
      const float b = beta(i), e = std::exp(cum[i]);
      for (int64_t x = 0; x < dv; ++x) row[x] = v[i * a.ldv + x] * b;
      for (int64_t x = 0; x < dk; ++x) row[dv + x] = (k[i * a.ldqk + x] * b) * e;
      if (i == 0) continue;
      matmul_nn({.a = cc + i * C,
                 .lda = C,
                 .b = uw,
                 .ldb = W,
                 .m = 1,
                 .n = W,
                 .k = i,
                 .c = tmp,
                 .ldc = W});
      for (int64_t x = 0; x < W; ++x) row[x] -= tmp[x];
    }
    // v' = U - W S
    matmul_nn(
        {.a = uw + dv, .lda = W, .b = S, .ldb = dv, .m = c, .n = dv, .k = dk, .c = tmp, .ldc = dv});
    for (int64_t i = 0; i < c; ++i)
      for (int64_t x = 0; x < dv; ++x) vnew[i * dv + x] = uw[i * W + x] - tmp[i * dv + x];
    // o = (q e^c) S + (Q Kᵀ ⊙ e^(c_i - c_j), j <= i) v'
    for (int64_t i = 0; i < c; ++i) {
      const float e = std::exp(cum[i]);
      for (int64_t x = 0; x < dk; ++x) qe[i * dk + x] = q[i * a.ldqk + x] * e;
    }
    float* out = a.out + s * a.ldo;
    matmul_nn(
        {.a = qe, .lda = dk, .b = S, .ldb = dv, .m = c, .n = dv, .k = dk, .c = out, .ldc = a.ldo});
    matmul_nt(
        {.a = q, .lda = a.ldqk, .b = k, .ldb = a.ldqk, .m = c, .n = c, .k = dk, .c = cc, .ldc = C});
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < c; ++j)
        cc[i * C + j] = j <= i ? cc[i * C + j] * std::exp(cum[i] - cum[j]) : 0.0f;
    matmul_nn({.a = cc,
               .lda = C,
               .b = vnew,
               .ldb = dv,
               .m = c,
               .n = dv,
               .k = c,
               .c = out,
               .ldc = a.ldo,
               .accumulate = true});
    // S <- e^(c_last) S + (k e^(c_last - c))ᵀ v'
    const float last = cum[c - 1];
    for (int64_t j = 0; j < c; ++j) {
      const float e = std::exp(last - cum[j]);
      for (int64_t r = 0; r < dk; ++r) kdt[r * C + j] = k[j * a.ldqk + r] * e;
    }
    vec::scale(S, std::exp(last), dk * dv);
    matmul_nn({.a = kdt,
               .lda = C,
               .b = vnew,
               .ldb = dv,
               .m = dk,
               .n = dv,
               .k = c,
               .c = S,
               .ldc = dv,
               .accumulate = true});
  }
}

}  // namespace deg
