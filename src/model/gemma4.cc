// Gemma 4 text backbone: config.json -> Gemma4Config, the tensor table, and the layer math as HF
// transformers computes it (models/gemma4, Gemma4TextModel): embedding scaled by sqrt(C);
// per-layer embeddings (PLE: a token table row scaled by sqrt(P) plus a normed projection of the
// embedding, times 2^-0.5, one P-wide slice per layer, carried in the residual stream's side
// lanes); per layer: RMSNorm (plain `w` scale) -> attention (q/k RMSNorm, v RMSNorm without
// scale, rotary per layer kind, scale 1, sliding window on sliding layers, K/V-sharing layers on
// their source's K/V) -> post-attention norm + residual -> GeGLU MLP (tanh GELU) between pre-
// and post-feedforward norms + residual -> PLE gate (GELU(h Wg) * ple, projected, normed) +
// residual -> the layer scalar; final norm, tied or untied head, final logit soft-cap (in
// Backbone::lm_logits). Letters as in backbone.h; N = B * L token rows, S stream width, P PLE
// width, NL layers.
#include "model/gemma4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/family_common.h"

namespace deg {

namespace {

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kGlobal = "full_attention";

struct Gemma4LayerWeights {
  // Every tensor on the family's backend (small f32 vectors too).
  Tensor input_norm, post_attn_norm, pre_ff_norm, post_ff_norm;  // [C]
  Tensor q, k, v, o;          // [Hq*D, C], [Hkv*D, C], [Hkv*D, C], [C, Hq*D]
  Tensor q_norm, k_norm;      // [D]
  Tensor gate, up, down;      // [I, C], [I, C], [C, I]
  Tensor ple_gate, ple_proj;  // [P, C], [C, P]
  Tensor post_ple_norm;       // [C]
  float scalar = 1.0f;
  RopeTable rope;
};

RopeTable layer_rope(const Gemma4Rope& r, int64_t head_dim) {
  if (!r.proportional) return rope_table(head_dim, 1.0, r.theta);
  // HF _compute_proportional_rope_parameters: int(partial * D // 2) turning frequencies
  // 1/theta^(2i/D) over the whole head (pairs i, i + D/2), the rest 0, all divided by factor.
  RopeTable t = rope_table(head_dim, 1.0, r.theta);
  const auto angles = int64_t(std::floor(r.partial * double(head_dim) / 2.0));
  for (int64_t i = 0; i < int64_t(t.inv_freq.size()); ++i) {
    if (i >= angles) t.inv_freq[size_t(i)] = 0.0f;
    t.inv_freq[size_t(i)] /= float(r.factor);
  }
  return t;
}

class Gemma4 final : public Family {
 public:
  Gemma4(const Gemma4Config& cfg, const TensorMap& w, const Ops& ops) : Family(ops), cfg_(cfg) {
    const int64_t C = cfg.hidden, V = cfg.vocab, P = cfg.ple_dim;
    const int64_t NL = int64_t(cfg.layers.size());
    embed_ = weight_on(ops, w, "embed_tokens.weight", {V, C});
    head_ = cfg.tied ? embed_ : weight_on(ops, w, "lm_head.weight", {V, C});
    final_norm_ = vector_on(ops, weight_f32(w, "norm.weight", {C}));
    spec_ = {.family = "gemma4",
             .hidden = C,
             .vocab = V,
             .stream = P > 0 ? C + NL * P : 0,
             .layers = {},
             .logit_softcap = cfg.softcap,
             .soft_id = cfg.pad_id,
             .media = cfg.media};
    if (P > 0) {
      ple_table_ = weight_on(ops, w, "embed_tokens_per_layer.weight", {cfg.ple_vocab, NL * P});
      ple_model_proj_ = weight_on(ops, w, "per_layer_model_projection.weight", {NL * P, C});
      ple_norm_ = vector_on(ops, weight_f32(w, "per_layer_projection_norm.weight", {P}));
    }
    for (int64_t i = 0; i < NL; ++i) {
      const Gemma4Layer& g = cfg.layers[size_t(i)];
      const int64_t Hq = g.heads, Hkv = g.kv_heads, D = g.head_dim, I = g.intermediate;
      auto n = [&](const std::string& s) { return layer_name(i, s); };
      Gemma4LayerWeights l;
      l.input_norm = vector_on(ops, weight_f32(w, n("input_layernorm.weight"), {C}));
      l.post_attn_norm = vector_on(ops, weight_f32(w, n("post_attention_layernorm.weight"), {C}));
      l.pre_ff_norm = vector_on(ops, weight_f32(w, n("pre_feedforward_layernorm.weight"), {C}));
      l.post_ff_norm = vector_on(ops, weight_f32(w, n("post_feedforward_layernorm.weight"), {C}));
      l.q = weight_on(ops, w, n("self_attn.q_proj.weight"), {Hq * D, C});
      l.o = weight_on(ops, w, n("self_attn.o_proj.weight"), {C, Hq * D});
      l.q_norm = vector_on(ops, weight_f32(w, n("self_attn.q_norm.weight"), {D}));
      if (g.kv_source < 0) {
        l.k = weight_on(ops, w, n("self_attn.k_proj.weight"), {Hkv * D, C});
        l.v = weight_on(ops, w, n("self_attn.v_proj.weight"), {Hkv * D, C});
        l.k_norm = vector_on(ops, weight_f32(w, n("self_attn.k_norm.weight"), {D}));
      }
      l.gate = weight_on(ops, w, n("mlp.gate_proj.weight"), {I, C});
      l.up = weight_on(ops, w, n("mlp.up_proj.weight"), {I, C});
      l.down = weight_on(ops, w, n("mlp.down_proj.weight"), {C, I});
      if (P > 0) {
        l.ple_gate = weight_on(ops, w, n("per_layer_input_gate.weight"), {P, C});
        l.ple_proj = weight_on(ops, w, n("per_layer_projection.weight"), {C, P});
        l.post_ple_norm = vector_on(ops, weight_f32(w, n("post_per_layer_input_norm.weight"), {C}));
      }
      // A persistent buffer in HF (ones at init); snapshots that lack it mean 1.
      if (w.count(n("layer_scalar"))) l.scalar = weight_f32(w, n("layer_scalar"), {1})[0];
      l.rope = layer_rope(g.sliding ? cfg.sliding_rope : cfg.global_rope, D);
      layers_.push_back(std::move(l));
      spec_.layers.push_back({.kind = LayerKind::attention,
                              .kv_heads = Hkv,
                              .head_dim = D,
                              .window = g.sliding ? cfg.window : 0,
                              .kv_source = g.kv_source});
    }
  }

