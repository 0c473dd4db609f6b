// The gpt family on the Family contract: the trainer's forward (src/train/gpt_step.cc) computed
// for a call's rows given their prefixes, written over the op interface (kernels/ops.h): every
// loop over tokens, rows and heads is an op's. What crosses tokens
// lives in the state: attention K/V (sliding windows are a mask over all kept positions; the key
// offset is applied when a key is read, so K holds each token's own rotated key) and the last two
// token ids (smear gate, n-gram hashes). What crosses layers rides in side lanes of the residual
// stream, per token: the token id (value-embedding lookups), x0, cache 0 (x0 plus the gated
// n-gram embedding), the n-gram embedding, both MUDD gate outputs, and the saved outputs of the
// layers read later (the skip source, the late layer, post-mix sources). The last layer runs the
// MUDD layer and the grouped post-loop mix, so final_norm is the plain RMS norm; finish_logits
// applies the soft cap, so lm_logits are the logits the trainer's loss sees.
//
// Layers without attention (MLP-only, skip, empty layers) declare an empty recurrent state. The
// attention sublayer is gpt_attention.cc. Arithmetic mirrors the trainer's order where it is cheap
// to (double-accumulated dot products in attention and gates, the same axpy order: residual
// mixes are `combine` ops summing their terms left to right), so results agree to rounding.
//
// Letters: B rows, L tokens of a call, N = B L, C model dim, S stream width, H heads, Dq / Dv
// q-k / v head widths, D K/V storage width, F MLP hidden, M MUDD hidden, G mix groups, Dn n-gram
// dim, n coefficients of a MUDD head.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/ops.h"
#include "model/family_common.h"
#include "model/gpt_internal.h"

