// AVX-512 GEMM tiles: f32 FMAs over f32 or exactly widened bf16 weights, and AVX512_BF16 dot
// products (vdpbf16ps) over bf16 activations and weights. Compiled for those ISAs only; called
// after runtime detection (kernels/cpu/gemm.cc). Each output element owns one 16-lane
// accumulator that walks k in steps of 16 (32 for bf16 dots) with a masked tail, then one fixed
// horizontal sum: the per-element order is the same for every tile shape.
// GCC 12's AVX-512 headers self-initialise `undefined` vectors, which -Wuninitialized flags
// inside every intrinsic that uses one: a known false positive, silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/gemm_isa.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

namespace deg::gemm_detail {

namespace {

constexpr int kMR = 4;  // rows per register tile
constexpr int kNR = 4;  // columns per register tile

inline __m512 load_w16(const void* w, int64_t offset, bool bf16) {
  if (bf16) {
    __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + offset));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(static_cast<const float*>(w) + offset);
}

inline __m512 load_w16_tail(const void* w, int64_t offset, bool bf16, __mmask16 mask) {
  if (bf16) {
    __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + offset);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + offset);
}

inline void store(float* y, float s, bool accumulate) {
  *y = accumulate ? *y + s : s;
}

template <int MR, int NR, bool WBF16>
void kernel_f32(const TileJob& j, int64_t m, int64_t n) {
  __m512 c[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NR; ++q) c[i][q] = _mm512_setzero_ps();
  const int64_t k = j.k;
  const float* x = j.x + m * j.ldx;
  int64_t kk = 0;
  for (; kk + 16 <= k; kk += 16) {
    __m512 wv[NR];
    for (int q = 0; q < NR; ++q) wv[q] = load_w16(j.w, (n + q) * j.ldw + kk, WBF16);
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_loadu_ps(x + i * j.ldx + kk);
      for (int q = 0; q < NR; ++q) c[i][q] = _mm512_fmadd_ps(xv, wv[q], c[i][q]);
    }
  }
  if (kk < k) {
    __mmask16 mask = __mmask16((1u << (k - kk)) - 1);
    __m512 wv[NR];
    for (int q = 0; q < NR; ++q) wv[q] = load_w16_tail(j.w, (n + q) * j.ldw + kk, WBF16, mask);
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * j.ldx + kk);
      for (int q = 0; q < NR; ++q) c[i][q] = _mm512_fmadd_ps(xv, wv[q], c[i][q]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NR; ++q)
      store(j.y + (m + i) * j.ldy + n + q, _mm512_reduce_add_ps(c[i][q]), j.accumulate);
}

template <int MR, int NR>
void kernel_bf16dot(const TileJob& j, int64_t m, int64_t n) {
  __m512 c[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NR; ++q) c[i][q] = _mm512_setzero_ps();
  const int64_t k = j.k;
  const uint16_t* w = static_cast<const uint16_t*>(j.w);
  const uint16_t* x = j.xb + m * j.ldxb;
  int64_t kk = 0;
  for (; kk + 32 <= k; kk += 32) {
    __m512bh wv[NR];
    for (int q = 0; q < NR; ++q) wv[q] = (__m512bh)_mm512_loadu_si512(w + (n + q) * j.ldw + kk);
    for (int i = 0; i < MR; ++i) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * j.ldxb + kk);
      for (int q = 0; q < NR; ++q) c[i][q] = _mm512_dpbf16_ps(c[i][q], xv, wv[q]);
    }
  }
  if (kk < k) {  // x is zero-padded to ldxb; the weight row is not: mask it
    __mmask32 mask = __mmask32((uint64_t(1) << (k - kk)) - 1);
    __m512bh wv[NR];
    for (int q = 0; q < NR; ++q)
      wv[q] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (n + q) * j.ldw + kk);
    for (int i = 0; i < MR; ++i) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * j.ldxb + kk);
      for (int q = 0; q < NR; ++q) c[i][q] = _mm512_dpbf16_ps(c[i][q], xv, wv[q]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NR; ++q)
      store(j.y + (m + i) * j.ldy + n + q, _mm512_reduce_add_ps(c[i][q]), j.accumulate);
}

using Kernel = void (*)(const TileJob&, int64_t, int64_t);

template <template <int, int> class K>
struct Table {
  Kernel at[kMR + 1][kNR + 1];
};

template <int MR, int NR>
struct F32W {
  static void run(const TileJob& j, int64_t m, int64_t n) { kernel_f32<MR, NR, false>(j, m, n); }
};
template <int MR, int NR>
struct Bf16W {
  static void run(const TileJob& j, int64_t m, int64_t n) { kernel_f32<MR, NR, true>(j, m, n); }
};
template <int MR, int NR>
struct Bf16Dot {
  static void run(const TileJob& j, int64_t m, int64_t n) { kernel_bf16dot<MR, NR>(j, m, n); }
};

