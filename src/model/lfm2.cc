// LFM2 / LFM2.5 text backbone: config.json -> Lfm2Config, the tensor table, and the layer math as
// HF transformers computes it (models/lfm2): gated short-conv layers (in_proj -> B, C, x; a
// depthwise causal conv of kernel K over B * x, no activation, its last K-1 inputs kept as the
// row's conv tail; out_proj of C * conv), full attention with per-head q/k RMSNorm, full-width
// rotary and GQA, a SwiGLU MLP (w1 gate, w3 up, w2 down), RMSNorm `w * norm(x)` everywhere,
// embedding_norm as the final norm, tied head. Letters as in backbone.h; I the MLP width,
// N = B * L token rows of a call.
#include "model/lfm2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "kernels/ops.h"

namespace deg {

namespace {

// Every tensor on the family's backend (small f32 vectors too).
struct ConvWeights {
  Tensor in, out;  // [3C, C] (rows: B, C, x), [C, C]
  Tensor conv;     // [C, K]
};

struct Lfm2AttentionWeights {
  Tensor q, k, v, o;      // [Hq*D, C], [Hkv*D, C], [Hkv*D, C], [C, Hq*D]
  Tensor q_norm, k_norm;  // [D]
};

struct Lfm2LayerWeights {
  LayerKind kind = LayerKind::recurrent;
  Tensor operator_norm, ffn_norm;  // [C]
  Tensor w1, w3, w2;               // [I, C], [I, C], [C, I]
  ConvWeights cv;
  Lfm2AttentionWeights at;
};

class Lfm2 final : public Family {
 public:
  Lfm2(const Lfm2Config& cfg, const TensorMap& w, const Ops& ops) : Family(ops), cfg_(cfg) {
    const int64_t C = cfg.hidden, I = cfg.ffn, V = cfg.vocab, K = cfg.conv_kernel;
    const int64_t Hq = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
    embed_ = weight_on(ops, w, "embed_tokens.weight", {V, C});
    head_ = cfg.tied ? embed_ : weight_on(ops, w, "lm_head.weight", {V, C});
    final_norm_ = vector_on(ops, weight_f32(w, "embedding_norm.weight", {C}));
    spec_ = {.family = "lfm2", .hidden = C, .vocab = V, .layers = {}};
    for (int64_t i = 0; i < int64_t(cfg.layers.size()); ++i) {
      Lfm2LayerWeights l;
      l.kind = cfg.layers[size_t(i)];
      l.operator_norm = vector_on(ops, weight_f32(w, layer_name(i, "operator_norm.weight"), {C}));
      l.ffn_norm = vector_on(ops, weight_f32(w, layer_name(i, "ffn_norm.weight"), {C}));
      const std::vector<Tensor> w13 =
          weights_stacked_on(ops, w,
                             {{layer_name(i, "feed_forward.w1.weight"), {I, C}},
                              {layer_name(i, "feed_forward.w3.weight"), {I, C}}});
      l.w1 = w13[0];
      l.w3 = w13[1];
      l.w2 = weight_on(ops, w, layer_name(i, "feed_forward.w2.weight"), {C, I});
      LayerSpec ls{.kind = l.kind};
      if (l.kind == LayerKind::recurrent) {
        auto n = [&](const std::string& s) { return layer_name(i, "conv." + s); };
        l.cv.in = weight_on(ops, w, n("in_proj.weight"), {3 * C, C});
        l.cv.out = weight_on(ops, w, n("out_proj.weight"), {C, C});
        l.cv.conv = vector_on(ops, weight_f32(w, n("conv.weight"), {C, 1, K}));
        ls.rec_shape = {};  // no recurrent state: the conv tail is all a row carries
        ls.conv_channels = C;
        ls.conv_kernel = K;
      } else {
        auto n = [&](const std::string& s) { return layer_name(i, "self_attn." + s); };
        l.at.q = weight_on(ops, w, n("q_proj.weight"), {Hq * D, C});
        l.at.k = weight_on(ops, w, n("k_proj.weight"), {Hkv * D, C});
        l.at.v = weight_on(ops, w, n("v_proj.weight"), {Hkv * D, C});
        l.at.o = weight_on(ops, w, n("out_proj.weight"), {C, Hq * D});
        l.at.q_norm = vector_on(ops, weight_f32(w, n("q_layernorm.weight"), {D}));
        l.at.k_norm = vector_on(ops, weight_f32(w, n("k_layernorm.weight"), {D}));
        ls.kv_heads = Hkv;
        ls.head_dim = D;
      }
      layers_.push_back(std::move(l));
      spec_.layers.push_back(ls);
    }
    rope_ = rope_table(D, 1.0, cfg.rope_theta);
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
    const Lfm2LayerWeights& w = layers_[size_t(index)];
    const int64_t N = c.rows.n(), C = cfg_.hidden;
    const bool rounded = w.kind == LayerKind::recurrent
                             ? bf16_products(c.precision, w.cv.in)
                             : bf16_products(c.precision, {&w.at.q, &w.at.k, &w.at.v});
    const ProjectionInput xn = projection_input(x, N, C, rounded);
    norm_rows(x, c.h, xn, N, w.operator_norm);
    if (w.kind == LayerKind::recurrent) {
      short_conv(x, w.cv, c, xn);
    } else {
      attention_mixer(x, w.at, c, xn);
    }
    const ProjectionInput xm =
        projection_input(x, N, C, bf16_products(c.precision, {&w.w1, &w.w3}));
    norm_rows(x, c.h, xm, N, w.ffn_norm);
    swiglu_mlp(x, {.h = c.h,
                   .xn = xm,
                   .n = N,
                   .hidden = cfg_.hidden,
                   .width = cfg_.ffn,
                   .gate = &w.w1,
                   .up = &w.w3,
                   .down = &w.w2,
                   .precision = c.precision});
  }