namespace deg {

namespace {

using namespace gpt_detail;

constexpr int64_t kHistory = 2;  // ids before a token that its embedding reads

float sigmoid(float x) {  // of a scalar weight
  return 1.0f / (1.0f + std::exp(-x));
}

// The [F, C] checkpoint tensor `name` transposed to [C, F] (contiguous) on `ops`' device.
Tensor transposed_on(const Ops& ops, const TensorMap& w, const std::string& name,
                     const Shape& shape) {
  return ops.upload(weight_need(w, name, shape).transpose(0, 1).contiguous());
}

// A two-layer MUDD head: out = (gelu(x W1^T) W2^T + b2) * scale, deltas = gelu(x W1^T) W2g^T *
// scale (the grouped post-loop mix only).
struct HeadWeights {
  Tensor w1, w2, w2g;  // [M, C], [n, M], [n G, M]
  Tensor b2;           // [n]
  float scale = 1.0f;
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

class Gpt final : public Family {
 public:
  Gpt(const GptConfig& cfg, const TensorMap& w, const Ops& ops)
      : Family(ops), cfg_(cfg), gl_(cfg.gate_lanes()) {
    cfg.validate();
    const int64_t C = cfg.model_dim, V = cfg.vocab_size, H = cfg.num_heads, L = cfg.num_layers;
    DEG_CHECK(V < (int64_t(1) << 24), "gpt: vocab {} does not fit the f32 id lane", V);
    nm_ = cfg.mudd_coefs();
    ng_ = cfg.mudd_gate_coefs();
    embed_ = weight_on(ops, w, "embed", {V, C});
    head_ = weight_on(ops, w, "lm_head", {V, C});
    const Tensor ve =
        weight_on(ops, w, "value_embeds", {int64_t(cfg.value_embed_layers.size()), V, C});
    for (size_t j = 0; j < cfg.value_embed_layers.size(); ++j) ve_.push_back(ve.select(0, j));
    ngram_ = weight_on(ops, w, "ngram_table", {cfg.ngram_vocab, cfg.ngram_dim});
    sign_pool_ =
        vector_on(ops, weight_f32(w, "ngram_sign_pool", {cfg.ngram_sign_rows, cfg.ngram_dim}));
    smear_ = vector_on(ops, weight_f32(w, "smear_gate", {1, cfg.smear_channels}));
    ve_gate_ = vector_on(ops, weight_f32(w, "ve_gate",
                                         {int64_t(cfg.value_embed_gate_layers.size()), H,
                                          2 * cfg.value_embed_gate_channels}));
    scalars_ = weight_f32(w, "scalars", {2 * L + 2});
    resid_ = weight_f32(w, "resid_lambdas", {L, 2});
    post_ = weight_f32(w, "post_lambdas", {L, 2});
    for (const char* kind : {"narrow", "wide"}) {
      const int64_t dq = std::string(kind) == "wide" ? cfg.head_dim : cfg.narrow_head_dim;
      const std::string pre = std::string("rotary.") + kind;
      freq_.push_back(vector_on(ops, weight_f32(w, pre + ".freq", {dq})));
      attn_scale_.push_back(weight_f32(w, pre + ".attn_scale", {1})[0]);
    }
    const int64_t F = cfg.mlp_hidden;
    spec_ = {.family = "gpt", .hidden = C, .vocab = V, .stream = 0, .history = kHistory};
    for (int i = 0; i < int(L); ++i) {
      LayerWeights l;
      l.attn = cfg.has_attn(i);
      l.mlp = cfg.has_mlp(i);
      if (l.attn) {
        AttnWeights& a = l.at;
        a.dq = cfg.qk_dim(i);
        a.dv = cfg.v_dim(i);
        a.d = std::max(a.dq, a.dv);
        a.qk = weight_on(ops, w, layer_name(i, "attn.qk"), {2 * H * a.dq, C});
        a.v = weight_on(ops, w, layer_name(i, "attn.v"), {H * a.dv, C});
        a.o = weight_on(ops, w, layer_name(i, "attn.o"), {C, H * a.dv});
        a.paired = cfg.paired(i);
        a.key_offset = cfg.long_window(i);
        a.window = cfg.long_window(i) ? cfg.window_long : cfg.window_short;
        const int wide = cfg.has(cfg.wide_qk_layers, i) ? 1 : 0;
        a.freq = freq_[size_t(wide)].data<float>();
        a.scale = attn_scale_[size_t(wide)];
        DEG_CHECK(!(a.paired && a.key_offset), "gpt: paired heads take no key offset");
        spec_.layers.push_back({.kind = LayerKind::attention, .kv_heads = H, .head_dim = a.d});
      } else {  // no state: an empty recurrent one
        spec_.layers.push_back({.kind = LayerKind::recurrent, .conv_kernel = 1});
      }
      if (l.mlp) {
        l.fc = weight_on(ops, w, layer_name(i, "mlp.fc"), {F, C});
        l.proj = transposed_on(ops, w, layer_name(i, "mlp.proj"), {F, C});
      }
      layers_.push_back(std::move(l));
    }
    if (cfg.parallel_mlp_layer >= 0) {
      par_fc_ = weight_on(ops, w, "parallel_mlp.fc", {F, C});
      par_proj_ = transposed_on(ops, w, "parallel_mlp.proj", {F, C});
    }
    const int64_t M = cfg.mudd_dim, G = cfg.mudd_groups, Mg = cfg.mudd_gate_dim;
    const Tensor w1 = weight_on(ops, w, "mudd_w1", {2, M, C});
    const Tensor w2 = weight_on(ops, w, "mudd_w2", {2, nm_, M});
    const std::vector<float> b2 = weight_f32(w, "mudd_b2", {2, nm_});
    const Tensor w2g = weight_on(ops, w, "mudd_w2g", {nm_, G, M});
    const Tensor gw1 = weight_on(ops, w, "mudd_gate_w1", {2, Mg, C});
    const Tensor gw2 = weight_on(ops, w, "mudd_gate_w2", {2, ng_, Mg});
    const std::vector<float> gb2 = weight_f32(w, "mudd_gate_b2", {2, ng_});
    const float gate_scale = weight_f32(w, "mudd_gate_scale", {1})[0];
    for (int id = 0; id < 2; ++id) {
      mudd_[id] = {.w1 = w1.select(0, id),
                   .w2 = w2.select(0, id),
                   .w2g = id == 1 ? w2g.view({nm_ * G, M}) : Tensor{},
                   .b2 = vector_on(
                       ops, std::vector<float>(b2.begin() + id * nm_, b2.begin() + (id + 1) * nm_)),
                   .scale = cfg.mudd_scale};
      gate_[id] = {.w1 = gw1.select(0, id),
                   .w2 = gw2.select(0, id),
                   .w2g = {},
                   .b2 = vector_on(ops, std::vector<float>(gb2.begin() + id * ng_,
                                                           gb2.begin() + (id + 1) * ng_)),
                   .scale = gate_scale};
    }
    // Side lanes.
    int64_t at = C;
    auto lane = [&](int64_t width) { return (at += width) - width; };
    lanes_.id = lane(1);
    lanes_.x0 = lane(C);
    lanes_.c0 = lane(C);
    lanes_.ngram = lane(cfg.ngram_dim);
    lanes_.gate[0] = lane(ng_);
    lanes_.gate[1] = lane(ng_);
    lanes_.cache.assign(size_t(L), -1);
    auto keep = [&](int j) {
      if (lanes_.cache[size_t(j)] < 0) lanes_.cache[size_t(j)] = j == 0 ? lanes_.c0 : lane(C);
    };
    if (cfg.skip_layer >= 0) keep(cfg.skip_source);
    keep(cfg.late_layer);
    for (const GptMixSource& s : cfg.post_mix_sources)
      if (s.kind == GptMixSource::Kind::cache) keep(s.layer);
    lanes_.width = at;
    spec_.stream = at;
    ones_ = vector_on(ops, std::vector<float>(size_t(std::max(C, cfg.head_dim)), 1.0f));
    zeros_ = vector_on(ops, std::vector<float>(size_t(std::max(C, cfg.head_dim)), 0.0f));
  }

