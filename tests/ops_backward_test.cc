// The op interface's training ops (kernels/ops.h "training"). On the CPU each backward op is
// checked against finite differences of its forward op: for a random output weighting g and a
// random direction d over every input, (L(x + e d) - L(x - e d)) / 2e with L = g . f(x) must match
// the gradients' inner product with d. The product is checked against a plain f64 loop. Where a
// GPU is visible, every case also runs on CUDA and must match the CPU's gradients; the optimizer
// steps are checked CUDA against CPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "kernels/ops_decorator.h"
#include "managed_alloc.h"
#include "train/optim.h"

namespace deg {
namespace {

using Floats = testing::ManagedVector<float>;
using Ids = testing::ManagedVector<int32_t>;
using testing::randn;
using testing::Synchronized;

std::vector<const Ops*> backends() {
  std::vector<const Ops*> b = {&cpu_ops()};
  if (cuda_available()) {
    static const Synchronized cuda(cuda_ops());
    b.push_back(&cuda);
  }
  return b;
}

double dot(const Floats& a, const Floats& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// An input of a case: its values and the gradient the backward op fills.
struct Var {
  Floats* x;
  Floats* grad;
};

// The directional check on `vars` for L = sum_outputs g . out, out = forward() (which reads the
// vars' current values); the gradients must already hold the backward op's result.
void expect_directional(const std::function<std::vector<Floats>()>& forward,
                        const std::vector<Floats>& g, const std::vector<Var>& vars,
                        std::mt19937& rng, double eps = 1e-2, double tol = 2e-3) {
  std::vector<Floats> dir;
  double analytic = 0;
  for (const Var& v : vars) {
    dir.push_back(randn(v.x->size(), rng));
    analytic += dot(*v.grad, dir.back());
  }
  auto loss_at = [&](double step) {
    std::vector<Floats> saved;
    for (size_t k = 0; k < vars.size(); ++k) {
      saved.push_back(*vars[k].x);
      for (size_t i = 0; i < vars[k].x->size(); ++i)
        (*vars[k].x)[i] = float((*vars[k].x)[i] + step * dir[k][i]);
    }
    const std::vector<Floats> out = forward();
    double l = 0;
    for (size_t o = 0; o < out.size(); ++o) l += dot(out[o], g[o]);
    for (size_t k = 0; k < vars.size(); ++k) *vars[k].x = saved[k];
    return l;
  };
  const double fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
  EXPECT_NEAR(analytic, fd, tol * std::max({1.0, std::fabs(fd), std::fabs(analytic)}))
      << "analytic " << analytic << " finite difference " << fd;
}

// The CUDA gradients against the CPU's.
// Returns the max error over the max |want|.
double expect_close(const Floats& got, const Floats& want, double tol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return INFINITY;
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  EXPECT_LE(err / scale, tol) << what << ": max error " << err << " of " << scale;
  return err / scale;
}

// Runs `body(ops)` on every backend; body returns the gradients it computed (CPU first). Returns
// the largest relative error (expect_close's) of any other backend against the CPU.
double across_backends(const std::function<std::vector<Floats>(const Ops&)>& body, double tol) {
  std::vector<Floats> cpu;
  double worst = 0;
  for (const Ops* ops : backends()) {
    SCOPED_TRACE(ops->name());
    std::vector<Floats> got = body(*ops);
    if (ops->device() == Device::cpu) {
      cpu = std::move(got);
      continue;
    }
    for (size_t k = 0; k < cpu.size(); ++k)
      worst = std::max(worst, expect_close(got[k], cpu[k], tol, "gradient " + std::to_string(k)));
  }
  return worst;
}

// A strided batch of 3 products (gaps between the matrices, but for bf16_all, whose operands
// lie back to back): each against f64 loops as above; the gaps of c untouched; on the CPU the
// same bits as each product alone.
TEST(OpsBackward, MatmulBatchComputesEachProduct) {
  std::mt19937 rng(2);
  const int64_t M = 19, N = 23, K = 37, count = 3;
  for (GemmPrecision p : {GemmPrecision::exact, GemmPrecision::bf16_all})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const bool low = p == GemmPrecision::bf16_all;
        auto r = [&](float v) { return low ? double(bf16_to_f32(f32_to_bf16(v))) : double(v); };
        const int64_t lda = (ta ? M : K) + (low ? 0 : 3), ldb = (tb ? K : N) + (low ? 0 : 2);
        const int64_t ldc = N + 5;
        const int64_t sa = (ta ? K : M) * lda + (low ? 0 : 7);
        const int64_t sb = (tb ? N : K) * ldb + (low ? 0 : 5), sc = M * ldc + 11;
        const Floats a = randn(size_t(count * sa), rng), b = randn(size_t(count * sb), rng);
        const Floats c0 = randn(size_t(count * sc), rng);
        const MatmulOpArgs args{.a = a.data(),
                                .lda = lda,
                                .ta = ta,
                                .b = b.data(),
                                .ldb = ldb,
                                .tb = tb,
                                .ldc = ldc,
                                .m = M,
                                .n = N,
                                .k = K,
                                .accumulate = true,
                                .precision = p,
                                .batch = count,
                                .stride_a = sa,
                                .stride_b = sb,
                                .stride_c = sc};
        across_backends(
            [&](const Ops& ops) {
              Floats c = c0;
              MatmulOpArgs all = args;
              all.c = c.data();
              ops.matmul(all);
              for (int64_t q = 0; q < count; ++q) {
                const float *aq = a.data() + q * sa, *bq = b.data() + q * sb;
                for (int64_t i = 0; i < M; ++i)
                  for (int64_t j = 0; j < N; ++j) {
                    double s = c0[size_t(q * sc + i * ldc + j)];
                    for (int64_t k = 0; k < K; ++k)
                      s += r(ta ? aq[k * lda + i] : aq[i * lda + k]) *
                           r(tb ? bq[j * ldb + k] : bq[k * ldb + j]);
                    EXPECT_NEAR(c[size_t(q * sc + i * ldc + j)], s, 1e-4 * (1 + std::fabs(s)))
                        << "product " << q << " ta " << ta << " tb " << tb << " bf16 " << low;
                  }
                for (int64_t e = M * ldc; e < sc; ++e)  // the gap after product q
                  EXPECT_EQ(c[size_t(q * sc + e)], c0[size_t(q * sc + e)]);
              }
              if (ops.device() == Device::cpu) {
                Floats one = c0;
                for (int64_t q = 0; q < count; ++q) {
                  MatmulOpArgs alone = args;
                  alone.a += q * sa, alone.b += q * sb, alone.c = one.data() + q * sc;
                  alone.batch = 1;
                  ops.matmul(alone);
                }
                EXPECT_EQ(std::memcmp(one.data(), c.data(), c.size() * sizeof(float)), 0);
              }
              return std::vector<Floats>{c};
            },
            1e-5);
      }
}

// bf16_all: a product handed its operands as the backend itself rounded them (ab_out of an
// earlier product, a forward gemm's xb_out, taken back as ab / bb) gives the same bits as one
// that rounds them again (a backend that computes in f32 ignores the three).
TEST(OpsBackward, MatmulTakesItsOwnRoundingBack) {
  std::mt19937 rng(4);
  const int64_t M = 40, N = 72, K = 4096;  // k long enough for CUDA's sliced product too
  const Floats a = randn(size_t(K * M), rng), b = randn(size_t(K * N), rng);  // a read with ta
  const Tensor w = Tensor::from_vector(std::vector<float>(size_t(3 * N), 0.5f), {3, N});
  for (const Ops* ops : backends()) {
    SCOPED_TRACE(ops->name());
    const Tensor wd = ops->upload(w);
    testing::ManagedVector<bf16> a_b(size_t(K * M)), b_b(size_t(K * N));
    Floats once(size_t(M * N)), again(size_t(M * N)), y(size_t(K * 3));
    const MatmulOpArgs args{.a = a.data(),
                            .lda = M,
                            .ta = true,
                            .b = b.data(),
                            .ldb = N,
                            .m = M,
                            .n = N,
                            .k = K,
                            .precision = GemmPrecision::bf16_all};
    MatmulOpArgs first = args;
    first.c = once.data();
    first.ldc = N;
    first.ab_out = a_b.data();
    ops->matmul(first);
    const GemmOutput o{.w = &wd, .y = y.data(), .ldy = 3};  // b's rows as a forward's input
    ops->gemm({.x = b.data(),
               .m = K,
               .k = N,
               .ldx = N,
               .outputs = {&o, 1},
               .precision = GemmPrecision::bf16_all,
               .xb_out = b_b.data()});
    MatmulOpArgs second = args;
    second.c = again.data();
    second.ldc = N;
    second.ab = a_b.data();
    second.bb = b_b.data();
    ops->matmul(second);
    EXPECT_EQ(std::memcmp(once.data(), again.data(), once.size() * sizeof(float)), 0);
  }
}

// bf16_all: the loops round a and b to bf16 first; an f32 product differs from that by ~1e-3
// of the sums, far past the tolerance. The second shape's long k over one output tile is what
// CUDA cuts into slices whose partial sums it adds (CudaOps::run_split_gemm): a weight's gradient
// over the tokens.
TEST(OpsBackward, MatmulEveryTransposeMatchesF64Loops) {
  std::mt19937 rng(1);
  for (const auto [M, N, K] : {std::array<int64_t, 3>{37, 29, 70}, {40, 72, 8192}})
    for (GemmPrecision p : {GemmPrecision::exact, GemmPrecision::bf16_all})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (bool acc : {false, true}) {
            const bool low = p == GemmPrecision::bf16_all;
            auto r = [&](float v) { return low ? double(bf16_to_f32(f32_to_bf16(v))) : double(v); };
            const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
            const Floats a = randn(size_t((ta ? K : M) * lda), rng);
            const Floats b = randn(size_t((tb ? N : K) * ldb), rng);
            const Floats c0 = randn(size_t(M * ldc), rng);
            across_backends(
                [&](const Ops& ops) {
                  Floats c = c0;
                  ops.matmul({.a = a.data(),
                              .lda = lda,
                              .ta = ta,
                              .b = b.data(),
                              .ldb = ldb,
                              .tb = tb,
                              .c = c.data(),
                              .ldc = ldc,
                              .m = M,
                              .n = N,
                              .k = K,
                              .accumulate = acc,
                              .precision = p});
                  for (int64_t i = 0; i < M; ++i)
                    for (int64_t j = 0; j < N; ++j) {
                      double s = acc ? c0[size_t(i * ldc + j)] : 0.0, mass = 0;
                      for (int64_t k = 0; k < K; ++k) {
                        const double t = r(ta ? a[size_t(k * lda + i)] : a[size_t(i * lda + k)]) *
                                         r(tb ? b[size_t(j * ldb + k)] : b[size_t(k * ldb + j)]);
                        s += t;
                        mass += std::fabs(t);
                      }
                      // f32 sums' rounding grows with the terms' mass, not the (cancelling) sum.
                      EXPECT_NEAR(c[size_t(i * ldc + j)], s,
                                  1e-4 * (1 + std::fabs(s)) + 2e-7 * mass)
                          << "k " << K << " ta " << ta << " tb " << tb << " acc " << acc << " bf16 "
                          << low;
                    }
                  return std::vector<Floats>{c};
                },
                1e-5);
          }
}

// Widths a lane holds 1, 4 and 17 dims of on CUDA (the register kernel's 2, 4 and 32).
TEST(OpsBackward, RmsNormPerHead) {
  std::mt19937 rng(2);
  for (const int64_t D : {20, 100, 520}) {
    const int64_t R = 9, H = 3, ld = H * D + 4;
    Floats x = randn(size_t(R * ld), rng, 2.0f);
    const Floats g = randn(size_t(R * H * D), rng);
    auto forward = [&](const Ops& ops) {
      Floats y(size_t(R * H * D));
      ops.rms_norm({.x = x.data(),
                    .ldx = ld,
                    .hx = D,
                    .y = y.data(),
                    .ldy = H * D,
                    .hy = D,
                    .rows = R,
                    .heads = H,
                    .dim = D,
                    .eps = 1e-5f});
      return std::vector<Floats>{y};
    };
    across_backends(
        [&](const Ops& ops) {
          Floats dx(x.size(), 0.5f), base = dx;
          ops.rms_norm_backward({.x = x.data(),
                                 .ldx = ld,
                                 .hx = D,
                                 .dy = g.data(),
                                 .ldy = H * D,
                                 .hy = D,
                                 .dx = dx.data(),
                                 .lddx = ld,
                                 .hdx = D,
                                 .rows = R,
                                 .heads = H,
                                 .dim = D,
                                 .eps = 1e-5f});
          for (size_t i = 0; i < dx.size(); ++i) dx[i] -= base[i];  // it adds
          Floats gx = dx;
          expect_directional([&] { return forward(ops); }, {g}, {{&x, &gx}}, rng);
          return std::vector<Floats>{dx};
        },
        1e-5);
  }
}

// 33 columns, and 32 at strides of multiples of 4 (CUDA: four columns a thread).
TEST(OpsBackward, Activations) {
  std::mt19937 rng(3);
  const int64_t R = 7;
  for (const auto& [n, ld] : {std::pair<int64_t, int64_t>{33, 35}, {32, 36}})
    for (Activation act :
         {Activation::relu_squared, Activation::gelu_erf, Activation::scaled_sigmoid}) {
      SCOPED_TRACE("activation " + std::to_string(int(act)) + " over " + std::to_string(n) +
                   " columns");
      Floats x = randn(size_t(R * ld), rng, 2.0f);
      const Floats g = randn(size_t(R * n), rng);
      across_backends(
          [&](const Ops& ops) {
            auto forward = [&] {
              Floats y(size_t(R * n));
              ops.activation({.x = x.data(),
                              .ldx = ld,
                              .y = y.data(),
                              .ldy = n,
                              .rows = R,
                              .n = n,
                              .act = act,
                              .a = 3.0f,
                              .b = 0.5f,
                              .c = 2.0f});
              return std::vector<Floats>{y};
            };
            Floats dx(x.size(), 0.0f);
            ops.activation_backward({.x = x.data(),
                                     .ldx = ld,
                                     .dy = g.data(),
                                     .ldy = n,
                                     .dx = dx.data(),
                                     .lddx = ld,
                                     .rows = R,
                                     .n = n,
                                     .act = act,
                                     .a = 3.0f,
                                     .b = 0.5f,
                                     .c = 2.0f});
            expect_directional(forward, {g}, {{&x, &dx}}, rng, 1e-3);
            // In place without accumulating: dy becomes dy act'(x).
            Floats inplace(size_t(R * ld), 0.0f);
            for (int64_t r = 0; r < R; ++r)
              for (int64_t j = 0; j < n; ++j) inplace[size_t(r * ld + j)] = g[size_t(r * n + j)];
            ops.activation_backward({.x = x.data(),
                                     .ldx = ld,
                                     .dy = inplace.data(),
                                     .ldy = ld,
                                     .dx = inplace.data(),
                                     .lddx = ld,
                                     .rows = R,
                                     .n = n,
                                     .act = act,
                                     .a = 3.0f,
                                     .b = 0.5f,
                                     .c = 2.0f,
                                     .accumulate = false});
            for (int64_t r = 0; r < R; ++r)
              for (int64_t j = 0; j < n; ++j)
                EXPECT_EQ(inplace[size_t(r * ld + j)], dx[size_t(r * ld + j)]);
            return std::vector<Floats>{dx};
          },
          1e-5);
    }
}

// 300 rows, and 2,500 (CUDA: chunks of 1,024 rows, then their partials), the accumulate flag.
TEST(OpsBackward, ColumnSumAddsRowsInOrder) {
  std::mt19937 rng(4);
  for (const int64_t R : {300, 2500}) {
    const int64_t n = 17, ld = 19;
    const Floats x = randn(size_t(R * ld), rng);
    across_backends(
        [&](const Ops& ops) {
          Floats out(size_t(n), 1.0f);
          ops.column_sum(
              {.x = x.data(), .ldx = ld, .rows = R, .n = n, .s = 0.5f, .out = out.data()});
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t r = 0; r < R; ++r) s += x[size_t(r * ld + j)];
            EXPECT_NEAR(out[size_t(j)], 1.0 + 0.5 * s, 1e-4);
          }
          Floats set(size_t(n), 7.0f);
          ops.column_sum({.x = x.data(),
                          .ldx = ld,
                          .rows = R,
                          .n = n,
                          .s = 0.5f,
                          .out = set.data(),
                          .accumulate = false});
          for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(set[size_t(j)] + 1.0f, out[size_t(j)], 1e-4);
          return std::vector<Floats>{out, set};
        },
        1e-6);
  }
}

