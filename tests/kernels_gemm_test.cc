// GEMM kernels against the scalar reference (max error and NMSE), for every ISA this CPU has,
// f32 and bf16 weights, exact and bf16 precision, tails in M, N and K; and row-count invariance:
// a row's output is bitwise the same alone, in any batch, at any position, and accumulated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/gemm.h"

namespace deg {
namespace {

struct GemmCase {
  int64_t m, n, k;
};

Tensor random_weight(int64_t n, int64_t k, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  Tensor w = Tensor::empty({n, k}, dtype);
  for (int64_t i = 0; i < n * k; ++i) {
    if (dtype == DType::bf16) {
      w.mutable_data<bf16>()[i] = f32_to_bf16(nd(rng));
    } else {
      w.mutable_data<float>()[i] = nd(rng);
    }
  }
  return w;
}

std::vector<float> random_x(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(m * k));
  for (auto& v : x) v = nd(rng);
  return x;
}

class ForceIsa {
 public:
  explicit ForceIsa(GemmIsa isa) : saved_(gemm_isa()) { gemm_force_isa(isa); }
  ~ForceIsa() { gemm_force_isa(saved_); }

 private:
  GemmIsa saved_;
};

std::vector<GemmIsa> isas() {
  std::vector<GemmIsa> out;
  for (int i = 0; i <= int(gemm_best_isa()); ++i) out.push_back(GemmIsa(i));
  return out;
}

TEST(KernelsGemm, MatchesScalarReference) {
  const GemmCase cases[] = {{1, 1, 1}, {3, 5, 37}, {13, 17, 64}, {70, 33, 100}, {5, 64, 1024}};
  for (GemmIsa isa : isas()) {
    ForceIsa force(isa);
    for (DType dt : {DType::f32, DType::bf16}) {
      for (GemmPrecision prec : {GemmPrecision::exact, GemmPrecision::bf16}) {
        for (const GemmCase& c : cases) {
          Tensor w = random_weight(c.n, c.k, dt, 7);
          std::vector<float> x = random_x(c.m, c.k, 11);
          std::vector<float> y(size_t(c.m * c.n)), ref(size_t(c.m * c.n));
          GemmOutput out{.w = &w, .y = y.data(), .ldy = c.n};
          GemmOutput out_ref{.w = &w, .y = ref.data(), .ldy = c.n};
          gemm({.x = x.data(),
                .m = c.m,
                .k = c.k,
                .ldx = c.k,
                .outputs = {&out, 1},
                .precision = prec});
          gemm_reference({.x = x.data(),
                          .m = c.m,
                          .k = c.k,
                          .ldx = c.k,
                          .outputs = {&out_ref, 1},
                          .precision = prec});
          double err = 0, se = 0, ss = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            double d = double(y[i]) - double(ref[i]);
            err = std::max(err, std::fabs(d));
            se += d * d;
            ss += double(ref[i]) * double(ref[i]);
          }
          // Both accumulate in f32 (different orders); bf16 dot products also round x the same
          // way but combine pairs in their own order.
          const double nmse = se / std::max(ss, 1e-30);
          EXPECT_LT(nmse, 1e-10) << gemm_isa_name(isa) << " " << dtype_name(dt) << " m" << c.m
                                 << " n" << c.n << " k" << c.k;
          EXPECT_LT(err, 1e-4 * std::sqrt(double(c.k))) << gemm_isa_name(isa);
        }
      }
    }
  }
}

TEST(KernelsGemm, RowResultsDoNotDependOnBatch) {
  const int64_t N = 23, K = 129, M = 13;
  for (GemmIsa isa : isas()) {
    ForceIsa force(isa);
    for (DType dt : {DType::f32, DType::bf16}) {
      for (GemmPrecision prec : {GemmPrecision::exact, GemmPrecision::bf16}) {
        Tensor w = random_weight(N, K, dt, 3);
        std::vector<float> x = random_x(M, K, 5);
        std::vector<float> batch(size_t(M * N));
        linear(x.data(), M, K, w, batch.data(), false, prec);
        for (int64_t r = 0; r < M; ++r) {
          std::vector<float> alone(static_cast<size_t>(N));
          linear(x.data() + r * K, 1, K, w, alone.data(), false, prec);
          EXPECT_EQ(std::memcmp(alone.data(), batch.data() + r * N, size_t(N) * 4), 0)
              << gemm_isa_name(isa) << " row " << r;
          // The same row as row 0 of a 2-row batch, next to a different row.
          std::vector<float> pair_x(x.begin() + r * K, x.begin() + (r + 1) * K);
          pair_x.insert(pair_x.end(), x.begin(), x.begin() + K);
          std::vector<float> pair(size_t(2 * N));
          linear(pair_x.data(), 2, K, w, pair.data(), false, prec);
          EXPECT_EQ(std::memcmp(alone.data(), pair.data(), size_t(N) * 4), 0);
        }
      }
    }
  }
}