  const BackboneSpec& spec() const override { return spec_; }
  const Tensor& lm_head() const override { return head_; }

  // As HF's Gemma4Model merges media: a soft token's embedding replaces the scaled token
  // embedding as given, its per-layer inputs project that embedding and look up the pad id.
  void embed_rows(const Exec& x, const EmbedCall& e) const override {
    const int64_t n = e.rows.n(), C = cfg_.hidden, S = spec_.stream_width(), P = cfg_.ple_dim;
    x.ops.gather({.table = &embed_,
                  .ids = e.ids,
                  .n = n,
                  .y = e.h,
                  .ldy = S,
                  .scale = float(std::sqrt(double(C))),
                  .soft_rows = e.soft_rows,
                  .soft = e.soft});
    if (P == 0) return;
    // Per-layer inputs in lanes [C, C + NL*P): (norm(h Wpᵀ C^-1/2) + table[id] sqrt(P)) 2^-1/2.
    const int64_t NL = int64_t(cfg_.layers.size());
    float* side = e.h + C;
    GemmOutput proj{.w = &ple_model_proj_, .y = side, .ldy = S};
    x.ops.gemm({.x = e.h, .m = n, .k = C, .ldx = S, .outputs = {&proj, 1}});
    x.ops.scale(
        {.y = side, .ldy = S, .rows = n, .n = NL * P, .s = float(std::pow(double(C), -0.5))});
    x.ops.rms_norm({.x = side,
                    .ldx = S,
                    .y = side,
                    .ldy = S,
                    .rows = n,
                    .heads = NL,
                    .dim = P,
                    .w = ple_norm_.data<float>(),
                    .eps = cfg_.eps,
                    .scale = NormScale::w});
    x.ops.gather({.table = &ple_table_,
                  .ids = e.ids,
                  .n = n,
                  .y = side,
                  .ldy = S,
                  .scale = float(std::sqrt(double(P))),
                  .keep = true,
                  .mix = float(std::pow(2.0, -0.5))});
  }

