// Head math against a plain double-precision transcription of the seed's formulas, bitwise
// batch and block invariance, and heads.safetensors round trips with the seed's key names.
#include "model/heads.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backbone_test_util.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace deg {
namespace {

constexpr int64_t C = 24;

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// y = W x + b in double.
std::vector<double> lin(const Linear& l, const float* x) {
  std::vector<double> y(static_cast<size_t>(l.out()));
  const float* w = l.weight.data<float>();
  for (int64_t o = 0; o < l.out(); ++o) {
    double s = l.bias.data<float>()[o];
    for (int64_t i = 0; i < l.in(); ++i) s += double(w[o * l.in() + i]) * x[i];
    y[size_t(o)] = s;
  }
  return y;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

void expect_close(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-4 * (1 + std::fabs(want))) << what;
}

Heads test_heads() {
  Heads h = Heads::init(C, 7);
  // Non-trivial span bias so the anchored path is visible.
  float* b = h.span_bias.mutable_data<float>();
  for (int64_t i = 0; i < h.span_bias.numel(); ++i) b[i] = 0.1f * float(i % 7) - 0.3f;
  return h;
}

TEST(Heads, InitFollowsPyTorchDefaults) {
  Heads h = Heads::init(C, 1);
  const float bound = 1.0f / std::sqrt(float(C));
  for (const Linear* l : {&h.choice.query, &h.span.k_end, &h.count}) {
    float lo = 1, hi = -1;
    for (float w : l->weight.to_f32_vector()) lo = std::min(lo, w), hi = std::max(hi, w);
    EXPECT_GE(lo, -bound);
    EXPECT_LT(hi, bound);
    EXPECT_LT(lo, -0.8f * bound);  // actually spread over the range
    EXPECT_GT(hi, 0.8f * bound);
  }
  EXPECT_EQ(h.anchor.prior.bias.data<float>()[0], kAnchorInitBias);
  EXPECT_EQ(h.count.out(), kMaxCount + 1);
  EXPECT_EQ(h.temp(HeadKind::extract), 1.0f);
  // Same seed, same bits; another seed, other bits.
  EXPECT_EQ(Heads::init(C, 1).span.q_start.weight.to_f32_vector(),
            h.span.q_start.weight.to_f32_vector());
  EXPECT_NE(Heads::init(C, 2).span.q_start.weight.to_f32_vector(),
            h.span.q_start.weight.to_f32_vector());
}

TEST(Heads, PointerNoulCountMatchFormulas) {
  Heads h = test_heads();
  auto a = randn(C, 1), opts = randn(3 * C, 2);
  auto got = pointer_logits(h.choice, a.data(), opts.data(), 3);
  auto q = lin(h.choice.query, a.data());
  for (int64_t i = 0; i < 3; ++i) {
    const float* o = opts.data() + i * C;
    double want = dot(q, lin(h.choice.key, o)) / 16.0 + lin(h.choice.prior, o)[0];
    expect_close(got[size_t(i)], want, "pointer");
  }
  auto noul = noul_logits(h, a.data(), 1);
  expect_close(noul[0], lin(h.noul, a.data())[0], "noul");
  auto count = count_logits(h, a.data(), 1);
  auto cw = lin(h.count, a.data());
  for (int64_t i = 0; i <= kMaxCount; ++i) expect_close(count[size_t(i)], cw[size_t(i)], "count");
}

TEST(Heads, SpanAndAnchorMatchFormulas) {
  Heads h = test_heads();
  const int64_t T = 40;
  auto ctx = randn(T * C, 3), a = randn(2 * C, 4);
  std::vector<SpanQuery> sq = {{}, {.anchor = 10, .region_end = 25}};
  SpanLogits s = span_logits(h, a.data(), 2, sq, ctx.data(), T);
  for (int64_t i = 0; i < 2; ++i) {
    const float* ai = a.data() + i * C;
    auto qs = lin(h.span.q_start, ai), qe = lin(h.span.q_end, ai);
    for (int64_t t = 0; t < T; ++t) {
      const float* c = ctx.data() + t * C;
      double ws = dot(qs, lin(h.span.k_start, c)) / 16.0;
      double we = dot(qe, lin(h.span.k_end, c)) / 16.0;
      if (sq[size_t(i)].anchor >= 0) {
        int inside = t >= 10 && t < 25;
        int b = rel_bucket(t - 10);
        ws += h.span_bias.get({0, inside, b});
        we += h.span_bias.get({1, inside, b});
      }
      expect_close(s.start[size_t(i * (T + 1) + t)], ws, "start");
      expect_close(s.end[size_t(i * (T + 1) + t)], we, "end");
    }
    expect_close(s.start[size_t(i * (T + 1) + T)], lin(h.span.null_start, ai)[0], "null start");
    expect_close(s.end[size_t(i * (T + 1) + T)], lin(h.span.null_end, ai)[0], "null end");
  }
  auto an = anchor_logits(h, a.data(), 1, {{.lo = 5, .hi = 30}}, ctx.data(), T);
  auto qa = lin(h.anchor.query, a.data());
  for (int64_t t = 0; t < T; ++t) {
    if (t < 5 || t >= 30) {
      EXPECT_TRUE(std::isinf(an[size_t(t)]) && an[size_t(t)] < 0) << t;
      continue;
    }
    const float* c = ctx.data() + t * C;
    expect_close(an[size_t(t)], dot(qa, lin(h.anchor.key, c)) / 16.0 + lin(h.anchor.prior, c)[0],
                 "anchor");
  }
}

TEST(Heads, RelBucketsAsTorchBucketizeRight) {
  // torch.bucketize(d, REL_EDGES, right=True): number of edges <= d.
  EXPECT_EQ(rel_bucket(-1000), 0);
  EXPECT_EQ(rel_bucket(-256), 1);
  EXPECT_EQ(rel_bucket(-5), 3);
  EXPECT_EQ(rel_bucket(-4), 4);
  EXPECT_EQ(rel_bucket(0), 5);
  EXPECT_EQ(rel_bucket(1), 6);
  EXPECT_EQ(rel_bucket(3), 7);
  EXPECT_EQ(rel_bucket(256), 14);
  EXPECT_EQ(rel_bucket(100000), 14);
}

TEST(Heads, BitwiseBatchAndContextLengthInvariance) {
  Heads h = test_heads();
  const int64_t T = 700;
  auto ctx = randn(T * C, 5, 0.5f), a = randn(5 * C, 6);
  std::vector<SpanQuery> sq = {{}, {.anchor = 3, .region_end = 90}, {}, {.anchor = 600}, {}};
  SpanLogits all = span_logits(h, a.data(), 5, sq, ctx.data(), T);
  for (int64_t i = 0; i < 5; ++i) {
    SpanLogits one = span_logits(h, a.data() + i * C, 1, {sq[size_t(i)]}, ctx.data(), T);
    for (int64_t t = 0; t <= T; ++t) {
      ASSERT_EQ(one.start[size_t(t)], all.start[size_t(i * (T + 1) + t)]) << i << " " << t;
      ASSERT_EQ(one.end[size_t(t)], all.end[size_t(i * (T + 1) + t)]) << i << " " << t;
    }
  }
  // A shorter context gives the same bits for the tokens it shares with the longer one.
  const int64_t T1 = 513;
  SpanLogits short_ctx = span_logits(h, a.data(), 1, {sq[0]}, ctx.data(), T1);
  for (int64_t t = 0; t < T1; ++t) ASSERT_EQ(short_ctx.start[size_t(t)], all.start[size_t(t)]);
  auto an_all = anchor_logits(h, a.data(), 3, {{}, {.lo = 2, .hi = 50}, {}}, ctx.data(), T);
  auto an_one = anchor_logits(h, a.data() + 2 * C, 1, {{}}, ctx.data(), T);
  for (int64_t t = 0; t < T; ++t) ASSERT_EQ(an_one[size_t(t)], an_all[size_t(2 * T + t)]);
}

// The context's keys made on a backend (as the engine makes them where the hidden states are)
// and the products with them there, against the formulas in double precision: the layout of
// the products that come back, the queries' padding on a GPU (70 queries: a block of 64 and a
// padded one), the span bias and the anchor regions.
class HeadsBackends : public ::testing::TestWithParam<Device> {};

TEST_P(HeadsBackends, KeysWhereTheContextIsMatchTheFormulas) {
  const Ops& ops = ops_for(GetParam());
  const Heads h = test_heads(), on = h.on(ops);
  const int64_t T = 300, n = 70;
  const auto ctx = randn(T * C, 11, 0.5f), a = randn(n * C, 12);
  Tensor ctx_on = ops.alloc({T, C}, DType::f32);
  ops.to_device(ctx_on.mutable_data<float>(), ctx.data(), ctx.size() * sizeof(float));
  std::vector<SpanQuery> sq(static_cast<size_t>(n));
  std::vector<Region> regions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 3) {
    sq[size_t(i)] = {.anchor = 3 * i, .region_end = 3 * i + 40};
    regions[size_t(i)] = {.lo = 2 * i, .hi = 2 * i + 100};
  }
  ContextKeys keys;
  span_keys(ops, on, ctx_on.data<float>(), T, keys);
  anchor_keys(ops, on, ctx_on.data<float>(), T, keys);
  const SpanLogits s = span_logits(h, a.data(), n, sq, keys);
  const std::vector<float> an = anchor_logits(h, a.data(), n, regions, keys);
  std::vector<std::vector<double>> ks, ke, ka, prior;
  for (int64_t t = 0; t < T; ++t) {
    const float* c = ctx.data() + t * C;
    ks.push_back(lin(h.span.k_start, c));
    ke.push_back(lin(h.span.k_end, c));
    ka.push_back(lin(h.anchor.key, c));
    prior.push_back(lin(h.anchor.prior, c));
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* ai = a.data() + i * C;
    const auto qs = lin(h.span.q_start, ai), qe = lin(h.span.q_end, ai),
               qa = lin(h.anchor.query, ai);
    const SpanQuery& q = sq[size_t(i)];
    const Region& r = regions[size_t(i)];
    for (int64_t t = 0; t < T; ++t) {
      double ws = dot(qs, ks[size_t(t)]) / 16.0, we = dot(qe, ke[size_t(t)]) / 16.0;
      if (q.anchor >= 0) {
        const int inside = t >= q.anchor && t < q.region_end;
        const int b = rel_bucket(t - q.anchor);
        ws += h.span_bias.get({0, inside, b});
        we += h.span_bias.get({1, inside, b});
      }
      expect_close(s.start[size_t(i * (T + 1) + t)], ws, "start");
      expect_close(s.end[size_t(i * (T + 1) + t)], we, "end");
      const float got = an[size_t(i * T + t)];
      if (t < r.lo || (r.hi >= 0 && t >= r.hi)) {
        EXPECT_TRUE(std::isinf(got) && got < 0) << i << " " << t;
      } else {
        expect_close(got, dot(qa, ka[size_t(t)]) / 16.0 + prior[size_t(t)][0], "anchor");
      }
    }
    expect_close(s.start[size_t(i * (T + 1) + T)], lin(h.span.null_start, ai)[0], "null start");
    expect_close(s.end[size_t(i * (T + 1) + T)], lin(h.span.null_end, ai)[0], "null end");
  }
}