// y = c0 y + c1 x1 + c2 x2 with per-row lane coefficients by column group, an offset and an
// added lane: every input, every coefficient lane and the old y get their gradients.
// Groups of 4 columns (a lane each), and one group of 75 (CUDA: 32 lanes, 2 or 3 columns each,
// an odd count for the 2-column loads).
TEST(OpsBackward, CombineTermsLanesAndTheOldOutput) {
  std::mt19937 rng(5);
  for (auto [n, group] : {std::pair<int64_t, int64_t>{12, 4}, {75, 75}}) {
    const int64_t R = 11, G = n / group, ld = n + 2, ldl = 5;
    Floats y0 = randn(size_t(R * ld), rng), x1 = randn(size_t(R * ld), rng);
    Floats x2 = randn(size_t(R * n), rng);
    Floats lane0 = randn(size_t(R * ldl), rng), lane2 = randn(size_t(R * ldl), rng);
    Floats add2 = randn(size_t(R * G), rng);
    const Floats g = randn(size_t(R * n), rng);
    across_backends(
        [&](const Ops& ops) {
          auto terms = [&] {
            return std::vector<CombineTerm>{
                {.lane = lane0.data(), .ldl = ldl, .gl = 1, .offset = 1.0f},
                {.x = x1.data(), .ldx = ld, .s = 0.7f},
                {.x = x2.data(),
                 .ldx = n,
                 .s = 0.5f,
                 .lane = lane2.data() + 1,
                 .ldl = ldl,
                 .gl = 1,
                 .add = add2.data(),
                 .lda = G,
                 .ga = 1}};
          };
          auto forward = [&] {
            Floats y(size_t(R * n));
            for (int64_t r = 0; r < R; ++r)
              for (int64_t j = 0; j < n; ++j) y[size_t(r * n + j)] = y0[size_t(r * ld + j)];
            const std::vector<CombineTerm> t = terms();
            ops.combine({.y = y.data(), .ldy = n, .rows = R, .n = n, .group = group, .terms = t});
            return std::vector<Floats>{y};
          };
          Floats dy0(y0.size(), 0.0f), dx1(x1.size(), 0.0f), dx2(x2.size(), 0.0f);
          Floats dc0(size_t(R * G), 0.0f), dc2(size_t(R * G), 0.0f);
          const std::vector<CombineTerm> t = terms();
          const CombineGrad grads[] = {
              {.dcoef = dc0.data(), .ldc = G},
              {.dx = dx1.data(), .lddx = ld},
              {.dx = dx2.data(), .lddx = n, .dcoef = dc2.data(), .ldc = G}};
          ops.combine_backward({.forward = {.rows = R, .n = n, .group = group, .terms = t},
                                .dy = g.data(),
                                .ldy = n,
                                .y_before = y0.data(),
                                .ldb = ld,
                                .dy_before = dy0.data(),
                                .lddb = ld,
                                .grads = grads});
          expect_directional(forward, {g}, {{&y0, &dy0}, {&x1, &dx1}, {&x2, &dx2}}, rng);
          // A lane's gradient is the coefficient's: d lane0 = dc0, d lane2 = 0.5 dc2, d add2 = dc2.
          Floats dl0(lane0.size(), 0.0f), dl2(lane2.size(), 0.0f), da2(add2.size(), 0.0f);
          for (int64_t r = 0; r < R; ++r)
            for (int64_t k = 0; k < G; ++k) {
              dl0[size_t(r * ldl + k)] = dc0[size_t(r * G + k)];
              dl2[size_t(r * ldl + 1 + k)] = 0.5f * dc2[size_t(r * G + k)];
              da2[size_t(r * G + k)] = dc2[size_t(r * G + k)];
            }
          expect_directional(forward, {g}, {{&lane0, &dl0}, {&lane2, &dl2}, {&add2, &da2}}, rng);
          return std::vector<Floats>{dy0, dx1, dx2, dc0, dc2};
        },
        1e-5);
  }
}

