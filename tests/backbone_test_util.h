// Helpers the backbone family tests share (golden and property tests of each family): fixture
// ids, error metrics, bitwise comparison, slices of [B, L, C] hidden tensors, random ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "io/npy.h"

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
inline std::vector<float> row_slice(const Tensor& t, int64_t row, int64_t count) {
  const int64_t per = t.numel() / t.dim(0);
  const float* p = t.data<float>() + row * per;
  return std::vector<float>(p, p + std::min(per, count));
}

inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(vocab));
  return ids;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace deg::testing
