// Sequence kernels: the chunked gated delta rule against the recurrence (with an initial state,
// partial chunks, value/key dims that differ), and attention against its double-precision
// reference with a prefix read by reference plus own causal keys. Scored by max error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/attention.h"
#include "kernels/delta_rule.h"
#include "test_util.h"

namespace deg {
namespace {

void l2(std::vector<float>& x, int64_t n, int64_t d, float post) {
  for (int64_t t = 0; t < n; ++t) {
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += double(x[size_t(t * d + i)]) * x[size_t(t * d + i)];
    for (int64_t i = 0; i < d; ++i) x[size_t(t * d + i)] *= float(post / std::sqrt(s + 1e-6));
  }
}

TEST(KernelsDeltaRule, ChunkedEqualsRecurrence) {
  for (int64_t n : {1, 5, 64, 65, 150}) {
    const int64_t dk = 16, dv = 8;
    auto q = testing::random_normal(size_t(n * dk), 1),
         k = testing::random_normal(size_t(n * dk), 2),
         v = testing::random_normal(size_t(n * dv), 3);
    l2(q, n, dk, 1.0f / std::sqrt(float(dk)));
    l2(k, n, dk, 1.0f);
    std::vector<float> g(static_cast<size_t>(n)), beta(static_cast<size_t>(n));
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t t = 0; t < n; ++t) {
      g[size_t(t)] = -0.2f * u(rng);  // some memory across chunks
      beta[size_t(t)] = u(rng);
    }
    auto s0 = testing::random_normal(size_t(dk * dv), 5, 0.3f);
    std::vector<float> s_rec = s0, s_chunk = s0, o_rec(size_t(n * dv)), o_chunk(size_t(n * dv));
    DeltaRuleArgs a{.n = n,
                    .dk = dk,
                    .dv = dv,
                    .q = q.data(),
                    .k = k.data(),
                    .ldqk = dk,
                    .v = v.data(),
                    .ldv = dv,
                    .g = g.data(),
                    .beta = beta.data(),
                    .ldgb = 1,
                    .state = s_rec.data(),
                    .out = o_rec.data(),
                    .ldo = dv};
    delta_rule_recurrent(a);
    a.state = s_chunk.data();
    a.out = o_chunk.data();
    delta_rule_chunked(a);
    double eo = 0, es = 0;
    for (size_t i = 0; i < o_rec.size(); ++i)
      eo = std::max(eo, double(std::fabs(o_rec[i] - o_chunk[i])));
    for (size_t i = 0; i < s_rec.size(); ++i)
      es = std::max(es, double(std::fabs(s_rec[i] - s_chunk[i])));
    EXPECT_LT(eo, 2e-5) << "n " << n;
    EXPECT_LT(es, 2e-5) << "n " << n;
  }
}

TEST(KernelsDeltaRule, ZeroBetaAndGLeaveStateAlone) {
  const int64_t n = 7, dk = 8, dv = 8;
  auto q = testing::random_normal(size_t(n * dk), 1), k = testing::random_normal(size_t(n * dk), 2),
       v = testing::random_normal(size_t(n * dv), 3);
  std::vector<float> g(static_cast<size_t>(n), 0.0f), beta(static_cast<size_t>(n), 0.0f),
      out(size_t(n * dv));
  auto s0 = testing::random_normal(size_t(dk * dv), 5);
  for (bool chunked : {false, true}) {
    std::vector<float> s = s0;
    DeltaRuleArgs a{.n = n,
                    .dk = dk,
                    .dv = dv,
                    .q = q.data(),
                    .k = k.data(),
                    .ldqk = dk,
                    .v = v.data(),
                    .ldv = dv,
                    .g = g.data(),
                    .beta = beta.data(),
                    .ldgb = 1,
                    .state = s.data(),
                    .out = out.data(),
                    .ldo = dv};
    chunked ? delta_rule_chunked(a) : delta_rule_recurrent(a);
    EXPECT_EQ(s, s0);
  }
}

TEST(KernelsAttention, MatchesReferenceWithPrefixAndOwnKeys) {
  const int64_t G = 3, D = 20, P = 37, before = 5, n = 11;
  auto q = testing::random_normal(size_t(n * G * D), 1),
       pk = testing::random_normal(size_t(P * D), 2), pv = testing::random_normal(size_t(P * D), 3);
  auto ok = testing::random_normal(size_t((before + n) * D), 4),
       ov = testing::random_normal(size_t((before + n) * D), 5);
  std::vector<float> out(size_t(n * G * D)), ref(size_t(n * G * D));
  AttentionArgs a{.t0 = 0,
                  .t1 = n,
                  .group = G,
                  .d = D,
                  .q = q.data(),
                  .ldq = G * D,
                  .prefix_k = pk.data(),
                  .prefix_v = pv.data(),
                  .prefix_len = P,
                  .own_k = ok.data(),
                  .own_v = ov.data(),
                  .own_before = before,
                  .scale = 0.3f,
                  .out = out.data(),
                  .ldo = G * D};
  attention(a);
  a.out = ref.data();
  attention_reference(a);
  double err = 0;
  for (size_t i = 0; i < out.size(); ++i) err = std::max(err, double(std::fabs(out[i] - ref[i])));
  EXPECT_LT(err, 1e-5);
  // Causality: changing a later own key changes no earlier query.
  ok[size_t((before + 6) * D)] += 10.0f;
  std::vector<float> changed(size_t(n * G * D));
  a.out = changed.data();
  attention(a);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t i = 0; i < G * D; ++i)
      EXPECT_EQ(changed[size_t(t * G * D + i)], out[size_t(t * G * D + i)]) << "query " << t;
  EXPECT_NE(changed[size_t(6 * G * D)], out[size_t(6 * G * D)]);
}