// y = table[id] * row_scale (+ kept y), ids repeating (so table rows sum several positions) and
// one negative (left alone), from an id array and from a float id lane.
TEST(OpsBackward, GatherScattersIntoTableRows) {
  std::mt19937 rng(6);
  const int64_t V = 9, C = 10, n = 40, ldy = 12;
  Floats table_v = randn(size_t(V * C), rng), scale = randn(size_t(n), rng);
  Ids ids(static_cast<size_t>(n));
  Floats lane(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    ids[size_t(i)] = i == 7 ? -1 : int32_t(rng() % V);
    lane[size_t(2 * i)] = float(ids[size_t(i)]);
  }
  const Floats g = randn(size_t(n * ldy), rng);
  for (bool from_lane : {false, true}) {
    across_backends(
        [&](const Ops& ops) {
          auto gather_args = [&](const Tensor* t, float* y) {
            return GatherArgs{.table = t,
                              .ids = from_lane ? nullptr : ids.data(),
                              .n = n,
                              .y = y,
                              .ldy = ldy,
                              .keep = true,
                              .id_lane = from_lane ? lane.data() : nullptr,
                              .ld_id = 2,
                              .row_scale = scale.data(),
                              .ld_scale = 1};
          };
          auto forward = [&] {
            const Tensor t = ops.upload(
                Tensor::from_vector(std::vector<float>(table_v.begin(), table_v.end()), {V, C}));
            Floats y(size_t(n * ldy), 0.0f);
            ops.gather(gather_args(&t, y.data()));
            return std::vector<Floats>{y};
          };
          const Tensor t = ops.upload(
              Tensor::from_vector(std::vector<float>(table_v.begin(), table_v.end()), {V, C}));
          Floats dtable(table_v.size(), 0.0f), dscale(size_t(n), 0.0f);
          ops.gather_backward({.forward = gather_args(&t, nullptr),
                               .dy = g.data(),
                               .ldy = ldy,
                               .dtable = dtable.data(),
                               .drow_scale = dscale.data(),
                               .ld_drow = 1});
          expect_directional(forward, {g}, {{&table_v, &dtable}, {&scale, &dscale}}, rng);
          return std::vector<Floats>{dtable, dscale};
        },
        1e-5);
  }
}