  const BackboneSpec& spec() const override { return spec_; }
  const Tensor& lm_head() const override { return head_; }

  // Token embedding, smear, x0 = norm(.), the n-gram embedding, the pre MUDD gate, cache 0.
  void embed_rows(const Exec& x, const EmbedCall& e) const override {
    const int64_t N = e.rows.n(), S = lanes_.width, C = cfg_.model_dim;
    const int64_t sc = cfg_.smear_channels;
    float* h = e.h;
    // The ids one and two back (-1 before a row's first position) and the id lane.
    int32_t* p1 = x.arena.ints(N);
    int32_t* p2 = x.arena.ints(N);
    auto shift = [&](int64_t back, int32_t* out, float* lane) {
      x.ops.shift_ids({.rows = e.rows,
                       .ids = e.ids,
                       .history = e.history,
                       .history_len = kHistory,
                       .back = back,
                       .out = out,
                       .lane = lane,
                       .ld_lane = S});
    };
    shift(1, p1, nullptr);
    shift(2, p2, nullptr);
    shift(0, nullptr, h + lanes_.id);
    // x = embed[id] + smear_lambda sigmoid(embed[id][:sc] . smear) embed[previous id]
    x.ops.gather({.table = &embed_, .ids = e.ids, .n = N, .y = h, .ldy = S});
    float* smear = x.arena.floats(N);
    x.ops.sigmoid_gates({.x = h,
                         .ldx = S,
                         .w = smear_.data<float>(),
                         .ldw = sc,
                         .rows = N,
                         .n = sc,
                         .s = scalars_[size_t(2 * cfg_.num_layers)],
                         .out = smear,
                         .ldo = 1});
    x.ops.gather({.table = &embed_,
                  .ids = p1,
                  .n = N,
                  .y = h,
                  .ldy = S,
                  .keep = true,
                  .row_scale = smear,
                  .ld_scale = 1});
    norm_rows(x, h, S, h + lanes_.x0, S, N);
    x.ops.ngram_embed({.rows = e.rows,
                       .ids = e.ids,
                       .prev1 = p1,
                       .prev2 = p2,
                       .table = &ngram_,
                       .sign_pool = sign_pool_.data<float>(),
                       .sign_rows = cfg_.ngram_sign_rows,
                       .bigram_rows = cfg_.bigram_row_muls,
                       .trigram_rows = cfg_.trigram_row_muls,
                       .bigram_signs = cfg_.bigram_sign_muls,
                       .trigram_signs = cfg_.trigram_sign_muls,
                       .y = h + lanes_.ngram,
                       .ldy = S});
    head_run(x, gate_[0], h + lanes_.x0, S, N, h + lanes_.gate[0], S, nullptr,
             GemmPrecision::exact);
    // x = x0 (+ gate x0_ngram), cache 0 = x
    x.ops.copy_rows(h + lanes_.x0, S, h, S, N, C);
    if (gl_.ngram[0] >= 0) add_ngram(x, h, N, h + lanes_.gate[0] + gl_.ngram[0], S);
    x.ops.copy_rows(h, S, h + lanes_.c0, S, N, C);
  }

