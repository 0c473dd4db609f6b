// The gpt family's one definition (src/model/gpt.cc, gpt_attention.cc, gpt_backward.cc): the
// class that inference runs as a Family and training runs with a tape, the attention sublayer's
// weights, inputs and entry points, and what a training forward keeps for its backward.
// Internal to the family; the rest of deg sees model/gpt.h.
//
// Letters: B rows, L tokens of a call, N = B L, C model dim, S stream width, H heads, Dq / Dv
// q-k / v head widths, D = max(Dq, Dv), P = 3 H D the width of a token's q, k, v row, F MLP hidden,
// M MUDD hidden, G mix groups, Dn n-gram dim, n coefficients of a MUDD head.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/backbone.h"
#include "model/gpt.h"
#include "model/gpt_config.h"

namespace deg::gpt_detail {

inline float sigmoid(float x) {  // of a scalar weight
  return 1.0f / (1.0f + std::exp(-x));
}

// One attention layer's weights and settings.
struct AttnWeights {
  Tensor qk, v, o;  // [2 H Dq, C], [H Dv, C], [C, H Dv]
  int64_t dq = 0, dv = 0, d = 0;
  bool paired = false, key_offset = false;
  int64_t window = 0;           // in attention positions (2 per token when paired)
  const float* freq = nullptr;  // [Dq] rotary frequencies
  float scale = 1.0f;           // softmax scale
};

// What a training forward's attention sublayer kept (arena memory of the pass).
struct AttnTape {
  const float* xn = nullptr;   // [N, C] the normed input
  const float* aux = nullptr;  // [N, C] added to V, or null
  float* pqk = nullptr;        // [N, 2 H Dq] xn W_qk^T (before sa0)
  float* pv = nullptr;         // [N, H Dv] xn W_v^T (before sa0)
  float* qkv = nullptr;        // [N, P] rotated normed q and k, then v (heads D apart)
  float* y_att = nullptr;      // [N, H Dv] attention's output
  float* y_xsa = nullptr;      // [N, H Dv] after XSA (null without)
  float* y = nullptr;          // [N, H Dv] the output projection's input
  std::vector<RowView> views;  // [B] the keys the rows read (into qkv; a prefix into another's)
  // The bf16 training path: xn and y as the forward's products rounded them (kept_bf16), or null.
  const bf16* xn_b = nullptr;
  const bf16* y_b = nullptr;
};

// What the attention sublayer reads besides its weights. Lanes are offsets into a token's
// residual stream row (-1: none).
struct AttnInputs {
  const LayerCall* call = nullptr;  // the layer call (stream, rows, lengths, positions, K/V views)
  const float* xn = nullptr;        // [N, C] normed input
  const float* aux = nullptr;    // [N, C] added to V (head h reads its leading Dv of C/H), or null
  const float* ones = nullptr;   // [>= Dq] unit RMS-norm weights
  const float* zeros = nullptr;  // [>= H Dv] added to V without aux (as the trainer adds 0)
  float sa0 = 1.0f;              // scales q, k, v
  float eps = 0.0f;              // q/k RMS norm
  int64_t model_dim = 0, heads = 0, rotary_dim = 0;
  int64_t stream = 0;                // S
  int64_t xsa = -1;                  // lane of head 0's raw XSA strength
  int64_t gate = -1;                 // lane of head 0's output gate
  const int32_t* segment = nullptr;  // [N] packed documents' first positions, or null
  // Training: the rows read their keys where the projections put them (no state): own keys in
  // the tape's qkv, a fork row's prefix in the qkv of the call it continues (prefix_views[b]'s
  // prefix fields). The tape keeps what the backward reads.
  AttnTape* tape = nullptr;
  const RowView* prefix_views = nullptr;  // [B] or null
};

// q, k = rotary(norm(sa0 xn W_qk^T)), v = sa0 xn W_v^T + aux; the call's real K/V into the rows'
// own buffers (inference); causal sliding-window attention over the rows' prefix and own keys
// (paired heads, key offset, segments); XSA and output gates -> y W_o^T [N, C] from the call's
// arena. The output scale is the caller's.
float* attention(const Exec& x, const AttnWeights& a, const AttnInputs& in);

// The gradients the attention sublayer's backward adds to (weights laid out as their tensors).
struct AttnGrads {
  float* dxn = nullptr;      // [N, C]
  float* daux = nullptr;     // [N, C], or null without aux
  float* dqk = nullptr;      // [2 H Dq, C]
  float* dv = nullptr;       // [H Dv, C]
  float* dout_w = nullptr;   // [C, H Dv]
  float* dsa0 = nullptr;     // one value
  float* dstream = nullptr;  // [N, S]: the XSA strength and gate lanes' gradients
  // Per row, the gradient buffers of the keys it read (the tape's views, laid out alike): own
  // keys in this call's dqkv, a prefix in the dqkv of the call it continues. Zero before.
  const RowView* dviews = nullptr;
  float* dqkv = nullptr;  // [N, P] this call's
};

// The q and k heads of pqk ([N, 2H Dq]) against their places in qkv (D apart): f(from, to, n)
// for each run of columns that lies alike in both (one run when Dq = D).
template <class F>
void for_qk_heads(const AttnWeights& a, int64_t heads, F f) {
  if (a.dq == a.d) {
    f(0, 0, 2 * heads * a.dq);
    return;
  }
  for (int64_t g = 0; g < 2 * heads; ++g) f(g * a.dq, g * a.d, a.dq);
}

// The attention sublayer's op arguments, shared by its forward and backward: v head h's
// combination (terms in t), the core attention over `views` (keys kv_dim apart), XSA over y.
CombineArgs v_head(const AttnWeights& a, const AttnInputs& in, float* qkv, const float* pv,
                   int64_t h, CombineTerm (&t)[2]);
AttendF64Args attend_args(const AttnWeights& a, const AttnInputs& in, const RowView* views,
                          float* qkv, int64_t kv_dim, float* y);
ProjectionArgs xsa_args(const AttnWeights& a, const AttnInputs& in, float* y, const float* qkv);

class GradOps;  // training helpers over ops (gpt_backward.cc)

// The backward of attention() from the gradient of its output (before the output scale), with
// in.tape the forward's.
void attention_backward(const GradOps& go, const AttnWeights& a, const AttnInputs& in,
                        const float* dout, const AttnGrads& g);

// The width of a token's q, k, v row (P) of an attention layer: H q heads, H k heads, H v heads,
// each D = max(Dq, Dv) wide (a head uses its leading Dq or Dv), so one head stride serves K and V.
inline int64_t qkv_width(const AttnWeights& a, int64_t heads) {
  return 3 * heads * a.d;
}

// A two-layer MUDD head: out = (gelu(x W1^T) W2^T + b2) * scale, deltas = gelu(x W1^T) W2g^T *
// scale (the grouped post-loop mix only).
struct HeadWeights {
  Tensor w1, w2, w2g;  // [M, C], [n, M], [n G, M]
  Tensor b2;           // [n]
  float scale = 1.0f;
};

// A head run's values kept for its backward.
struct HeadTape {
  const float* x = nullptr;  // input rows (stride ldx)
  int64_t ldx = 0;
  float* pre = nullptr;  // [N, M] x W1^T
  float* act = nullptr;  // [N, M] gelu(pre)
  float* u = nullptr;    // [N, n] act W2^T (before bias and scale)
};

// Arena room for a training forward product's input as the backend rounds it (GemmArgs::xb_out),
// kept on the tape so that the backward's products of that input take it back: on the bf16
// training path (bf16_all) with a tape, else null.
inline bf16* kept_bf16(const Exec& x, GemmPrecision p, bool tape, int64_t n) {
  if (!tape || p != GemmPrecision::bf16_all) return nullptr;
  return reinterpret_cast<bf16*>(x.arena.floats((n + 1) / 2));
}

struct MlpTape {
  const float* xn = nullptr;                                         // [N, C]
  float* pre = nullptr;                                              // [N, F] xn fc^T
  float* act = nullptr;                                              // [N, F] relu(pre)^2
  float* out = nullptr;                                              // [N, C] act proj
  float *par_pre = nullptr, *par_act = nullptr, *par_out = nullptr;  // the parallel MLP
  // The bf16 training path: xn, act and par_act as the forward's products rounded them, or null.
  const bf16 *xn_b = nullptr, *act_b = nullptr, *par_act_b = nullptr;
};

struct LayerTape {
  float* x_in = nullptr;      // [N, C] the hidden state entering the layer
  float* x_attn = nullptr;    // [N, C] after the attention (skip, injection) sublayer
  const float* xn = nullptr;  // [N, C] the attention input (own norm, or norm(late cache))
  float* ve = nullptr;        // [N, C] the value-embedding rows (ungated)
  float* ve_gate = nullptr;   // [N, H] the VE gate's values (2 sigmoid)
  float* aux = nullptr;       // [N, C] what V adds
  AttnTape attn;
  float* out = nullptr;  // [N, C] the attention output before its scale
  MlpTape mlp;
  HeadTape post_gate;  // the post MUDD gate (post_gate_layer)
  // The MUDD layer.
  HeadTape mudd;
  float* mu = nullptr;           // [N, n]
  float* recomb = nullptr;       // [N, C]
  float* attn_scaled = nullptr;  // [N, C] out * sa1
  HeadTape post;                 // the post-loop mix head
  float* coef = nullptr;         // [N, n]
  float* deltas = nullptr;       // [N, n G]
};

// What a training forward kept of one call (arena memory of its Exec).
struct CallTape {
  GptTrainCall call;
  float* h = nullptr;          // [N, S] the stream at the end
  int32_t* prev1 = nullptr;    // [N] ids one back
  int32_t* prev2 = nullptr;    // [N] ids two back
  float* smear_sig = nullptr;  // [N] sigmoid of the smear gate
  float* smear = nullptr;      // [N] smear lambda * smear_sig
  float* smeared = nullptr;    // [N, C] the smeared embedding (x0's norm input)
  HeadTape pre_gate;
  std::vector<LayerTape> layers;
  float* final_xn = nullptr;  // [N, C]
};

struct LayerWeights {
  bool attn = false, mlp = false;
  AttnWeights at;
  Tensor fc, proj;  // [F, C], [C, F] (proj transposed from the checkpoint's [F, C])
};

// Lanes of the residual stream after the hidden state [0, C).
struct StreamLanes {
  int64_t id = 0, x0 = 0, c0 = 0, ngram = 0;
  int64_t gate[2] = {0, 0};    // pre / post MUDD gate outputs [n_g]
  std::vector<int64_t> cache;  // [L] where cache[j] is kept (cache 0: c0), -1 when never read
  int64_t width = 0;           // S
};

// The gpt model: a Family for inference, and the forward (with a tape) and backward of
// training over the same methods.
class GptNet final : public Family {
 public:
  GptNet(const GptConfig& cfg, const TensorMap& w, const Ops& ops);