// 13 rows, and 300 (CUDA sums dw over blocks of 128 rows, the last one partial).
TEST(OpsBackward, SigmoidGatesTwoInputs) {
  std::mt19937 rng(7);
  for (const int64_t R : {13, 300}) {
    const int64_t H = 3, n = 8, ldx = 10, ldw = 2 * n + 1, ldo = H + 1;
    Floats x = randn(size_t(R * ldx), rng), x2 = randn(size_t(R * ldx), rng);
    Floats w = randn(size_t(H * ldw), rng, 0.3f);
    const Floats g = randn(size_t(R * ldo), rng);
    across_backends(
        [&](const Ops& ops) {
          auto args = [&](float* out) {
            return SigmoidGateArgs{.x = x.data(),
                                   .ldx = ldx,
                                   .x2 = x2.data(),
                                   .ldx2 = ldx,
                                   .w = w.data(),
                                   .ldw = ldw,
                                   .rows = R,
                                   .heads = H,
                                   .n = n,
                                   .s = 2.0f,
                                   .out = out,
                                   .ldo = ldo};
          };
          auto forward = [&] {
            Floats out(size_t(R * ldo), 0.0f);
            ops.sigmoid_gates(args(out.data()));
            return std::vector<Floats>{out};
          };
          Floats dx(x.size(), 0.0f), dx2(x2.size(), 0.0f), dw(w.size(), 0.0f);
          ops.sigmoid_gates_backward({.forward = args(nullptr),
                                      .dout = g.data(),
                                      .lddo = ldo,
                                      .dx = dx.data(),
                                      .lddx = ldx,
                                      .dx2 = dx2.data(),
                                      .lddx2 = ldx,
                                      .dw = dw.data()});
          // The gate reads only its heads' columns of g (the padding lane is not an output).
          Floats gm = g;
          for (int64_t r = 0; r < R; ++r) gm[size_t(r * ldo + H)] = 0.0f;
          // A step of 3e-3: at 1e-2 the third-order term of 900 gates moved the quotient 1.5%
          // along some directions (the second backend's, on an H100; the CPU's gradients agree).
          expect_directional(forward, {gm}, {{&x, &dx}, {&x2, &dx2}, {&w, &dw}}, rng, 3e-3);
          return std::vector<Floats>{dx, dx2, dw};
        },
        1e-5);
  }
}

// Rows of 3 real tokens of 4 (the padded one is left alone), 2 heads of 6.
TEST(OpsBackward, SubtractProjection) {
  std::mt19937 rng(8);
  const int64_t L = 4, H = 2, D = 6, ld = H * D;
  const int64_t lengths[] = {3, 2}, positions[] = {0, 5};
  const RowTable rows{.rows = 2, .tokens = L, .lengths = lengths, .positions = positions};
  Floats y = randn(size_t(2 * L * ld), rng), v = randn(size_t(2 * L * ld), rng);
  Floats s = randn(size_t(2 * L * H), rng);
  const Floats g = randn(size_t(2 * L * ld), rng);
  across_backends(
      [&](const Ops& ops) {
        auto args = [&](float* yy) {
          return ProjectionArgs{.rows = rows,
                                .y = yy,
                                .ldy = ld,
                                .hy = D,
                                .v = v.data(),
                                .ldv = ld,
                                .hv = D,
                                .strength = s.data(),
                                .lds = H,
                                .heads = H,
                                .dim = D};
        };
        auto forward = [&] {
          Floats out = y;
          ops.subtract_projection(args(out.data()));
          return std::vector<Floats>{out};
        };
        Floats dy = g, dv(v.size(), 0.0f), ds(s.size(), 0.0f);
        ops.subtract_projection_backward({.forward = args(y.data()),
                                          .dy_out = dy.data(),
                                          .lddo = ld,
                                          .dy = dy.data(),
                                          .lddy = ld,
                                          .dv = dv.data(),
                                          .lddv = ld,
                                          .dstrength = ds.data(),
                                          .ldds = H});
        expect_directional(forward, {g}, {{&y, &dy}, {&v, &dv}, {&s, &ds}}, rng, 1e-3);
        return std::vector<Floats>{dy, dv, ds};
      },
      1e-5);
}

