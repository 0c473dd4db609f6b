// The scalar ops of kernels/ops.h (kernels/cpu/scalar_ops.cc) against expectations written out
// here: combinations with lane / group / offset / add coefficients summed left to right, shifted
// ids across the history, interleaved rotary at paired-head positions, the n-gram hash at the
// reserved positions, sigmoid gates, activations, projection removal, and f64 attention against
// a plain softmax. Each CPU op (threaded) equals its one-thread reference bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/scalar_ops.h"
#include "kernels/ops.h"

namespace deg {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(OpsScalar, CombineSumsTermsLeftToRight) {
  const int64_t R = 37, n = 12, ld = 16, group = 4;
  auto y0 = randn(size_t(R * ld), 1), u = randn(size_t(R * n), 2), v = randn(size_t(R * ld), 3);
  auto lane = randn(size_t(R * 3), 4), add = randn(size_t(R * 3), 5);
  const CombineTerm t[] = {
      {.s = 0.5f},
      {.x = u.data(),
       .ldx = n,
       .s = 2.0f,
       .lane = lane.data(),
       .ldl = 3,
       .gl = 1,
       .add = add.data(),
       .lda = 3,
       .ga = 1},
      {.x = v.data(), .ldx = ld, .lane = lane.data(), .ldl = 3, .offset = 1.0f}};
  std::vector<float> y = y0;
  cpu_ops().combine({.y = y.data(), .ldy = ld, .rows = R, .n = n, .group = group, .terms = t});
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < ld; ++j) {
      const size_t i = size_t(r * ld + j);
      if (j >= n) {
        EXPECT_EQ(y[i], y0[i]);  // past n: untouched
        continue;
      }
      const int64_t g = j / group;
      const float c1 = 2.0f * lane[size_t(r * 3 + g)] + add[size_t(r * 3 + g)];
      const float c2 = 1.0f + lane[size_t(r * 3)];
      float want = 0.5f * y0[i];
      want += c1 * u[size_t(r * n + j)];
      want += c2 * v[i];
      EXPECT_EQ(y[i], want) << r << " " << j;
    }
  }
  std::vector<float> ref = y0;
  combine_reference({.y = ref.data(), .ldy = ld, .rows = R, .n = n, .group = group, .terms = t});
  EXPECT_TRUE(same_bits(y, ref));
}

TEST(OpsScalar, ShiftIdsReadTheHistory) {
  // Two rows of 3 tokens: row 0 at position 0, row 1 at position 5 with history {7, 8}.
  const int64_t lengths[] = {3, 2}, positions[] = {0, 5};
  const int32_t ids[] = {1, 2, 3, 4, 5, 6}, history[] = {0, 0, 7, 8};
  const RowTable rows{.rows = 2, .tokens = 3, .lengths = lengths, .positions = positions};
  int32_t back1[6], back2[6];
  float lane[12];
  cpu_ops().shift_ids(
      {.rows = rows, .ids = ids, .history = history, .history_len = 2, .back = 1, .out = back1});
  cpu_ops().shift_ids({.rows = rows,
                       .ids = ids,
                       .history = history,
                       .history_len = 2,
                       .back = 2,
                       .out = back2,
                       .lane = lane,
                       .ld_lane = 2});
  const int32_t want1[] = {-1, 1, 2, 8, 4, 5}, want2[] = {-1, -1, 1, 7, 8, 4};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(back1[i], want1[i]) << i;
    EXPECT_EQ(back2[i], want2[i]) << i;
    EXPECT_EQ(lane[2 * i], float(want2[i])) << i;
  }
}

TEST(OpsScalar, RopePairsRotatePairsAtPairedPositions) {
  const int64_t L = 4, H = 4, D = 6, dims = 4;
  const int64_t lengths[] = {3}, positions[] = {2};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  const std::vector<float> freq = {0.5f, 0.0f, 0.125f, 0.0f};
  const auto x0 = randn(size_t(L * H * D), 7);
  auto x = x0;
  const RopePairsArgs a{.rows = rows,
                        .freq = freq.data(),
                        .x = x.data(),
                        .ldx = H * D,
                        .heads = H,
                        .hs = D,
                        .dims = dims,
                        .paired_heads = true};
  cpu_ops().rope_pairs(a);
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* in = x0.data() + (t * H + h) * D;
      const float* out = x.data() + (t * H + h) * D;
      if (t >= 3) {  // padded: untouched
        EXPECT_EQ(std::memcmp(in, out, size_t(D) * sizeof(float)), 0);
        continue;
      }
      const double p = double(2 * (2 + t) + h % 2);
      for (int64_t d = 0; d < D; ++d) {
        float want = in[d];
        if (d < dims) {
          const int64_t e = d - d % 2;
          const double th = p * double(freq[size_t(e)]);
          const float c = float(std::cos(th)), s = float(std::sin(th));
          want = d % 2 == 0 ? c * in[d] + s * in[d + 1] : c * in[d] - s * in[d - 1];
        }
        EXPECT_EQ(out[d], want) << t << " " << h << " " << d;
      }
    }
  }
}

