// Depthwise causal conv kernels (kernels/conv.h): the plain form (LFM2) and the SiLU form (Gated
// DeltaNet) against a double-precision sum over tail ++ x, and a sequence read in two pieces
// (the tail carried in place between them) equal to one piece, bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/conv.h"
#include "test_util.h"

namespace deg {
namespace {

struct ConvCase {
  int64_t n, channels, kernel;
};

class KernelsConv : public ::testing::TestWithParam<ConvCase> {};

TEST_P(KernelsConv, MatchesDirectSumAndCarriesTheTail) {
  const auto [n, C, K] = GetParam();
  const int64_t K1 = K - 1;
  std::vector<float> x = testing::random_normal(size_t(n * C), 1),
                     w = testing::random_normal(size_t(C * K), 2);
  std::vector<float> tail = testing::random_normal(size_t(K1 * C), 3);
  for (bool silu : {false, true}) {
    auto run = silu ? causal_conv_silu : causal_conv;
    std::vector<float> y(size_t(n * C)), tail_out(size_t(K1 * C));
    run({.n = n,
         .channels = C,
         .kernel = K,
         .x = x.data(),
         .ldx = C,
         .tail_in = tail.data(),
         .w = w.data(),
         .y = y.data(),
         .ldy = C,
         .tail_out = tail_out.data()});
    auto ext = [&](int64_t r, int64_t c) {
      return double(r < K1 ? tail[size_t(r * C + c)] : x[size_t((r - K1) * C + c)]);
    };
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += ext(t + k, c) * double(w[size_t(c * K + k)]);
        if (silu) s = s / (1 + std::exp(-s));
        EXPECT_NEAR(y[size_t(t * C + c)], s, 1e-5 * (1 + std::fabs(s))) << t << " " << c;
      }
    for (int64_t r = 0; r < K1; ++r)
      for (int64_t c = 0; c < C; ++c)
        EXPECT_EQ(tail_out[size_t(r * C + c)], float(ext(n + r, c))) << "tail " << r;

    // Two pieces, the tail updated in place (tail_out aliases tail_in), equal one piece.
    for (int64_t split : {int64_t(0), std::min<int64_t>(1, n), n / 2, n}) {
      std::vector<float> carry = tail, y2(size_t(n * C));
      for (auto [from, count] : {std::pair{int64_t(0), split}, std::pair{split, n - split}}) {
        run({.n = count,
             .channels = C,
             .kernel = K,
             .x = x.data() + from * C,
             .ldx = C,
             .tail_in = carry.data(),
             .w = w.data(),
             .y = y2.data() + from * C,
             .ldy = C,
             .tail_out = carry.data()});
      }
      EXPECT_EQ(y2, y) << "split " << split;
      EXPECT_EQ(carry, tail_out) << "split " << split;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelsConv,
                         ::testing::Values(ConvCase{7, 5, 3}, ConvCase{1, 8, 4}, ConvCase{12, 3, 2},
                                           ConvCase{5, 4, 1}, ConvCase{0, 3, 3}));

}  // namespace
}  // namespace deg