TEST(OpsBackward, NgramEmbedScattersBothHashedRows) {
  std::mt19937 rng(9);
  const int64_t V = 23, Dn = 6, P = 4, L = 5, ldy = 8;
  const int64_t lengths[] = {5, 3}, positions[] = {0, 4};
  const RowTable rows{.rows = 2, .tokens = L, .lengths = lengths, .positions = positions};
  Ids ids(size_t(2 * L)), p1(ids.size()), p2(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {  // few distinct ids: hashed rows repeat
    ids[i] = int32_t(rng() % 3);
    p1[i] = int32_t(rng() % 3);
    p2[i] = int32_t(rng() % 3);
  }
  Floats table_v = randn(size_t(V * Dn), rng);
  const Floats pool = randn(size_t(P * Dn), rng);
  const Floats g = randn(size_t(2 * L * ldy), rng);
  across_backends(
      [&](const Ops& ops) {
        auto args = [&](const Tensor* t, float* y) {
          return NgramEmbedArgs{.rows = rows,
                                .ids = ids.data(),
                                .prev1 = p1.data(),
                                .prev2 = p2.data(),
                                .table = t,
                                .sign_pool = pool.data(),
                                .sign_rows = P,
                                .bigram_rows = {1000003, 998244353},
                                .trigram_rows = {-7919, 2147483629, 65537},
                                .bigram_signs = {40503, 97},
                                .trigram_signs = {12289, 786433, 3},
                                .y = y,
                                .ldy = ldy};
        };
        auto table = [&] {
          return ops.upload(
              Tensor::from_vector(std::vector<float>(table_v.begin(), table_v.end()), {V, Dn}));
        };
        auto forward = [&] {
          const Tensor t = table();
          Floats y(size_t(2 * L * ldy), 0.0f);
          ops.ngram_embed(args(&t, y.data()));
          return std::vector<Floats>{y};
        };
        Floats gm = g;  // the columns past Dn are not outputs
        for (int64_t i = 0; i < 2 * L; ++i)
          for (int64_t d = Dn; d < ldy; ++d) gm[size_t(i * ldy + d)] = 0.0f;
        const Tensor t = table();
        Floats dtable(table_v.size(), 0.0f);
        ops.ngram_embed_backward(
            {.forward = args(&t, nullptr), .dy = gm.data(), .ldy = ldy, .dtable = dtable.data()});
        expect_directional(forward, {gm}, {{&table_v, &dtable}}, rng);
        return std::vector<Floats>{dtable};
      },
      1e-5);
}

TEST(OpsBackward, RopePairsInverseUndoesTheRotation) {
  std::mt19937 rng(10);
  const int64_t L = 6, H = 4, hs = 8, dims = 6;
  const int64_t lengths[] = {6, 4}, positions[] = {3, 100};
  const RowTable rows{.rows = 2, .tokens = L, .lengths = lengths, .positions = positions};
  Floats freq(static_cast<size_t>(dims));
  for (int64_t i = 0; i < dims; ++i) freq[size_t(i)] = float(std::pow(100.0, -double(i) / dims));
  const Floats x0 = randn(size_t(2 * L * H * hs), rng);
  for (bool paired : {false, true}) {
    across_backends(
        [&](const Ops& ops) {
          Floats x = x0;
          RopePairsArgs a{.rows = rows,
                          .freq = freq.data(),
                          .x = x.data(),
                          .ldx = H * hs,
                          .heads = H,
                          .hs = hs,
                          .dims = dims,
                          .paired_heads = paired};
          ops.rope_pairs(a);
          a.inverse = true;
          ops.rope_pairs(a);
          for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], x0[i], 1e-5) << i;
          return std::vector<Floats>{x};
        },
        1e-5);
  }
}

// Two fork rows over prefixes (their own, or one both read) and own keys, for the two
// attention_f64 backward tests below: the forward and backward on every backend (CUDA against the
// CPU within 1e-5, or with bf16 within kBf16Attention) and the directional check of dq and of the
// prefixes' and own buffers' dK / dV (of the f64 form: bf16's roundings are coarser than the
// check's steps, so a bf16 backend is held to the CPU's f64 instead); `check` then sees the
// gradients (prefix K, prefix V, own K, own V). Returns the largest error against the CPU.
struct TwoRows {
  int64_t H, dq, dv, D, P, cap, L, rot;
  const int64_t* lengths;  // [2]; each row's tokens past its length are padding
  const RowTable* rows;
  float scale, q_std;
  int64_t window;
  bool paired, offset, shared;
  const int32_t* segment;  // null: no segments
  uint32_t seed;
  bool bf16 = false;  // AttendF64Args::bf16 (the CPU computes the f64 form)
};

// CUDA's bf16 tensor-core attention against the CPU's f64 (outputs and gradients, max error over
// max magnitude): q, k, v, the output gradient and the probabilities rounded to bf16 (an H200
// measured 0.0096 at most, 2026-12-07).
constexpr double kBf16Attention = 2e-2;

double check_two_rows(
    const TwoRows& c,
    const std::function<void(const Floats&, const Floats&, const Floats&, const Floats&)>& check) {
  const int64_t H = c.H, D = c.D, P = c.P, cap = c.cap, L = c.L;
  std::mt19937 rng(c.seed);
  Floats pk = randn(size_t(2 * H * P * D), rng), pv = randn(size_t(2 * H * P * D), rng);
  Floats ok = randn(size_t(2 * H * cap * D), rng), ov = randn(size_t(2 * H * cap * D), rng);
  Floats q = randn(size_t(2 * L * H * c.dq), rng, c.q_std);
  const Floats g = randn(size_t(2 * L * H * c.dv), rng);
  return across_backends(
      [&](const Ops& ops) {
        auto views = [&](Floats& k1, Floats& v1, Floats& k2, Floats& v2) {
          std::vector<RowView> vs;
          for (int64_t b = 0; b < 2; ++b) {
            const int64_t pb = c.shared ? 0 : b;
            vs.push_back({.prefix_k = k1.data() + pb * H * P * D,
                          .prefix_v = v1.data() + pb * H * P * D,
                          .prefix_len = P,
                          .prefix_stride = P * D,
                          .own_k = k2.data() + b * H * cap * D,
                          .own_v = v2.data() + b * H * cap * D,
                          .own_stride = cap * D});
          }
          return vs;
        };
        auto args = [&](const std::vector<RowView>& vs, float* out) {
          return AttendF64Args{.rows = *c.rows,
                               .views = vs.data(),
                               .q = q.data(),
                               .ldq = H * c.dq,
                               .hq = c.dq,
                               .out = out,
                               .ldo = H * c.dv,
                               .ho = c.dv,
                               .heads = H,
                               .qk_dim = c.dq,
                               .v_dim = c.dv,
                               .kv_dim = D,
                               .scale = c.scale,
                               .window = c.window,
                               .paired_heads = c.paired,
                               .key_offset = c.offset,
                               .offset_from = c.rot,
                               .segment = c.segment,
                               .bf16 = c.bf16};
        };
        auto forward = [&] {
          const std::vector<RowView> vs = views(pk, pv, ok, ov);
          Floats out(size_t(2 * L * H * c.dv), 0.0f);
          ops.attention_f64(args(vs, out.data()));
          return std::vector<Floats>{out};
        };
        Floats dpk(pk.size(), 0.0f), dpv(pv.size(), 0.0f), dok(ok.size(), 0.0f),
            dov(ov.size(), 0.0f), dqq(q.size(), 0.0f);
        const std::vector<RowView> vs = views(pk, pv, ok, ov);
        const std::vector<RowView> dvs = views(dpk, dpv, dok, dov);
        ops.attention_f64_backward({.forward = args(vs, nullptr),
                                    .dout = g.data(),
                                    .lddo = H * c.dv,
                                    .hdo = c.dv,
                                    .dq = dqq.data(),
                                    .lddq = H * c.dq,
                                    .hdq = c.dq,
                                    .dviews = dvs.data()});
        Floats gm = g;  // padded outputs are zeros, not functions of the inputs
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t t = c.lengths[b]; t < L; ++t)
            for (int64_t e = 0; e < H * c.dv; ++e) gm[size_t((b * L + t) * H * c.dv + e)] = 0.0f;
        if (!c.bf16 || ops.device() == Device::cpu)
          expect_directional(forward, {gm},
                             {{&q, &dqq}, {&pk, &dpk}, {&pv, &dpv}, {&ok, &dok}, {&ov, &dov}}, rng,
                             1e-3);
        check(dpk, dpv, dok, dov);
        return std::vector<Floats>{forward()[0], dqq, dpk, dpv, dok, dov};
      },
      c.bf16 ? kBf16Attention : 1e-5);
}