 private:
  // y = norm(x) * w over n rows of C.
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
                    .scale = NormScale::w,
                    .yb = out.b16});
  }

  // Gated short conv: h += out_proj(C * conv(B * x)). One buffer [N, 3C] holds B | C | x: B * x
  // overwrites B, the conv output overwrites x (never its own input), then is gated by C.
  void short_conv(const Exec& x, const ConvWeights& w, const LayerCall& c,
                  ProjectionInput xn) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden, W3 = 3 * C;
    float* bcx = x.arena.floats(N * W3);
    GemmOutput in{.w = &w.in, .y = bcx, .ldy = W3};
    project(x, xn, N, C, {&in, 1}, c.precision);
    x.ops.binary(
        {.a = bcx + 2 * C, .lda = W3, .y = bcx, .ldy = W3, .rows = N, .n = C, .mul = true});
    x.ops.causal_conv({.rows = c.rows,
                       .views = c.views,
                       .x = bcx,
                       .ldx = W3,
                       .y = bcx + 2 * C,
                       .ldy = W3,
                       .channels = C,
                       .kernel = cfg_.conv_kernel,
                       .w = w.conv.data<float>(),
                       .ldt = C});
    x.ops.binary(
        {.a = bcx + C, .lda = W3, .y = bcx + 2 * C, .ldy = W3, .rows = N, .n = C, .mul = true});
    GemmOutput out{.w = &w.out, .y = c.h, .ldy = C, .accumulate = true};
    x.ops.gemm({.x = bcx + 2 * C,
                .m = N,
                .k = C,
                .ldx = W3,
                .outputs = {&out, 1},
                .precision = c.precision});
  }

  // Full attention: h += out_proj(attention(rope(norm(q)), rope(norm(k)), v)).
  void attention_mixer(const Exec& x, const Lfm2AttentionWeights& w, const LayerCall& c,
                       ProjectionInput xn) const {
    const int64_t N = c.rows.n(), C = cfg_.hidden;
    const int64_t Hq = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
    const int64_t QW = Hq * D, KW = Hkv * D;
    float* q = x.arena.floats(N * QW);
    float* k = x.arena.floats(N * KW);
    float* v = x.arena.floats(N * KW);
    GemmOutput outs[] = {{.w = &w.q, .y = q, .ldy = QW},
                         {.w = &w.k, .y = k, .ldy = KW},
                         {.w = &w.v, .y = v, .ldy = KW}};
    project(x, xn, N, C, outs, c.precision);
    // q and k normed per head and rotated; this call's real K/V into the rows' own buffers.
    for (auto [p, heads, norm] : {std::tuple{q, Hq, &w.q_norm}, std::tuple{k, Hkv, &w.k_norm}}) {
      x.ops.rms_norm({.x = p,
                      .ldx = heads * D,
                      .y = p,
                      .ldy = heads * D,
                      .rows = N,
                      .heads = heads,
                      .dim = D,
                      .w = norm->data<float>(),
                      .eps = cfg_.eps,
                      .scale = NormScale::w});
      x.ops.rope(
          {.rows = c.rows, .table = &rope_, .x = p, .ldx = heads * D, .heads = heads, .hs = D});
    }
    float* o = self_attention(x, {.call = &c,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .heads = Hq,
                                  .kv_heads = Hkv,
                                  .head_dim = D,
                                  .scale = 1.0f / std::sqrt(float(D)),
                                  .bf16 = bf16_products(c.precision, w.q)});
    GemmOutput out{.w = &w.o, .y = c.h, .ldy = C, .accumulate = true};
    x.ops.gemm(
        {.x = o, .m = N, .k = QW, .ldx = QW, .outputs = {&out, 1}, .precision = c.precision});
  }

  Lfm2Config cfg_;
  BackboneSpec spec_;
  Tensor embed_, head_;
  Tensor final_norm_;
  std::vector<Lfm2LayerWeights> layers_;
  RopeTable rope_;
};

}  // namespace

