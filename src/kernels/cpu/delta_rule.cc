// CPU gated delta rule (kernels/delta_rule.h). The chunked form follows the algebra of HF's
// torch_chunk_gated_delta_rule (FLA's chunk_gated_delta_rule): within a chunk, with cumulative
// log decay c_t and A[i][j] = beta_i (k_i·k_j) e^(c_i - c_j) for j < i, solve (I + A) U = beta V
// and (I + A) W = beta K e^c by forward substitution; then v'_i = U_i - W_i S,
// o_i = e^(c_i) q_i S + Σ_{j<=i} (q_i·k_j) e^(c_i - c_j) v'_j and
// S <- e^(c_last) S + Σ_j e^(c_last - c_j) k_j ⊗ v'_j.
#include "kernels/delta_rule.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/vec.h"

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
    float* o = a.out + t * a.ldo;
    for (int64_t j = 0; j < dv; ++j) o[j] = 0;
    for (int64_t i = 0; i < dk; ++i) vec::axpy(o, q[i], S + i * dv, dv);
  }
}

DEG_CPU_CLONES void delta_rule_chunked(const DeltaRuleArgs& a, int64_t chunk) {
  const int64_t dk = a.dk, dv = a.dv, C = chunk;
  DEG_CHECK(C > 0, "delta rule chunk {}", C);
  std::vector<float> cum(static_cast<size_t>(C)), U(size_t(C * dv)), W(size_t(C * dk));
  std::vector<float> kk(size_t(C * C)), vnew(size_t(C * dv)), kdec(static_cast<size_t>(dk));
  float* S = a.state;
  for (int64_t s = 0; s < a.n; s += C) {
    const int64_t c = std::min(C, a.n - s);
    auto q = [&](int64_t i) { return a.q + (s + i) * a.ldqk; };
    auto k = [&](int64_t i) { return a.k + (s + i) * a.ldqk; };
    auto v = [&](int64_t i) { return a.v + (s + i) * a.ldv; };
    auto beta = [&](int64_t i) { return a.beta[(s + i) * a.ldgb]; };
    // Cumulative log decay (torch's CPU cumsum accumulates in double).
    double run = 0;
    for (int64_t i = 0; i < c; ++i) {
      run += double(a.g[(s + i) * a.ldgb]);
      cum[size_t(i)] = float(run);
    }
    // kk[i][j] = k_i·k_j for j <= i.
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j <= i; ++j) kk[size_t(i * C + j)] = vec::dot(k(i), k(j), dk);
    // Forward substitution, row by row: U_i = beta_i v_i - Σ_{j<i} A_ij U_j, same for W.
    for (int64_t i = 0; i < c; ++i) {
      const float b = beta(i);
      float* Ui = &U[size_t(i * dv)];
      float* Wi = &W[size_t(i * dk)];
      for (int64_t x = 0; x < dv; ++x) Ui[x] = v(i)[x] * b;
      const float e = std::exp(cum[size_t(i)]);
      for (int64_t x = 0; x < dk; ++x) Wi[x] = (k(i)[x] * b) * e;
      for (int64_t j = 0; j < i; ++j) {
        const float aij = (b * kk[size_t(i * C + j)]) * std::exp(cum[size_t(i)] - cum[size_t(j)]);
        vec::axpy(Ui, -aij, &U[size_t(j * dv)], dv);
        vec::axpy(Wi, -aij, &W[size_t(j * dk)], dk);
      }
    }
    // v'_i = U_i - W_i S
    for (int64_t i = 0; i < c; ++i) {
      float* vn = &vnew[size_t(i * dv)];
      for (int64_t x = 0; x < dv; ++x) vn[x] = U[size_t(i * dv + x)];
      const float* Wi = &W[size_t(i * dk)];
      for (int64_t r = 0; r < dk; ++r) vec::axpy(vn, -Wi[r], S + r * dv, dv);
    }
    // o_i = e^(c_i) (q_i S) + Σ_{j<=i} (q_i·k_j) e^(c_i - c_j) v'_j
    for (int64_t i = 0; i < c; ++i) {
      float* o = a.out + (s + i) * a.ldo;
      for (int64_t x = 0; x < dv; ++x) o[x] = 0;
      const float e = std::exp(cum[size_t(i)]);
      for (int64_t r = 0; r < dk; ++r) vec::axpy(o, q(i)[r] * e, S + r * dv, dv);
      for (int64_t j = 0; j <= i; ++j) {
        const float w = vec::dot(q(i), k(j), dk) * std::exp(cum[size_t(i)] - cum[size_t(j)]);
        vec::axpy(o, w, &vnew[size_t(j * dv)], dv);
      }
    }
    // S <- e^(c_last) S + Σ_j (e^(c_last - c_j) k_j) ⊗ v'_j
    const float last = cum[size_t(c - 1)];
    vec::scale(S, std::exp(last), dk * dv);
    for (int64_t j = 0; j < c; ++j) {
      const float e = std::exp(last - cum[size_t(j)]);
      for (int64_t r = 0; r < dk; ++r) kdec[size_t(r)] = k(j)[r] * e;
      for (int64_t r = 0; r < dk; ++r)
        vec::axpy(S + r * dv, kdec[size_t(r)], &vnew[size_t(j * dv)], dv);
    }
  }
}

}  // namespace deg