TEST(KernelsGemm, SeveralOutputsAndAccumulate) {
  const int64_t M = 9, K = 40;
  Tensor a = random_weight(16, K, DType::bf16, 1), b = random_weight(3, K, DType::f32, 2);
  std::vector<float> x = random_x(M, K, 9);
  std::vector<float> ya(size_t(M * 16)), yb(size_t(M * 3), 1.0f);
  GemmOutput outs[] = {{.w = &a, .y = ya.data(), .ldy = 16},
                       {.w = &b, .y = yb.data(), .ldy = 3, .accumulate = true}};
  gemm({.x = x.data(), .m = M, .k = K, .ldx = K, .outputs = outs});
  std::vector<float> ra(size_t(M * 16)), rb(size_t(M * 3));
  linear(x.data(), M, K, a, ra.data());
  linear(x.data(), M, K, b, rb.data());
  EXPECT_EQ(std::memcmp(ya.data(), ra.data(), ya.size() * 4), 0);
  for (size_t i = 0; i < yb.size(); ++i) EXPECT_EQ(yb[i], 1.0f + rb[i]);
}

TEST(KernelsGemm, SmallMatmulsMatchReference) {
  // Raw row-major products used inside the delta rule and attention, with leading dimensions.
  const GemmCase cases[] = {{1, 1, 1}, {3, 70, 5}, {17, 33, 64}, {64, 128, 64}, {5, 16, 0}};
  for (GemmIsa isa : isas()) {
    ForceIsa force(isa);
    for (const GemmCase& c : cases) {
      for (bool acc : {false, true}) {
        const int64_t lda = c.k + 3, ldb_nt = c.k + 1, ldb_nn = c.n + 2, ldc = c.n + 5;
        std::vector<float> a = random_x(c.m, lda, 1), bt = random_x(c.n, ldb_nt, 2),
                           bn = random_x(std::max<int64_t>(c.k, 1), ldb_nn, 3);
        std::vector<float> y0 = random_x(c.m, ldc, 4);
        for (int which = 0; which < 2; ++which) {
          std::vector<float> y = y0, ref = y0;
          MatmulArgs args{.a = a.data(),
                          .lda = lda,
                          .b = which ? bn.data() : bt.data(),
                          .ldb = which ? ldb_nn : ldb_nt,
                          .m = c.m,
                          .n = c.n,
                          .k = c.k,
                          .c = y.data(),
                          .ldc = ldc,
                          .accumulate = acc};
          which ? matmul_nn(args) : matmul_nt(args);
          args.c = ref.data();
          which ? matmul_nn_reference(args) : matmul_nt_reference(args);
          double err = 0;
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = size_t(i * ldc + j);
              if (j >= c.n) {
                EXPECT_EQ(y[at], y0[at]) << "wrote outside C";
              } else {
                err = std::max(err, std::fabs(double(y[at]) - double(ref[at])));
              }
            }
          EXPECT_LT(err, 1e-5 * std::sqrt(double(c.k) + 1))
              << gemm_isa_name(isa) << (which ? " nn" : " nt") << " m" << c.m << " n" << c.n;
        }
      }
    }
  }
}

TEST(KernelsGemm, PeakReportsBf16OnlyWhereTheCpuHasIt) {
  // deg bench divides by these: a bf16 peak must exist exactly when gemm can use vdpbf16ps, and
  // the f32 peak whenever a vector ISA runs (values are not asserted: tests never time).
  const PeakFlops p = measure_peak_flops(0.02);
  EXPECT_EQ(p.bf16 > 0, gemm_best_isa() == GemmIsa::avx512bf16);
  EXPECT_EQ(p.f32 > 0, gemm_best_isa() != GemmIsa::scalar);
  EXPECT_TRUE(std::isfinite(p.f32) && std::isfinite(p.bf16));
}

}  // namespace
}  // namespace deg