int64_t lfm2_ffn_width(int64_t intermediate, bool auto_adjust, std::optional<double> multiplier,
                       int64_t multiple_of) {
  if (!auto_adjust) return intermediate;
  // Python's int(2 * I / 3) and int(m * w): float arithmetic, truncated.
  int64_t width = int64_t(2.0 * double(intermediate) / 3.0);
  if (multiplier) {
    width = int64_t(*multiplier * double(width));
    width = multiple_of * ((width + multiple_of - 1) / multiple_of);
  }
  return width;
}

bool lfm2_handles(const std::string& model_type) {
  return model_type == "lfm2";
}

Lfm2Config Lfm2Config::from_json(const JsonConfig& root) {
  const JsonConfig t = root.text();
  auto unsupported = [&](const std::string& key, const std::string& what) {
    return Error(ErrorKind::unsupported, what, {.path = t.path()})
        .with_pointer(t.pointer() + "/" + key);
  };
  Lfm2Config c;
  c.vocab = t.get_in<int64_t>("vocab_size", 1, kMaxConfigVocab);
  c.hidden = t.get_in<int64_t>("hidden_size", 1, kMaxConfigHidden);
  const int64_t n_layers = t.get_in<int64_t>("num_hidden_layers", 1, kMaxConfigLayers);
  c.heads = t.get_in<int64_t>("num_attention_heads", 1, kMaxConfigHeads);
  c.kv_heads = t.get_or_in<int64_t>("num_key_value_heads", c.heads, 1, kMaxConfigHeads);
  c.head_dim = t.get_or_in<int64_t>("head_dim", c.hidden / c.heads, 1, kMaxConfigHeadDim);
  c.conv_kernel = t.get_or_in<int64_t>("conv_L_cache", 3, 1, kMaxConfigConvKernel);
  c.eps = float(t.get_or_in<double>(
      "norm_eps", t.get_or_in<double>("block_norm_eps", 1e-5, kMinConfigEps, kMaxConfigEps),
      kMinConfigEps, kMaxConfigEps));

  // MLP width: HF reads block_ff_dim before intermediate_size; an explicit null multiplier
  // means "no multiplier" (no rounding), an absent one HF's default 1.0.
  const int64_t ff = t.has("block_ff_dim")
                         ? t.get_in<int64_t>("block_ff_dim", 1, kMaxConfigWidth)
                         : t.get_in<int64_t>("intermediate_size", 1, kMaxConfigWidth);
  std::optional<double> multiplier = 1.0;
  if (t.json().contains("block_ffn_dim_multiplier")) {
    multiplier =
        t.has("block_ffn_dim_multiplier")
            ? std::optional<double>(t.get_in<double>("block_ffn_dim_multiplier", 1e-3, 1e3))
            : std::nullopt;
  }
  const int64_t multiple_of = t.get_or_in<int64_t>("block_multiple_of", 256, 1, kMaxConfigWidth);
  c.ffn =
      lfm2_ffn_width(ff, t.get_or<bool>("block_auto_adjust_ff_dim", true), multiplier, multiple_of);

  if (t.get_or<bool>("conv_bias", false)) {
    throw unsupported("conv_bias", "conv_bias true is not supported (LFM2 releases have none)");
  }
  if (t.has("layer_types")) {
    for (const std::string& s : t.get<std::vector<std::string>>("layer_types")) {
      if (s == "conv") {
        c.layers.push_back(LayerKind::recurrent);
      } else if (s == "full_attention") {
        c.layers.push_back(LayerKind::attention);
      } else {
        throw unsupported("layer_types",
                          "unknown layer type \"" + s + "\" (expected conv or full_attention)");
      }
    }
  } else {  // HF: full_attn_idxs, by default every layer
    std::vector<int64_t> idx;
    if (t.has("full_attn_idxs")) {
      idx = t.get<std::vector<int64_t>>("full_attn_idxs");
    } else {
      for (int64_t i = 0; i < n_layers; ++i) idx.push_back(i);
    }
    for (int64_t i = 0; i < n_layers; ++i) {
      const bool attn = std::find(idx.begin(), idx.end(), i) != idx.end();
      c.layers.push_back(attn ? LayerKind::attention : LayerKind::recurrent);
    }
  }
  if (int64_t(c.layers.size()) != n_layers) {
    throw unsupported("layer_types", fmt::format("{} layer types for num_hidden_layers {}",
                                                 c.layers.size(), n_layers));
  }

  // Rotary: rope_parameters (transformers 5; flat, or per layer type) wins over the legacy
  // top-level keys, of which HF reads the original `theta` first.
  c.rope_theta = t.get_or_in<double>(
      "theta", t.get_or_in<double>("rope_theta", 1e6, kMinRopeTheta, kMaxRopeTheta), kMinRopeTheta,
      kMaxRopeTheta);
  if (t.has("rope_parameters")) {
    JsonConfig rp = t.sub("rope_parameters");
    if (!rp.has("rope_theta") && rp.has("full_attention")) rp = rp.sub("full_attention");
    if (rp.get_or<std::string>("rope_type", "default") != "default") {
      throw unsupported("rope_parameters", "only rope_type \"default\" is supported");
    }
    c.rope_theta = rp.get_or_in<double>("rope_theta", c.rope_theta, kMinRopeTheta, kMaxRopeTheta);
  }
  if (t.has("rope_scaling")) {
    const JsonConfig rs = t.sub("rope_scaling");
    const std::string type =
        rs.get_or<std::string>("rope_type", rs.get_or<std::string>("type", "default"));
    if (type != "default") throw unsupported("rope_scaling", "only default rope is supported");
  }

  auto tied_in = [](const JsonConfig& j) -> std::optional<bool> {  // HF: tie_embedding first
    if (j.has("tie_embedding")) return j.get<bool>("tie_embedding");
    if (j.has("tie_word_embeddings")) return j.get<bool>("tie_word_embeddings");
    return std::nullopt;
  };
  c.tied = tied_in(root).value_or(tied_in(t).value_or(true));

  if (c.vocab <= 0 || c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.heads % c.kv_heads ||
      c.head_dim <= 0 || c.head_dim % 2 || c.conv_kernel < 1 || c.ffn <= 0) {
    throw Error(
        ErrorKind::format,
        fmt::format("inconsistent sizes: vocab {}, hidden {}, {} q / {} kv heads of {}, "
                    "conv kernel {}, MLP width {}",
                    c.vocab, c.hidden, c.heads, c.kv_heads, c.head_dim, c.conv_kernel, c.ffn),
        {.path = t.path()});
  }
  return c;
}