  void layer(const Exec& x, int index, const LayerCall& c) const override {
    const int i = index;
    const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
    float* h = c.h;
    if (i == cfg_.post_gate_layer) {
      head_run(x, gate_[1], h, S, N, h + lanes_.gate[1], S, nullptr, c.precision);
    }
    if (i == cfg_.mudd_layer()) {
      mudd_layer(x, c);
      return;
    }
    const LayerWeights& lw = layers_[size_t(i)];
    if (i == cfg_.skip_layer) {  // x += sigmoid(skip scalar) gate x_source
      const CombineTerm t[] = {{},
                               {.x = h + lanes_.cache[size_t(cfg_.skip_source)],
                                .ldx = S,
                                .s = sigmoid(scalars_[size_t(2 * cfg_.num_layers + 1)]),
                                .lane = h + lanes_.gate[1] + gl_.skip,
                                .ldl = S}};
      x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = t});
    } else if (!lw.attn) {
      mix_and_inject(x, i, c, resid_[size_t(2 * i)], nullptr, 0.0f);
    } else {
      float* xn = x.arena.floats(N * C);
      const bool late = uses_late(i);
      norm_rows(x, late ? h + lanes_.cache[size_t(cfg_.late_layer)] : h, S, xn, C, N);
      const float* aux = value_embedding(x, i, c, xn);
      const float* out = attention(x, i, c, xn, aux);
      mix_and_inject(x, i, c, resid_[size_t(2 * i)], out,
                     scalars_[size_t(2 * i + 1)] * post_[size_t(2 * i)]);
    }
    mlp(x, i, c, nullptr, nullptr);
    if (lanes_.cache[size_t(i)] >= 0 && i > 0) {  // save the layer's output
      x.ops.copy_rows(h, S, h + lanes_.cache[size_t(i)], S, N, C);
    }
  }

  void final_norm(const Exec& x, const float* h, float* out, int64_t n) const override {
    norm_rows(x, h, cfg_.model_dim, out, cfg_.model_dim, n);
  }

  void finish_logits(const Exec& x, float* logits, int64_t n) const override {
    x.ops.activation({.x = logits,
                      .ldx = n,
                      .y = logits,
                      .ldy = n,
                      .rows = 1,
                      .n = n,
                      .act = Activation::scaled_sigmoid,
                      .a = cfg_.softcap_a,
                      .b = cfg_.softcap_b,
                      .c = cfg_.softcap_c});
  }

 private:
  bool uses_late(int i) const { return cfg_.late_layer >= 0 && i > cfg_.late_layer; }

  // y [n, C] at stride ldy = RMS norm of x [n, C] at stride ldx (no weight).
  void norm_rows(const Exec& x, const float* in, int64_t ldx, float* y, int64_t ldy,
                 int64_t n) const {
    x.ops.rms_norm({.x = in,
                    .ldx = ldx,
                    .y = y,
                    .ldy = ldy,
                    .rows = n,
                    .dim = cfg_.model_dim,
                    .w = ones_.data<float>(),
                    .eps = cfg_.norm_eps,
                    .scale = NormScale::w});
  }

