// Qwen3.5 text backbone: config.json -> Qwen35Config, the tensor table, and the layer math as HF
// transformers computes it (models/qwen3_5): Gated DeltaNet layers (in_proj_qkv/z/b/a, causal
// conv + SiLU, L2-normalised q/k, beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias),
// value heads grouped over key heads, gated RMSNorm, out_proj), gated full attention (q and an
// output gate from q_proj, q/k RMSNorm with 1 + w, partial rotary, GQA), SwiGLU MLP, final norm,
// tied or untied head. Letters as in backbone.h; N = B * L token rows of a call.
#include "model/qwen35.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/conv.h"
#include "kernels/delta_rule.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/scratch.h"

namespace deg {

namespace {

constexpr int64_t kConvChannelBlock = 512;  // conv work unit (channels)

struct DeltaNetWeights {
  Tensor qkv, z, b, a, out;      // [Cc, C], [Hv*Dv, C], [Hv, C], [Hv, C], [C, Hv*Dv]
  std::vector<float> conv;       // [Cc, K]
  std::vector<float> neg_decay;  // [Hv] -exp(A_log)
  std::vector<float> dt_bias;    // [Hv]
  std::vector<float> norm;       // [Dv] gated RMSNorm weight
};

struct AttentionWeights {
  Tensor q, k, v, o;                  // [Hq*2D, C], [Hkv*D, C], [Hkv*D, C], [C, Hq*D]
  std::vector<float> q_norm, k_norm;  // [D]
};

struct LayerWeights {
  LayerKind kind = LayerKind::recurrent;
  std::vector<float> input_norm, post_norm;  // [C]
  Tensor gate, up, down;                     // [I, C], [I, C], [C, I]
  DeltaNetWeights dn;
  AttentionWeights at;
};

class Qwen35 final : public Family {
 public:
  Qwen35(const Qwen35Config& cfg, const TensorMap& w) : cfg_(cfg) {
    const int64_t C = cfg.hidden, I = cfg.intermediate, V = cfg.vocab;
    const int64_t Hv = cfg.lin_v_heads, Dv = cfg.lin_v_dim, Cc = cfg.conv_channels();
    const int64_t Hq = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
    embed_ = weight_need(w, "embed_tokens.weight", {V, C});
    head_ = cfg.tied ? embed_ : weight_need(w, "lm_head.weight", {V, C});
    final_norm_ = weight_f32(w, "norm.weight", {C});
    spec_ = {.family = "qwen3_5", .hidden = C, .vocab = V, .layers = {}};
    for (int64_t i = 0; i < int64_t(cfg.layers.size()); ++i) {
      LayerWeights l;
      l.kind = cfg.layers[size_t(i)];
      l.input_norm = weight_f32(w, layer_name(i, "input_layernorm.weight"), {C});
      l.post_norm = weight_f32(w, layer_name(i, "post_attention_layernorm.weight"), {C});
      l.gate = weight_need(w, layer_name(i, "mlp.gate_proj.weight"), {I, C});
      l.up = weight_need(w, layer_name(i, "mlp.up_proj.weight"), {I, C});
      l.down = weight_need(w, layer_name(i, "mlp.down_proj.weight"), {C, I});
      LayerSpec ls{.kind = l.kind};
      if (l.kind == LayerKind::recurrent) {
        auto n = [&](const std::string& s) { return layer_name(i, "linear_attn." + s); };
        l.dn.qkv = weight_need(w, n("in_proj_qkv.weight"), {Cc, C});
        l.dn.z = weight_need(w, n("in_proj_z.weight"), {Hv * Dv, C});
        l.dn.b = weight_need(w, n("in_proj_b.weight"), {Hv, C});
        l.dn.a = weight_need(w, n("in_proj_a.weight"), {Hv, C});
        l.dn.out = weight_need(w, n("out_proj.weight"), {C, Hv * Dv});
        l.dn.conv = weight_f32(w, n("conv1d.weight"), {Cc, 1, cfg.conv_kernel});
        for (float a : weight_f32(w, n("A_log"), {Hv})) l.dn.neg_decay.push_back(-std::exp(a));
        l.dn.dt_bias = weight_f32(w, n("dt_bias"), {Hv});
        l.dn.norm = weight_f32(w, n("norm.weight"), {Dv});
        ls.rec_shape = {Hv, cfg.lin_k_dim, Dv};
        ls.conv_channels = Cc;
        ls.conv_kernel = cfg.conv_kernel;
      } else {
        auto n = [&](const std::string& s) { return layer_name(i, "self_attn." + s); };
        l.at.q = weight_need(w, n("q_proj.weight"), {Hq * 2 * D, C});
        l.at.k = weight_need(w, n("k_proj.weight"), {Hkv * D, C});
        l.at.v = weight_need(w, n("v_proj.weight"), {Hkv * D, C});
        l.at.o = weight_need(w, n("o_proj.weight"), {C, Hq * D});
        l.at.q_norm = weight_f32(w, n("q_norm.weight"), {D});
        l.at.k_norm = weight_f32(w, n("k_norm.weight"), {D});
        ls.kv_heads = Hkv;
        ls.head_dim = D;
      }
      layers_.push_back(std::move(l));
      spec_.layers.push_back(ls);
    }
    rope_ = rope_table(D, cfg.partial_rotary, cfg.rope_theta);
  }

