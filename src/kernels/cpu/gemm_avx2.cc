// AVX2 + FMA GEMM tiles (the fallback below AVX-512): f32 FMAs over f32 or exactly widened bf16
// weights. Each output element owns one 8-lane accumulator walking k in steps of 8 with a masked
// tail, then one fixed horizontal sum, so the per-element order is the same for every tile shape.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/gemm_isa.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace deg::gemm_detail {

namespace {

constexpr int kMR = 4;
constexpr int kNR = 2;

inline __m256 load_w8(const void* w, int64_t offset, bool bf16) {
  if (bf16) {
    __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + offset));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(w) + offset);
}

// Lanes [0, n) of a row of 8 (n < 8), zeros elsewhere; scalar loads (AVX2 has no 16-bit masks).
inline __m256 load_tail8(const void* p, int64_t offset, int n, bool bf16) {
  alignas(32) float t[8] = {};
  for (int i = 0; i < n; ++i) {
    if (bf16) {
      uint32_t bits = uint32_t(static_cast<const uint16_t*>(p)[offset + i]) << 16;
      __builtin_memcpy(&t[i], &bits, 4);
    } else {
      t[i] = static_cast<const float*>(p)[offset + i];
    }
  }
  return _mm256_load_ps(t);
}

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);                 // 4 lanes
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));        // 2 lanes
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x1));  // 1 lane
  return _mm_cvtss_f32(s);
}

template <int MR, int NR, bool WBF16>
void kernel_f32(const TileJob& j, int64_t m, int64_t n) {
  __m256 c[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NR; ++q) c[i][q] = _mm256_setzero_ps();
  const int64_t k = j.k;
  const float* x = j.x + m * j.ldx;
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 wv[NR];
    for (int q = 0; q < NR; ++q) wv[q] = load_w8(j.w, (n + q) * j.ldw + kk, WBF16);
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * j.ldx + kk);
      for (int q = 0; q < NR; ++q) c[i][q] = _mm256_fmadd_ps(xv, wv[q], c[i][q]);
    }
  }
  if (kk < k) {
    int rest = int(k - kk);
    __m256 wv[NR];
    for (int q = 0; q < NR; ++q) wv[q] = load_tail8(j.w, (n + q) * j.ldw + kk, rest, WBF16);
    for (int i = 0; i < MR; ++i) {
      __m256 xv = load_tail8(x + i * j.ldx, kk, rest, false);
      for (int q = 0; q < NR; ++q) c[i][q] = _mm256_fmadd_ps(xv, wv[q], c[i][q]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NR; ++q) {
      float s = hsum(c[i][q]);
      float* y = j.y + (m + i) * j.ldy + n + q;
      *y = j.accumulate ? *y + s : s;
    }
}

using Kernel = void (*)(const TileJob&, int64_t, int64_t);

template <bool WBF16>
void run_tiles(const TileJob& j) {
  static constexpr Kernel table[kMR + 1][kNR + 1] = {
      {nullptr, nullptr, nullptr},
      {nullptr, kernel_f32<1, 1, WBF16>, kernel_f32<1, 2, WBF16>},
      {nullptr, kernel_f32<2, 1, WBF16>, kernel_f32<2, 2, WBF16>},
      {nullptr, kernel_f32<3, 1, WBF16>, kernel_f32<3, 2, WBF16>},
      {nullptr, kernel_f32<4, 1, WBF16>, kernel_f32<4, 2, WBF16>},
  };
  for (int64_t n = j.n0; n < j.n1; n += kNR) {
    int nr = int(j.n1 - n < kNR ? j.n1 - n : kNR);
    for (int64_t m = j.m0; m < j.m1; m += kMR) {
      int mr = int(j.m1 - m < kMR ? j.m1 - m : kMR);
      table[mr][nr](j, m, n);
    }
  }
}

// NN tiles: MR rows of A broadcast against NV 8-column vectors of one B row per k step.
template <int MR, int NV>
void nn_tile(const NnJob& j, int64_t m, int64_t n, __m256i last) {
  const __m256i all = _mm256_set1_epi32(-1);
  __m256 c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) c[i][v] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < j.k; ++kk) {
    const float* brow = j.b + kk * j.ldb + n;
    __m256 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_maskload_ps(brow + 8 * v, v == NV - 1 ? last : all);
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_set1_ps(j.a[(m + i) * j.lda + kk]);
      for (int v = 0; v < NV; ++v) c[i][v] = _mm256_fmadd_ps(av, bv[v], c[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      float* y = j.c + (m + i) * j.ldc + n + 8 * v;
      const __m256i mask = v == NV - 1 ? last : all;
      __m256 r = c[i][v];
      if (j.accumulate) r = _mm256_add_ps(_mm256_maskload_ps(y, mask), r);
      _mm256_maskstore_ps(y, mask, r);
    }
}
}  // namespace

void nn_avx2(const NnJob& j) {
  constexpr int kMRn = 4;
  for (int64_t n = 0; n < j.n; n += 16) {
    const int64_t cols = std::min<int64_t>(16, j.n - n);
    const int nv = int((cols + 7) / 8);
    const int rest = int(cols - 8 * (nv - 1));
    alignas(32) int32_t lanes[8];
    for (int l = 0; l < 8; ++l) lanes[l] = l < rest ? -1 : 0;
    const __m256i last = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    for (int64_t m = 0; m < j.m; m += kMRn) {
      const int mr = int(std::min<int64_t>(kMRn, j.m - m));
      using F = void (*)(const NnJob&, int64_t, int64_t, __m256i);
      static constexpr F table[5][3] = {{nullptr, nullptr, nullptr},
                                        {nullptr, nn_tile<1, 1>, nn_tile<1, 2>},
                                        {nullptr, nn_tile<2, 1>, nn_tile<2, 2>},
                                        {nullptr, nn_tile<3, 1>, nn_tile<3, 2>},
                                        {nullptr, nn_tile<4, 1>, nn_tile<4, 2>}};
      table[mr][nv](j, m, n, last);
    }
  }
}

void tile_avx2(const TileJob& job) {
  if (job.w_bf16) {
    run_tiles<true>(job);
  } else {
    run_tiles<false>(job);
  }
}

float peak_loop_f32_avx2(int64_t iters) {
  __m256 c[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i) c[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kPeakAccumulators; ++i) c[i] = _mm256_fmadd_ps(c[i], a, b);
  __m256 s = c[0];
  for (int i = 1; i < kPeakAccumulators; ++i) s = _mm256_add_ps(s, c[i]);
  return hsum(s);
}

}  // namespace deg::gemm_detail

#pragma GCC pop_options
