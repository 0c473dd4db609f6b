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
  const int64_t P = a.prefix_len, own = a.own_before + a.t1, nk = P + own;
  float* qb = scratch_floats(kKernelSlots + 0, size_t(R * D));
  float* s = scratch_floats(kKernelSlots + 1, size_t(R * nk));
  float* ob = scratch_floats(kKernelSlots + 2, size_t(R * D));
  float* inv = scratch_floats(kKernelSlots + 3, size_t(R));
  for (int64_t t = a.t0; t < a.t1; ++t)
    for (int64_t g = 0; g < G; ++g)
      std::memcpy(qb + ((t - a.t0) * G + g) * D, a.q + t * a.ldq + g * D,
                  size_t(D) * sizeof(float));
  // Scores against every key up to the block's last query; later keys of earlier queries are
  // masked below (their probabilities are exact zeros).
  matmul_nt(
      {.a = qb, .lda = D, .b = a.prefix_k, .ldb = D, .m = R, .n = P, .k = D, .c = s, .ldc = nk});
  matmul_nt(
      {.a = qb, .lda = D, .b = a.own_k, .ldb = D, .m = R, .n = own, .k = D, .c = s + P, .ldc = nk});
  for (int64_t r = 0; r < R; ++r) {
    const int64_t valid = P + a.own_before + a.t0 + r / G + 1;
    float* row = s + r * nk;
    float mx = row[0] * a.scale;
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, row[j] * a.scale);
    float total = 0;
    for (int64_t j = 0; j < valid; ++j) {
      row[j] = std::exp(row[j] * a.scale - mx);
      total += row[j];
    }
    for (int64_t j = valid; j < nk; ++j) row[j] = 0.0f;
    inv[r] = 1.0f / total;
  }
  matmul_nn(
      {.a = s, .lda = nk, .b = a.prefix_v, .ldb = D, .m = R, .n = D, .k = P, .c = ob, .ldc = D});
  matmul_nn({.a = s + P,
             .lda = nk,
             .b = a.own_v,
             .ldb = D,
             .m = R,
             .n = D,
             .k = own,
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
    for (int64_t g = 0; g < a.group; ++g) {
      const float* q = a.q + t * a.ldq + g * D;
      std::vector<double> s(static_cast<size_t>(nk));
      double mx = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) {
        const float* kj = key_at(a, a.prefix_k, a.own_k, j);
        double d = 0;
        for (int64_t x = 0; x < D; ++x) d += double(q[x]) * double(kj[x]);
        s[size_t(j)] = d * a.scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double total = 0;
      for (double& v : s) total += (v = std::exp(v - mx));
      for (int64_t x = 0; x < D; ++x) {
        double acc = 0;
        for (int64_t j = 0; j < nk; ++j) acc += s[size_t(j)] * key_at(a, a.prefix_v, a.own_v, j)[x];
        a.out[t * a.ldo + g * D + x] = float(acc / total);
      }
    }
  }
}

}  // namespace deg
