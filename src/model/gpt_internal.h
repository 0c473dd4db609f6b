// Pieces of the gpt family (src/model/gpt.cc) shared with its attention sublayer
// (src/model/gpt_attention.cc): the attention sublayer's weights, inputs and entry point.
// Internal to the family; not part of the Family contract.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/backbone.h"

namespace deg::gpt_detail {

// One attention layer's weights and settings.
struct AttnWeights {
  Tensor qk, v, o;  // [2 H Dq, C], [H Dv, C], [C, H Dv]
  int64_t dq = 0, dv = 0, d = 0;
  bool paired = false, key_offset = false;
  int64_t window = 0;           // in attention positions (2 per token when paired)
  const float* freq = nullptr;  // [Dq] rotary frequencies
  float scale = 1.0f;           // softmax scale
};

// What the attention sublayer reads besides its weights. Lanes are offsets into a token's
// residual stream row (-1: none).
struct AttnInputs {
  const LayerCall* call = nullptr;  // the layer call (stream, rows, lengths, positions, K/V views)
  const float* xn = nullptr;        // [N, C] normed input
  const float* aux = nullptr;    // [N, C] added to V (head h reads its leading Dv of C/H), or null
  const float* ones = nullptr;   // [>= Dq] unit RMS-norm weights
  const float* zeros = nullptr;  // [>= Dv] added to V without aux (as the trainer adds 0)
  float sa0 = 1.0f;              // scales q, k, v
  float eps = 0.0f;              // q/k RMS norm
  int64_t model_dim = 0, heads = 0, rotary_dim = 0;
  int64_t stream = 0;  // S
  int64_t xsa = -1;    // lane of head 0's raw XSA strength
  int64_t gate = -1;   // lane of head 0's output gate
};

// q, k = rotary(norm(sa0 xn W_qk^T)), v = sa0 xn W_v^T + aux; the call's real K/V into the rows'
// own buffers; causal sliding-window attention over the rows' prefix and own keys (paired heads,
// key offset); XSA and output gates -> y W_o^T [N, C] from the call's arena. The output scale is
// the caller's.
float* attention(const Exec& x, const AttnWeights& a, const AttnInputs& in);

}  // namespace deg::gpt_detail
