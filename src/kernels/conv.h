// Depthwise causal convolution, one row at a time, carrying the row's conv tail (its last K-1
// inputs) across calls: ext = tail ++ x, y[t] = Σ_k ext[t+k] w[k], then SiLU for Gated DeltaNet
// (causal_conv_silu) or nothing for LFM2's short conv (causal_conv). A row reads only its own n
// real positions, so padding never reaches the tail.
#pragma once

#include <cstdint>

namespace deg {

struct CausalConvArgs {
  int64_t n = 0;             // real positions of this row
  int64_t channels = 0;      // C
  int64_t kernel = 0;        // K
  const float* x = nullptr;  // [n, C] at row stride ldx
  int64_t ldx = 0;
  const float* tail_in = nullptr;  // [K-1, C] at row stride ldt: the inputs before x[0]
  int64_t ldt = 0;                 // 0: C
  const float* w = nullptr;        // [C, K]
  float* y = nullptr;              // [n, C] at row stride ldy (must not alias x)
  int64_t ldy = 0;
  float* tail_out = nullptr;  // [K-1, C] at stride ldt: the last K-1 rows of ext, or null; may
                              // alias tail_in
};

void causal_conv_silu(const CausalConvArgs& a);
void causal_conv(const CausalConvArgs& a);

}  // namespace deg