INSTANTIATE_TEST_SUITE_P(Device, HeadsBackends, ::testing::ValuesIn(testing::test_devices()),
                         [](const auto& info) {
                           return std::string(info.param == Device::cuda ? "cuda" : "cpu");
                         });

TEST(Heads, SaveLoadRoundTripWithSeedKeys) {
  testing::TempDir dir;
  Heads h = test_heads();
  h.save(dir / "heads.safetensors");
  SafetensorsFile f = SafetensorsFile::open(dir / "heads.safetensors");
  for (const char* key :
       {"choice.query.weight", "choice.key.bias", "choice.prior.weight", "score.query.weight",
        "noul.weight", "noul.bias", "span.q_start.weight", "span.k_end.bias",
        "span.null_start.weight", "span.null_end.bias", "count.weight", "anchor.query.weight",
        "anchor.prior.bias", "span_bias", "temperature"}) {
    ASSERT_NE(f.find(key), nullptr) << key;
    EXPECT_EQ(f.find(key)->dtype, DType::f32) << key;
  }
  EXPECT_EQ(f.tensors().size(), 2u * 17 + 2);  // 17 Linears (weight + bias), span_bias, temperature
  Heads back = Heads::load(dir / "heads.safetensors");
  EXPECT_EQ(back.hidden, C);
  EXPECT_EQ(back.span.q_end.weight.to_f32_vector(), h.span.q_end.weight.to_f32_vector());
  EXPECT_EQ(back.span_bias.to_f32_vector(), h.span_bias.to_f32_vector());
  EXPECT_EQ(back.anchor.prior.bias.to_f32_vector(), h.anchor.prior.bias.to_f32_vector());

  // A heads file with a wrong shape or a missing tensor is refused, naming the tensor.
  safetensors_write(dir / "bad.safetensors", {{"noul.weight", Tensor::empty({1, C}, DType::f32)}});
  try {
    Heads::load(dir / "bad.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_FALSE(e.context().tensor.empty()) << e.what();
  }
}

}  // namespace
}  // namespace deg