  void final_norm(const Exec& x, const float* h, float* out, int64_t n) const override {
    norm_rows(x, h, cfg_.hidden, {.f32 = out}, cfg_.hidden, n, final_norm_.data<float>());
  }

  void layer(const Exec& x, int index, const LayerCall& c) const override {
    const Gemma4LayerWeights& w = layers_[size_t(index)];
    const Gemma4Layer& g = cfg_.layers[size_t(index)];
    const int64_t N = c.rows.n(), C = cfg_.hidden, S = spec_.stream_width();
    const ProjectionInput xn =
        projection_input(x, N, C, bf16_products(c.precision, {&w.q, &w.k, &w.v}));
    float* out = x.arena.floats(N * C);
    norm_rows(x, c.h, S, xn, C, N, w.input_norm.data<float>());
    attention_block(x, w, g, c, xn, out);
    add_normed(x, c.h, out, N, w.post_attn_norm);
    mlp(x, w, g, c, out);
    if (cfg_.ple_dim > 0) per_layer_input(x, w, index, c, out);
    if (w.scalar != 1.0f) x.ops.scale({.y = c.h, .ldy = S, .rows = N, .n = C, .s = w.scalar});
  }

 private:
  // y[r] = norm(x[r]) * w over n rows of C at strides ldx / ldy.
  void norm_rows(const Exec& x, const float* in, int64_t ldx, ProjectionInput y, int64_t ldy,
                 int64_t n, const float* w) const {
    x.ops.rms_norm({.x = in,
                    .ldx = ldx,
                    .y = y.f32,
                    .ldy = ldy,
                    .rows = n,
                    .dim = cfg_.hidden,
                    .w = w,
                    .eps = cfg_.eps,
                    .scale = NormScale::w,
                    .yb = y.b16});
  }

  // h[:, :C] += norm(y) * w for y [N, C] (normed in place).
  void add_normed(const Exec& x, float* h, float* y, int64_t n, const Tensor& w) const {
    const int64_t C = cfg_.hidden;
    norm_rows(x, y, C, {.f32 = y}, C, n, w.data<float>());
    x.ops.binary({.a = y, .lda = C, .y = h, .ldy = spec_.stream_width(), .rows = n, .n = C});
  }

