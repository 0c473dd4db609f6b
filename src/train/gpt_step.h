// One training step of the gpt family on the CPU without an autograd framework: the forward
// keeps what the backward needs (GptActs), the backward walks the layers in reverse and adds
// every parameter's gradient. The whole-model loss and gradients are checked against PyTorch
// autograd of tools/reference/gpt_reference.py (tests/train_gpt_reference_test.cc), every block
// by finite differences (tests/train_gradcheck_test.cc).
//
// A batch is one packed token stream (the seed's B = 1 varlen layout): attention runs inside
// segments (seg_start), while smear, n-gram hashes and multi-token targets read the stream as
// is, as the seed's do. `deg train` packs documents with their fork queries: a query's tokens
// follow its document's last token (prev), continue its positions (pos) and see its keys
// (ctx_lo, ctx_hi) besides their own, exactly as the inference fork reads the trunk state.
//
// Letters: T tokens, C model dim, H heads, F MLP hidden, V vocab, Dn n-gram dim.
#pragma once

#include <cstdint>
#include <vector>

#include "train/attention.h"
#include "train/gpt_params.h"
#include "train/loss.h"
#include "train/ops.h"

namespace deg::train {

struct GptBatch {
  std::vector<int32_t> inputs;     // [T]
  std::vector<int32_t> targets;    // [T] (-1: none)
  std::vector<int32_t> prefix;     // [T] prefix-token targets, or empty
  std::vector<int32_t> seg_start;  // [T] first position of each token's attention segment
  // The fork layout, all [T] or all empty (the stream as is: t - 1, t, no context range).
  std::vector<int32_t> prev;            // stream index of the token before this one, -1: none
  std::vector<int32_t> pos;             // position in its sequence
  std::vector<int32_t> ctx_lo, ctx_hi;  // keys [ctx_lo, ctx_hi) are visible too
  int64_t size() const { return int64_t(inputs.size()); }
  int64_t prev_of(int64_t t) const { return prev.empty() ? t - 1 : prev[size_t(t)]; }
  int64_t pos_of(int64_t t) const { return pos.empty() ? t : pos[size_t(t)]; }
};

struct GptStepOptions {
  std::vector<float> mtp_weights{1.0f};
  float prefix_weight = 0.0f;
  int64_t window_short = 0;  // attention windows (tokens)
  int64_t window_long = 0;
};

// Row ids [2T] (bigram rows then trigram rows) and sign-pool rows [2T] of a batch's tokens
// (ngram_table.py ngram_row_ids, perf/kernels/ngram_embed.py sign hashes; int32 wrap-around),
// each hashed with the tokens before it (GptBatch::prev_of) from its position on.
void ngram_hash(const GptConfig& c, const GptBatch& b, int32_t* rows, int32_t* signs);

// A two-layer head on the residual stream: out = (gelu(x W1^T) W2^T + b2) * scale, and for the
// grouped post-loop mix deltas = gelu(x W1^T) W2g^T * scale (MUDD and MUDD-gate blocks).
struct HeadActs {
  Buf pre, h;    // [T, M]
  Buf unscaled;  // [T, n] before scale
  Buf out;       // [T, n]
  Buf deltas;    // [T, n * G] (grouped only)
};
struct HeadWeights {
  const float* w1 = nullptr;   // [M, C]
  const float* w2 = nullptr;   // [n, M]
  const float* b2 = nullptr;   // [n]
  const float* w2g = nullptr;  // [n * G, M] or null
  int64_t M = 0, n = 0, G = 0;
  float scale = 1.0f;
};
struct HeadGrads {
  float* w1 = nullptr;
  float* w2 = nullptr;
  float* b2 = nullptr;
  float* w2g = nullptr;
  float* scale = nullptr;  // the learned scale's gradient, or null for a constant scale
};
void head_forward(const HeadWeights& w, const float* x, int64_t T, int64_t C, HeadActs& a);
// dout [T, n], ddeltas [T, n * G] or null; adds into dx [T, C] and g.
void head_backward(const HeadWeights& w, const float* x, int64_t T, int64_t C, const HeadActs& a,
                   const float* dout, const float* ddeltas, float* dx, const HeadGrads& g);

// relu(x fc^T)^2 proj with fc, proj [F, C].
struct MlpActs {
  Buf pre, act;  // [T, F]
  Buf out;       // [T, C]
};
void mlp_forward(const float* x, const float* fc, const float* proj, int64_t T, int64_t C,
                 int64_t F, MlpActs& a);
void mlp_backward(const float* x, const float* fc, const float* proj, int64_t T, int64_t C,
                  int64_t F, const MlpActs& a, const float* dout, float* dx, float* dfc,
                  float* dproj);

struct LayerActs {
  Buf x_in;                // [T, C] stream entering the layer
  Buf attn_xn, attn_rstd;  // own normed attention input (when not the shared late one)
  Buf ve_gate_z;           // [T, H] VE gate logits
  Buf aux_v;               // [T, C]
  AttnSaved attn;
  Buf attn_out;  // [T, C]
  Buf x_attn;    // [T, C] stream after the attention sublayer
  Buf mlp_xn, mlp_rstd;
  MlpActs mlp, par;
  Buf x_out;      // [T, C]
  HeadActs mudd;  // MUDD layer: its 14 coefficients
  Buf x_recomb;   // MUDD layer: (1 + mu5) x + mu3 c0 + mu4 c_late
};

struct GptActs {
  int64_t T = 0;
  Buf emb;                                       // [T, C]
  Buf smear_z;                                   // [T]
  Buf smeared;                                   // [T, C]
  Buf x0, x0_rstd;                               // [T, C], [T]
  std::vector<int32_t> ngram_rows, ngram_signs;  // [2T]
  Buf x0_ngram;                                  // [T, Dn]
  std::vector<Buf> ve;                           // per plane [T, C]
  HeadActs gate[2];                              // pre / post MUDD gates
  Buf cache0;                                    // [T, C]
  std::vector<LayerActs> layers;
  Buf late_xn, late_rstd;    // norm(cache[late])
  HeadActs post;             // post-loop MUDD (grouped)
  Buf mixed;                 // [T, C]
  Buf final_xn, final_rstd;  // [T, C], [T]
};

// The forward up to the final normed hidden state (acts.final_xn).
void gpt_forward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs& acts);
// Mean loss of a batch (forward only).
double gpt_loss(const GptParams& p, const GptBatch& b, const GptStepOptions& o);
// Mean loss, and its gradients added into `grads` (GptParams::zeros_like layout).
double gpt_loss_and_grad(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                         std::vector<ParamTensor>& grads);
// Soft-capped logits [T, V] of a batch's inputs (the inference conformance door).
Buf gpt_logits(const GptParams& p, const GptBatch& b, const GptStepOptions& o);

// The backward of gpt_forward given d(final_xn); adds into grads.
void gpt_backward(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                  const GptActs& acts, const float* dfinal, std::vector<ParamTensor>& grads);

}  // namespace deg::train