// attention_f64 over a prefix and own keys, with a window, paired heads or the key offset, and
// packed segments: dq, and dK / dV into both the prefix's and the own buffers' gradient views;
// also with both rows reading one prefix (fork rows of one document: the prefix's gradient sums
// both rows' shares).
TEST(OpsBackward, AttentionF64PrefixOwnWindowPairedKeyOffsetSegments) {
  const int64_t H = 4, D = 6, P = 5, cap = 8, L = 4;
  const int64_t lengths[] = {3, 4}, positions[] = {P, P};
  const RowTable rows{.rows = 2, .tokens = L, .lengths = lengths, .positions = positions};
  // Segments: row 0's tokens in one that starts inside the prefix, row 1's last two tokens in a
  // segment of their own (P + 2 on).
  const Ids segment = {2, 2, 2, 0, 0, 0, int32_t(P + 2), int32_t(P + 2)};
  // A short window starts past key 0; a long one lets the queries see key 0, whose dims from
  // `rot` on the key offset also hands to key 1 (two readers of one element). Then the same with
  // AttendF64Args::bf16 (CUDA's tensor-core kernels).
  double worst_bf16 = 0;
  for (bool bf16 : {false, true})
    for (bool paired : {false, true})
      for (bool offset : {false, true})
        for (bool segmented : {false, true})
          for (bool long_window : {false, true})
            for (bool shared : {false, true}) {
              if (paired && offset) continue;
              SCOPED_TRACE(std::string(paired ? "paired" : "plain") +
                           (offset ? " key offset" : "") + (segmented ? " segments" : "") +
                           (long_window ? " long window" : "") + (shared ? " shared prefix" : "") +
                           (bf16 ? " bf16" : ""));
              const TwoRows c{.H = H,
                              .dq = 6,
                              .dv = 5,
                              .D = D,
                              .P = P,
                              .cap = cap,
                              .L = L,
                              .rot = 2,
                              .lengths = lengths,
                              .rows = &rows,
                              .scale = 0.5f,
                              .q_std = 1.0f,
                              .window = long_window ? 64
                                        : paired    ? 7
                                                    : 4,
                              .paired = paired,
                              .offset = offset,
                              .shared = shared,
                              .segment = segmented ? segment.data() : nullptr,
                              .seed = 11,
                              .bf16 = bf16};
              const double err = check_two_rows(
                  c, [&](const Floats&, const Floats& dpv, const Floats&, const Floats&) {
                    // Row 0's prefix values at positions 0 and 1: inside the window, before its
                    // segment.
                    double hidden = 0;
                    for (int64_t h = 0; h < H; ++h)
                      for (int64_t e = 0; e < 2 * D; ++e)
                        hidden += std::fabs(dpv[size_t(h * P * D + e)]);
                    if (segmented && !shared) {  // (row 1's first segment starts at 0)
                      EXPECT_EQ(hidden, 0.0);
                    } else {
                      EXPECT_GT(hidden, 0.0);
                    }
                  });
              if (bf16) worst_bf16 = std::max(worst_bf16, err);
            }
  if (backends().size() > 1)
    std::printf("bf16 attention against the CPU's f64: largest error %.3g of the largest value\n",
                worst_bf16);
}

// The same op at sizes past the CUDA backward's tiles (32 keys a block, 32 queries staged at
// once): a prefix of 45 keys and rows of 70 and 53 tokens (no length a multiple of 32), windows
// shorter and longer than a tile, paired heads, the key offset, several documents in a row, and
// two fork rows sharing one prefix (its gradient sums both rows' shares); head dims over 64 take
// the CUDA backward's per-key kernels instead.
TEST(OpsBackward, AttentionF64AcrossKeyAndQueryTiles) {
  const int64_t H = 4, P = 45, cap = 72, L = 70;
  const int64_t lengths[] = {70, 53}, positions[] = {P, P};
  const RowTable rows{.rows = 2, .tokens = L, .lengths = lengths, .positions = positions};
  // Row 0: a document from prefix position 10 up to its token 30, then one from P + 30; row 1:
  // a document from 0, then one from P + 41.
  Ids segment(size_t(2 * L));
  for (int64_t t = 0; t < L; ++t) {
    segment[size_t(t)] = t < 30 ? 10 : int32_t(P + 30);
    segment[size_t(L + t)] = t < 41 ? 0 : int32_t(P + 41);
  }
  // Head widths: 16 (the CUDA kernels' narrow tiles), 72 (wider query tiles, the per-key
  // kernels), 144 (the widest query tiles).
  double worst_bf16 = 0;
  for (bool bf16 : {false, true})
    for (int64_t width : {16, 72, 144})
      for (bool paired : {false, true})
        for (bool offset : {false, true})
          for (bool segmented : {false, true})
            for (bool long_window : {false, true})
              for (bool shared : {false, true}) {
                if (paired && offset) continue;
                const bool wide = width > 16;
                if (wide && !(segmented && long_window && shared)) continue;
                const int64_t dq = width, dv = wide ? width - 6 : 12, D = wide ? width : 72;
                SCOPED_TRACE(
                    std::string(paired ? "paired" : "plain") + (offset ? " key offset" : "") +
                    (segmented ? " segments" : "") + (long_window ? " long window" : "") +
                    (shared ? " shared prefix" : "") +
                    (wide ? " width " + std::to_string(width) : "") + (bf16 ? " bf16" : ""));
                // In virtual positions: paired heads' windows cover half as many tokens.
                const TwoRows c{.H = H,
                                .dq = dq,
                                .dv = dv,
                                .D = D,
                                .P = P,
                                .cap = cap,
                                .L = L,
                                .rot = 4,
                                .lengths = lengths,
                                .rows = &rows,
                                .scale = 1.0f / std::sqrt(float(dq)),
                                .q_std = 0.3f,
                                .window = long_window ? 100 : 20,
                                .paired = paired,
                                .offset = offset,
                                .shared = shared,
                                .segment = segmented ? segment.data() : nullptr,
                                .seed = 23,
                                .bf16 = bf16};
                const double err = check_two_rows(
                    c, [&](const Floats&, const Floats&, const Floats& dok, const Floats&) {
                      // Row 1's own keys past its length: nobody reads them.
                      double unread = 0;
                      for (int64_t h = 0; h < H; ++h)
                        for (int64_t e = lengths[1] * D; e < cap * D; ++e)
                          unread += std::fabs(dok[size_t((H + h) * cap * D + e)]);
                      EXPECT_EQ(unread, 0.0);
                    });
                if (bf16) worst_bf16 = std::max(worst_bf16, err);
              }
  if (backends().size() > 1)
    std::printf("bf16 attention against the CPU's f64: largest error %.3g of the largest value\n",
                worst_bf16);
}