  // h[:, :Dn] += coef * n-gram embedding over n tokens, coef[t] at coef + t ldc.
  void add_ngram(const Exec& x, float* h, int64_t n, const float* coef, int64_t ldc) const {
    const int64_t S = lanes_.width;
    const CombineTerm t[] = {{}, {.x = h + lanes_.ngram, .ldx = S, .lane = coef, .ldl = ldc}};
    x.ops.combine({.y = h, .ldy = S, .rows = n, .n = cfg_.ngram_dim, .terms = t});
  }

  // out [N, n] at stride ldo (and deltas [N, n G] when the head has w2g) of x [N, C] at ldx.
  void head_run(const Exec& x, const HeadWeights& w, const float* in, int64_t ldx, int64_t N,
                float* out, int64_t ldo, float* deltas, GemmPrecision precision) const {
    const int64_t M = w.w1.dim(0), n = w.w2.dim(0), C = cfg_.model_dim;
    float* pre = x.arena.floats(N * M);
    GemmOutput o1{.w = &w.w1, .y = pre, .ldy = M};
    x.ops.gemm({.x = in, .m = N, .k = C, .ldx = ldx, .outputs = {&o1, 1}, .precision = precision});
    x.ops.activation(
        {.x = pre, .ldx = M, .y = pre, .ldy = M, .rows = N, .n = M, .act = Activation::gelu_erf});
    float* u = x.arena.floats(N * n);
    const int64_t nd = deltas ? w.w2g.dim(0) : 0;
    GemmOutput o2[] = {{.w = &w.w2, .y = u, .ldy = n}, {.w = &w.w2g, .y = deltas, .ldy = nd}};
    x.ops.gemm({.x = pre,
                .m = N,
                .k = M,
                .ldx = M,
                .outputs = {o2, size_t(deltas ? 2 : 1)},
                .precision = precision});
    x.ops.bias_scale({.x = u,
                      .ldx = n,
                      .y = out,
                      .ldy = ldo,
                      .rows = N,
                      .n = n,
                      .bias = w.b2.data<float>(),
                      .s = w.scale});
    if (deltas) x.ops.scale({.y = deltas, .ldy = nd, .rows = N, .n = nd, .s = w.scale});
  }

  // x = r x (+ o_scale out) (+ x0 gate x0), then x[:, :Dn] += n-gram gate n-gram: the residual
  // mix of layer i and its x0 / n-gram injections.
  void mix_and_inject(const Exec& x, int i, const LayerCall& c, float r, const float* out,
                      float o_scale) const {
    const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
    float* h = c.h;
    const float* g = h + lanes_.gate[gl_.gate_id[size_t(i)]];
    CombineTerm t[3] = {{.s = r}};
    size_t k = 1;
    if (out) t[k++] = {.x = out, .ldx = C, .s = o_scale};
    if (gl_.x0[size_t(i)] >= 0)
      t[k++] = {.x = h + lanes_.x0, .ldx = S, .lane = g + gl_.x0[size_t(i)], .ldl = S};
    x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = {t, k}});
    if (gl_.ngram[size_t(i)] >= 0 && i != 0) add_ngram(x, h, N, g + gl_.ngram[size_t(i)], S);
  }

  // Value embedding added to V on layer i (2 sigmoid-gated per head where gated), or null.
  const float* value_embedding(const Exec& x, int i, const LayerCall& c, const float* xn) const {
    const int ve = cfg_.value_embed_index(i), veg = cfg_.value_embed_gate_index(i);
    if (ve < 0) return nullptr;
    const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
    const int64_t H = cfg_.num_heads, gc = cfg_.value_embed_gate_channels;
    float* aux = x.arena.floats(N * C);
    x.ops.gather({.table = &ve_[size_t(ve)],
                  .n = N,
                  .y = aux,
                  .ldy = C,
                  .id_lane = c.h + lanes_.id,
                  .ld_id = S});
    if (veg < 0) return aux;
    // Every head's gate reads the ungated plane.
    float* gv = x.arena.floats(N * H);
    x.ops.sigmoid_gates({.x = xn,
                         .ldx = C,
                         .x2 = aux,
                         .ldx2 = C,
                         .w = ve_gate_.data<float>() + veg * H * 2 * gc,
                         .ldw = 2 * gc,
                         .rows = N,
                         .heads = H,
                         .n = gc,
                         .s = 2.0f,
                         .out = gv,
                         .ldo = H});
    const CombineTerm t[] = {{.lane = gv, .ldl = H, .gl = 1}};
    x.ops.combine({.y = aux, .ldy = C, .rows = N, .n = C, .group = cfg_.head_dim, .terms = t});
    return aux;
  }

  // The attention sublayer of layer i before its output scale: y W_o^T [N, C] (padded rows 0).
  float* attention(const Exec& x, int i, const LayerCall& c, const float* xn,
                   const float* aux) const {
    const int xsa = gl_.xsa[size_t(i)], gate = gl_.attn_gate[size_t(i)];
    return gpt_detail::attention(
        x, layers_[size_t(i)].at,
        {.call = &c,
         .xn = xn,
         .aux = aux,
         .ones = ones_.data<float>(),
         .zeros = zeros_.data<float>(),
         .sa0 = scalars_[size_t(2 * i)],
         .eps = cfg_.norm_eps,
         .model_dim = cfg_.model_dim,
         .heads = cfg_.num_heads,
         .rotary_dim = cfg_.rotary_dim,
         .stream = lanes_.width,
         .xsa = xsa >= 0 ? lanes_.gate[0] + xsa : -1,
         .gate = gate >= 0 ? lanes_.gate[gl_.gate_id[size_t(i)]] + gate : -1});
  }

  // The MLP sublayer of layer i in place on the stream: x = rm x + pm mlp(norm(x)) (+ the
  // parallel MLP). MUDD layer: mu = its coefficients, x = mu12 x + mu13 mlp(norm(x)); mlp_xn
  // receives norm(x) (the post mix reads it).
  void mlp(const Exec& x, int i, const LayerCall& c, const float* mu, float** mlp_xn) const;

  void mudd_layer(const Exec& x, const LayerCall& c) const;

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