TEST(KernelsAttention, QueryHeadsAloneEqualTheirGroupBitwise) {
  // attend_rows splits a KV head's query heads among threads when there are few work units (a
  // decode step): a head computed alone must give its bits in the group.
  const int64_t G = 8, D = 24, P = 300, before = 3, n = 2;
  auto q = testing::random_normal(size_t(n * G * D), 11),
       pk = testing::random_normal(size_t(P * D), 12),
       pv = testing::random_normal(size_t(P * D), 13);
  auto ok = testing::random_normal(size_t((before + n) * D), 14),
       ov = testing::random_normal(size_t((before + n) * D), 15);
  for (int64_t window : {int64_t(0), int64_t(100)}) {
    std::vector<float> group(size_t(n * G * D)), alone(size_t(n * G * D), -1.0f);
    AttentionArgs a{.t0 = 0,
                    .t1 = n,
                    .group = G,
                    .d = D,
                    .q = q.data(),
                    .ldq = G * D,
                    .prefix_k = pk.data(),
                    .prefix_v = pv.data(),
                    .prefix_len = P,
                    .own_k = ok.data(),
                    .own_v = ov.data(),
                    .own_before = before,
                    .scale = 0.7f,
                    .window = window,
                    .out = group.data(),
                    .ldo = G * D};
    attention(a);
    for (int64_t g0 = 0; g0 < G;) {  // pieces of 1, 2, 3 and 2 heads
      const int64_t g1 = std::min(G, g0 + 1 + g0 % 3);
      AttentionArgs part = a;
      part.group = g1 - g0;
      part.q = q.data() + g0 * D;
      part.out = alone.data() + g0 * D;
      attention(part);
      g0 = g1;
    }
    EXPECT_EQ(std::memcmp(group.data(), alone.data(), group.size() * sizeof(float)), 0)
        << "window " << window;
  }
}

TEST(KernelsAttention, SlidingWindowMatchesReferenceAndIgnoresKeysBeyondIt) {
  const int64_t G = 2, D = 16, W = 7, P = 9, before = 4, n = 13;
  auto q = testing::random_normal(size_t(n * G * D), 11),
       pk = testing::random_normal(size_t(P * D), 12),
       pv = testing::random_normal(size_t(P * D), 13);
  auto ok = testing::random_normal(size_t((before + n) * D), 14),
       ov = testing::random_normal(size_t((before + n) * D), 15);
  std::vector<float> out(size_t(n * G * D)), ref(size_t(n * G * D));
  AttentionArgs a{.t0 = 0,
                  .t1 = n,
                  .group = G,
                  .d = D,
                  .q = q.data(),
                  .ldq = G * D,
                  .prefix_k = pk.data(),
                  .prefix_v = pv.data(),
                  .prefix_len = P,
                  .own_k = ok.data(),
                  .own_v = ov.data(),
                  .own_before = before,
                  .scale = 0.4f,
                  .window = W,
                  .out = out.data(),
                  .ldo = G * D};
  for (int64_t t0 : {int64_t(0), int64_t(5)}) {  // blocks that start inside and past the prefix
    a.t0 = t0;
    a.out = out.data();
    attention(a);
    a.out = ref.data();
    attention_reference(a);
    double err = 0;
    for (size_t i = size_t(t0 * G * D); i < out.size(); ++i)
      err = std::max(err, double(std::fabs(out[i] - ref[i])));
    EXPECT_LT(err, 1e-5) << "t0 " << t0;
  }
  // Query t (key index P + before + t) sees keys (P + before + t - W, P + before + t]: changing
  // the last prefix key moves only the queries that still reach it.
  a.t0 = 0;
  a.out = out.data();
  attention(a);
  pk[size_t((P - 1) * D)] += 10.0f;
  std::vector<float> changed(size_t(n * G * D));
  a.out = changed.data();
  attention(a);
  for (int64_t t = 0; t < n; ++t) {
    const bool reaches = P - 1 > P + before + t - W;
    EXPECT_EQ(changed[size_t(t * G * D)] != out[size_t(t * G * D)], reaches) << "query " << t;
  }
}

TEST(KernelsAttention, SlidingWindowOverATailEqualsOverAllKeysBitwise) {
  // The same queries with all earlier keys in the own buffer, or only the last W - 1 of them:
  // bitwise equal (masked keys add exact zeros), as chunked prefill relies on.
  const int64_t G = 2, D = 16, W = 6, before = 23, n = 9;
  auto q = testing::random_normal(size_t(n * G * D), 21);
  auto ok = testing::random_normal(size_t((before + n) * D), 22),
       ov = testing::random_normal(size_t((before + n) * D), 23);
  std::vector<float> all(size_t(n * G * D)), tail(size_t(n * G * D));
  AttentionArgs a{.t0 = 0,
                  .t1 = n,
                  .group = G,
                  .d = D,
                  .q = q.data(),
                  .ldq = G * D,
                  .own_k = ok.data(),
                  .own_v = ov.data(),
                  .own_before = before,
                  .scale = 0.25f,
                  .window = W,
                  .out = all.data(),
                  .ldo = G * D};
  attention(a);
  const int64_t skip = before - (W - 1);
  a.own_k = ok.data() + skip * D;
  a.own_v = ov.data() + skip * D;
  a.own_before = W - 1;
  a.out = tail.data();
  attention(a);
  EXPECT_EQ(all, tail);
}

}  // namespace
}  // namespace deg