  const BackboneSpec& spec() const override { return spec_; }
  const Tensor& lm_head() const override { return head_; }

  void embed(const int32_t* ids, int64_t n, float* h) const override {
    gather_embeddings(embed_, ids, n, h, cfg_.hidden);
  }

  void final_norm(const float* h, float* out, int64_t n) const override {
    norm_rows(h, out, n, final_norm_);
  }

  void layer(int index, const LayerCall& c) const override {
    const LayerWeights& w = layers_[size_t(index)];
    const int64_t N = c.rows * c.tokens;
    float* xn = scratch_floats(kLayerSlots + 0, size_t(N * cfg_.hidden));
    norm_rows(c.h, xn, N, w.input_norm);
    if (w.kind == LayerKind::recurrent) {
      delta_net(w.dn, c, xn);
    } else {
      attention_mixer(w.at, c, xn);
    }
    mlp(w, c, xn);
  }

 private:
  void norm_rows(const float* x, float* y, int64_t n, const std::vector<float>& w) const {
    rms_norm_rows(x, y, n, cfg_.hidden, w, cfg_.eps, NormScale::one_plus_w);
  }

  void mlp(const LayerWeights& w, const LayerCall& c, float* xn) const {
    const int64_t N = c.rows * c.tokens;
    norm_rows(c.h, xn, N, w.post_norm);
    swiglu_mlp({.h = c.h,
                .xn = xn,
                .n = N,
                .hidden = cfg_.hidden,
                .width = cfg_.intermediate,
                .gate = &w.gate,
                .up = &w.up,
                .down = &w.down,
                .precision = c.precision});
  }

