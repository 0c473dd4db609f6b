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
#include "kernels/ops.h"

namespace deg {

namespace {

// Every tensor on the family's backend (small f32 vectors too).
struct DeltaNetWeights {
  Tensor qkv, z, b, a, out;  // [Cc, C], [Hv*Dv, C], [Hv, C], [Hv, C], [C, Hv*Dv]
  Tensor conv;               // [Cc, K]
  Tensor neg_decay;          // [Hv] -exp(A_log)
  Tensor dt_bias;            // [Hv]
  Tensor norm;               // [Dv] gated RMSNorm weight
};

struct Qwen35AttentionWeights {
  Tensor q, k, v, o;      // [Hq*2D, C], [Hkv*D, C], [Hkv*D, C], [C, Hq*D]
  Tensor q_norm, k_norm;  // [D]
};

struct Qwen35LayerWeights {
  LayerKind kind = LayerKind::recurrent;
  Tensor input_norm, post_norm;  // [C]
  Tensor gate, up, down;         // [I, C], [I, C], [C, I]
  DeltaNetWeights dn;
  Qwen35AttentionWeights at;
};

class Qwen35 final : public Family {
 public:
  Qwen35(const Qwen35Config& cfg, const TensorMap& w, const Ops& ops) : Family(ops), cfg_(cfg) {
    const int64_t C = cfg.hidden, I = cfg.intermediate, V = cfg.vocab;
    const int64_t Hv = cfg.lin_v_heads, Dv = cfg.lin_v_dim, Cc = cfg.conv_channels();
    const int64_t Hq = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
    embed_ = weight_on(ops, w, "embed_tokens.weight", {V, C});
    head_ = cfg.tied ? embed_ : weight_on(ops, w, "lm_head.weight", {V, C});
    final_norm_ = vector_on(ops, weight_f32(w, "norm.weight", {C}));
    spec_ = {.family = "qwen3_5", .hidden = C, .vocab = V, .layers = {}};
    for (int64_t i = 0; i < int64_t(cfg.layers.size()); ++i) {
      Qwen35LayerWeights l;
      l.kind = cfg.layers[size_t(i)];
      l.input_norm = vector_on(ops, weight_f32(w, layer_name(i, "input_layernorm.weight"), {C}));
      l.post_norm =
          vector_on(ops, weight_f32(w, layer_name(i, "post_attention_layernorm.weight"), {C}));
      const std::vector<Tensor> gate_up =
          weights_stacked_on(ops, w,
                             {{layer_name(i, "mlp.gate_proj.weight"), {I, C}},
                              {layer_name(i, "mlp.up_proj.weight"), {I, C}}});
      l.gate = gate_up[0];
      l.up = gate_up[1];
      l.down = weight_on(ops, w, layer_name(i, "mlp.down_proj.weight"), {C, I});
      LayerSpec ls{.kind = l.kind};
      if (l.kind == LayerKind::recurrent) {
        auto n = [&](const std::string& s) { return layer_name(i, "linear_attn." + s); };
        // The four input projections as one stacked weight: one GEMM on a GPU.
        const std::vector<Tensor> in = weights_stacked_on(ops, w,
                                                          {{n("in_proj_qkv.weight"), {Cc, C}},
                                                           {n("in_proj_z.weight"), {Hv * Dv, C}},
                                                           {n("in_proj_b.weight"), {Hv, C}},
                                                           {n("in_proj_a.weight"), {Hv, C}}});
        l.dn.qkv = in[0];
        l.dn.z = in[1];
        l.dn.b = in[2];
        l.dn.a = in[3];
        l.dn.out = weight_on(ops, w, n("out_proj.weight"), {C, Hv * Dv});
        l.dn.conv = vector_on(ops, weight_f32(w, n("conv1d.weight"), {Cc, 1, cfg.conv_kernel}));
        std::vector<float> neg_decay;
        for (float a : weight_f32(w, n("A_log"), {Hv})) neg_decay.push_back(-std::exp(a));
        l.dn.neg_decay = vector_on(ops, neg_decay);
        l.dn.dt_bias = vector_on(ops, weight_f32(w, n("dt_bias"), {Hv}));
        l.dn.norm = vector_on(ops, weight_f32(w, n("norm.weight"), {Dv}));
        ls.rec_shape = {Hv, cfg.lin_k_dim, Dv};
        ls.delta_k_heads = cfg.lin_k_heads;
        ls.conv_channels = Cc;
        ls.conv_kernel = cfg.conv_kernel;
      } else {
        auto n = [&](const std::string& s) { return layer_name(i, "self_attn." + s); };
        l.at.q = weight_on(ops, w, n("q_proj.weight"), {Hq * 2 * D, C});
        l.at.k = weight_on(ops, w, n("k_proj.weight"), {Hkv * D, C});
        l.at.v = weight_on(ops, w, n("v_proj.weight"), {Hkv * D, C});
        l.at.o = weight_on(ops, w, n("o_proj.weight"), {C, Hq * D});
        l.at.q_norm = vector_on(ops, weight_f32(w, n("q_norm.weight"), {D}));
        l.at.k_norm = vector_on(ops, weight_f32(w, n("k_norm.weight"), {D}));
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

  void embed_rows(const Exec& x, const EmbedCall& e) const override {
    x.ops.gather({.table = &embed_, .ids = e.ids, .n = e.rows.n(), .y = e.h, .ldy = cfg_.hidden});
  }

  void final_norm(const Exec& x, const float* h, float* out, int64_t n) const override {
    norm_rows(x, h, {.f32 = out}, n, final_norm_);
  }

  void layer(const Exec& x, int index, const LayerCall& c) const override {
    const Qwen35LayerWeights& w = layers_[size_t(index)];
    const int64_t N = c.rows.n(), C = cfg_.hidden;
    const bool rounded = w.kind == LayerKind::recurrent
                             ? bf16_products(c.precision, {&w.dn.qkv, &w.dn.z, &w.dn.b, &w.dn.a})
                             : bf16_products(c.precision, {&w.at.q, &w.at.k, &w.at.v});
    const ProjectionInput xn = projection_input(x, N, C, rounded);
    norm_rows(x, c.h, xn, N, w.input_norm);
    if (w.kind == LayerKind::recurrent) {
      delta_net(x, w.dn, c, xn);
    } else {
      attention_mixer(x, w.at, c, xn);
    }
    const ProjectionInput xm =
        projection_input(x, N, C, bf16_products(c.precision, {&w.gate, &w.up}));
    norm_rows(x, c.h, xm, N, w.post_norm);
    swiglu_mlp(x, {.h = c.h,
                   .xn = xm,
                   .n = N,
                   .hidden = cfg_.hidden,
                   .width = cfg_.intermediate,
                   .gate = &w.gate,
                   .up = &w.up,
                   .down = &w.down,
                   .precision = c.precision});
  }

 private:
  // y = norm(x) * (1 + w) over n rows of C.
  void norm_rows(const Exec& x, const float* in, ProjectionInput out, int64_t n,
                 const Tensor& w) const {
    const int64_t C = cfg_.hidden;
    x.ops.rms_norm({.x = in,
                    .ldx = C,
                    .y = out.f32,
                    .ldy = C,
                    .rows = n,
                    .dim = C,
                    .w = w.data<float>(),
                    .eps = cfg_.eps,
                    .scale = NormScale::one_plus_w,
                    .yb = out.b16});
  }

  // Gated DeltaNet mixer: h += out_proj(gated_norm(delta_rule(conv(qkv)), z)).
  void delta_net(const Exec& x, const DeltaNetWeights& w, const LayerCall& c,
                 ProjectionInput xn) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden;
    const int64_t Hk = cfg_.lin_k_heads, Hv = cfg_.lin_v_heads, Dk = cfg_.lin_k_dim,
                  Dv = cfg_.lin_v_dim, Cc = cfg_.conv_channels();
    const int64_t KD = Hk * Dk, VD = Hv * Dv;
    // The projections side by side in one [N, P] buffer (one GEMM with the stacked weights).
    const int64_t P = Cc + VD + 2 * Hv;
    float* mixed = x.arena.floats(N * P);
    float* z = mixed + Cc;
    float* beta = z + VD;
    float* g = beta + Hv;
    GemmOutput outs[] = {{.w = &w.qkv, .y = mixed, .ldy = P},
                         {.w = &w.z, .y = z, .ldy = P},
                         {.w = &w.b, .y = beta, .ldy = P},
                         {.w = &w.a, .y = g, .ldy = P}};
    project(x, xn, N, C, outs, c.precision);
    // beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); padded positions: 0 and 0.
    x.ops.delta_gates({.rows = c.rows,
                       .beta = beta,
                       .g = g,
                       .ld = P,
                       .heads = Hv,
                       .neg_decay = w.neg_decay.data<float>(),
                       .dt_bias = w.dt_bias.data<float>()});
    float* conv = x.arena.floats(N * Cc);
    x.ops.causal_conv({.rows = c.rows,
                       .views = c.views,
                       .x = mixed,
                       .ldx = P,
                       .y = conv,
                       .ldy = Cc,
                       .channels = Cc,
                       .kernel = cfg_.conv_kernel,
                       .w = w.conv.data<float>(),
                       .silu = true});
    // q, k: L2-normalised per head (q also scaled by Dk^-0.5), as HF's use_qk_l2norm_in_kernel;
    // k's heads follow q's, so one call does both.
    x.ops.l2_norm({.x = conv,
                   .ldx = Cc,
                   .rows = N,
                   .heads = 2 * Hk,
                   .dim = Dk,
                   .post_scale = 1.0f / std::sqrt(float(Dk)),
                   .unscaled_heads = Hk});
    float* core = x.arena.floats(N * VD);
    x.ops.delta_rule({.rows = c.rows,
                      .views = c.views,
                      .q = conv,
                      .k = conv + KD,
                      .v = conv + 2 * KD,
                      .ld = Cc,
                      .g = g,
                      .beta = beta,
                      .ldg = P,
                      .out = core,
                      .ldo = VD,
                      .k_heads = Hk,
                      .v_heads = Hv,
                      .dk = Dk,
                      .dv = Dv});
    // Gated RMSNorm per (token, value head) with z, then out_proj into the residual.
    const ProjectionInput normed =
        projection_input(x, N, VD, bf16_products(c.precision, w.out), core);
    x.ops.rms_norm({.x = core,
                    .ldx = VD,
                    .hx = Dv,
                    .y = normed.f32,
                    .ldy = VD,
                    .hy = Dv,
                    .rows = N,
                    .heads = Hv,
                    .dim = Dv,
                    .w = w.norm.data<float>(),
                    .eps = cfg_.eps,
                    .scale = NormScale::w,
                    .gate = z,
                    .ldg = P,
                    .hg = Dv,
                    .yb = normed.b16});
    GemmOutput out{.w = &w.out, .y = c.h, .ldy = C, .accumulate = true};
    project(x, normed, N, VD, {&out, 1}, c.precision);
  }

  // Gated full attention: h += o_proj(attention(rope(norm(q)), rope(norm(k)), v) * sigmoid(gate)).
  void attention_mixer(const Exec& x, const Qwen35AttentionWeights& w, const LayerCall& c,
                       ProjectionInput xn) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden;
    const int64_t Hq = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
    const int64_t QW = Hq * 2 * D, KW = Hkv * D, OW = Hq * D;
    float* qg = x.arena.floats(N * QW);
    float* k = x.arena.floats(N * KW);
    float* v = x.arena.floats(N * KW);
    GemmOutput outs[] = {{.w = &w.q, .y = qg, .ldy = QW},
                         {.w = &w.k, .y = k, .ldy = KW},
                         {.w = &w.v, .y = v, .ldy = KW}};
    project(x, xn, N, C, outs, c.precision);
    // q: the first half of each head's 2D block of q_proj, normed per head into its own buffer;
    // k normed in place; both rotated; this call's real K/V into the rows' own buffers.
    float* q = x.arena.floats(N * OW);
    x.ops.rms_norm({.x = qg,
                    .ldx = QW,
                    .hx = 2 * D,
                    .y = q,
                    .ldy = OW,
                    .rows = N,
                    .heads = Hq,
                    .dim = D,
                    .w = w.q_norm.data<float>(),
                    .eps = cfg_.eps,
                    .scale = NormScale::one_plus_w});
    x.ops.rms_norm({.x = k,
                    .ldx = KW,
                    .y = k,
                    .ldy = KW,
                    .rows = N,
                    .heads = Hkv,
                    .dim = D,
                    .w = w.k_norm.data<float>(),
                    .eps = cfg_.eps,
                    .scale = NormScale::one_plus_w});
    x.ops.rope({.rows = c.rows, .table = &rope_, .x = q, .ldx = OW, .heads = Hq, .hs = D});
    x.ops.rope({.rows = c.rows, .table = &rope_, .x = k, .ldx = KW, .heads = Hkv, .hs = D});
    float* o = self_attention(x, {.call = &c,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .heads = Hq,
                                  .kv_heads = Hkv,
                                  .head_dim = D,
                                  .scale = 1.0f / std::sqrt(float(D)),
                                  .bf16 = bf16_products(c.precision, w.q)});
    // o * sigmoid(gate): the gate is the second half of each head's 2D block of q_proj.
    const ProjectionInput gated = projection_input(x, N, OW, bf16_products(c.precision, w.o), o);
    x.ops.glu({.gate = qg + D,
               .ldg = 2 * D,
               .out = o,
               .ldo = D,
               .rows = N * Hq,
               .n = D,
               .act = Activation::sigmoid,
               .outb = gated.b16});
    GemmOutput out{.w = &w.o, .y = c.h, .ldy = C, .accumulate = true};
    project(x, gated, N, OW, {&out, 1}, c.precision);
  }

  Qwen35Config cfg_;
  BackboneSpec spec_;
  Tensor embed_, head_;
  Tensor final_norm_;
  std::vector<Qwen35LayerWeights> layers_;
  RopeTable rope_;
};

}  // namespace

bool qwen35_handles(const std::string& model_type) {
  return model_type == "qwen3_5" || model_type == "qwen3_5_text";
}

Qwen35Config Qwen35Config::from_json(const JsonConfig& root) {
  const JsonConfig t = root.text();
  Qwen35Config c;
  c.vocab = t.get_in<int64_t>("vocab_size", 1, kMaxConfigVocab);
  c.hidden = t.get_in<int64_t>("hidden_size", 1, kMaxConfigHidden);
  c.intermediate = t.get_in<int64_t>("intermediate_size", 1, kMaxConfigWidth);
  const int64_t n_layers = t.get_in<int64_t>("num_hidden_layers", 1, kMaxConfigLayers);
  c.heads = t.get_in<int64_t>("num_attention_heads", 1, kMaxConfigHeads);
  c.kv_heads = t.get_in<int64_t>("num_key_value_heads", 1, kMaxConfigHeads);
  c.head_dim = t.get_or_in<int64_t>("head_dim", c.hidden / c.heads, 1, kMaxConfigHeadDim);
  c.lin_k_heads = t.get_in<int64_t>("linear_num_key_heads", 1, kMaxConfigHeads);
  c.lin_v_heads = t.get_in<int64_t>("linear_num_value_heads", 1, kMaxConfigHeads);
  c.lin_k_dim = t.get_in<int64_t>("linear_key_head_dim", 1, kMaxConfigHeadDim);
  c.lin_v_dim = t.get_in<int64_t>("linear_value_head_dim", 1, kMaxConfigHeadDim);
  c.conv_kernel = t.get_or_in<int64_t>("linear_conv_kernel_dim", 4, 1, kMaxConfigConvKernel);
  c.eps = float(t.get_or_in<double>("rms_norm_eps", 1e-6, kMinConfigEps, kMaxConfigEps));
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
    const int64_t every = t.get_or_in<int64_t>("full_attention_interval", 4, 1, kMaxConfigLayers);
    for (int64_t i = 0; i < n_layers; ++i)
      c.layers.push_back((i + 1) % every ? LayerKind::recurrent : LayerKind::attention);
  }
  if (int64_t(c.layers.size()) != n_layers) {
    throw unsupported("layer_types", fmt::format("{} layer types for num_hidden_layers {}",
                                                 c.layers.size(), n_layers));
  }
  // Rotary: rope_parameters (transformers 5) wins over the legacy top-level keys.
  c.rope_theta = t.get_or_in<double>("rope_theta", 10000.0, kMinRopeTheta, kMaxRopeTheta);
  c.partial_rotary = t.get_or_in<double>("partial_rotary_factor", 0.25, 0.0, 1.0);
  if (t.has("rope_parameters")) {
    const JsonConfig rp = t.sub("rope_parameters");
    if (rp.get_or<std::string>("rope_type", "default") != "default") {
      throw unsupported("rope_parameters", "only rope_type \"default\" is supported");
    }
    c.rope_theta = rp.get_or_in<double>("rope_theta", c.rope_theta, kMinRopeTheta, kMaxRopeTheta);
    c.partial_rotary = rp.get_or_in<double>("partial_rotary_factor", c.partial_rotary, 0.0, 1.0);
  }
  c.tied = root.has("tie_word_embeddings") ? root.get<bool>("tie_word_embeddings")
                                           : t.get_or<bool>("tie_word_embeddings", false);
  if (c.heads % c.kv_heads || c.lin_v_heads % c.lin_k_heads || c.head_dim < 1) {
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

std::unique_ptr<Family> qwen35_family(const Qwen35Config& cfg, const TensorMap& weights,
                                      const Ops& ops) {
  return std::make_unique<Qwen35>(cfg, weights, ops);
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
