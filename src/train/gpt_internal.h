// Helpers shared by the gpt forward (gpt_step.cc) and backward (gpt_backward.cc): weight access
// by name, the attention sublayer's shape and inputs per layer, cache and mix-source lookup.
#pragma once

#include <string>

#include "core/error.h"
#include "train/gpt_step.h"

namespace deg::train::detail {

// Read-only access to the trained tensors by name, and the per-layer scalars.
// The per-layer scalars are looked up once: they are read inside per-element loops.
struct Weights {
  Weights(const GptParams& params, const GptConfig& config)
      : p(params),
        c(config),
        scalars(params.data("scalars")),
        resid_lambdas(params.data("resid_lambdas")),
        post_lambdas(params.data("post_lambdas")) {}
  const GptParams& p;
  const GptConfig& c;
  const float* scalars;
  const float* resid_lambdas;
  const float* post_lambdas;
  const float* get(const std::string& n) const { return p.data(n); }
  float sa(int i, int k) const { return scalars[2 * i + k]; }
  float smear_lambda() const { return scalars[2 * c.num_layers]; }
  float skip_lambda() const { return scalars[2 * c.num_layers + 1]; }
  float resid(int i, int k) const { return resid_lambdas[2 * i + k]; }
  float post(int i, int k) const { return post_lambdas[2 * i + k]; }
  HeadWeights mudd(int id) const {
    const int64_t M = c.mudd_dim, n = c.mudd_coefs(), C = c.model_dim;
    return {.w1 = get("mudd_w1") + id * M * C,
            .w2 = get("mudd_w2") + id * n * M,
            .b2 = get("mudd_b2") + id * n,
            .w2g = id == 1 ? get("mudd_w2g") : nullptr,
            .M = M,
            .n = n,
            .G = c.mudd_groups,
            .scale = c.mudd_scale};
  }
  HeadWeights gate(int id) const {
    const int64_t M = c.mudd_gate_dim, n = c.mudd_gate_coefs(), C = c.model_dim;
    return {.w1 = get("mudd_gate_w1") + id * M * C,
            .w2 = get("mudd_gate_w2") + id * n * M,
            .b2 = get("mudd_gate_b2") + id * n,
            .M = M,
            .n = n,
            .scale = get("mudd_gate_scale")[0]};
  }
  std::string layer(int i, const char* what) const {
    return "layers." + std::to_string(i) + "." + what;
  }
};

inline AttnLayerShape attn_shape(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                                 int i) {
  const GptConfig& c = p.config();
  const bool wide = c.has(c.wide_qk_layers, i);
  const RotaryState& r = wide ? p.rotary_wide : p.rotary_narrow;
  DEG_CHECK(int64_t(r.freq.size()) == c.qk_dim(i), "rotary table width");
  return {.T = b.size(),
          .C = c.model_dim,
          .H = c.num_heads,
          .dq = c.qk_dim(i),
          .dv = c.v_dim(i),
          .aux_width = c.head_dim,
          .rotary_dim = c.rotary_dim,
          .paired = c.paired(i),
          .key_offset = c.long_window(i),
          .window = c.long_window(i) ? o.window_long : o.window_short,
          .attn_scale = r.attn_scale,
          .eps = c.norm_eps,
          .freq = r.freq.data(),
          .seg_start = b.seg_start.data(),
          .prev = b.prev.empty() ? nullptr : b.prev.data(),
          .pos = b.pos.empty() ? nullptr : b.pos.data(),
          .ctx_lo = b.ctx_lo.empty() ? nullptr : b.ctx_lo.data(),
          .ctx_hi = b.ctx_lo.empty() ? nullptr : b.ctx_hi.data()};
}

inline const float* cache_of(const GptActs& a, int j) {
  return j == 0 ? a.cache0.data() : a.layers[size_t(j)].x_out.data();
}

inline bool uses_late(const GptConfig& c, int i) {
  return c.late_layer >= 0 && i > c.late_layer;
}

inline const float* mix_source(const GptConfig& c, const GptActs& a, const GptMixSource& s) {
  switch (s.kind) {
    case GptMixSource::Kind::cache: return cache_of(a, s.layer);
    case GptMixSource::Kind::value_embed: return a.ve[size_t(c.value_embed_index(s.layer))].data();
    case GptMixSource::Kind::last_mlp_in: return a.layers.back().mlp_xn.data();
    case GptMixSource::Kind::late_attn_in: return a.late_xn.data();
  }
  return nullptr;
}

// The attention sublayer's inputs for layer i (aux_v and gates already in acts).
inline AttnLayerInputs attn_inputs(const Weights& w, const GptActs& a, int i, float o_scale) {
  const GptConfig& c = w.c;
  const LayerActs& la = a.layers[size_t(i)];
  const auto lanes = c.gate_lanes();
  const int64_t ng = c.mudd_gate_coefs();
  AttnLayerInputs in{.xn = uses_late(c, i) ? a.late_xn.data() : la.attn_xn.data(),
                     .w_qk = w.get(w.layer(i, "attn.qk")),
                     .w_v = w.get(w.layer(i, "attn.v")),
                     .w_o = w.get(w.layer(i, "attn.o")),
                     .sa0 = w.sa(i, 0),
                     .o_scale = o_scale,
                     .aux_v = la.aux_v.empty() ? nullptr : la.aux_v.data()};
  if (lanes.xsa[size_t(i)] >= 0) in.xsa = {a.gate[0].out.data() + lanes.xsa[size_t(i)], ng};
  if (lanes.attn_gate[size_t(i)] >= 0)
    in.gate = {a.gate[lanes.gate_id[size_t(i)]].out.data() + lanes.attn_gate[size_t(i)], ng};
  return in;
}

}  // namespace deg::train::detail
