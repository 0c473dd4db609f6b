// Helpers the backbone family tests share (golden and property tests of each family): fixture
// ids, error metrics, the golden checks against HF fixtures, bitwise comparison, slices of
// [B, L, C] hidden tensors, random ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/npy.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"
#include "model/backbone.h"
#include "model/load.h"

namespace deg::testing {

// ids.npy (int64 [T]) of a fixture directory.
inline std::vector<int32_t> npy_ids(const std::filesystem::path& file) {
  Tensor t = npy_read(file).to(DType::i64);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < t.numel(); ++i) ids.push_back(int32_t(t.data<int64_t>()[i]));
  return ids;
}

// max |a - b| / max |b|
inline double rel_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return INFINITY;
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return err / scale;
}

inline double rel_max_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  return rel_max_error(a.to_f32_vector(), b.to_f32_vector());
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Where two [n, width] float arrays first differ bitwise, for a failure message: "vector i,
// element j: a vs b (largest difference d)", or "equal".
inline std::string first_difference(const std::vector<float>& a, const std::vector<float>& b,
                                    int64_t width) {
  if (a.size() != b.size()) return "sizes differ";
  size_t first = a.size();
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    first = std::min(first, i);
    most = std::max(most, std::fabs(double(a[i]) - double(b[i])));
  }
  if (first == a.size()) return "equal";
  return "vector " + std::to_string(int64_t(first) / width) + ", element " +
         std::to_string(int64_t(first) % width) + ": " + std::to_string(a[first]) + " vs " +
         std::to_string(b[first]) + " (largest difference " + std::to_string(most) + ")";
}

// Row b, positions [0, n) of a [B, L, C] hidden tensor.
inline std::vector<float> row_of(const Tensor& h, int64_t b, int64_t n) {
  const int64_t L = h.dim(1), C = h.dim(2);
  const float* p = h.data<float>() + b * L * C;
  return std::vector<float>(p, p + n * C);
}

// Positions [from, from + n) of a [1, T, C] (or [T, C]) hidden tensor.
inline std::vector<float> span_of(const Tensor& h, int64_t from, int64_t n) {
  const int64_t C = h.dim(-1);
  const float* p = h.data<float>() + from * C;
  return std::vector<float>(p, p + n * C);
}

// The first `count` floats (all when larger) of row `row` of a [B, ...] f32 tensor.
inline std::vector<float> row_slice(const Tensor& device_tensor, int64_t row, int64_t count) {
  const Tensor t = host_copy(device_tensor);  // state may live on a GPU
  const int64_t per = t.numel() / t.dim(0);
  const float* p = t.data<float>() + row * per;
  return std::vector<float>(p, p + std::min(per, count));
}

// What fork row `row` keeps of recurrent layer `layer`'s state: its own rec, or where it carries
// the state as history (ForkState::hist_cap), the kept history entries (k, d, g of its own_len
// tokens, head by head).
inline std::vector<float> kept_rec(const ForkState& fs, size_t layer, int64_t row) {
  const LayerState& l = fs.own[layer];
  if (!l.hist_k.defined() || fs.owns_rec(row)) return row_slice(l.rec, row, INT64_MAX);
  std::vector<float> out;
  const int64_t len = fs.own_len[size_t(row)], cap = fs.hist_cap;
  for (const Tensor* t : {&l.hist_k, &l.hist_d, &l.hist_g}) {
    const std::vector<float> all = row_slice(*t, row, INT64_MAX);
    const int64_t heads = t->dim(1), width = t->rank() == 4 ? t->dim(3) : 1;
    for (int64_t h = 0; h < heads; ++h)
      out.insert(out.end(), all.begin() + h * cap * width, all.begin() + (h * cap + len) * width);
  }
  return out;
}

inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(vocab));
  return ids;
}

// The golden checks every family's HF fixture gets (`dir` holds ids.npy, logits.npy and
// hidden.npy): logits and final-norm hidden states within 1e-4 of HF's when the input is read in
// 64-token pieces; one read of the whole input gives the same logits bitwise; a fork at each of
// `forks` (trunk = the first K ids, the rest one fork row) stays within 1e-4. Returns the logits'
// error.
// The devices the family tests run on: the CPU, and CUDA where a GPU is visible (the
// scripts/device-test run).
inline std::vector<Device> test_devices() {
  std::vector<Device> d = {Device::cpu};
  if (cuda_available()) d.push_back(Device::cuda);
  return d;
}

