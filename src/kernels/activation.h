// Elementwise activations of the MLP and the attention output gate. Elementwise means batch
// invariant by construction: each output depends on its own inputs only.
#pragma once

#include <cstdint>

namespace deg {

// SwiGLU: out[i] = silu(gate[i]) * up[i] for n elements (out may alias gate or up).
void swiglu(const float* gate, const float* up, float* out, int64_t n);

// x[r, i] *= sigmoid(gate[r, i]) over rows of n at strides ldx / ldg (gated attention output).
void sigmoid_gate(float* x, int64_t ldx, const float* gate, int64_t ldg, int64_t rows, int64_t n);

}  // namespace deg
