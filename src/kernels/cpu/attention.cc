// CPU attention (kernels/attention.h). Per block of queries (all heads of the group): scores
// against the keys as one small matmul (each score one dot product in a fixed order), softmax
// per query in key order, then the weighted sum of values as another small matmul (each output
// element sequential over keys; masked keys contribute exact zeros), divided by the sum.
#include "kernels/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/scratch.h"

namespace deg {

namespace {

const float* key_at(const AttentionArgs& a, const float* prefix, const float* own, int64_t j) {
  return j < a.prefix_len ? prefix + j * a.d : own + (j - a.prefix_len) * a.d;
}

}  // namespace

DEG_CPU_CLONES void attention(const AttentionArgs& a) {
  const int64_t G = a.group, D = a.d, R = (a.t1 - a.t0) * G;
  if (R <= 0) return;
  const int64_t P = a.prefix_len, own = a.own_before + a.t1;
  // The first key any query of the block can see (0 without a window): prefix keys [p0, P) and
  // own keys [o0, own) take part, in that order.
  const int64_t first =
      a.window > 0 ? std::max<int64_t>(0, P + a.own_before + a.t0 - a.window + 1) : 0;
  const int64_t p0 = std::min(first, P), o0 = std::max<int64_t>(0, first - P);
  const int64_t np = P - p0, no = own - o0, nk = np + no;
  const float* pk = np > 0 ? a.prefix_k + p0 * D : a.prefix_k;
  const float* pv = np > 0 ? a.prefix_v + p0 * D : a.prefix_v;
  float* qb = scratch_floats(kKernelSlots + 0, size_t(R * D));
  float* s = scratch_floats(kKernelSlots + 1, size_t(R * nk));
  float* ob = scratch_floats(kKernelSlots + 2, size_t(R * D));
  float* inv = scratch_floats(kKernelSlots + 3, size_t(R));
  for (int64_t t = a.t0; t < a.t1; ++t)
    for (int64_t g = 0; g < G; ++g)
      std::memcpy(qb + ((t - a.t0) * G + g) * D, a.q + t * a.ldq + g * D,
                  size_t(D) * sizeof(float));
  // Scores against every key up to the block's last query; keys outside a query's reach (later
  // keys, or keys past its window) are masked below (their probabilities are exact zeros).
  matmul_nt({.a = qb, .lda = D, .b = pk, .ldb = D, .m = R, .n = np, .k = D, .c = s, .ldc = nk});
  matmul_nt({.a = qb,
             .lda = D,
             .b = a.own_k + o0 * D,
             .ldb = D,
             .m = R,
             .n = no,
             .k = D,
             .c = s + np,
             .ldc = nk});
  for (int64_t r = 0; r < R; ++r) {
    const int64_t query = P + a.own_before + a.t0 + r / G;  // its key index
    const int64_t hi = query + 1 - first;
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, query - a.window + 1) - first : 0;
    float* row = s + r * nk;
    float mx = row[lo] * a.scale;
    for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, row[j] * a.scale);
    float total = 0;
    for (int64_t j = lo; j < hi; ++j) {
      row[j] = std::exp(row[j] * a.scale - mx);
      total += row[j];
    }
    for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
    for (int64_t j = hi; j < nk; ++j) row[j] = 0.0f;
    inv[r] = 1.0f / total;
  }
  matmul_nn({.a = s, .lda = nk, .b = pv, .ldb = D, .m = R, .n = D, .k = np, .c = ob, .ldc = D});
  matmul_nn({.a = s + np,
             .lda = nk,
             .b = a.own_v + o0 * D,
             .ldb = D,
             .m = R,
             .n = D,
             .k = no,
             .c = ob,
             .ldc = D,
             .accumulate = true});
  for (int64_t t = a.t0; t < a.t1; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (t - a.t0) * G + g;
      float* o = a.out + t * a.ldo + g * D;
      for (int64_t x = 0; x < D; ++x) o[x] = ob[r * D + x] * inv[r];
    }
}

void attention_reference(const AttentionArgs& a) {
  const int64_t D = a.d;
  for (int64_t t = a.t0; t < a.t1; ++t) {
    const int64_t nk = a.prefix_len + a.own_before + t + 1;
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, nk - a.window) : 0;
    for (int64_t g = 0; g < a.group; ++g) {
      const float* q = a.q + t * a.ldq + g * D;
      std::vector<double> s(static_cast<size_t>(nk));
      double mx = -INFINITY;
      for (int64_t j = lo; j < nk; ++j) {
        const float* kj = key_at(a, a.prefix_k, a.own_k, j);
        double d = 0;
        for (int64_t x = 0; x < D; ++x) d += double(q[x]) * double(kj[x]);
        s[size_t(j)] = d * a.scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double total = 0;
      for (int64_t j = lo; j < nk; ++j) total += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
      for (int64_t x = 0; x < D; ++x) {
        double acc = 0;
        for (int64_t j = lo; j < nk; ++j)
          acc += s[size_t(j)] * key_at(a, a.prefix_v, a.own_v, j)[x];
        a.out[t * a.ldo + g * D + x] = float(acc / total);
      }
    }
  }
}

}  // namespace deg