// A device backend against the CPU's on an HF fixture (`dir` with ids.npy), both GEMM
// precisions: as close as each is to HF (1e-4 with f32 activations; bf16 dot products round
// differently on each backend, 2e-2; `bf16` false: exact only).
inline void expect_backend_agrees_with_cpu(const std::filesystem::path& dir, Device device,
                                           bool bf16 = true) {
  const std::vector<int32_t> ids = npy_ids(dir / "ids.npy");
  for (GemmPrecision p : {GemmPrecision::exact, GemmPrecision::bf16}) {
    if (p == GemmPrecision::bf16 && !bf16) continue;
    auto cpu = backbone_open(dir, {.precision = p});
    auto other = backbone_open(dir, {.precision = p, .device = device});
    const double err =
        rel_max_error(backbone_forward(*other, ids, true), backbone_forward(*cpu, ids, true));
    EXPECT_LT(err, p == GemmPrecision::exact ? 1e-4 : 2e-2)
        << dir.filename().string() << (p == GemmPrecision::exact ? " exact" : " bf16");
  }
}

// Test names of the family suites' parameters: a fixture or a GEMM precision, then "_cuda" on
// CUDA (gtest's name generator for Combine(fixtures or precisions, test_devices())).
struct FixtureOnDevice {
  template <class Info>
  std::string operator()(const Info& info) const {
    return std::string(std::get<0>(info.param)) +
           (std::get<1>(info.param) == Device::cuda ? "_cuda" : "");
  }
};
struct PrecisionOnDevice {
  template <class Info>
  std::string operator()(const Info& info) const {
    return std::string(std::get<0>(info.param) == GemmPrecision::exact ? "exact" : "bf16") +
           (std::get<1>(info.param) == Device::cuda ? "_cuda" : "");
  }
};

// test_devices() less the CPU: the backends checked against the CPU's.
inline std::vector<Device> gpu_devices() {
  std::vector<Device> d = test_devices();
  d.erase(d.begin());
  return d;
}

inline double expect_matches_hf(const std::filesystem::path& dir, const std::vector<int64_t>& forks,
                                Device device = Device::cpu) {
  const std::string name = dir.filename().string();
  auto backbone = backbone_open(dir, {.device = device, .read_chunk = 64});
  const std::vector<int32_t> ids = npy_ids(dir / "ids.npy");
  const Tensor expected = npy_read(dir / "logits.npy");
  const Tensor logits = backbone_forward(*backbone, ids, /*logits=*/true);
  const double err = rel_max_error(logits, expected);
  EXPECT_LT(err, 1e-4) << name << " logits";
  const Tensor hidden = backbone_forward(*backbone, ids, /*logits=*/false);
  EXPECT_LT(rel_max_error(hidden, npy_read(dir / "hidden.npy")), 1e-4) << name << " hidden";
  for (int64_t k : forks) {
    EXPECT_LT(rel_max_error(backbone_forward(*backbone, ids, true, k), expected), 1e-4)
        << name << " fork at " << k;
  }
  backbone->set_options({.read_chunk = 4096});  // the device stays
  EXPECT_EQ(rel_max_error(backbone_forward(*backbone, ids, true), logits), 0.0)
      << name << ": one read differs from 64-token reads";
  return err;
}

// A bf16 fixture read with bf16 dot products: {deg's distance to HF fp32 (on the same
// bf16-rounded weights), HF's own bf16 run's distance to it (logits_native_bf16.npy)}.
inline std::pair<double, double> bf16_distances(const std::filesystem::path& dir,
                                                Device device = Device::cpu) {
  auto backbone = backbone_open(dir, {.precision = GemmPrecision::bf16, .device = device});
  const Tensor fp32 = npy_read(dir / "logits.npy");
  const Tensor logits = backbone_forward(*backbone, npy_ids(dir / "ids.npy"), true);
  return {rel_max_error(logits, fp32),
          rel_max_error(npy_read(dir / "logits_native_bf16.npy"), fp32)};
}

// A document's hidden states read in one prefill from an empty state: what forks and chunks
// must reproduce.
inline Tensor full_hidden(const Backbone& bb, const std::vector<int32_t>& ids) {
  State s = bb.empty_state(1);
  return bb.prefill(TokenBatch::single(ids), s);
}

// A document the property tests prefill once and fork from: its ids and the state they left.
struct Doc {
  std::vector<int32_t> prefix;
  State state;
};

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace deg::testing
