// Per-ISA GEMM tile loops behind kernels/gemm.h (internal to kernels/cpu). Each computes
// y[m0:m1, n0:n1] of one output over the full K; every element's sequence of operations is the
// same whatever the tile shape, so row blocking never changes results.
#pragma once

#include <cstdint>

namespace deg::gemm_detail {

struct TileJob {
  const float* x = nullptr;  // [M, K] f32, row stride ldx
  int64_t ldx = 0;
  const uint16_t* xb = nullptr;  // [M, ldxb] x rounded to bf16, zero-padded to ldxb (bf16 dots)
  int64_t ldxb = 0;
  const void* w = nullptr;  // [N, K] at row stride ldw
  int64_t ldw = 0;
  bool w_bf16 = false;
  int64_t k = 0;
  int64_t m0 = 0, m1 = 0, n0 = 0, n1 = 0;
  float* y = nullptr;  // [M, N] at row stride ldy
  int64_t ldy = 0;
  bool accumulate = false;
};

// C[m, n] (+)= A[m, k] · B[k, n], f32, B row-major: each C element accumulates sequentially over
// k from zero (one FMA per k), then is added to C when accumulating.
struct NnJob {
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  int64_t m = 0, n = 0, k = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
};
void nn_avx2(const NnJob& job);
void nn_avx512(const NnJob& job);

void tile_avx2(const TileJob& job);
void tile_avx512(const TileJob& job);
void tile_avx512_bf16dot(const TileJob& job);  // needs xb and bf16 w

// Tight in-register loops for the peak measurement; return a value so nothing is optimized away.
float peak_loop_f32_avx2(int64_t iters);
float peak_loop_f32_avx512(int64_t iters);
float peak_loop_bf16_avx512(int64_t iters);
inline constexpr int kPeakAccumulators = 12;

}  // namespace deg::gemm_detail
