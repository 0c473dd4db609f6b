// The gpt model (seed 003) on the Family contract, for a call's rows given their prefixes, written
// over the op interface (kernels/ops.h): every loop over tokens, rows and heads is an op's. What
// crosses tokens lives in the state: attention K/V (sliding windows are a mask over all kept
// positions; the key offset is applied when a key is read, so K holds each token's own rotated key)
// and the last two token ids (smear gate, n-gram hashes). What crosses layers rides in side lanes
// of the residual stream, per token: the token id (value-embedding lookups), x0, cache 0 (x0 plus
// the gated n-gram embedding), the n-gram embedding, both MUDD gate outputs, and the saved outputs
// of the layers read later (the skip source, the late layer, post-mix sources). The last layer runs
// the MUDD layer and the grouped post-loop mix, so final_norm is the plain RMS norm; finish_logits
// applies the soft cap, so lm_logits are the logits the trainer's loss sees.
//
// Layers without attention (MLP-only, skip, empty layers) declare an empty recurrent state. The
// attention sublayer is gpt_attention.cc. Arithmetic keeps the seed's plain-torch order where it
// is cheap to (double-accumulated dot products in attention and gates, residual mixes as
// `combine` ops summing their terms left to right).
//
// Training runs these same methods with a tape (train_forward): values an op would overwrite in
// place are kept, and attention reads the pass's own keys where the projections put them instead
// of a State; gpt_backward.cc walks them back.
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