TEST(OpsScalar, NgramEmbedUsesReservedRowsAtTheStart) {
  const int64_t V = 10, Dn = 3, P = 4;
  auto table_data = randn(size_t(V * Dn), 8);
  Tensor table = Tensor::from_vector(table_data, {V, Dn});
  auto pool = randn(size_t(P * Dn), 9);
  const int64_t lengths[] = {3}, positions[] = {0};
  const RowTable rows{.rows = 1, .tokens = 3, .lengths = lengths, .positions = positions};
  const int32_t ids[] = {3, 4, 5}, p1[] = {-1, 3, 4}, p2[] = {-1, -1, 3};
  std::vector<float> y(size_t(3 * Dn));
  cpu_ops().ngram_embed({.rows = rows,
                         .ids = ids,
                         .prev1 = p1,
                         .prev2 = p2,
                         .table = &table,
                         .sign_pool = pool.data(),
                         .sign_rows = P,
                         .bigram_rows = {3, 5},
                         .trigram_rows = {2, 7, 11},
                         .bigram_signs = {1, 2},
                         .trigram_signs = {3, 1, 2},
                         .y = y.data(),
                         .ldy = Dn});
  // Position 0: bigram row V/2 - 1 = 4, trigram row V - 1 = 9, both with sign row 0.
  // Position 1: bigram row (3*4 ^ 5*4) mod 4 = (12 ^ 20) mod 4 = 24 mod 4 = 0, sign (2*3 ^ 1*4)
  // & 3 = 2; trigram reserved.
  const int64_t bigram_row[] = {4, 0}, bigram_sign[] = {0, 2};
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t d = 0; d < Dn; ++d) {
      float want = 0.0f;
      want += table_data[size_t(bigram_row[t] * Dn + d)] * pool[size_t(bigram_sign[t] * Dn + d)];
      want += table_data[size_t(9 * Dn + d)] * pool[size_t(d)];
      EXPECT_EQ(y[size_t(t * Dn + d)], want) << t << " " << d;
    }
}

TEST(OpsScalar, SigmoidGatesAndActivations) {
  const int64_t R = 5, H = 3, n = 7;
  auto x = randn(size_t(R * n), 10), x2 = randn(size_t(R * n), 11),
       w = randn(size_t(H * 2 * n), 12);
  std::vector<float> g(size_t(R * H));
  cpu_ops().sigmoid_gates({.x = x.data(),
                           .ldx = n,
                           .x2 = x2.data(),
                           .ldx2 = n,
                           .w = w.data(),
                           .ldw = 2 * n,
                           .rows = R,
                           .heads = H,
                           .n = n,
                           .s = 2.0f,
                           .out = g.data(),
                           .ldo = H});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h) {
      double a = 0, b = 0;
      for (int64_t i = 0; i < n; ++i) {
        a += double(w[size_t(h * 2 * n + i)]) * x[size_t(r * n + i)];
        b += double(w[size_t(h * 2 * n + n + i)]) * x2[size_t(r * n + i)];
      }
      const float z = float(a) + float(b);
      EXPECT_EQ(g[size_t(r * H + h)], 2.0f * (1.0f / (1.0f + std::exp(-z))));
    }
  auto v = randn(100, 13, 3.0f);
  for (Activation act :
       {Activation::relu_squared, Activation::gelu_erf, Activation::scaled_sigmoid}) {
    std::vector<float> y(v.size());
    cpu_ops().activation({.x = v.data(),
                          .ldx = 10,
                          .y = y.data(),
                          .ldy = 10,
                          .rows = 10,
                          .n = 10,
                          .act = act,
                          .a = 30.0f,
                          .b = 5.0f,
                          .c = 7.5f});
    for (size_t i = 0; i < v.size(); ++i) {
      const float u = v[i];
      float want = 0;
      if (act == Activation::relu_squared) want = u > 0 ? u * u : 0.0f;
      if (act == Activation::gelu_erf)
        want = 0.5f * u * (1.0f + std::erf(u * 0.70710678118654752f));
      if (act == Activation::scaled_sigmoid)
        want = 30.0f * (1.0f / (1.0f + std::exp(-((u + 5.0f) / 7.5f))));
      EXPECT_EQ(y[i], want) << int(act) << " " << i;
    }
  }
}

