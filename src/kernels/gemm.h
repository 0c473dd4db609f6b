// Projections: y[M, N] (+)= x[M, K] · W[N, K]ᵀ with fp32 accumulation. x and y are f32; W is f32
// or bf16 in the HF Linear layout (usually a read-only view into mmap'd weights, never copied).
//
// Batch invariance: every y[m, n] is ONE dot product over k whose order of operations depends on
// K, the precision and the ISA only — never on M, on the other rows, or on how threads split the
// work. A row's output is therefore bitwise the same alone or in any batch. Tiling over rows and
// columns changes which registers hold accumulators, not the per-element sequence.
//
// Not here: convolutions, attention (kernels/attention.h), anything with a bias.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace deg {

enum class GemmPrecision : uint8_t {
  exact,     // x stays f32; bf16 weights are widened exactly (shift) and multiplied in f32
  bf16,      // with bf16 weights: x rounded to bf16 once, then bf16 dot products with f32
             // accumulation (AVX512_BF16 vdpbf16ps where the CPU has it, f32 FMAs over the rounded
             // values elsewhere). f32 weights ignore this and run exact.
  bf16_all,  // x and every weight rounded to bf16 (f32 weights too), then as bf16: the bf16
             // training path (GptStepOptions::precision), whose master weights stay f32.
};

// The products round their operands to bf16: bf16 over bf16 weights, or bf16_all.
inline bool rounds_to_bf16(GemmPrecision p, DType weight) {
  return p == GemmPrecision::bf16_all || (p == GemmPrecision::bf16 && weight == DType::bf16);
}

enum class GemmIsa : uint8_t { scalar, avx2, avx512, avx512bf16 };

// One weight applied to the shared input; several outputs make one parallel job (the union of
// their columns is split over threads), which keeps narrow projections (N = 16) cheap.
struct GemmOutput {
  const Tensor* w = nullptr;  // [N, K] f32 or bf16, contiguous
  float* y = nullptr;         // [M, N] at row stride ldy
  int64_t ldy = 0;
  bool accumulate = false;  // y += x·Wᵀ (residual adds) instead of y = x·Wᵀ
};

struct GemmArgs {
  const float* x = nullptr;  // [M, K] at row stride ldx
  // Instead of x: the rows already rounded to bf16 by the op that wrote them (NormArgs::yb,
  // GluArgs::outb), at row stride ldx. Only for bf16 dot products (precision bf16, bf16
  // weights), whose results it leaves bitwise as they are from x; it saves their rounding pass.
  const bf16* xb = nullptr;
  int64_t m = 0;
  int64_t k = 0;
  int64_t ldx = 0;
  std::span<const GemmOutput> outputs;
  GemmPrecision precision = GemmPrecision::exact;
  // bf16_all (the bf16 training path): a backend that rounds x into device memory writes that
  // rounding here, [m, k] packed, for the backward's products of the same x to take back
  // (MatmulOpArgs::bb) instead of rounding x again; one that rounds as it goes (the CPU's) leaves
  // it alone.
  bf16* xb_out = nullptr;
};

// The optimized kernel for the best ISA of this CPU (or the one forced below), threaded over
// output columns and row blocks with deg::parallel_for.
void gemm(const GemmArgs& args);
// Single-threaded scalar reference: the oracle for tests and the fallback without AVX2. It has
// its own fixed order (sequential over k), so it matches gemm() to rounding, not bitwise.
void gemm_reference(const GemmArgs& args);

// The ISA gemm() uses: the best this CPU supports, unless forced (tests, benchmarks).
GemmIsa gemm_isa();
GemmIsa gemm_best_isa();
void gemm_force_isa(GemmIsa isa);  // must be <= gemm_best_isa()
const char* gemm_isa_name(GemmIsa isa);

// Convenience for one output.
inline void linear(const float* x, int64_t m, int64_t k, const Tensor& w, float* y,
                   bool accumulate = false, GemmPrecision precision = GemmPrecision::exact) {
  GemmOutput out{.w = &w, .y = y, .ldy = w.dim(0), .accumulate = accumulate};
  gemm({.x = x, .m = m, .k = k, .ldx = k, .outputs = {&out, 1}, .precision = precision});
}

// Small single-threaded f32 products for kernels that already run one task per thread (the
// delta rule, attention), on raw row-major matrices with leading dimensions:
//   matmul_nt: C[m, n] (+)= A[m, k] · B[n, k]ᵀ   (each element one dot product, as gemm())
//   matmul_nn: C[m, n] (+)= A[m, k] · B[k, n]    (each element sequential in k)
// Every element's order depends on k only, never on m, n or the tiling. Accumulating adds the
// finished sum to C.
struct MatmulArgs {
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  int64_t m = 0, n = 0, k = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
};
void matmul_nt(const MatmulArgs& a);
void matmul_nn(const MatmulArgs& a);
void matmul_nt_reference(const MatmulArgs& a);
void matmul_nn_reference(const MatmulArgs& a);

// Peak of this CPU's dot-product units, measured now with a tight in-register loop on every pool
// thread for about `seconds`: FLOP/s of bf16 dot products (vdpbf16ps) when available, and of f32
// FMAs. The yardstick `deg bench` divides its GEMM rates by.
struct PeakFlops {
  double bf16 = 0;  // 0 when the CPU has no bf16 dot product
  double f32 = 0;
};
PeakFlops measure_peak_flops(double seconds);

}  // namespace deg