  const BackboneSpec& spec() const override { return spec_; }
  const Tensor& lm_head() const override { return head_; }
  void embed_rows(const Exec& x, const EmbedCall& e) const override { embed(x, e, nullptr); }
  void layer(const Exec& x, int index, const LayerCall& c) const override {
    run_layer(x, index, c, nullptr, nullptr, nullptr);
  }
  void final_norm(const Exec& x, const float* h, float* out, int64_t n) const override {
    norm_rows(x, h, cfg_.model_dim, out, cfg_.model_dim, n);
  }
  void finish_logits(const Exec& x, float* logits, int64_t n) const override;

  // Training (gpt_backward.cc for the backward).
  std::vector<float*> train_forward(const Exec& x, std::span<const GptTrainCall> calls,
                                    GptTape& tape) const;
  void train_backward(const Exec& x, const GptTape& tape, std::span<const float* const> dfinal,
                      const GptGrads& grads) const;

 private:
  friend class GradOps;
  bool uses_late(int i) const { return cfg_.late_layer >= 0 && i > cfg_.late_layer; }
  // Token embedding, smear, x0 = norm(.), the n-gram embedding, the pre MUDD gate, cache 0.
  void embed(const Exec& x, const EmbedCall& e, CallTape* tape) const;
  // Layer i; with a tape, keeps what the backward reads and reads its keys from the pass (the
  // prefix of fork rows from prefix_views).
  void run_layer(const Exec& x, int i, const LayerCall& c, LayerTape* tape, const int32_t* segment,
                 const RowView* prefix_views) const;
  void norm_rows(const Exec& x, const float* in, int64_t ldx, float* y, int64_t ldy,
                 int64_t n) const;
  void add_ngram(const Exec& x, float* h, int64_t n, const float* coef, int64_t ldc) const;
  void head_run(const Exec& x, const HeadWeights& w, const float* in, int64_t ldx, int64_t N,
                float* out, int64_t ldo, float* deltas, GemmPrecision precision,
                HeadTape* tape) const;
  void mix_and_inject(const Exec& x, int i, const LayerCall& c, float r, const float* out,
                      float o_scale) const;
  const float* value_embedding(const Exec& x, int i, const LayerCall& c, const float* xn,
                               LayerTape* tape) const;
  float* attention(const Exec& x, int i, const LayerCall& c, const float* xn, const float* aux,
                   LayerTape* tape, const int32_t* segment, const RowView* prefix_views) const;
  AttnInputs attn_inputs(int i, const LayerCall& c, const float* xn, const float* aux) const;
  // The MLP sublayer of layer i in place on the stream: x = rm x + pm mlp(norm(x)) (+ the
  // parallel MLP). MUDD layer: mu = its coefficients, x = mu12 x + mu13 mlp(norm(x)); mlp_xn
  // receives norm(x) (the post mix reads it).
  void mlp(const Exec& x, int i, const LayerCall& c, const float* mu, float** mlp_xn,
           MlpTape* tape) const;
  void mudd_layer(const Exec& x, const LayerCall& c, LayerTape* tape, const int32_t* segment,
                  const RowView* prefix_views) const;
  // The post-loop mix source k's rows (a value-embedding source gathered into `scratch`).
  const float* mix_source(const Exec& x, const LayerCall& c, size_t k, const float* mlp_xn,
                          const float* late_xn, float* scratch, int64_t& ld) const;

  GptConfig cfg_;
  GptConfig::GateLanes gl_;
  int64_t nm_ = 0, ng_ = 0;  // MUDD / MUDD-gate coefficients
  BackboneSpec spec_;
  StreamLanes lanes_;
  Tensor embed_, head_, ngram_;
  std::vector<Tensor> ve_;                             // per plane [V, C]
  Tensor sign_pool_, smear_, ve_gate_, ones_, zeros_;  // on the backend's device
  std::vector<float> scalars_, resid_, post_;          // read here, passed as op scalars
  std::vector<Tensor> freq_;                           // narrow, wide
  std::vector<float> attn_scale_;
  std::vector<LayerWeights> layers_;
  Tensor par_fc_, par_proj_;
  HeadWeights mudd_[2], gate_[2];
};

}  // namespace deg::gpt_detail

namespace deg {

struct GptTape {
  std::vector<gpt_detail::CallTape> calls;
};

}  // namespace deg