void Gpt::mlp(const Exec& x, int i, const LayerCall& c, const float* mu, float** mlp_xn) const {
  const LayerWeights& lw = layers_[size_t(i)];
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim, F = cfg_.mlp_hidden;
  float* h = c.h;
  if (!lw.mlp) {
    x.ops.scale({.y = h, .ldy = S, .rows = N, .n = C, .s = resid_[size_t(2 * i + 1)]});
    return;
  }
  float* xn = x.arena.floats(N * C);
  norm_rows(x, h, S, xn, C, N);
  if (mlp_xn) *mlp_xn = xn;
  // relu(xn fc^T)^2 proj for (fc, proj) -> out [N, C]
  auto run = [&](const Tensor& fc, const Tensor& proj) {
    float* act = x.arena.floats(N * F);
    GemmOutput o1{.w = &fc, .y = act, .ldy = F};
    x.ops.gemm({.x = xn, .m = N, .k = C, .ldx = C, .outputs = {&o1, 1}, .precision = c.precision});
    x.ops.activation({.x = act,
                      .ldx = F,
                      .y = act,
                      .ldy = F,
                      .rows = N,
                      .n = F,
                      .act = Activation::relu_squared});
    float* out = x.arena.floats(N * C);
    GemmOutput o2{.w = &proj, .y = out, .ldy = C};
    x.ops.gemm({.x = act, .m = N, .k = F, .ldx = F, .outputs = {&o2, 1}, .precision = c.precision});
    return out;
  };
  const float* out = run(lw.fc, lw.proj);
  if (mu) {
    const CombineTerm t[] = {{.lane = mu + 12, .ldl = nm_},
                             {.x = out, .ldx = C, .lane = mu + 13, .ldl = nm_}};
    x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = t});
    return;
  }
  const float* par = i == cfg_.parallel_mlp_layer ? run(par_fc_, par_proj_) : nullptr;
  const float rm = resid_[size_t(2 * i + 1)], pm = post_[size_t(2 * i + 1)];
  const CombineTerm t[] = {{.s = rm}, {.x = out, .ldx = C, .s = pm}, {.x = par, .ldx = C, .s = pm}};
  x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = {t, size_t(par ? 3 : 2)}});
}