// One row of 4200 tokens: windows of thousands of keys, past the CUDA query tiles' score cache
// (blocks whose keys span more than 1040 recompute their scores in each pass), so those walk
// many key tiles, and the dK / dV tiles many query chunks.
TEST(OpsBackward, AttentionF64LongRowsRecomputePastTheScoreCache) {
  const int64_t H = 2, dq = 8, dv = 8, D = 8, L = 4200, rot = 3;
  const int64_t lengths[] = {L}, positions[] = {0};
  const RowTable rows{.rows = 1, .tokens = L, .lengths = lengths, .positions = positions};
  for (bool bf16 : {false, true})
    for (bool offset : {false, true}) {
      SCOPED_TRACE(std::string(offset ? "key offset" : "plain") + (bf16 ? " bf16" : ""));
      std::mt19937 rng(29);
      Floats k = randn(size_t(H * L * D), rng), v = randn(size_t(H * L * D), rng);
      Floats q = randn(size_t(L * H * dq), rng, 0.3f);
      const Floats g = randn(size_t(L * H * dv), rng);
      across_backends(
          [&](const Ops& ops) {
            auto views = [&](Floats& kb, Floats& vb) {
              return std::vector<RowView>{
                  {.own_k = kb.data(), .own_v = vb.data(), .own_stride = L * D}};
            };
            auto args = [&](const std::vector<RowView>& vs, float* out) {
              return AttendF64Args{.rows = rows,
                                   .views = vs.data(),
                                   .q = q.data(),
                                   .ldq = H * dq,
                                   .hq = dq,
                                   .out = out,
                                   .ldo = H * dv,
                                   .ho = dv,
                                   .heads = H,
                                   .qk_dim = dq,
                                   .v_dim = dv,
                                   .kv_dim = D,
                                   .scale = 1.0f / std::sqrt(float(dq)),
                                   .window = 100000,
                                   .key_offset = offset,
                                   .offset_from = rot,
                                   .bf16 = bf16};
            };
            auto forward = [&] {
              const std::vector<RowView> vs = views(k, v);
              Floats out(size_t(L * H * dv), 0.0f);
              ops.attention_f64(args(vs, out.data()));
              return std::vector<Floats>{out};
            };
            Floats dk(k.size(), 0.0f), dvv(v.size(), 0.0f), dqq(q.size(), 0.0f);
            const std::vector<RowView> vs = views(k, v), dviews = views(dk, dvv);
            ops.attention_f64_backward({.forward = args(vs, nullptr),
                                        .dout = g.data(),
                                        .lddo = H * dv,
                                        .hdo = dv,
                                        .dq = dqq.data(),
                                        .lddq = H * dq,
                                        .hdq = dq,
                                        .dviews = dviews.data()});
            // A step of 1e-2, not 1e-3: the loss sums 67,200 f32 outputs, whose roundings move a
            // 1e-3 difference quotient by ~1e-2 (the H200 failed it at 0.0078 with the gradients
            // equal to the CPU's within 1e-5); the quotient's own error at 1e-2 is ~1e-4.
            if (!bf16 || ops.device() == Device::cpu)
              expect_directional(forward, {g}, {{&q, &dqq}, {&k, &dk}, {&v, &dvv}}, rng, 1e-2);
            return std::vector<Floats>{forward()[0], dqq, dk, dvv};
          },
          bf16 ? kBf16Attention : 1e-5);
    }
}

// ---- optimizer steps: CUDA against the CPU (the CPU's formulas: tests/train_optim_test.cc) ----

TEST(OpsOptimizer, AdamNesterovAndSumSquares) {
  std::mt19937 rng(12);
  const int64_t n = 10007;
  const Floats p0 = randn(size_t(n), rng), g0 = randn(size_t(n), rng);
  const Floats m0 = randn(size_t(n), rng, 0.1f);
  Floats v0 = randn(size_t(n), rng);
  for (float& v : v0) v = v * v;
  across_backends(
      [&](const Ops& ops) {
        Floats p = p0, g = g0, m = m0, v = v0;
        ops.adam_step({.p = p.data(),
                       .g = g.data(),
                       .m = m.data(),
                       .v = v.data(),
                       .n = n,
                       .beta1 = 0.9f,
                       .beta2 = 0.95f,
                       .eps = 1e-10f,
                       .step_size = 0.01f,
                       .wd = 0.001f});
        for (float x : g) EXPECT_EQ(x, 0.0f);
        Floats buf = m0, u(g0.size()), gn = g0;
        ops.nesterov({.g = gn.data(), .buf = buf.data(), .u = u.data(), .n = n, .momentum = 0.9f});
        for (float x : gn) EXPECT_EQ(x, 0.0f);  // consumed
        const double ss = ops.sum_squares(p0.data(), n);
        double want = 0;
        for (float x : p0) want += double(x) * x;
        EXPECT_NEAR(ss, want, 1e-9 * want);
        return std::vector<Floats>{p, m, v, buf, u, Floats{float(ss)}};
      },
      1e-6);
}

