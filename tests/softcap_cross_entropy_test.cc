// softcap_cross_entropy (kernels/ops.h): the CPU backend against the reference backend's
// double-precision formula, its gradients against finite differences, row independence, and
// the CUDA backend against the CPU where a GPU is visible.
//
// Letters: T rows, C model dim, V vocab.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backbone_test_util.h"
#include "core/dtype.h"
#include "kernels/ops.h"
#include "kernels/reference_ops.h"

namespace deg {
namespace {

struct LossCase {
  std::string name;
  int64_t T = 0, C = 0, V = 0;
  std::vector<float> mtp{1.0f};
  float prefix_weight = 0.0f;  // prefix targets are given when != 0
  DType w_dtype = DType::f32;
  float a = 23.0f, b = 5.0f, c = 7.5f;
};

void PrintTo(const LossCase& k, std::ostream* os) {
  *os << k.name;
}

// Host inputs and outputs of one call; strides wider than C, so row strides are exercised.
struct LossData {
  int64_t T, C, V, ldx, lddx;
  std::vector<float> xn;  // [T, ldx]
  Tensor w;               // [V, C]
  std::vector<int32_t> targets, prefix;
  std::vector<float> loss, dxn, dw;  // outputs (dxn, dw start random: the op adds to them)
};

LossData make_data(const LossCase& k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  LossData d{.T = k.T, .C = k.C, .V = k.V, .ldx = k.C + 3, .lddx = k.C + 5};
  d.xn.resize(size_t(d.T * d.ldx));
  for (float& x : d.xn) x = normal(rng);
  // Logits of a few units: the soft cap's steep and flat parts both appear.
  std::vector<float> w(size_t(k.V * k.C));
  for (float& x : w) x = normal(rng) * 3.0f / std::sqrt(float(k.C));
  d.w = Tensor::from_vector(w, {k.V, k.C});
  if (k.w_dtype == DType::bf16) d.w = d.w.to(DType::bf16);
  // Mostly real targets; some none (-1), some out of range on either side.
  std::uniform_int_distribution<int32_t> token(0, int32_t(k.V) - 1), kind(0, 9);
  auto target = [&] {
    const int32_t x = kind(rng);
    return x == 0 ? -1 : x == 1 ? int32_t(k.V) + x : x == 2 ? -7 : token(rng);
  };
  for (int64_t t = 0; t < k.T; ++t) d.targets.push_back(target());
  d.targets[1] = -1;  // with one target: a row without terms
  if (k.prefix_weight != 0.0f)
    for (int64_t t = 0; t < k.T; ++t) d.prefix.push_back(target());
  d.loss.assign(size_t(k.T), -1.0f);
  d.dxn.resize(size_t(d.T * d.lddx));
  d.dw.resize(size_t(k.V * k.C));
  for (float& x : d.dxn) x = normal(rng) * 1e-3f;
  for (float& x : d.dw) x = normal(rng) * 1e-3f;
  return d;
}

SoftcapCrossEntropyArgs args_of(const LossCase& k, LossData& d, bool grad) {
  SoftcapCrossEntropyArgs a{.xn = d.xn.data(),
                            .ldx = d.ldx,
                            .w = &d.w,
                            .targets = d.targets.data(),
                            .prefix = d.prefix.empty() ? nullptr : d.prefix.data(),
                            .rows = d.T,
                            .a = k.a,
                            .b = k.b,
                            .c = k.c,
                            .mtp = int64_t(k.mtp.size()),
                            .prefix_weight = k.prefix_weight,
                            .loss = d.loss.data(),
                            .dxn = grad ? d.dxn.data() : nullptr,
                            .lddx = d.lddx,
                            .dw = grad ? d.dw.data() : nullptr};
  std::copy(k.mtp.begin(), k.mtp.end(), a.mtp_weights.begin());
  return a;
}

// max |x - y| / max(max |y|, floor).
double rel_error(const std::vector<float>& x, const std::vector<float>& y, double floor = 1e-30) {
  double err = 0, scale = floor;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_TRUE(std::isfinite(x[i])) << "element " << i;
    err = std::max(err, std::abs(double(x[i]) - y[i]));
    scale = std::max(scale, std::abs(double(y[i])));
  }
  return err / scale;
}

const std::vector<LossCase>& cases() {
  static const std::vector<LossCase> c = {
      {.name = "one_target", .T = 9, .C = 8, .V = 13},
      {.name = "mtp3", .T = 17, .C = 12, .V = 37, .mtp = {1.0f, 0.5f, 0.25f}},
      {.name = "mtp8_prefix",
       .T = 12,
       .C = 16,
       .V = 29,
       .mtp = {1.0f, 0.7f, 0.5f, 0.3f, 0.2f, 0.1f, 0.05f, 0.02f},
       .prefix_weight = 0.4f},
      {.name = "prefix_only_weight",
       .T = 10,
       .C = 8,
       .V = 21,
       .mtp = {0.0f, 1.0f},
       .prefix_weight = 1.5f},
      {.name = "bf16_weight_other_cap",
       .T = 11,
       .C = 24,
       .V = 40,
       .mtp = {1.0f, 0.5f},
       .prefix_weight = 0.3f,
       .w_dtype = DType::bf16,
       .a = 15.0f,
       .b = 1.0f,
       .c = 3.0f},
      // 16M / V = 320 rows per chunk on the CPU, 1,280 on CUDA: 1,300 rows cross a chunk on
      // both; CUDA's d(xn) product over V = 50,304 is cut into 12 slices (run_split_gemm).
      {.name = "two_chunks",
       .T = 1300,
       .C = 8,
       .V = 50304,
       .mtp = {1.0f, 0.5f},
       .prefix_weight = 0.25f,
       .w_dtype = DType::bf16},
  };
  return c;
}

class SoftcapCrossEntropy : public ::testing::TestWithParam<LossCase> {};

// The CPU backend against the reference backend's double-precision loop: loss, dxn and dw (both
// added to what was there), rows without targets included.
TEST_P(SoftcapCrossEntropy, CpuMatchesDoubleFormula) {
  const LossCase& k = GetParam();
  LossData cpu = make_data(k, 1), ref = make_data(k, 1);
  cpu_ops().softcap_cross_entropy(args_of(k, cpu, true));
  reference_ops().softcap_cross_entropy(args_of(k, ref, true));
  // f32 logits and soft cap against double (measured: loss <= 2e-7; gradients <= 6e-7, except
  // dxn over V = 50304, a sum of 50304 f32 terms that nearly cancel: 3.1e-5).
  EXPECT_LT(rel_error(cpu.loss, ref.loss), 1e-6) << "loss";
  EXPECT_LT(rel_error(cpu.dxn, ref.dxn), 1e-4) << "dxn";
  EXPECT_LT(rel_error(cpu.dw, ref.dw), 1e-4) << "dw";
  // Without a gradient nothing but the loss is written.
  LossData plain = make_data(k, 1), before = make_data(k, 1);
  cpu_ops().softcap_cross_entropy(args_of(k, plain, false));
  EXPECT_EQ(plain.loss, cpu.loss);
  EXPECT_EQ(plain.dxn, before.dxn);
  EXPECT_EQ(plain.dw, before.dw);
}

// A row's loss does not depend on the other rows: rows [s, T) alone give the same bits (their
// targets t + k are the same either way).
TEST_P(SoftcapCrossEntropy, RowLossIndependentOfOtherRows) {
  const LossCase& k = GetParam();
  LossData all = make_data(k, 2);
  cpu_ops().softcap_cross_entropy(args_of(k, all, false));
  const int64_t s = k.T / 3;
  LossData tail = make_data(k, 2);
  SoftcapCrossEntropyArgs a = args_of(k, tail, false);
  a.xn += s * tail.ldx;
  a.targets += s;
  if (a.prefix) a.prefix += s;
  a.rows = k.T - s;
  cpu_ops().softcap_cross_entropy(a);
  for (int64_t t = s; t < k.T; ++t)
    EXPECT_EQ(tail.loss[size_t(t - s)], all.loss[size_t(t)]) << "row " << t;
}

INSTANTIATE_TEST_SUITE_P(Cases, SoftcapCrossEntropy, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The gradient against central differences of the mean loss on a tiny case, every xn and W
// element.
TEST(SoftcapCrossEntropyGradient, MatchesFiniteDifferences) {
  const LossCase k{.name = "tiny",
                   .T = 5,
                   .C = 4,
                   .V = 7,
                   .mtp = {1.0f, 0.5f, 0.25f},
                   .prefix_weight = 0.6f,
                   .a = 6.0f,
                   .b = 1.0f,
                   .c = 2.0f};
  LossData d = make_data(k, 3);
  std::fill(d.dxn.begin(), d.dxn.end(), 0.0f);
  std::fill(d.dw.begin(), d.dw.end(), 0.0f);
  cpu_ops().softcap_cross_entropy(args_of(k, d, true));
  auto mean_loss = [&](LossData& e) {
    cpu_ops().softcap_cross_entropy(args_of(k, e, false));
    double s = 0;
    for (float l : e.loss) s += l;
    return s / double(k.T);
  };
  const float h = 1e-2f;
  double worst = 0, scale = 0;
  for (int64_t t = 0; t < k.T; ++t)
    for (int64_t c = 0; c < k.C; ++c) {
      LossData e = make_data(k, 3);
      const size_t i = size_t(t * e.ldx + c);
      e.xn[i] += h;
      const double up = mean_loss(e);
      e.xn[i] -= 2 * h;
      const double fd = (up - mean_loss(e)) / (2 * h);
      const double g = d.dxn[size_t(t * d.lddx + c)];
      worst = std::max(worst, std::abs(fd - g));
      scale = std::max(scale, std::abs(g));
    }
  for (int64_t i = 0; i < k.V * k.C; ++i) {
    LossData e = make_data(k, 3);
    std::vector<float> w = e.w.to_f32_vector();
    w[size_t(i)] += h;
    e.w = Tensor::from_vector(w, {k.V, k.C});
    const double up = mean_loss(e);
    w[size_t(i)] -= 2 * h;
    e.w = Tensor::from_vector(w, {k.V, k.C});
    const double fd = (up - mean_loss(e)) / (2 * h);
    worst = std::max(worst, std::abs(fd - double(d.dw[size_t(i)])));
    scale = std::max(scale, std::abs(double(d.dw[size_t(i)])));
  }
  ASSERT_GT(scale, 1e-3);
  // O(h²) truncation and f32 rounding of the loss over 2h (measured: 2.3e-5 of the largest).
  EXPECT_LT(worst / scale, 1e-3);
}

// ---- the CUDA backend against the CPU (instantiated where a GPU is visible) ----

struct DeviceLoss {
  const Ops& ops;
  std::vector<Tensor> held;

  template <class T>
  T* upload(const std::vector<T>& v) {
    held.push_back(ops.alloc({int64_t(std::max<size_t>(v.size(), 1) * sizeof(T))}, DType::u8));
    ops.to_device(held.back().raw_mutable(), v.data(), v.size() * sizeof(T));
    return reinterpret_cast<T*>(held.back().raw_mutable());
  }
  template <class T>
  void download(std::vector<T>& v, const T* p) {
    ops.to_host(v.data(), p, v.size() * sizeof(T));
  }

  // The call of `a` (host pointers into d) on the device; results back into d.
  void run(SoftcapCrossEntropyArgs a, LossData& d, bool grad) {
    const Tensor w = ops.upload(d.w);
    a.w = &w;
    a.xn = upload(d.xn);
    a.targets = upload(d.targets);
    a.prefix = d.prefix.empty() ? nullptr : upload(d.prefix);
    float* loss = upload(d.loss);
    float* dxn = upload(d.dxn);
    float* dw = upload(d.dw);
    a.loss = loss;
    a.dxn = grad ? dxn : nullptr;
    a.dw = grad ? dw : nullptr;
    ops.softcap_cross_entropy(a);
    download(d.loss, loss);
    download(d.dxn, dxn);
    download(d.dw, dw);
  }
};

class SoftcapCrossEntropyDevice : public ::testing::TestWithParam<std::tuple<LossCase, Device>> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SoftcapCrossEntropyDevice);

// f32 products (f32 W, or a bf16 W widened) within f32 rounding of the CPU; bf16 products
// (`bf16`: xn, W — an f32 W rounded too, the bf16 training path — and dz rounded to bf16)
// within bf16 rounding.
TEST_P(SoftcapCrossEntropyDevice, MatchesTheCpu) {
  const auto& [k, device] = GetParam();
  for (bool bf16 : {false, true}) {
    LossData cpu = make_data(k, 4), dev = make_data(k, 4);
    cpu_ops().softcap_cross_entropy(args_of(k, cpu, true));
    SoftcapCrossEntropyArgs a = args_of(k, dev, true);
    a.bf16 = bf16;
    DeviceLoss{ops_for(device)}.run(a, dev, true);
    const double tol = bf16 ? 3e-2 : 2e-5;
    const std::string what = bf16 ? " (bf16 products)" : " (f32)";
    EXPECT_LT(rel_error(dev.loss, cpu.loss), tol) << "loss" << what;
    EXPECT_LT(rel_error(dev.dxn, cpu.dxn), bf16 ? tol : 1e-4) << "dxn" << what;
    EXPECT_LT(rel_error(dev.dw, cpu.dw), bf16 ? tol : 1e-4) << "dw" << what;
  }
}

// On the device too a row's loss is the same bits whatever rows share the call.
TEST_P(SoftcapCrossEntropyDevice, RowLossIndependentOfOtherRows) {
  const auto& [k, device] = GetParam();
  LossData all = make_data(k, 5), tail = make_data(k, 5);
  SoftcapCrossEntropyArgs whole = args_of(k, all, false);
  whole.bf16 = k.w_dtype == DType::bf16;
  DeviceLoss{ops_for(device)}.run(whole, all, false);
  const int64_t s = k.T / 3;
  // The same rows from s on: the inputs shifted so that row t - s of the call is row t.
  tail.xn.erase(tail.xn.begin(), tail.xn.begin() + s * tail.ldx);
  tail.targets.erase(tail.targets.begin(), tail.targets.begin() + s);
  if (!tail.prefix.empty()) tail.prefix.erase(tail.prefix.begin(), tail.prefix.begin() + s);
  tail.T = k.T - s;
  tail.loss.resize(size_t(tail.T));
  SoftcapCrossEntropyArgs part = args_of(k, tail, false);
  part.bf16 = whole.bf16;
  DeviceLoss{ops_for(device)}.run(part, tail, false);
  for (int64_t t = s; t < k.T; ++t)
    EXPECT_EQ(tail.loss[size_t(t - s)], all.loss[size_t(t)]) << "row " << t;
}

INSTANTIATE_TEST_SUITE_P(Cases, SoftcapCrossEntropyDevice,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::ValuesIn(testing::gpu_devices())),
                         [](const auto& info) { return std::get<0>(info.param).name + "_cuda"; });

}  // namespace
}  // namespace deg