TEST(OpsScalar, SubtractProjectionLeavesYOrthogonal) {
  const int64_t L = 3, H = 2, D = 8;
  const int64_t lengths[] = {2}, positions[] = {0};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  const auto y0 = randn(size_t(L * H * D), 14), v = randn(size_t(L * H * D), 15);
  const std::vector<float> strength(size_t(L * H), 20.0f);  // tanh = 1: all of the projection
  auto y = y0;
  cpu_ops().subtract_projection({.rows = rows,
                                 .y = y.data(),
                                 .ldy = H * D,
                                 .hy = D,
                                 .v = v.data(),
                                 .ldv = H * D,
                                 .hv = D,
                                 .strength = strength.data(),
                                 .lds = H,
                                 .heads = H,
                                 .dim = D});
  for (int64_t t = 0; t < L; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const size_t at = size_t((t * H + h) * D);
      double yv = 0, vv = 0;
      for (int64_t d = 0; d < D; ++d) {
        yv += double(y[at + size_t(d)]) * v[at + size_t(d)];
        vv += double(v[at + size_t(d)]) * v[at + size_t(d)];
      }
      if (t < 2) {
        EXPECT_LT(std::abs(yv) / vv, 1e-6) << t << " " << h;
      } else {
        EXPECT_EQ(std::memcmp(y.data() + at, y0.data() + at, size_t(D) * sizeof(float)), 0);
      }
    }
}

// f64 attention of one row (prefix of 5 keys + 7 own tokens, 3 of them this call's) against a
// plain softmax, and the threaded op against its reference bitwise, with and without paired
// heads and key offsets.
TEST(OpsScalar, AttentionF64MatchesSoftmax) {
  const int64_t H = 4, dq = 6, dv = 5, D = 6, P = 5, cap = 16, L = 4, before = 4, rot = 2;
  const auto pk = randn(size_t(H * P * D), 16), pvv = randn(size_t(H * P * D), 17);
  auto ok = randn(size_t(H * cap * D), 18), ov = randn(size_t(H * cap * D), 19);
  const auto q = randn(size_t(L * H * dq), 20);
  const int64_t lengths[] = {3}, positions[] = {P + before};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  const RowView view{.prefix_k = pk.data(),
                     .prefix_v = pvv.data(),
                     .prefix_len = P,
                     .prefix_stride = P * D,
                     .own_k = ok.data(),
                     .own_v = ov.data(),
                     .own_before = before,
                     .own_stride = cap * D};
  for (bool paired : {false, true}) {
    for (bool offset : {false, true}) {
      if (paired && offset) continue;
      const int64_t window = paired ? 9 : 6;
      std::vector<float> out(size_t(L * H * dv), 1.0f), ref(out.size(), 2.0f);
      AttendF64Args a{.rows = rows,
                      .views = &view,
                      .q = q.data(),
                      .ldq = H * dq,
                      .hq = dq,
                      .out = out.data(),
                      .ldo = H * dv,
                      .ho = dv,
                      .heads = H,
                      .qk_dim = dq,
                      .v_dim = dv,
                      .kv_dim = D,
                      .scale = 0.4f,
                      .window = window,
                      .paired_heads = paired,
                      .key_offset = offset,
                      .offset_from = rot};
      cpu_ops().attention_f64(a);
      a.out = ref.data();
      attention_f64_reference(a);
      EXPECT_TRUE(same_bits(out, ref));
      auto kv = [&](bool value, int64_t head, int64_t p) {
        const std::vector<float>& pre = value ? pvv : pk;
        const std::vector<float>& own = value ? ov : ok;
        return p < P ? pre.data() + head * P * D + p * D
                     : own.data() + head * cap * D + (p - P) * D;
      };
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const float* y = out.data() + (t * H + h) * dv;
          if (t >= 3) {
            for (int64_t d = 0; d < dv; ++d) EXPECT_EQ(y[d], 0.0f);
            continue;
          }
          const int64_t pos = P + before + t, half = H / 2;
          const int64_t qpos = paired ? 2 * pos + h / half : pos;
          std::vector<double> s;
          std::vector<const float*> vs;
          for (int64_t j = std::max<int64_t>(0, qpos - window); j <= qpos; ++j) {
            const int64_t p = paired ? j / 2 : j;
            const int64_t g = paired ? h % half + (j % 2) * half : h;
            const float* k = kv(false, g, p);
            const float* kp = offset && p > 0 ? kv(false, g, p - 1) : k;
            double dot = 0;
            for (int64_t d = 0; d < dq; ++d)
              dot += double(q[size_t((t * H + h) * dq + d)]) * (d < rot ? k[d] : kp[d]);
            s.push_back(0.4 * dot);
            vs.push_back(kv(true, g, p));
          }
          double mx = -1e300, sum = 0;
          for (double x : s) mx = std::max(mx, x);
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int64_t d = 0; d < dv; ++d) {
            double want = 0;
            for (size_t j = 0; j < s.size(); ++j) want += s[j] / sum * vs[j][d];
            EXPECT_NEAR(y[d], want, 1e-5) << paired << offset << " " << t << " " << h;
          }
        }
    }
  }
}

}  // namespace
}  // namespace deg