// frobenius_normalize over 3 blocks (the last shorter than a sum chunk's multiple): each block
// as sum_squares and scale give it, bitwise, on every backend.
TEST(OpsOptimizer, FrobeniusNormalizeIsSumSquaresThenScale) {
  std::mt19937 rng(15);
  const int64_t n = 10007, count = 3;
  const Floats x0 = randn(size_t(n * count), rng);
  across_backends(
      [&](const Ops& ops) {
        Floats x = x0, want = x0;
        ops.frobenius_normalize(
            {.x = x.data(), .n = n, .count = count, .margin = 2e-2, .eps = 1e-6});
        for (int64_t i = 0; i < count; ++i) {
          const double s = ops.sum_squares(x0.data() + i * n, n);
          const float f = float(1.0 / (std::sqrt(s) * (1 + 2e-2) + 1e-6));
          ops.scale({.y = want.data() + i * n, .ldy = n, .rows = 1, .n = n, .s = f});
        }
        EXPECT_EQ(std::memcmp(x.data(), want.data(), x.size() * sizeof(float)), 0);
        double norm = 0;  // the first block now has a norm just below 1
        for (int64_t j = 0; j < n; ++j) norm += double(x[size_t(j)]) * x[size_t(j)];
        EXPECT_NEAR(std::sqrt(norm), 1 / 1.02, 1e-5);
        return std::vector<Floats>{x};
      },
      1e-7);
}

// Polar Express (train::polar_express's ops) and NorMuon's step, wide and tall.
TEST(OpsOptimizer, PolarExpressAndNorMuonStep) {
  std::mt19937 rng(13);
  for (auto [R, K] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}}) {
    const Floats x0 = randn(size_t(R * K), rng), p0 = randn(size_t(R * K), rng);
    const Floats s0 = Floats(size_t(std::max(R, K)), 0.01f);
    across_backends(
        [&](const Ops& ops) {
          Floats x = x0;
          train::polar_express(ops, x.data(), R, K);
          // Near orthogonal: the rows (wide) or columns (tall) have norms near 1.
          for (int64_t i = 0; i < std::min(R, K); ++i) {
            double nrm = 0;
            for (int64_t j = 0; j < std::max(R, K); ++j) {
              const float e = R <= K ? x[size_t(i * K + j)] : x[size_t(j * K + i)];
              nrm += double(e) * e;
            }
            EXPECT_GT(nrm, 0.3);
            EXPECT_LT(nrm, 1.6);
          }
          Floats p = p0, second = s0;
          ops.normuon_step({.u = x.data(),
                            .p = p.data(),
                            .second = second.data(),
                            .rows = R,
                            .cols = K,
                            .beta2 = 0.9f,
                            .lr = 0.02f,
                            .wd = 0.1f});
          return std::vector<Floats>{x, p, second};
        },
        1e-4);
  }
}

// Polar Express over a batch (NorMuon's shape classes, the products in strided batches): each
// matrix's result as it is alone, bitwise on the CPU (the same products, matrix by matrix) and
// within f32 rounding on CUDA (one launch per product of the batch).
TEST(OpsOptimizer, PolarExpressBatchMatchesEachAlone) {
  std::mt19937 rng(14);
  for (auto [R, K] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}}) {
    const int64_t count = 3, n = R * K;
    const Floats x0 = randn(size_t(count * n), rng);
    across_backends(
        [&](const Ops& ops) {
          Floats batch = x0, alone = x0;
          train::polar_express(ops, batch.data(), R, K, count);
          for (int64_t i = 0; i < count; ++i) train::polar_express(ops, alone.data() + i * n, R, K);
          if (ops.device() == Device::cpu) {
            EXPECT_EQ(std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float)), 0);
          } else {
            expect_close(batch, alone, 1e-5, "batch against alone");
          }
          return std::vector<Floats>{batch};
        },
        1e-4);
  }
}

// Nesterov and NorMuon's step over a batch (a shape class's blocks, their vectors found through
// pointer tables): each block as it is alone, bitwise, on every backend; wide and tall blocks.
TEST(OpsOptimizer, NesterovAndNorMuonBatchMatchEachAlone) {
  std::mt19937 rng(16);
  for (auto [R, K] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}}) {
    const int64_t count = 3, n = R * K, nsec = std::max(R, K);
    const Floats g0 = randn(size_t(count * n), rng), m0 = randn(size_t(count * n), rng, 0.1f);
    const Floats p0 = randn(size_t(count * n), rng), s0(size_t(count * nsec), 0.01f);
    const Floats muls = {1.0f, 0.5f, 2.0f};
    across_backends(
        [&](const Ops& ops) {
          Floats g = g0, m = m0, p = p0, second = s0, u(size_t(count * n));
          testing::ManagedVector<float*> gs, bufs, ps, seconds;
          for (int64_t j = count - 1; j >= 0; --j) {  // the blocks in another order than memory's
            gs.push_back(g.data() + j * n), bufs.push_back(m.data() + j * n);
            ps.push_back(p.data() + j * n), seconds.push_back(second.data() + j * nsec);
          }
          ops.nesterov({.u = u.data(),
                        .n = n,
                        .momentum = 0.9f,
                        .count = count,
                        .gs = gs.data(),
                        .bufs = bufs.data()});
          ops.normuon_step({.u = u.data(),
                            .rows = R,
                            .cols = K,
                            .beta2 = 0.9f,
                            .lr = 0.02f,
                            .wd = 0.1f,
                            .count = count,
                            .ps = ps.data(),
                            .seconds = seconds.data(),
                            .lr_muls = muls.data()});
          for (float x : g) EXPECT_EQ(x, 0.0f);
          Floats ga = g0, ma = m0, pa = p0, sa = s0, ua = Floats(size_t(n));
          for (int64_t j = count - 1; j >= 0; --j) {  // batch position count - 1 - j
            const int64_t b = count - 1 - j;
            ops.nesterov({.g = ga.data() + j * n,
                          .buf = ma.data() + j * n,
                          .u = ua.data(),
                          .n = n,
                          .momentum = 0.9f});
            EXPECT_EQ(std::memcmp(ua.data(), u.data() + b * n, size_t(n) * sizeof(float)), 0);
            ops.normuon_step({.u = u.data() + b * n,
                              .p = pa.data() + j * n,
                              .second = sa.data() + j * nsec,
                              .rows = R,
                              .cols = K,
                              .beta2 = 0.9f,
                              .lr = 0.02f * muls[size_t(b)],
                              .wd = 0.1f});
          }
          EXPECT_EQ(std::memcmp(m.data(), ma.data(), m.size() * sizeof(float)), 0);
          EXPECT_EQ(std::memcmp(p.data(), pa.data(), p.size() * sizeof(float)), 0);
          EXPECT_EQ(std::memcmp(second.data(), sa.data(), second.size() * sizeof(float)), 0);
          return std::vector<Floats>{u, m, p, second};
        },
        1e-4);
  }
}

}  // namespace
}  // namespace deg