  // Gated DeltaNet mixer: h += out_proj(gated_norm(delta_rule(conv(qkv)), z)).
  void delta_net(const DeltaNetWeights& w, const LayerCall& c, const float* xn) const {
    const int64_t B = c.rows, L = c.tokens, N = B * L, C = cfg_.hidden;
    const int64_t Hk = cfg_.lin_k_heads, Hv = cfg_.lin_v_heads, Dk = cfg_.lin_k_dim,
                  Dv = cfg_.lin_v_dim, Cc = cfg_.conv_channels(), K = cfg_.conv_kernel;
    const int64_t KD = Hk * Dk, VD = Hv * Dv;
    float* mixed = scratch_floats(kLayerSlots + 3, size_t(N * Cc));
    float* z = scratch_floats(kLayerSlots + 4, size_t(N * VD));
    float* beta = scratch_floats(kLayerSlots + 5, size_t(N * Hv));
    float* g = scratch_floats(kLayerSlots + 6, size_t(N * Hv));
    GemmOutput outs[] = {{.w = &w.qkv, .y = mixed, .ldy = Cc},
                         {.w = &w.z, .y = z, .ldy = VD},
                         {.w = &w.b, .y = beta, .ldy = Hv},
                         {.w = &w.a, .y = g, .ldy = Hv}};
    gemm({.x = xn, .m = N, .k = C, .ldx = C, .outputs = outs, .precision = c.precision});
    // beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); padded positions: 0 and 0.
    for_each_index(N, 16, [&](int64_t i) {
      const bool real = i % L < c.lengths[i / L];
      float* bt = beta + i * Hv;
      float* gt = g + i * Hv;
      for (int64_t h = 0; h < Hv; ++h) {
        bt[h] = real ? 1.0f / (1.0f + std::exp(-bt[h])) : 0.0f;
        const float a = gt[h] + w.dt_bias[size_t(h)];
        gt[h] = real ? w.neg_decay[size_t(h)] * (a > 20.0f ? a : std::log1p(std::exp(a))) : 0.0f;
      }
    });
    // Causal conv + SiLU per (row, block of channels) over the row's real positions, carrying
    // the tail; padded rows of the output are zeroed.
    float* conv = scratch_floats(kLayerSlots + 7, size_t(N * Cc));
    const int64_t blocks = (Cc + kConvChannelBlock - 1) / kConvChannelBlock;
    for_each_index(B * blocks, 1, [&](int64_t task) {
      const int64_t b = task / blocks, c0 = task % blocks * kConvChannelBlock;
      const int64_t n = c.lengths[b], width = std::min(kConvChannelBlock, Cc - c0);
      const RowView& v = c.views[b];
      causal_conv_silu({.n = n,
                        .channels = width,
                        .kernel = K,
                        .x = mixed + b * L * Cc + c0,
                        .ldx = Cc,
                        .tail_in = v.tail_in + c0,
                        .ldt = Cc,
                        .w = w.conv.data() + c0 * K,
                        .y = conv + b * L * Cc + c0,
                        .ldy = Cc,
                        .tail_out = v.tail_out ? v.tail_out + c0 : nullptr});
      for (int64_t t = n; t < L; ++t)
        std::memset(conv + (b * L + t) * Cc + c0, 0, size_t(width) * sizeof(float));
    });
    // q, k: L2-normalised per head (q also scaled by Dk^-0.5), as HF's use_qk_l2norm_in_kernel.
    const float q_scale = 1.0f / std::sqrt(float(Dk));
    for_each_index(N, 16, [&](int64_t i) {
      l2_norm(conv + i * Cc, Dk, Hk, Dk, 1e-6f, q_scale);
      l2_norm(conv + i * Cc + KD, Dk, Hk, Dk, 1e-6f, 1.0f);
    });
    // Delta rule per (row, value head); value head h reads key head h / (Hv / Hk).
    float* core = scratch_floats(kLayerSlots + 8, size_t(N * VD));
    for (int64_t b = 0; b < B; ++b)  // padded rows
      std::memset(core + (b * L + c.lengths[b]) * VD, 0,
                  size_t((L - c.lengths[b]) * VD) * sizeof(float));
    const int64_t per_head = Dk * Dv;
    for_each_index(B * Hv, 1, [&](int64_t task) {
      const int64_t b = task / Hv, h = task % Hv, kh = h / (Hv / Hk);
      const RowView& v = c.views[b];
      float* state = v.rec_out + h * per_head;
      if (v.rec_in != v.rec_out) {
        std::memcpy(state, v.rec_in + h * per_head, size_t(per_head) * sizeof(float));
      }
      const float* row = conv + b * L * Cc;
      DeltaRuleArgs args{.n = c.lengths[b],
                         .dk = Dk,
                         .dv = Dv,
                         .q = row + kh * Dk,
                         .k = row + KD + kh * Dk,
                         .ldqk = Cc,
                         .v = row + 2 * KD + h * Dv,
                         .ldv = Cc,
                         .g = g + b * L * Hv + h,
                         .beta = beta + b * L * Hv + h,
                         .ldgb = Hv,
                         .state = state,
                         .out = core + b * L * VD + h * Dv,
                         .ldo = VD};
      if (args.n == 1) {
        delta_rule_recurrent(args);
      } else {
        delta_rule_chunked(args);
      }
    });
    // Gated RMSNorm per (token, value head) with z, then out_proj into the residual.
    parallel_for(
        N,
        [&](int64_t b, int64_t e) {
          gated_rms_norm({.x = core + b * VD,
                          .ldx = Dv,
                          .y = core + b * VD,
                          .ldy = Dv,
                          .rows = (e - b) * Hv,
                          .dim = Dv,
                          .w = w.norm.data(),
                          .eps = cfg_.eps,
                          .scale = NormScale::w},
                         z + b * VD, Dv);
        },
        16);
    GemmOutput out{.w = &w.out, .y = c.h, .ldy = C, .accumulate = true};
    gemm({.x = core, .m = N, .k = VD, .ldx = VD, .outputs = {&out, 1}, .precision = c.precision});
  }