  // out [N, C] = o_proj(attention(rope(norm(q)), rope(norm(k)), norm(v))); owner layers write
  // this call's real K/V into the rows' own buffers first.
  void attention_block(const Exec& x, const Gemma4LayerWeights& w, const Gemma4Layer& g,
                       const LayerCall& c, ProjectionInput xn, float* out) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden;
    const int64_t Hq = g.heads, Hkv = g.kv_heads, D = g.head_dim;
    const int64_t QW = Hq * D, KW = Hkv * D;
    const bool owner = g.kv_source < 0;
    float* q = x.arena.floats(N * QW);
    float* k = owner ? x.arena.floats(N * KW) : nullptr;
    float* v = owner ? x.arena.floats(N * KW) : nullptr;
    GemmOutput outs[] = {{.w = &w.q, .y = q, .ldy = QW},
                         {.w = &w.k, .y = k, .ldy = KW},
                         {.w = &w.v, .y = v, .ldy = KW}};
    project(x, xn, N, C, {outs, size_t(owner ? 3 : 1)}, c.precision);
    // Per head: RMSNorm of q and k (scaled), of v (no scale); q and k rotated.
    auto norm_heads = [&](float* p, int64_t heads, const float* scale) {
      x.ops.rms_norm({.x = p,
                      .ldx = heads * D,
                      .y = p,
                      .ldy = heads * D,
                      .rows = N,
                      .heads = heads,
                      .dim = D,
                      .w = scale,
                      .eps = cfg_.eps,
                      .scale = NormScale::w});
    };
    norm_heads(q, Hq, w.q_norm.data<float>());
    x.ops.rope({.rows = c.rows, .table = &w.rope, .x = q, .ldx = QW, .heads = Hq, .hs = D});
    if (owner) {
      norm_heads(k, Hkv, w.k_norm.data<float>());
      norm_heads(v, Hkv, nullptr);
      x.ops.rope({.rows = c.rows, .table = &w.rope, .x = k, .ldx = KW, .heads = Hkv, .hs = D});
    }
    float* o = self_attention(x, {.call = &c,
                                  .q = q,
                                  .k = owner ? k : nullptr,
                                  .v = owner ? v : nullptr,
                                  .heads = Hq,
                                  .kv_heads = Hkv,
                                  .head_dim = D,
                                  .scale = 1.0f,  // q/k norms replace the 1/sqrt(D) scale
                                  .window = g.sliding ? cfg_.window : 0,
                                  .bf16 = bf16_products(c.precision, w.q)});
    GemmOutput proj{.w = &w.o, .y = out, .ldy = C};
    x.ops.gemm(
        {.x = o, .m = N, .k = QW, .ldx = QW, .outputs = {&proj, 1}, .precision = c.precision});
  }

  // h += post_ff_norm(down(gelu(gate(x)) * up(x))), x = pre_ff_norm(h).
  void mlp(const Exec& x, const Gemma4LayerWeights& w, const Gemma4Layer& g, const LayerCall& c,
           float* out) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden, I = g.intermediate;
    const ProjectionInput xn =
        projection_input(x, N, C, bf16_products(c.precision, {&w.gate, &w.up}));
    norm_rows(x, c.h, spec_.stream_width(), xn, C, N, w.pre_ff_norm.data<float>());
    float* gate = x.arena.floats(N * I);
    float* up = x.arena.floats(N * I);
    GemmOutput outs[] = {{.w = &w.gate, .y = gate, .ldy = I}, {.w = &w.up, .y = up, .ldy = I}};
    project(x, xn, N, C, outs, c.precision);
    const ProjectionInput act = projection_input(x, N, I, bf16_products(c.precision, w.down), gate);
    x.ops.glu({.gate = gate,
               .ldg = I,
               .up = up,
               .ldu = I,
               .out = act.f32,
               .ldo = I,
               .rows = N,
               .n = I,
               .act = Activation::gelu_tanh,
               .outb = act.b16});
    GemmOutput down{.w = &w.down, .y = out, .ldy = C};
    project(x, act, N, I, {&down, 1}, c.precision);
    add_normed(x, c.h, out, N, w.post_ff_norm);
  }

  // h += post_ple_norm(proj(gelu(gate(h)) * ple_layer)), ple_layer = stream lanes of `index`.
  void per_layer_input(const Exec& x, const Gemma4LayerWeights& w, int index, const LayerCall& c,
                       float* out) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden, P = cfg_.ple_dim;
    const int64_t S = spec_.stream_width();
    float* g = x.arena.floats(N * P);
    GemmOutput gate{.w = &w.ple_gate, .y = g, .ldy = P};
    x.ops.gemm(
        {.x = c.h, .m = N, .k = C, .ldx = S, .outputs = {&gate, 1}, .precision = c.precision});
    const ProjectionInput act =
        projection_input(x, N, P, bf16_products(c.precision, w.ple_proj), g);
    x.ops.glu({.gate = g,
               .ldg = P,
               .up = c.h + C + int64_t(index) * P,
               .ldu = S,
               .out = act.f32,
               .ldo = P,
               .rows = N,
               .n = P,
               .act = Activation::gelu_tanh,
               .outb = act.b16});
    GemmOutput proj{.w = &w.ple_proj, .y = out, .ldy = C};
    project(x, act, N, P, {&proj, 1}, c.precision);
    add_normed(x, c.h, out, N, w.post_ple_norm);
  }

  Gemma4Config cfg_;
  BackboneSpec spec_;
  Tensor embed_, head_;
  Tensor ple_table_, ple_model_proj_;  // [Vp, NL*P] (mapped on the CPU), [NL*P, C]
  Tensor ple_norm_;                    // [P]
  Tensor final_norm_;                  // [C]
  std::vector<Gemma4LayerWeights> layers_;
};

}  // namespace

