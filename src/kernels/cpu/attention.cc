// CPU attention (kernels/attention.h). Per query: the scores of its `group` heads against every
// key (a key is loaded once for all heads of the group), the max, exp and sum in key order, then
// the weighted sum of values divided by the sum.
#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/vec.h"

namespace deg {

namespace {

const float* key_at(const AttentionArgs& a, const float* prefix, const float* own, int64_t j) {
  return j < a.prefix_len ? prefix + j * a.d : own + (j - a.prefix_len) * a.d;
}

}  // namespace

DEG_CPU_CLONES void attention(const AttentionArgs& a) {
  const int64_t G = a.group, D = a.d;
  const int64_t max_keys = a.prefix_len + a.own_before + a.t1;
  std::vector<float> scores(size_t(G * max_keys));
  std::vector<float> m(static_cast<size_t>(G)), sum(static_cast<size_t>(G));
  for (int64_t t = a.t0; t < a.t1; ++t) {
    const int64_t nk = a.prefix_len + a.own_before + t + 1;
    const float* q = a.q + t * a.ldq;
    for (int64_t j = 0; j < nk; ++j) {
      const float* kj = key_at(a, a.prefix_k, a.own_k, j);
      for (int64_t g = 0; g < G; ++g)
        scores[size_t(g * nk + j)] = vec::dot(q + g * D, kj, D) * a.scale;
    }
    for (int64_t g = 0; g < G; ++g) {
      float* s = &scores[size_t(g * nk)];
      float mx = s[0];
      for (int64_t j = 1; j < nk; ++j) mx = std::max(mx, s[j]);
      float total = 0;
      for (int64_t j = 0; j < nk; ++j) {
        s[j] = std::exp(s[j] - mx);
        total += s[j];
      }
      sum[size_t(g)] = total;
      float* o = a.out + t * a.ldo + g * D;
      for (int64_t x = 0; x < D; ++x) o[x] = 0;
    }
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = key_at(a, a.prefix_v, a.own_v, j);
      for (int64_t g = 0; g < G; ++g)
        vec::axpy(a.out + t * a.ldo + g * D, scores[size_t(g * nk + j)], vj, D);
    }
    for (int64_t g = 0; g < G; ++g) vec::scale(a.out + t * a.ldo + g * D, 1.0f / sum[size_t(g)], D);
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