  // Gated full attention: h += o_proj(attention(rope(norm(q)), rope(norm(k)), v) * sigmoid(gate)).
  void attention_mixer(const AttentionWeights& w, const LayerCall& c, const float* xn) const {
    const int64_t B = c.rows, L = c.tokens, N = B * L, C = cfg_.hidden;
    const int64_t Hq = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim, G = Hq / Hkv;
    const int64_t QW = Hq * 2 * D, KW = Hkv * D, OW = Hq * D;
    float* qg = scratch_floats(kLayerSlots + 9, size_t(N * QW));
    float* k = scratch_floats(kLayerSlots + 10, size_t(N * KW));
    float* v = scratch_floats(kLayerSlots + 11, size_t(N * KW));
    float* q = scratch_floats(kLayerSlots + 12, size_t(N * OW));
    GemmOutput outs[] = {{.w = &w.q, .y = qg, .ldy = QW},
                         {.w = &w.k, .y = k, .ldy = KW},
                         {.w = &w.v, .y = v, .ldy = KW}};
    gemm({.x = xn, .m = N, .k = C, .ldx = C, .outputs = outs, .precision = c.precision});
    // Per token: q (first half of each head's 2D block of q_proj) and k normed per head, rotated,
    // and this call's real K/V written into the row's own buffers.
    for_each_index(N, 16, [&](int64_t i) {
      const int64_t b = i / L, t = i % L;
      float* qi = q + i * OW;
      for (int64_t h = 0; h < Hq; ++h)
        std::memcpy(qi + h * D, qg + i * QW + h * 2 * D, size_t(D) * sizeof(float));
      norm_heads(qi, Hq, D, w.q_norm.data(), cfg_.eps, NormScale::one_plus_w);
      float* ki = k + i * KW;
      norm_heads(ki, Hkv, D, w.k_norm.data(), cfg_.eps, NormScale::one_plus_w);
      if (t >= c.lengths[b]) return;
      const int64_t pos = c.positions[b] + t;
      rope_apply(rope_, pos, qi, Hq, D);
      rope_apply(rope_, pos, ki, Hkv, D);
      store_kv(c.views[b], t, ki, v + i * KW, Hkv, D);
    });
    // Attention per (row, KV head, block of queries).
    float* o = scratch_floats(kLayerSlots + 13, size_t(N * OW));
    attend_rows({.call = &c,
                 .q = q,
                 .ldq = OW,
                 .out = o,
                 .ldo = OW,
                 .kv_heads = Hkv,
                 .group = G,
                 .head_dim = D,
                 .scale = 1.0f / std::sqrt(float(D))});
    // o * sigmoid(gate): the gate is the second half of each head's 2D block of q_proj.
    sigmoid_gate(o, D, qg + D, 2 * D, N * Hq, D);
    GemmOutput out{.w = &w.o, .y = c.h, .ldy = C, .accumulate = true};
    gemm({.x = o, .m = N, .k = OW, .ldx = OW, .outputs = {&out, 1}, .precision = c.precision});
  }

