// The gpt family's attention sublayer for training, forward and explicit backward (seed 003
// CausalSelfAttention, track_1_short/model/attention.py): q/k/v projection scaled by the SA
// lambda, per-head QK RMS norm, rotary on the leading rotary_dim dims (fixed dims after them),
// the partial key offset, value embeddings added to V, paired heads (head h of token t sits at
// position 2t + h / (H/2), slot h % (H/2), rotary position 2t + h % 2), causal sliding-window
// attention inside segments, gated XSA, per-head output gates, and the scaled output projection.
//
// Letters: T tokens, C model dim, H heads, N attention positions (T, or 2T when paired),
// S head slots (H, or H/2 when paired), Dq q/k head width, Dv v head width.
#pragma once

#include <cstdint>

#include "train/ops.h"

namespace deg::train {

// Causal sliding-window attention over N positions: key j is visible to query i when
// seg_start[i] <= j <= i or ctx_lo[i] <= j < ctx_hi[i], and apos[i] - apos[j] <= window. apos
// (the position a window measures) runs contiguously inside a segment; null means apos[i] = i,
// null ctx ranges mean none. A fork query of `deg train` sees its document's keys that way.
struct AttnCore {
  int64_t N = 0, S = 0, dq = 0, dv = 0;
  const int32_t* seg_start = nullptr;  // [N]
  int64_t window = 0;
  float scale = 1.0f;
  const int32_t* apos = nullptr;                       // [N] or null
  const int32_t *ctx_lo = nullptr, *ctx_hi = nullptr;  // [N] or null
};
// The softmax of a forward kept for its backward, which then recomputes no exponential: query
// i's probabilities head by head over its visible keys ([i][h][key]), from offsets[i].
struct AttnProbs {
  Buf p;
  std::vector<int64_t> offsets;  // [N + 1]
};
// q, k [N, S, Dq], v [N, S, Dv] -> out [N, S, Dv], lse [N, S]; fills `probs` when given.
void attention_core_forward(const AttnCore& a, const float* q, const float* k, const float* v,
                            float* out, float* lse, AttnProbs* probs = nullptr);
// Writes dq, dk, dv (overwritten, same shapes as q, k, v); reads the forward's probabilities
// when given, else recomputes them from lse.
void attention_core_backward(const AttnCore& a, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, const float* dout, float* dq,
                             float* dk, float* dv, const AttnProbs* probs = nullptr);

struct AttnLayerShape {
  int64_t T = 0, C = 0, H = 0;
  int64_t dq = 0, dv = 0;  // this layer's q/k and v head widths
  int64_t aux_width = 0;   // head width of aux_v rows (a narrower v reads its leading dv)
  int64_t rotary_dim = 0;
  bool paired = false;
  bool key_offset = false;
  int64_t window = 0;
  float attn_scale = 1.0f;
  float eps = 1.1920928955078125e-7f;
  const float* freq = nullptr;         // [Dq] angular frequency per dim (0 past rotary_dim)
  const int32_t* seg_start = nullptr;  // [T]
  // The fork layout (GptBatch): previous token (key offset), position (rotary, window) and the
  // extra visible key range of each token; null: t - 1, t and none.
  const int32_t* prev = nullptr;
  const int32_t* pos = nullptr;
  const int32_t *ctx_lo = nullptr, *ctx_hi = nullptr;
};

// Per-token, per-head lanes inside a wider row ([T, stride], head h at offset + h).
struct Lanes {
  const float* data = nullptr;
  int64_t stride = 0;
  float at(int64_t t, int64_t h) const { return data[t * stride + h]; }
};
struct LanesGrad {
  float* data = nullptr;
  int64_t stride = 0;
};

struct AttnLayerInputs {
  const float* xn = nullptr;     // [T, C] normed input
  const float* w_qk = nullptr;   // [2 H Dq, C] (q heads then k heads)
  const float* w_v = nullptr;    // [H Dv, C]
  const float* w_o = nullptr;    // [C, H Dv]
  float sa0 = 1.0f;              // scales q, k, v
  float o_scale = 1.0f;          // scales the output projection (sa1 x post lambda)
  const float* aux_v = nullptr;  // [T, H aux_width] added to V, or null
  Lanes xsa;                     // raw XSA strengths (tanh applied here), or data null
  Lanes gate;                    // output gates, or data null
};

struct AttnLayerGrads {
  float* dxn = nullptr;  // [T, C] accumulated
  float* dw_qk = nullptr;
  float* dw_v = nullptr;
  float* dw_o = nullptr;
  float dsa0 = 0.0f;
  float do_scale = 0.0f;
  float* daux_v = nullptr;  // accumulated where aux_v was given
  LanesGrad dxsa;           // accumulated
  LanesGrad dgate;          // accumulated
};

// What the backward reads.
struct AttnSaved {
  Buf p_qk, p_v;  // [T, 2H Dq], [T, H Dv]: projections before sa0
  Buf normed;     // [T, 2H, Dq]
  Buf rstd;       // [T, 2H]
  Buf q, k, v;    // [N, S, Dq] x2, [N, S, Dv]
  Buf core, lse;  // [N, S, Dv], [N, S]
  AttnProbs probs;
  Buf y2, y3;                                 // [T, H, Dv]: after XSA, after the gate
  Buf out_lin;                                // [T, C]: y3 W_o^T
  std::vector<int32_t> seg_start;             // [N]
  std::vector<int32_t> apos, ctx_lo, ctx_hi;  // [N] (empty in the plain layout)
};

// out [T, C] = the sublayer's output (o_scale included).
void attention_layer_forward(const AttnLayerShape& s, const AttnLayerInputs& in, AttnSaved& saved,
                             float* out);
void attention_layer_backward(const AttnLayerShape& s, const AttnLayerInputs& in,
                              const AttnSaved& saved, const float* dout, AttnLayerGrads& g);

}  // namespace deg::train