Lfm2Config Lfm2Config::preset(const std::string& size) {
  if (size != "1.2b") {
    throw Error(ErrorKind::invalid_argument, "unknown LFM2 size \"" + size + "\" (known: 1.2b)");
  }
  // LFM2.5-1.2B: 16 layers, attention at 2, 5, 8, 10, 12, 14; block_ff_dim 12288 auto-adjusted
  // to 8192.
  Lfm2Config c{.vocab = 65536,
               .hidden = 2048,
               .ffn = lfm2_ffn_width(12288, true, 1.0, 256),
               .layers = {},
               .heads = 32,
               .kv_heads = 8,
               .head_dim = 64,
               .rope_theta = 1e6,
               .conv_kernel = 3,
               .eps = 1e-5f,
               .tied = true};
  for (int i = 0; i < 16; ++i) {
    const bool attn = i == 2 || i == 5 || i == 8 || i == 10 || i == 12 || i == 14;
    c.layers.push_back(attn ? LayerKind::attention : LayerKind::recurrent);
  }
  return c;
}

std::vector<std::pair<std::string, Shape>> lfm2_tensor_table(const Lfm2Config& c) {
  const int64_t C = c.hidden, I = c.ffn, D = c.head_dim;
  std::vector<std::pair<std::string, Shape>> t{{"embed_tokens.weight", {c.vocab, C}},
                                               {"embedding_norm.weight", {C}}};
  if (!c.tied) t.push_back({"lm_head.weight", {c.vocab, C}});
  for (int64_t i = 0; i < int64_t(c.layers.size()); ++i) {
    auto add = [&](const std::string& n, Shape s) { t.push_back({layer_name(i, n), s}); };
    add("operator_norm.weight", {C});
    add("ffn_norm.weight", {C});
    add("feed_forward.w1.weight", {I, C});
    add("feed_forward.w3.weight", {I, C});
    add("feed_forward.w2.weight", {C, I});
    if (c.layers[size_t(i)] == LayerKind::recurrent) {
      add("conv.in_proj.weight", {3 * C, C});
      add("conv.conv.weight", {C, 1, c.conv_kernel});
      add("conv.out_proj.weight", {C, C});
    } else {
      add("self_attn.q_proj.weight", {c.heads * D, C});
      add("self_attn.k_proj.weight", {c.kv_heads * D, C});
      add("self_attn.v_proj.weight", {c.kv_heads * D, C});
      add("self_attn.out_proj.weight", {C, c.heads * D});
      add("self_attn.q_layernorm.weight", {D});
      add("self_attn.k_layernorm.weight", {D});
    }
  }
  return t;
}

std::unique_ptr<Family> lfm2_family(const Lfm2Config& cfg, const TensorMap& weights,
                                    const Ops& ops) {
  return std::make_unique<Lfm2>(cfg, weights, ops);
}

TensorMap lfm2_random_weights(const Lfm2Config& cfg, DType dtype, uint64_t seed) {
  const auto table = lfm2_tensor_table(cfg);
  return random_weights({.table = &table,
                         .dtype = dtype,
                         .seed = seed,
                         .f32 = [](const std::string&, const Shape& s) { return s.size() == 1; },
                         .adjust =
                             [](const std::string& name, float unit, float x) {
                               // Norm weights around 1; conv kernels of unit scale (HF's init is
                               // U(-1/sqrt(K), 1/sqrt(K))), so the conv path matters.
                               if (name.ends_with("norm.weight")) return 1.0f + x;
                               if (name.ends_with("conv.conv.weight")) return unit - 0.5f;
                               return x;
                             }});
}

}  // namespace deg