template <template <int, int> class K>
constexpr Table<K> make_table() {
  Table<K> t{};
  t.at[1][1] = K<1, 1>::run, t.at[1][2] = K<1, 2>::run, t.at[1][3] = K<1, 3>::run;
  t.at[1][4] = K<1, 4>::run, t.at[2][1] = K<2, 1>::run, t.at[2][2] = K<2, 2>::run;
  t.at[2][3] = K<2, 3>::run, t.at[2][4] = K<2, 4>::run, t.at[3][1] = K<3, 1>::run;
  t.at[3][2] = K<3, 2>::run, t.at[3][3] = K<3, 3>::run, t.at[3][4] = K<3, 4>::run;
  t.at[4][1] = K<4, 1>::run, t.at[4][2] = K<4, 2>::run, t.at[4][3] = K<4, 3>::run;
  t.at[4][4] = K<4, 4>::run;
  return t;
}

template <template <int, int> class K>
void run_tiles(const TileJob& j) {
  static constexpr Table<K> table = make_table<K>();
  for (int64_t n = j.n0; n < j.n1; n += kNR) {
    int nr = int(j.n1 - n < kNR ? j.n1 - n : kNR);
    for (int64_t m = j.m0; m < j.m1; m += kMR) {
      int mr = int(j.m1 - m < kMR ? j.m1 - m : kMR);
      table.at[mr][nr](j, m, n);
    }
  }
}

// NN tiles: MR rows of A broadcast against NV 16-column vectors of one B row per k step.
template <int MR, int NV>
void nn_tile(const NnJob& j, int64_t m, int64_t n, __mmask16 last) {
  __m512 c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) c[i][v] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < j.k; ++kk) {
    const float* brow = j.b + kk * j.ldb + n;
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v)
      bv[v] =
          v == NV - 1 ? _mm512_maskz_loadu_ps(last, brow + 16 * v) : _mm512_loadu_ps(brow + 16 * v);
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(j.a[(m + i) * j.lda + kk]);
      for (int v = 0; v < NV; ++v) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      float* y = j.c + (m + i) * j.ldc + n + 16 * v;
      const __mmask16 mask = v == NV - 1 ? last : __mmask16(0xffff);
      __m512 r = c[i][v];
      if (j.accumulate) r = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), r);
      _mm512_mask_storeu_ps(y, mask, r);
    }
}

using NnKernel = void (*)(const NnJob&, int64_t, int64_t, __mmask16);

template <int MR>
constexpr NnKernel nn_pick(int nv) {
  return nv == 1   ? nn_tile<MR, 1>
         : nv == 2 ? nn_tile<MR, 2>
         : nv == 3 ? nn_tile<MR, 3>
                   : nn_tile<MR, 4>;
}
}  // namespace

void nn_avx512(const NnJob& j) {
  constexpr int kMRn = 4;
  for (int64_t n = 0; n < j.n; n += 64) {
    const int64_t cols = std::min<int64_t>(64, j.n - n);
    const int nv = int((cols + 15) / 16);
    const int rest = int(cols - 16 * (nv - 1));
    const __mmask16 last = __mmask16((1u << rest) - 1);
    for (int64_t m = 0; m < j.m; m += kMRn) {
      const int mr = int(std::min<int64_t>(kMRn, j.m - m));
      NnKernel f = mr == 1   ? nn_pick<1>(nv)
                   : mr == 2 ? nn_pick<2>(nv)
                   : mr == 3 ? nn_pick<3>(nv)
                             : nn_pick<4>(nv);
      f(j, m, n, last);
    }
  }
}

void tile_avx512(const TileJob& job) {
  if (job.w_bf16) {
    run_tiles<Bf16W>(job);
  } else {
    run_tiles<F32W>(job);
  }
}

void tile_avx512_bf16dot(const TileJob& job) {
  run_tiles<Bf16Dot>(job);
}

float peak_loop_f32_avx512(int64_t iters) {
  __m512 c[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i) c[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kPeakAccumulators; ++i) c[i] = _mm512_fmadd_ps(c[i], a, b);
  __m512 s = c[0];
  for (int i = 1; i < kPeakAccumulators; ++i) s = _mm512_add_ps(s, c[i]);
  return _mm512_reduce_add_ps(s);
}

float peak_loop_bf16_avx512(int64_t iters) {
  __m512 c[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i) c[i] = _mm512_set1_ps(float(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x2f80);  // 2^-32
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kPeakAccumulators; ++i) c[i] = _mm512_dpbf16_ps(c[i], a, b);
  __m512 s = c[0];
  for (int i = 1; i < kPeakAccumulators; ++i) s = _mm512_add_ps(s, c[i]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace deg::gemm_detail

#pragma GCC pop_options