Gemma4Config Gemma4Config::preset(const std::string& size) {
  return from_json(JsonConfig(gemma4_preset_json(size), "<gemma4 preset " + size + ">"));
}

Json gemma4_preset_json(const std::string& size) {
  if (size != "e2b") {
    throw Error(ErrorKind::invalid_argument, "unknown Gemma 4 size \"" + size + "\" (known: e2b)");
  }
  // Gemma 4 E2B's text decoder as publicly described: 35 layers of 4 sliding (window 512, head
  // dim 256) : 1 global (head dim 512, proportional rotary 0.25); 8 query heads over 1 K/V head;
  // width 1536, MLP 6144 (double on the 20 K/V-sharing layers); per-layer embeddings of 256;
  // vocabulary 262144; final soft-cap 30.
  Json types = Json::array();
  for (int i = 0; i < 35; ++i) types.push_back(i % 5 == 4 ? kGlobal : kSliding);
  return {
      {"model_type", "gemma4_text"},
      {"architectures", {"Gemma4ForCausalLM"}},
      {"vocab_size", 262144},
      {"hidden_size", 1536},
      {"intermediate_size", 6144},
      {"num_hidden_layers", 35},
      {"layer_types", types},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 1},
      {"head_dim", 256},
      {"global_head_dim", 512},
      {"sliding_window", 512},
      {"num_kv_shared_layers", 20},
      {"use_double_wide_mlp", true},
      {"hidden_size_per_layer_input", 256},
      {"final_logit_softcapping", 30.0},
      {"rope_parameters",
       {{kSliding, {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
        {kGlobal,
         {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}}}}}};
}

bool gemma4_handles(const std::string& model_type) {
  return model_type == "gemma4" || model_type == "gemma4_text";
}