  Qwen35Config cfg_;
  BackboneSpec spec_;
  Tensor embed_, head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  RopeTable rope_;
};

}  // namespace

bool qwen35_handles(const std::string& model_type) {
  return model_type == "qwen3_5" || model_type == "qwen3_5_text";
}

Qwen35Config Qwen35Config::from_json(const JsonConfig& root) {
  const JsonConfig t = root.text();
  Qwen35Config c;
  c.vocab = t.get<int64_t>("vocab_size");
  c.hidden = t.get<int64_t>("hidden_size");
  c.intermediate = t.get<int64_t>("intermediate_size");
  const int64_t n_layers = t.get<int64_t>("num_hidden_layers");
  c.heads = t.get<int64_t>("num_attention_heads");
  c.kv_heads = t.get<int64_t>("num_key_value_heads");
  c.head_dim = t.get_or<int64_t>("head_dim", c.hidden / std::max<int64_t>(c.heads, 1));
  c.lin_k_heads = t.get<int64_t>("linear_num_key_heads");
  c.lin_v_heads = t.get<int64_t>("linear_num_value_heads");
  c.lin_k_dim = t.get<int64_t>("linear_key_head_dim");
  c.lin_v_dim = t.get<int64_t>("linear_value_head_dim");
  c.conv_kernel = t.get_or<int64_t>("linear_conv_kernel_dim", 4);
  c.eps = t.get_or<float>("rms_norm_eps", 1e-6f);
  auto unsupported = [&](const std::string& key, const std::string& what) {
    return Error(ErrorKind::unsupported, what, {.path = t.path()})
        .with_pointer(t.pointer() + "/" + key);
  };
  if (t.get_or<std::string>("hidden_act", "silu") != "silu") {
    throw unsupported("hidden_act", "only hidden_act \"silu\" is supported");
  }
  if (t.get_or<bool>("attention_bias", false)) {
    throw unsupported("attention_bias", "attention_bias true is not supported");
  }
  if (t.has("layer_types")) {
    for (const std::string& s : t.get<std::vector<std::string>>("layer_types")) {
      if (s == "linear_attention") {
        c.layers.push_back(LayerKind::recurrent);
      } else if (s == "full_attention") {
        c.layers.push_back(LayerKind::attention);
      } else {
        throw unsupported("layer_types", "unknown layer type \"" + s +
                                             "\" (expected linear_attention or full_attention)");
      }
    }
  } else {  // HF default: every full_attention_interval-th layer is full attention
    const int64_t every = t.get_or<int64_t>("full_attention_interval", 4);
    for (int64_t i = 0; i < n_layers; ++i)
      c.layers.push_back((i + 1) % every ? LayerKind::recurrent : LayerKind::attention);
  }
  if (int64_t(c.layers.size()) != n_layers) {
    throw unsupported("layer_types", fmt::format("{} layer types for num_hidden_layers {}",
                                                 c.layers.size(), n_layers));
  }
  // Rotary: rope_parameters (transformers 5) wins over the legacy top-level keys.
  c.rope_theta = t.get_or<double>("rope_theta", 10000.0);
  c.partial_rotary = t.get_or<double>("partial_rotary_factor", 0.25);
  if (t.has("rope_parameters")) {
    const JsonConfig rp = t.sub("rope_parameters");
    if (rp.get_or<std::string>("rope_type", "default") != "default") {
      throw unsupported("rope_parameters", "only rope_type \"default\" is supported");
    }
    c.rope_theta = rp.get_or<double>("rope_theta", c.rope_theta);
    c.partial_rotary = rp.get_or<double>("partial_rotary_factor", c.partial_rotary);
  }
  c.tied = root.has("tie_word_embeddings") ? root.get<bool>("tie_word_embeddings")
                                           : t.get_or<bool>("tie_word_embeddings", false);
  if (c.heads <= 0 || c.kv_heads <= 0 || c.heads % c.kv_heads || c.lin_k_heads <= 0 ||
      c.lin_v_heads % c.lin_k_heads || c.conv_kernel < 1 || c.head_dim <= 0) {
    throw Error(ErrorKind::format,
                fmt::format("inconsistent head counts: {} q / {} kv heads, {} key / {} value "
                            "DeltaNet heads, conv kernel {}",
                            c.heads, c.kv_heads, c.lin_k_heads, c.lin_v_heads, c.conv_kernel),
                {.path = t.path()});
  }
  return c;
}

Qwen35Config Qwen35Config::preset(const std::string& size) {
  if (size != "0.8b") {
    throw Error(ErrorKind::invalid_argument, "unknown Qwen3.5 size \"" + size + "\" (known: 0.8b)");
  }
  Qwen35Config c{.vocab = 248320,
                 .hidden = 1024,
                 .intermediate = 3584,
                 .layers = {},
                 .heads = 8,
                 .kv_heads = 2,
                 .head_dim = 256,
                 .rope_theta = 1e7,
                 .partial_rotary = 0.25,
                 .lin_k_heads = 16,
                 .lin_v_heads = 16,
                 .lin_k_dim = 128,
                 .lin_v_dim = 128,
                 .conv_kernel = 4,
                 .eps = 1e-6f,
                 .tied = true};
  for (int i = 0; i < 24; ++i)
    c.layers.push_back((i + 1) % 4 ? LayerKind::recurrent : LayerKind::attention);
  return c;
}

std::vector<std::pair<std::string, Shape>> qwen35_tensor_table(const Qwen35Config& c) {
  const int64_t C = c.hidden, I = c.intermediate, Hv = c.lin_v_heads, Dv = c.lin_v_dim;
  const int64_t Cc = c.conv_channels(), D = c.head_dim;
  std::vector<std::pair<std::string, Shape>> t{{"embed_tokens.weight", {c.vocab, C}},
                                               {"norm.weight", {C}}};
  if (!c.tied) t.push_back({"lm_head.weight", {c.vocab, C}});
  for (int64_t i = 0; i < int64_t(c.layers.size()); ++i) {
    auto add = [&](const std::string& n, Shape s) { t.push_back({layer_name(i, n), s}); };
    add("input_layernorm.weight", {C});
    add("post_attention_layernorm.weight", {C});
    add("mlp.gate_proj.weight", {I, C});
    add("mlp.up_proj.weight", {I, C});
    add("mlp.down_proj.weight", {C, I});
    if (c.layers[size_t(i)] == LayerKind::recurrent) {
      add("linear_attn.in_proj_qkv.weight", {Cc, C});
      add("linear_attn.in_proj_z.weight", {Hv * Dv, C});
      add("linear_attn.in_proj_b.weight", {Hv, C});
      add("linear_attn.in_proj_a.weight", {Hv, C});
      add("linear_attn.conv1d.weight", {Cc, 1, c.conv_kernel});
      add("linear_attn.dt_bias", {Hv});
      add("linear_attn.A_log", {Hv});
      add("linear_attn.norm.weight", {Dv});
      add("linear_attn.out_proj.weight", {C, Hv * Dv});
    } else {
      add("self_attn.q_proj.weight", {c.heads * 2 * D, C});
      add("self_attn.k_proj.weight", {c.kv_heads * D, C});
      add("self_attn.v_proj.weight", {c.kv_heads * D, C});
      add("self_attn.o_proj.weight", {C, c.heads * D});
      add("self_attn.q_norm.weight", {D});
      add("self_attn.k_norm.weight", {D});
    }
  }
  return t;
}

std::unique_ptr<Family> qwen35_family(const Qwen35Config& cfg, const TensorMap& weights) {
  return std::make_unique<Qwen35>(cfg, weights);
}

TensorMap qwen35_random_weights(const Qwen35Config& cfg, DType dtype, uint64_t seed) {
  const auto table = qwen35_tensor_table(cfg);
  return random_weights({.table = &table,
                         .dtype = dtype,
                         .seed = seed,
                         .f32 =
                             [](const std::string& name, const Shape& shape) {
                               return shape.size() == 1 || name.find("conv1d") != std::string::npos;
                             },
                         .adjust =
                             [](const std::string& name, float unit, float x) {
                               if (name.ends_with("A_log")) return std::log(1.0f + 15.0f * unit);
                               if (name.ends_with("dt_bias") ||
                                   name.ends_with("linear_attn.norm.weight"))
                                 return x + 1.0f;
                               return x;
                             }});
}

}  // namespace deg