// The last layer: MUDD coefficients from x, V = gated VE + mu0 c0 + mu1 c_late + mu2 x,
// x <- (1 + mu5) x + mu3 c0 + mu4 c_late, attention over norm(c_late), then
// mu8 x + mu9 attn + mu10 c0 (+ mu11 n-gram), the MLP with mu12 / mu13, and the post-loop mix
// x + sum_k (mu_k + delta_kg) src_k per channel group.
void Gpt::mudd_layer(const Exec& x, const LayerCall& c) const {
  const int i = cfg_.mudd_layer();
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
  const int64_t H = cfg_.num_heads, hd = cfg_.head_dim, nm = nm_;
  float* h = c.h;
  const int64_t late = lanes_.cache[size_t(cfg_.late_layer)];
  float* mu = x.arena.floats(N * nm);  // [N, n]
  head_run(x, mudd_[0], h, S, N, mu, nm, nullptr, c.precision);
  float* xn = x.arena.floats(N * C);  // norm(cache[late]): the attention input
  norm_rows(x, h + late, S, xn, C, N);
  // aux = (mu6 | mu7 by head half) VE + mu0 c0 + mu1 c_late + mu2 x
  float* aux = x.arena.floats(N * C);
  const Tensor& ve = ve_[size_t(cfg_.value_embed_index(i))];
  x.ops.gather({.table = &ve, .n = N, .y = aux, .ldy = C, .id_lane = h + lanes_.id, .ld_id = S});
  const CombineTerm ta[] = {{.lane = mu + 6, .ldl = nm, .gl = 1},
                            {.x = h + lanes_.c0, .ldx = S, .lane = mu + 0, .ldl = nm},
                            {.x = h + late, .ldx = S, .lane = mu + 1, .ldl = nm},
                            {.x = h, .ldx = S, .lane = mu + 2, .ldl = nm}};
  x.ops.combine({.y = aux, .ldy = C, .rows = N, .n = C, .group = H / 2 * hd, .terms = ta});
  float* recomb = x.arena.floats(N * C);
  const CombineTerm tr[] = {{.x = h, .ldx = S, .lane = mu + 5, .ldl = nm, .offset = 1.0f},
                            {.x = h + lanes_.c0, .ldx = S, .lane = mu + 3, .ldl = nm},
                            {.x = h + late, .ldx = S, .lane = mu + 4, .ldl = nm}};
  x.ops.combine({.y = recomb, .ldy = C, .rows = N, .n = C, .terms = tr});
  float* out = attention(x, i, c, xn, aux);
  x.ops.scale({.y = out, .ldy = C, .rows = N, .n = C, .s = scalars_[size_t(2 * i + 1)]});
  const CombineTerm tx[] = {{.x = recomb, .ldx = C, .lane = mu + 8, .ldl = nm},
                            {.x = out, .ldx = C, .lane = mu + 9, .ldl = nm},
                            {.x = h + lanes_.c0, .ldx = S, .lane = mu + 10, .ldl = nm}};
  x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = tx});
  add_ngram(x, h, N, mu + 11, nm);
  float* mlp_xn = nullptr;
  mlp(x, i, c, mu, &mlp_xn);
  // Post-loop mix, one source at a time: x[g] += (coef_k + delta_kg) src_k[g] per group g.
  const int64_t G = cfg_.mudd_groups;
  float* coef = x.arena.floats(N * nm);
  float* deltas = x.arena.floats(N * nm * G);
  head_run(x, mudd_[1], h, S, N, coef, nm, deltas, c.precision);
  float* ve_rows = nullptr;  // a value-embedding source's rows
  for (size_t k = 0; k < cfg_.post_mix_sources.size(); ++k) {
    const GptMixSource& s = cfg_.post_mix_sources[k];
    const float* src = nullptr;
    int64_t ld = C;
    switch (s.kind) {
      case GptMixSource::Kind::cache:
        src = h + lanes_.cache[size_t(s.layer)];
        ld = S;
        break;
      case GptMixSource::Kind::value_embed:
        if (!ve_rows) ve_rows = x.arena.floats(N * C);
        x.ops.gather({.table = &ve_[size_t(cfg_.value_embed_index(s.layer))],
                      .n = N,
                      .y = ve_rows,
                      .ldy = C,
                      .id_lane = h + lanes_.id,
                      .ld_id = S});
        src = ve_rows;
        break;
      case GptMixSource::Kind::last_mlp_in: src = mlp_xn; break;
      case GptMixSource::Kind::late_attn_in: src = xn; break;
    }
    const CombineTerm t[] = {{},
                             {.x = src,
                              .ldx = ld,
                              .lane = coef + k,
                              .ldl = nm,
                              .add = deltas + int64_t(k) * G,
                              .lda = nm * G,
                              .ga = 1}};
    x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .group = C / G, .terms = t});
  }
}

}  // namespace