Gemma4Config Gemma4Config::from_json(const JsonConfig& root) {
  const JsonConfig t = root.text();
  auto unsupported = [&](const std::string& key, const std::string& what) {
    return Error(ErrorKind::unsupported, what, {.path = t.path()})
        .with_pointer(t.pointer() + "/" + key);
  };
  Gemma4Config c;
  c.vocab = t.get_in<int64_t>("vocab_size", 1, kMaxConfigVocab);
  c.hidden = t.get_in<int64_t>("hidden_size", 1, kMaxConfigHidden);
  c.intermediate = t.get_in<int64_t>("intermediate_size", 1, kMaxConfigWidth);
  const int64_t n = t.get_in<int64_t>("num_hidden_layers", 1, kMaxConfigLayers);
  const int64_t heads = t.get_in<int64_t>("num_attention_heads", 1, kMaxConfigHeads);
  const int64_t kv_heads = t.get_in<int64_t>("num_key_value_heads", 1, kMaxConfigHeads);
  const int64_t head_dim = t.get_or_in<int64_t>("head_dim", c.hidden / heads, 1, kMaxConfigHeadDim);
  const int64_t global_dim =
      t.get_or_in<int64_t>("global_head_dim", head_dim, 1, kMaxConfigHeadDim);
  c.eps = float(t.get_or_in<double>("rms_norm_eps", 1e-6, kMinConfigEps, kMaxConfigEps));
  c.ple_dim = t.get_or_in<int64_t>("hidden_size_per_layer_input", 0, 0, kMaxConfigHidden);
  c.ple_vocab = t.get_or_in<int64_t>("vocab_size_per_layer_input", c.vocab, 1, kMaxConfigVocab);
  c.softcap = float(t.get_or_in<double>("final_logit_softcapping", 0.0, 0.0, kMaxConfigSoftcap));
  c.tied = root.has("tie_word_embeddings") ? root.get<bool>("tie_word_embeddings")
                                           : t.get_or<bool>("tie_word_embeddings", true);
  if (t.get_or<std::string>("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh") {
    throw unsupported("hidden_activation",
                      "only hidden_activation \"gelu_pytorch_tanh\" is supported");
  }
  for (const char* off : {"attention_bias", "attention_k_eq_v", "enable_moe_block"}) {
    if (t.get_or<bool>(off, false)) {
      throw unsupported(off, std::string(off) +
                                 " true is not supported (no such Gemma 4 text "
                                 "model runs in deg yet)");
    }
  }
  bool images_bidirectional = false;  // not implemented: such a model reads no image parts
  if (auto it = t.json().find("use_bidirectional_attention"); it != t.json().end()) {
    // "vision" makes image tokens bidirectional; text stays causal. "all" / true does not.
    if ((it->is_boolean() && it->get<bool>()) || (it->is_string() && *it == "all")) {
      throw unsupported("use_bidirectional_attention",
                        "bidirectional text attention is not "
                        "supported");
    }
    images_bidirectional = it->is_string() && *it == "vision";
  }
  // The text pad id stands at soft positions (the per-layer embedding reads it there).
  const int64_t pad = t.get_or<int64_t>("pad_token_id", 0);
  if (pad < 0 || pad >= c.vocab) {
    throw unsupported("pad_token_id",
                      fmt::format("pad_token_id {} outside the vocabulary of {}", pad, c.vocab));
  }
  c.pad_id = int32_t(pad);
  // Media kinds: those whose encoder the multimodal snapshot configures, with the ids at its
  // root (HF's defaults when absent); a kind with an id outside the vocabulary is left out.
  auto media_id = [&](const char* key, int64_t fallback) {
    return root.get_or<int64_t>(key, fallback);
  };
  const auto in_vocab = [&](int64_t id) { return id >= 0 && id < c.vocab; };
  struct Kind {
    const char* name;
    const char* encoder;
    int64_t open, placeholder, close;
  };
  for (const Kind& k : {Kind{"image", "vision_config", media_id("boi_token_id", 255999),
                             media_id("image_token_id", 258880), media_id("eoi_token_id", 258882)},
                        Kind{"audio", "audio_config", media_id("boa_token_id", 256000),
                             media_id("audio_token_id", 258881),
                             media_id("eoa_token_index", media_id("eoa_token_id", 258883))}}) {
    if (!root.has("text_config") || !root.has(k.encoder)) continue;  // gemma4_text: no encoders
    if (images_bidirectional && std::string(k.name) == "image") continue;
    if (in_vocab(k.open) && in_vocab(k.placeholder) && in_vocab(k.close))
      c.media.push_back({k.name, int32_t(k.open), int32_t(k.placeholder), int32_t(k.close)});
  }

  if (!t.has("layer_types")) {
    throw unsupported("layer_types",
                      "layer_types is missing: list \"sliding_attention\" / "
                      "\"full_attention\" for every layer");
  }
  const auto types = t.get<std::vector<std::string>>("layer_types");
  if (int64_t(types.size()) != n) {
    throw unsupported("layer_types",
                      fmt::format("{} layer types for num_hidden_layers {}", types.size(), n));
  }
  const int64_t shared = t.get_or<int64_t>("num_kv_shared_layers", 0);
  if (shared < 0 || shared >= n) {
    throw unsupported("num_kv_shared_layers",
                      fmt::format("num_kv_shared_layers {} must leave at least one of {} layers "
                                  "computing K/V",
                                  shared, n));
  }
  const bool double_wide = t.get_or<bool>("use_double_wide_mlp", false);
  for (int64_t i = 0; i < n; ++i) {
    const std::string& type = types[size_t(i)];
    if (type != kSliding && type != kGlobal) {
      throw unsupported("layer_types", "unknown layer type \"" + type +
                                           "\" (expected sliding_attention or full_attention)");
    }
    const bool sliding = type == kSliding, wide = double_wide && i >= n - shared;
    c.layers.push_back({.sliding = sliding,
                        .heads = heads,
                        .kv_heads = kv_heads,
                        .head_dim = sliding ? head_dim : global_dim,
                        .intermediate = c.intermediate * (wide ? 2 : 1)});
  }
  // per_layer_config (transformers >= 5.15): {"<layer>": {"head_dim": .., ...}} overrides.
  if (auto plc = t.json().find("per_layer_config"); plc != t.json().end() && plc->is_object()) {
    for (auto it = plc->begin(); it != plc->end(); ++it) {
      const std::string at = "per_layer_config/" + it.key();
      const std::string& key = it.key();
      if (key.empty() || key.size() > 9 ||
          key.find_first_not_of("0123456789") != std::string::npos || std::stoll(key) >= n ||
          !it->is_object()) {
        throw unsupported(at, "per_layer_config keys must be layer indices below " +
                                  std::to_string(n) + " with an object each");
      }
      Gemma4Layer& l = c.layers[size_t(std::stoll(key))];
      for (auto f = it->begin(); f != it->end(); ++f) {
        const Json& value = f.value();
        if (f.key() == "head_dim" && value.is_number_integer()) {
          l.head_dim = value.get<int64_t>();
        } else if (f.key() == "num_key_value_heads" && value.is_number_integer()) {
          l.kv_heads = value.get<int64_t>();
        } else if (f.key() == "num_attention_heads" && value.is_number_integer()) {
          l.heads = value.get<int64_t>();
        } else if (!value.is_null() &&
                   !(t.json().contains(f.key()) && t.json()[f.key()] == value)) {
          throw unsupported(at + "/" + f.key(),
                            "per-layer setting \"" + f.key() + "\" is not supported");
        }
      }
    }
  }
  // K/V-sharing layers read the last earlier computing layer of their kind.
  for (int64_t i = n - shared; i < n; ++i) {
    Gemma4Layer& l = c.layers[size_t(i)];
    for (int64_t j = n - shared - 1; j >= 0 && l.kv_source < 0; --j)
      if (c.layers[size_t(j)].sliding == l.sliding) l.kv_source = int(j);
    if (l.kv_source < 0) {
      throw unsupported("num_kv_shared_layers",
                        fmt::format("shared layer {} has no earlier {} layer to read K/V from", i,
                                    types[size_t(i)]));
    }
    const Gemma4Layer& src = c.layers[size_t(l.kv_source)];
    if (src.kv_heads != l.kv_heads || src.head_dim != l.head_dim) {
      throw unsupported(
          "num_kv_shared_layers",
          fmt::format("shared layer {} and its K/V source {} differ in shape", i, l.kv_source));
    }
  }
  const bool any_sliding =
      std::any_of(c.layers.begin(), c.layers.end(), [](const Gemma4Layer& l) { return l.sliding; });
  if (any_sliding) c.window = t.get_in<int64_t>("sliding_window", 1, kMaxConfigWindow);
  // Rotary per layer kind: rope_parameters {"sliding_attention": {..}, "full_attention": {..}}
  // (HF's defaults when absent).
  if (t.has("rope_parameters")) {
    const JsonConfig rp = t.sub("rope_parameters");
    for (const char* kind : {kSliding, kGlobal}) {
      if (!rp.has(kind)) continue;
      const JsonConfig r = rp.sub(kind);
      Gemma4Rope& out = std::string(kind) == kSliding ? c.sliding_rope : c.global_rope;
      const std::string type = r.get_or<std::string>("rope_type", "default");
      if (type != "default" && type != "proportional") {
        throw Error(ErrorKind::unsupported,
                    "rope_type \"" + type + "\" (supported: default, proportional)",
                    {.path = t.path()})
            .with_pointer(r.pointer() + "/rope_type");
      }
      out = {.proportional = type == "proportional",
             .theta = r.get_or_in<double>("rope_theta", out.theta, kMinRopeTheta, kMaxRopeTheta),
             .partial = r.get_or_in<double>("partial_rotary_factor", 1.0, 0.0, 1.0),
             .factor = r.get_or_in<double>("factor", 1.0, 1e-6, 1e6)};
    }
  }
  for (const Gemma4Layer& l : c.layers) {
    if (l.heads <= 0 || l.kv_heads <= 0 || l.heads % l.kv_heads || l.head_dim <= 0 ||
        l.head_dim % 2 || l.head_dim > 512) {
      throw Error(ErrorKind::format,
                  fmt::format("inconsistent attention shape: {} q / {} kv heads of dim {}", l.heads,
                              l.kv_heads, l.head_dim),
                  {.path = t.path()});
    }
  }
  if ((any_sliding && c.window < 1) || c.ple_dim < 0 || (c.ple_dim > 0 && c.ple_vocab < c.vocab)) {
    throw Error(ErrorKind::format,
                fmt::format("inconsistent settings: sliding_window {}, hidden_size_per_layer_input "
                            "{}, vocab_size_per_layer_input {} (vocab_size {})",
                            c.window, c.ple_dim, c.ple_vocab, c.vocab),
                {.path = t.path()});
  }
  return c;
}

std::vector<std::pair<std::string, Shape>> gemma4_tensor_table(const Gemma4Config& c) {
  const int64_t C = c.hidden, P = c.ple_dim, NL = int64_t(c.layers.size());
  std::vector<std::pair<std::string, Shape>> t{{"embed_tokens.weight", {c.vocab, C}},
                                               {"norm.weight", {C}}};
  if (!c.tied) t.push_back({"lm_head.weight", {c.vocab, C}});
  if (P > 0) {
    t.push_back({"embed_tokens_per_layer.weight", {c.ple_vocab, NL * P}});
    t.push_back({"per_layer_model_projection.weight", {NL * P, C}});
    t.push_back({"per_layer_projection_norm.weight", {P}});
  }
  for (int64_t i = 0; i < NL; ++i) {
    const Gemma4Layer& g = c.layers[size_t(i)];
    const int64_t D = g.head_dim, I = g.intermediate;
    auto add = [&](const std::string& n, Shape s) { t.push_back({layer_name(i, n), s}); };
    add("input_layernorm.weight", {C});
    add("post_attention_layernorm.weight", {C});
    add("pre_feedforward_layernorm.weight", {C});
    add("post_feedforward_layernorm.weight", {C});
    add("self_attn.q_proj.weight", {g.heads * D, C});
    add("self_attn.q_norm.weight", {D});
    add("self_attn.o_proj.weight", {C, g.heads * D});
    if (g.kv_source < 0) {
      add("self_attn.k_proj.weight", {g.kv_heads * D, C});
      add("self_attn.v_proj.weight", {g.kv_heads * D, C});
      add("self_attn.k_norm.weight", {D});
    }
    add("mlp.gate_proj.weight", {I, C});
    add("mlp.up_proj.weight", {I, C});
    add("mlp.down_proj.weight", {C, I});
    if (P > 0) {
      add("per_layer_input_gate.weight", {P, C});
      add("per_layer_projection.weight", {C, P});
      add("post_per_layer_input_norm.weight", {C});
    }
    add("layer_scalar", {1});
  }
  return t;
}

std::unique_ptr<Family> gemma4_family(const Gemma4Config& cfg, const TensorMap& weights,
                                      const Ops& ops) {
  return std::make_unique<Gemma4>(cfg, weights, ops);
}

TensorMap gemma4_random_weights(const Gemma4Config& cfg, DType dtype, uint64_t seed) {
  const auto table = gemma4_tensor_table(cfg);
  std::set<std::string> vectors;  // norm weights (plain `w` scale) and layer scalars
  for (const auto& [name, shape] : table)
    if (shape.size() == 1) vectors.insert(name);
  return random_weights({.table = &table,
                         .dtype = dtype,
                         .seed = seed,
                         .f32 = [](const std::string&, const Shape& s) { return s.size() == 1; },
                         .adjust =
                             [&vectors](const std::string& name, float unit, float x) {
                               if (name.ends_with("layer_scalar")) return 0.5f + unit;
                               if (vectors.contains(name)) return 1.0f + (unit - 0.5f) * 0.2f;
                               return x;
                             }});
}

}  // namespace deg