namespace deg::gpt_detail {

namespace {

// The [F, C] checkpoint tensor `name` transposed to [C, F] (contiguous) on `ops`' device: an f32
// matrix by the backend's transpose where it is (a training step's resident parameters never
// leave the GPU), a bf16 one on the host.
Tensor transposed_on(const Ops& ops, const TensorMap& w, const std::string& name,
                     const Shape& shape) {
  const Tensor& t = weight_need(w, name, shape);
  if (t.dtype() != DType::f32 || !t.is_contiguous())
    return ops.upload(host_copy(t).transpose(0, 1).contiguous());
  const Tensor x = ops.upload(t);
  Tensor y = ops.alloc({shape[1], shape[0]}, DType::f32);
  ops.transpose(x.data<float>(), shape[1], y.mutable_data<float>(), shape[0], shape[0], shape[1]);
  return y;
}

}  // namespace

GptNet::GptNet(const GptConfig& cfg, const TensorMap& w, const Ops& ops)
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
  // f32 as it is (a trainer's resident copy stays where it is: no copy a step), else widened.
  const Shape pool{cfg.ngram_sign_rows, cfg.ngram_dim};
  sign_pool_ = weight_need(w, "ngram_sign_pool", pool).dtype() == DType::f32
                   ? weight_on(ops, w, "ngram_sign_pool", pool)
                   : vector_on(ops, weight_f32(w, "ngram_sign_pool", pool));
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
  spec_ = {.family = "gpt", .hidden = C, .vocab = V, .stream = 0, .history = kGptHistory};
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
                 .b2 = vector_on(
                     ops, std::vector<float>(gb2.begin() + id * ng_, gb2.begin() + (id + 1) * ng_)),
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

void GptNet::finish_logits(const Exec& x, float* logits, int64_t n) const {
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

void GptNet::embed(const Exec& x, const EmbedCall& e, CallTape* tape) const {
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
                     .history_len = kGptHistory,
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
  float* sig = x.arena.floats(N);
  float* smear = x.arena.floats(N);
  x.ops.sigmoid_gates({.x = h,
                       .ldx = S,
                       .w = smear_.data<float>(),
                       .ldw = sc,
                       .rows = N,
                       .n = sc,
                       .out = sig,
                       .ldo = 1});
  x.ops.bias_scale({.x = sig,
                    .ldx = 1,
                    .y = smear,
                    .ldy = 1,
                    .rows = N,
                    .n = 1,
                    .s = scalars_[size_t(2 * cfg_.num_layers)]});
  x.ops.gather({.table = &embed_,
                .ids = p1,
                .n = N,
                .y = h,
                .ldy = S,
                .keep = true,
                .row_scale = smear,
                .ld_scale = 1});
  if (tape) {
    tape->prev1 = p1;
    tape->prev2 = p2;
    tape->smear_sig = sig;
    tape->smear = smear;
    tape->smeared = x.arena.floats(N * C);
    x.ops.copy_rows(h, S, tape->smeared, C, N, C);
  }
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
  head_run(x, gate_[0], h + lanes_.x0, S, N, h + lanes_.gate[0], S, nullptr, GemmPrecision::exact,
           tape ? &tape->pre_gate : nullptr);
  // x = x0 (+ gate x0_ngram), cache 0 = x
  x.ops.copy_rows(h + lanes_.x0, S, h, S, N, C);
  if (gl_.ngram[0] >= 0) add_ngram(x, h, N, h + lanes_.gate[0] + gl_.ngram[0], S);
  x.ops.copy_rows(h, S, h + lanes_.c0, S, N, C);
}

void GptNet::run_layer(const Exec& x, int i, const LayerCall& c, LayerTape* tape,
                       const int32_t* segment, const RowView* prefix_views) const {
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
  float* h = c.h;
  auto keep = [&](float*& copy) {  // the hidden state as it is now
    copy = x.arena.floats(N * C);
    x.ops.copy_rows(h, S, copy, C, N, C);
  };
  if (tape) keep(tape->x_in);
  if (i == cfg_.post_gate_layer) {
    head_run(x, gate_[1], h, S, N, h + lanes_.gate[1], S, nullptr, c.precision,
             tape ? &tape->post_gate : nullptr);
  }
  if (i == cfg_.mudd_layer()) {
    mudd_layer(x, c, tape, segment, prefix_views);
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
    const float* aux = value_embedding(x, i, c, xn, tape);
    float* out = attention(x, i, c, xn, aux, tape, segment, prefix_views);
    if (tape) {
      tape->xn = xn;
      tape->out = out;
    }
    mix_and_inject(x, i, c, resid_[size_t(2 * i)], out,
                   scalars_[size_t(2 * i + 1)] * post_[size_t(2 * i)]);
  }
  if (tape) keep(tape->x_attn);
  mlp(x, i, c, nullptr, nullptr, tape ? &tape->mlp : nullptr);
  if (lanes_.cache[size_t(i)] >= 0 && i > 0) {  // save the layer's output
    x.ops.copy_rows(h, S, h + lanes_.cache[size_t(i)], S, N, C);
  }
}

// y [n, C] at stride ldy = RMS norm of x [n, C] at stride ldx (no weight).
void GptNet::norm_rows(const Exec& x, const float* in, int64_t ldx, float* y, int64_t ldy,
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
void GptNet::add_ngram(const Exec& x, float* h, int64_t n, const float* coef, int64_t ldc) const {
  const int64_t S = lanes_.width;
  const CombineTerm t[] = {{}, {.x = h + lanes_.ngram, .ldx = S, .lane = coef, .ldl = ldc}};
  x.ops.combine({.y = h, .ldy = S, .rows = n, .n = cfg_.ngram_dim, .terms = t});
}

// out [N, n] at stride ldo (and deltas [N, n G] when the head has w2g) of x [N, C] at ldx.
void GptNet::head_run(const Exec& x, const HeadWeights& w, const float* in, int64_t ldx, int64_t N,
                      float* out, int64_t ldo, float* deltas, GemmPrecision precision,
                      HeadTape* tape) const {
  const int64_t M = w.w1.dim(0), n = w.w2.dim(0), C = cfg_.model_dim;
  float* pre = x.arena.floats(N * M);
  GemmOutput o1{.w = &w.w1, .y = pre, .ldy = M};
  x.ops.gemm({.x = in, .m = N, .k = C, .ldx = ldx, .outputs = {&o1, 1}, .precision = precision});
  float* act = tape ? x.arena.floats(N * M) : pre;
  x.ops.activation(
      {.x = pre, .ldx = M, .y = act, .ldy = M, .rows = N, .n = M, .act = Activation::gelu_erf});
  float* u = x.arena.floats(N * n);
  const int64_t nd = deltas ? w.w2g.dim(0) : 0;
  GemmOutput o2[] = {{.w = &w.w2, .y = u, .ldy = n}, {.w = &w.w2g, .y = deltas, .ldy = nd}};
  x.ops.gemm({.x = act,
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
  if (tape) *tape = {.x = in, .ldx = ldx, .pre = pre, .act = act, .u = u};
}

// x = r x (+ o_scale out) (+ x0 gate x0), then x[:, :Dn] += n-gram gate n-gram: the residual
// mix of layer i and its x0 / n-gram injections.
void GptNet::mix_and_inject(const Exec& x, int i, const LayerCall& c, float r, const float* out,
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
const float* GptNet::value_embedding(const Exec& x, int i, const LayerCall& c, const float* xn,
                                     LayerTape* tape) const {
  const int ve = cfg_.value_embed_index(i), veg = cfg_.value_embed_gate_index(i);
  if (ve < 0) return nullptr;
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
  const int64_t H = cfg_.num_heads, gc = cfg_.value_embed_gate_channels;
  float* rows = x.arena.floats(N * C);
  x.ops.gather({.table = &ve_[size_t(ve)],
                .n = N,
                .y = rows,
                .ldy = C,
                .id_lane = c.h + lanes_.id,
                .ld_id = S});
  if (tape) tape->ve = tape->aux = rows;
  if (veg < 0) return rows;
  // Every head's gate reads the ungated plane.
  float* gv = x.arena.floats(N * H);
  x.ops.sigmoid_gates({.x = xn,
                       .ldx = C,
                       .x2 = rows,
                       .ldx2 = C,
                       .w = ve_gate_.data<float>() + veg * H * 2 * gc,
                       .ldw = 2 * gc,
                       .rows = N,
                       .heads = H,
                       .n = gc,
                       .s = 2.0f,
                       .out = gv,
                       .ldo = H});
  float* aux = x.arena.floats(N * C);
  const CombineTerm t[] = {{.x = rows, .ldx = C, .lane = gv, .ldl = H, .gl = 1}};
  x.ops.combine({.y = aux, .ldy = C, .rows = N, .n = C, .group = cfg_.head_dim, .terms = t});
  if (tape) {
    tape->ve_gate = gv;
    tape->aux = aux;
  }
  return aux;
}

AttnInputs GptNet::attn_inputs(int i, const LayerCall& c, const float* xn, const float* aux) const {
  const int xsa = gl_.xsa[size_t(i)], gate = gl_.attn_gate[size_t(i)];
  return {.call = &c,
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
          .gate = gate >= 0 ? lanes_.gate[gl_.gate_id[size_t(i)]] + gate : -1};
}

// The attention sublayer of layer i before its output scale: y W_o^T [N, C] (padded rows 0).
float* GptNet::attention(const Exec& x, int i, const LayerCall& c, const float* xn,
                         const float* aux, LayerTape* tape, const int32_t* segment,
                         const RowView* prefix_views) const {
  AttnInputs in = attn_inputs(i, c, xn, aux);
  in.segment = segment;
  in.tape = tape ? &tape->attn : nullptr;
  in.prefix_views = prefix_views;
  return gpt_detail::attention(x, layers_[size_t(i)].at, in);
}

void GptNet::mlp(const Exec& x, int i, const LayerCall& c, const float* mu, float** mlp_xn,
                 MlpTape* tape) const {
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
  // relu(xn fc^T)^2 proj for (fc, proj) -> out [N, C]; pre and act kept for a tape, with the
  // products' roundings of xn (the first run's) and act (kept_bf16).
  const bf16* xn_b = nullptr;
  // y [N, w rows] = in [N, k] w^T, in's rounding kept at `keep` (or null).
  auto product = [&](const float* in, int64_t k, const Tensor& w, float* y, bf16* keep) {
    GemmOutput o{.w = &w, .y = y, .ldy = w.dim(0)};
    x.ops.gemm({.x = in,
                .m = N,
                .k = k,
                .ldx = k,
                .outputs = {&o, 1},
                .precision = c.precision,
                .xb_out = keep});
  };
  auto run = [&](const Tensor& fc, const Tensor& proj, float** pre_out, float** act_out,
                 const bf16** act_b) {
    float* pre = x.arena.floats(N * F);
    bf16* xb = xn_b ? nullptr : kept_bf16(x, c.precision, tape, N * C);
    product(xn, C, fc, pre, xb);
    if (xb) xn_b = xb;
    float* act = tape ? x.arena.floats(N * F) : pre;
    x.ops.activation({.x = pre,
                      .ldx = F,
                      .y = act,
                      .ldy = F,
                      .rows = N,
                      .n = F,
                      .act = Activation::relu_squared});
    float* out = x.arena.floats(N * C);
    bf16* ab = kept_bf16(x, c.precision, tape, N * F);
    product(act, F, proj, out, ab);
    *pre_out = pre;
    *act_out = act;
    *act_b = ab;
    return out;
  };
  MlpTape t{.xn = xn};
  t.out = run(lw.fc, lw.proj, &t.pre, &t.act, &t.act_b);
  t.xn_b = xn_b;
  if (mu) {
    const CombineTerm ct[] = {{.lane = mu + 12, .ldl = nm_},
                              {.x = t.out, .ldx = C, .lane = mu + 13, .ldl = nm_}};
    x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = ct});
  } else {
    if (i == cfg_.parallel_mlp_layer)
      t.par_out = run(par_fc_, par_proj_, &t.par_pre, &t.par_act, &t.par_act_b);
    const float rm = resid_[size_t(2 * i + 1)], pm = post_[size_t(2 * i + 1)];
    const CombineTerm ct[] = {
        {.s = rm}, {.x = t.out, .ldx = C, .s = pm}, {.x = t.par_out, .ldx = C, .s = pm}};
    x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = {ct, size_t(t.par_out ? 3 : 2)}});
  }
  if (tape) *tape = t;
}

const float* GptNet::mix_source(const Exec& x, const LayerCall& c, size_t k, const float* mlp_xn,
                                const float* late_xn, float* scratch, int64_t& ld) const {
  const GptMixSource& s = cfg_.post_mix_sources[k];
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
  ld = C;
  switch (s.kind) {
    case GptMixSource::Kind::cache: ld = S; return c.h + lanes_.cache[size_t(s.layer)];
    case GptMixSource::Kind::value_embed:
      x.ops.gather({.table = &ve_[size_t(cfg_.value_embed_index(s.layer))],
                    .n = N,
                    .y = scratch,
                    .ldy = C,
                    .id_lane = c.h + lanes_.id,
                    .ld_id = S});
      return scratch;
    case GptMixSource::Kind::last_mlp_in: return mlp_xn;
    case GptMixSource::Kind::late_attn_in: return late_xn;
  }
  return nullptr;
}

// The last layer: MUDD coefficients from x, V = gated VE + mu0 c0 + mu1 c_late + mu2 x,
// x <- (1 + mu5) x + mu3 c0 + mu4 c_late, attention over norm(c_late), then
// mu8 x + mu9 attn + mu10 c0 (+ mu11 n-gram), the MLP with mu12 / mu13, and the post-loop mix
// x + sum_k (mu_k + delta_kg) src_k per channel group.
void GptNet::mudd_layer(const Exec& x, const LayerCall& c, LayerTape* tape, const int32_t* segment,
                        const RowView* prefix_views) const {
  const int i = cfg_.mudd_layer();
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
  const int64_t H = cfg_.num_heads, hd = cfg_.head_dim, nm = nm_;
  float* h = c.h;
  const int64_t late = lanes_.cache[size_t(cfg_.late_layer)];
  float* mu = x.arena.floats(N * nm);  // [N, n]
  head_run(x, mudd_[0], h, S, N, mu, nm, nullptr, c.precision, tape ? &tape->mudd : nullptr);
  float* xn = x.arena.floats(N * C);  // norm(cache[late]): the attention input
  norm_rows(x, h + late, S, xn, C, N);
  // aux = (mu6 | mu7 by head half) VE + mu0 c0 + mu1 c_late + mu2 x
  float* ve = x.arena.floats(N * C);
  const Tensor& plane = ve_[size_t(cfg_.value_embed_index(i))];
  x.ops.gather({.table = &plane, .n = N, .y = ve, .ldy = C, .id_lane = h + lanes_.id, .ld_id = S});
  float* aux = x.arena.floats(N * C);
  const CombineTerm ta[] = {{.x = ve, .ldx = C, .lane = mu + 6, .ldl = nm, .gl = 1},
                            {.x = h + lanes_.c0, .ldx = S, .lane = mu + 0, .ldl = nm},
                            {.x = h + late, .ldx = S, .lane = mu + 1, .ldl = nm},
                            {.x = h, .ldx = S, .lane = mu + 2, .ldl = nm}};
  x.ops.combine({.y = aux, .ldy = C, .rows = N, .n = C, .group = H / 2 * hd, .terms = ta});
  float* recomb = x.arena.floats(N * C);
  const CombineTerm tr[] = {{.x = h, .ldx = S, .lane = mu + 5, .ldl = nm, .offset = 1.0f},
                            {.x = h + lanes_.c0, .ldx = S, .lane = mu + 3, .ldl = nm},
                            {.x = h + late, .ldx = S, .lane = mu + 4, .ldl = nm}};
  x.ops.combine({.y = recomb, .ldy = C, .rows = N, .n = C, .terms = tr});
  float* out = attention(x, i, c, xn, aux, tape, segment, prefix_views);
  float* scaled = x.arena.floats(N * C);
  x.ops.bias_scale({.x = out,
                    .ldx = C,
                    .y = scaled,
                    .ldy = C,
                    .rows = N,
                    .n = C,
                    .s = scalars_[size_t(2 * i + 1)]});
  const CombineTerm tx[] = {{.x = recomb, .ldx = C, .lane = mu + 8, .ldl = nm},
                            {.x = scaled, .ldx = C, .lane = mu + 9, .ldl = nm},
                            {.x = h + lanes_.c0, .ldx = S, .lane = mu + 10, .ldl = nm}};
  x.ops.combine({.y = h, .ldy = S, .rows = N, .n = C, .terms = tx});
  add_ngram(x, h, N, mu + 11, nm);
  if (tape) {
    tape->xn = xn;
    tape->ve = ve;
    tape->aux = aux;
    tape->mu = mu;
    tape->recomb = recomb;
    tape->out = out;
    tape->attn_scaled = scaled;
    tape->x_attn = x.arena.floats(N * C);
    x.ops.copy_rows(h, S, tape->x_attn, C, N, C);
  }
  float* mlp_xn = nullptr;
  mlp(x, i, c, mu, &mlp_xn, tape ? &tape->mlp : nullptr);
  // Post-loop mix, one source at a time: x[g] += (coef_k + delta_kg) src_k[g] per group g.
  const int64_t G = cfg_.mudd_groups;
  float* coef = x.arena.floats(N * nm);
  float* deltas = x.arena.floats(N * nm * G);
  const float* post_in = h;  // a tape keeps the head's input: the mix below changes h
  int64_t post_ld = S;
  if (tape) {
    float* copy = x.arena.floats(N * C);
    x.ops.copy_rows(h, S, copy, C, N, C);
    post_in = copy;
    post_ld = C;
  }
  head_run(x, mudd_[1], post_in, post_ld, N, coef, nm, deltas, c.precision,
           tape ? &tape->post : nullptr);
  if (tape) {
    tape->coef = coef;
    tape->deltas = deltas;
  }
  float* scratch = x.arena.floats(N * C);  // a value-embedding source's rows
  for (size_t k = 0; k < cfg_.post_mix_sources.size(); ++k) {
    int64_t ld = C;
    const float* src = mix_source(x, c, k, mlp_xn, xn, scratch, ld);
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

std::vector<float*> GptNet::train_forward(const Exec& x, std::span<const GptTrainCall> calls,
                                          GptTape& tape) const {
  const int64_t S = lanes_.width, C = cfg_.model_dim;
  for (const Tensor* t : {&embed_, &head_, &ngram_})
    DEG_CHECK(t->dtype() == DType::f32, "gpt training needs f32 weights");
  tape.calls.assign(calls.size(), CallTape{});
  for (size_t k = 0; k < calls.size(); ++k) {
    const GptTrainCall& call = calls[k];
    DEG_CHECK(call.prefix_calls.empty() || (int64_t(call.prefix_calls.size()) == call.rows.rows &&
                                            call.prefix_rows.size() == call.prefix_calls.size()),
              "gpt training: call {} needs one prefix call and row per row", k);
    for (size_t b = 0; b < call.prefix_calls.size(); ++b) {
      const int pc = call.prefix_calls[b];
      DEG_CHECK(pc >= 0 && pc < int(k) && call.prefix_rows[b] >= 0 &&
                    call.prefix_rows[b] < calls[size_t(pc)].rows.rows,
                "gpt training: call {} row {} continues a later call or a missing row", k, b);
    }
    CallTape& ct = tape.calls[k];
    ct.call = call;
    ct.h = x.arena.floats(call.rows.n() * S);
    ct.layers.assign(size_t(cfg_.num_layers), LayerTape{});
    embed(x, {.ids = call.ids, .rows = call.rows, .history = call.history, .h = ct.h}, &ct);
  }
  for (int i = 0; i < cfg_.num_layers; ++i) {
    for (size_t k = 0; k < calls.size(); ++k) {
      CallTape& ct = tape.calls[k];
      const GptTrainCall& call = calls[k];
      std::vector<RowView> prefixes;  // a fork call's rows read their prefix row's keys
      if (!call.prefix_calls.empty() && cfg_.has_attn(i)) {
        for (int64_t b = 0; b < call.rows.rows; ++b) {
          const AttnTape& src =
              tape.calls[size_t(call.prefix_calls[size_t(b)])].layers[size_t(i)].attn;
          const RowView& p = src.views[size_t(call.prefix_rows[size_t(b)])];
          prefixes.push_back({.prefix_k = p.own_k,
                              .prefix_v = p.own_v,
                              .prefix_len = call.rows.positions[b],
                              .prefix_stride = p.own_stride});
        }
      }
      const LayerCall lc{.h = ct.h, .rows = call.rows, .precision = call.precision};
      run_layer(x, i, lc, &ct.layers[size_t(i)], call.segment,
                prefixes.empty() ? nullptr : prefixes.data());
    }
  }
  std::vector<float*> finals;
  for (CallTape& ct : tape.calls) {
    const int64_t N = ct.call.rows.n();
    ct.final_xn = x.arena.floats(N * C);
    norm_rows(x, ct.h, S, ct.final_xn, C, N);
    finals.push_back(ct.final_xn);
  }
  return finals;
}

}  // namespace deg::gpt_detail

namespace deg {

using gpt_detail::GptNet;

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
  return std::make_unique<GptNet>(cfg, weights, ops);
}

}  // namespace deg