bool gpt_handles(const Json& config) {
  return config.is_object() && config.contains("family") && config["family"] == "gpt";
}

std::vector<std::pair<std::string, Shape>> gpt_tensor_table(const GptConfig& c) {
  const int64_t C = c.model_dim, V = c.vocab_size, H = c.num_heads, L = c.num_layers;
  const int64_t nm = c.mudd_coefs(), ng = c.mudd_gate_coefs();
  std::vector<std::pair<std::string, Shape>> t{
      {"embed", {V, C}},
      {"lm_head", {V, C}},
      {"value_embeds", {int64_t(c.value_embed_layers.size()), V, C}},
      {"ngram_table", {c.ngram_vocab, c.ngram_dim}},
      {"smear_gate", {1, c.smear_channels}},
      {"ve_gate", {int64_t(c.value_embed_gate_layers.size()), H, 2 * c.value_embed_gate_channels}},
      {"scalars", {2 * L + 2}},
      {"resid_lambdas", {L, 2}},
      {"post_lambdas", {L, 2}}};
  for (int i = 0; i < int(L); ++i) {
    if (c.has_attn(i)) {
      t.push_back({layer_name(i, "attn.qk"), {2 * H * c.qk_dim(i), C}});
      t.push_back({layer_name(i, "attn.v"), {H * c.v_dim(i), C}});
      t.push_back({layer_name(i, "attn.o"), {C, H * c.v_dim(i)}});
    }
    if (c.has_mlp(i)) {
      t.push_back({layer_name(i, "mlp.fc"), {c.mlp_hidden, C}});
      t.push_back({layer_name(i, "mlp.proj"), {c.mlp_hidden, C}});
    }
  }
  if (c.parallel_mlp_layer >= 0) {
    t.push_back({"parallel_mlp.fc", {c.mlp_hidden, C}});
    t.push_back({"parallel_mlp.proj", {c.mlp_hidden, C}});
  }
  t.push_back({"mudd_w1", {2, c.mudd_dim, C}});
  t.push_back({"mudd_w2", {2, nm, c.mudd_dim}});
  t.push_back({"mudd_b2", {2, nm}});
  t.push_back({"mudd_w2g", {nm, c.mudd_groups, c.mudd_dim}});
  t.push_back({"mudd_gate_w1", {2, c.mudd_gate_dim, C}});
  t.push_back({"mudd_gate_w2", {2, ng, c.mudd_gate_dim}});
  t.push_back({"mudd_gate_b2", {2, ng}});
  t.push_back({"mudd_gate_scale", {1}});
  t.push_back({"ngram_sign_pool", {c.ngram_sign_rows, c.ngram_dim}});
  t.push_back({"rotary.narrow.freq", {c.narrow_head_dim}});
  t.push_back({"rotary.narrow.attn_scale", {1}});
  t.push_back({"rotary.wide.freq", {c.head_dim}});
  t.push_back({"rotary.wide.attn_scale", {1}});
  return t;
}

std::unique_ptr<Family> gpt_family(const GptConfig& cfg, const TensorMap& weights, const Ops& ops) {
  return std::make_unique<Gpt>(cfg, weights, ops);
}

}  // namespace deg
