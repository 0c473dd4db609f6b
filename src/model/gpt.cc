// The gpt family on the Family contract: the trainer's forward (src/train/gpt_step.cc) computed
// per row of a call given the row's prefix, with the kernels' GEMMs and norms. What crosses tokens
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
// to (double-accumulated dot products in attention and gates, the same axpy order), so results
// agree to rounding.
//
// Letters: B rows, L tokens of a call, N = B L, C model dim, S stream width, H heads, Dq / Dv
// q-k / v head widths, D K/V storage width, F MLP hidden, M MUDD hidden, G mix groups, Dn n-gram
// dim, n coefficients of a MUDD head.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/scratch.h"
#include "model/family_common.h"
#include "model/gpt_internal.h"

namespace deg {

namespace {

using namespace gpt_detail;

constexpr int64_t kHistory = 2;  // ids before a token that its embedding reads

float gelu(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}
int32_t wrap_mul(int32_t m, int32_t x) {
  return int32_t(uint32_t(m) * uint32_t(x));
}
int32_t py_mod(int32_t a, int32_t m) {  // Python's % for m > 0
  const int32_t r = a % m;
  return r < 0 ? r + m : r;
}

// Row `row` of a [rows, width] table as f32: a pointer into it, or widened into `tmp`.
const float* table_row(const Tensor& t, int64_t row, float* tmp) {
  const int64_t w = t.dim(-1);
  if (t.dtype() == DType::f32) return t.data<float>() + row * w;
  const bf16* r = t.data<bf16>() + row * w;
  for (int64_t i = 0; i < w; ++i) tmp[i] = bf16_to_f32(r[i]);
  return tmp;
}

// A two-layer MUDD head: out = (gelu(x W1^T) W2^T + b2) * scale, deltas = gelu(x W1^T) W2g^T *
// scale (the grouped post-loop mix only).
struct HeadWeights {
  Tensor w1, w2, w2g;     // [M, C], [n, M], [n G, M]
  std::vector<float> b2;  // [n]
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
  Gpt(const GptConfig& cfg, const TensorMap& w) : cfg_(cfg), gl_(cfg.gate_lanes()) {
    cfg.validate();
    const int64_t C = cfg.model_dim, V = cfg.vocab_size, H = cfg.num_heads, L = cfg.num_layers;
    DEG_CHECK(V < (int64_t(1) << 24), "gpt: vocab {} does not fit the f32 id lane", V);
    nm_ = cfg.mudd_coefs();
    ng_ = cfg.mudd_gate_coefs();
    embed_ = weight_need(w, "embed", {V, C});
    head_ = weight_need(w, "lm_head", {V, C});
    const Tensor& ve =
        weight_need(w, "value_embeds", {int64_t(cfg.value_embed_layers.size()), V, C});
    for (size_t j = 0; j < cfg.value_embed_layers.size(); ++j) ve_.push_back(ve.select(0, j));
    ngram_ = weight_need(w, "ngram_table", {cfg.ngram_vocab, cfg.ngram_dim});
    sign_pool_ = weight_f32(w, "ngram_sign_pool", {cfg.ngram_sign_rows, cfg.ngram_dim});
    smear_ = weight_f32(w, "smear_gate", {1, cfg.smear_channels});
    ve_gate_ = weight_f32(
        w, "ve_gate",
        {int64_t(cfg.value_embed_gate_layers.size()), H, 2 * cfg.value_embed_gate_channels});
    scalars_ = weight_f32(w, "scalars", {2 * L + 2});
    resid_ = weight_f32(w, "resid_lambdas", {L, 2});
    post_ = weight_f32(w, "post_lambdas", {L, 2});
    for (const char* kind : {"narrow", "wide"}) {
      const int64_t dq = std::string(kind) == "wide" ? cfg.head_dim : cfg.narrow_head_dim;
      const std::string pre = std::string("rotary.") + kind;
      freq_.push_back(weight_f32(w, pre + ".freq", {dq}));
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
        a.qk = weight_need(w, layer_name(i, "attn.qk"), {2 * H * a.dq, C});
        a.v = weight_need(w, layer_name(i, "attn.v"), {H * a.dv, C});
        a.o = weight_need(w, layer_name(i, "attn.o"), {C, H * a.dv});
        a.paired = cfg.paired(i);
        a.key_offset = cfg.long_window(i);
        a.window = cfg.long_window(i) ? cfg.window_long : cfg.window_short;
        const int wide = cfg.has(cfg.wide_qk_layers, i) ? 1 : 0;
        a.freq = freq_[size_t(wide)].data();
        a.scale = attn_scale_[size_t(wide)];
        DEG_CHECK(!(a.paired && a.key_offset), "gpt: paired heads take no key offset");
        spec_.layers.push_back({.kind = LayerKind::attention, .kv_heads = H, .head_dim = a.d});
      } else {  // no state: an empty recurrent one
        spec_.layers.push_back({.kind = LayerKind::recurrent, .conv_kernel = 1});
      }
      if (l.mlp) {
        l.fc = weight_need(w, layer_name(i, "mlp.fc"), {F, C});
        l.proj = weight_need(w, layer_name(i, "mlp.proj"), {F, C}).transpose(0, 1).contiguous();
      }
      layers_.push_back(std::move(l));
    }
    if (cfg.parallel_mlp_layer >= 0) {
      par_fc_ = weight_need(w, "parallel_mlp.fc", {F, C});
      par_proj_ = weight_need(w, "parallel_mlp.proj", {F, C}).transpose(0, 1).contiguous();
    }
    const int64_t M = cfg.mudd_dim, G = cfg.mudd_groups, Mg = cfg.mudd_gate_dim;
    const Tensor& w1 = weight_need(w, "mudd_w1", {2, M, C});
    const Tensor& w2 = weight_need(w, "mudd_w2", {2, nm_, M});
    const std::vector<float> b2 = weight_f32(w, "mudd_b2", {2, nm_});
    const Tensor& w2g = weight_need(w, "mudd_w2g", {nm_, G, M});
    const Tensor& gw1 = weight_need(w, "mudd_gate_w1", {2, Mg, C});
    const Tensor& gw2 = weight_need(w, "mudd_gate_w2", {2, ng_, Mg});
    const std::vector<float> gb2 = weight_f32(w, "mudd_gate_b2", {2, ng_});
    const float gate_scale = weight_f32(w, "mudd_gate_scale", {1})[0];
    for (int id = 0; id < 2; ++id) {
      mudd_[id] = {.w1 = w1.select(0, id),
                   .w2 = w2.select(0, id),
                   .w2g = id == 1 ? w2g.view({nm_ * G, M}) : Tensor{},
                   .b2 = std::vector<float>(b2.begin() + id * nm_, b2.begin() + (id + 1) * nm_),
                   .scale = cfg.mudd_scale};
      gate_[id] = {.w1 = gw1.select(0, id),
                   .w2 = gw2.select(0, id),
                   .w2g = {},
                   .b2 = std::vector<float>(gb2.begin() + id * ng_, gb2.begin() + (id + 1) * ng_),
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
    ones_.assign(size_t(std::max(C, cfg.head_dim)), 1.0f);
    const int64_t nmax = std::max(nm_, ng_);
    arena_per_token_ = 16 * C + 2 * F + 2 * M + 2 * Mg + 4 * nmax + nm_ * G + 64;
  }

  const BackboneSpec& spec() const override { return spec_; }
  const Tensor& lm_head() const override { return head_; }

  // Token embedding, smear, x0 = norm(.), the n-gram embedding, the pre MUDD gate, cache 0.
  void embed_rows(const Exec& /*x*/, const EmbedCall& e) const override {
    const int64_t Lc = e.rows.tokens, N = e.rows.rows * Lc, S = lanes_.width, C = cfg_.model_dim;
    const int64_t Dn = cfg_.ngram_dim, sc = cfg_.smear_channels;
    const float smear_lambda = scalars_[size_t(2 * cfg_.num_layers)];
    for_each(N, 16, [&](int64_t i) {
      const int64_t b = i / Lc, t = i % Lc, pos = e.rows.positions[b] + t;
      auto before = [&](int64_t k) {  // the id k tokens back
        return t >= k ? e.ids[i - k] : e.history[b * kHistory + kHistory - (k - t)];
      };
      const int32_t id = e.ids[i], p1 = before(1), p2 = before(2);
      float* x = e.h + i * S;
      float* tmp = scratch_floats(kTokenSlot, size_t(std::max(C, Dn)));
      const float* emb = table_row(embed_, id, tmp);
      std::memcpy(x, emb, size_t(C) * sizeof(float));
      if (pos >= 1) {
        const float g = smear_lambda * sigmoid(dot(x, smear_.data(), sc));
        axpy(g, table_row(embed_, p1, tmp), x, C);
      }
      rms_norm({.x = x,
                .ldx = C,
                .y = x + lanes_.x0,
                .ldy = C,
                .rows = 1,
                .dim = C,
                .w = ones_.data(),
                .eps = cfg_.norm_eps,
                .scale = NormScale::w});
      ngram_embed(pos, id, p1, p2, x + lanes_.ngram, tmp);
      x[lanes_.id] = float(id);
    });
    head_run(gate_[0], e.h + lanes_.x0, S, N, e.h + lanes_.gate[0], S, nullptr,
             GemmPrecision::exact);
    const int ng0 = gl_.ngram[0];
    for_each(N, 16, [&](int64_t i) {
      float* x = e.h + i * S;
      std::memcpy(x, x + lanes_.x0, size_t(C) * sizeof(float));
      if (ng0 >= 0) axpy(x[lanes_.gate[0] + ng0], x + lanes_.ngram, x, Dn);
      std::memcpy(x + lanes_.c0, x, size_t(C) * sizeof(float));
    });
  }

  void layer(const Exec& /*x*/, int index, const LayerCall& c) const override {
    const int i = index;
    const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
    SlotArena ar(kLayerSlots + 0, size_t(N * arena_per_token_));
    float* h = c.h;
    if (i == cfg_.post_gate_layer) {
      head_run(gate_[1], h, S, N, h + lanes_.gate[1], S, nullptr, c.precision);
    }
    if (i == cfg_.mudd_layer()) {
      mudd_layer(c, ar);
      return;
    }
    const LayerWeights& lw = layers_[size_t(i)];
    if (i == cfg_.skip_layer) {
      const float sl = sigmoid(scalars_[size_t(2 * cfg_.num_layers + 1)]);
      const int64_t src = lanes_.cache[size_t(cfg_.skip_source)];
      for_each(N, 16, [&](int64_t t) {
        float* x = h + t * S;
        axpy(sl * x[lanes_.gate[1] + gl_.skip], x + src, x, C);
      });
    } else if (!lw.attn) {
      const float r = resid_[size_t(2 * i)];
      for_each(N, 16, [&](int64_t t) {
        float* x = h + t * S;
        for (int64_t k = 0; k < C; ++k) x[k] *= r;
        inject(i, x);
      });
    } else {
      float* xn = ar.take(N * C);
      const bool late = uses_late(i);
      norm_rows(late ? h + lanes_.cache[size_t(cfg_.late_layer)] : h, S, xn, C, N);
      const float* aux = value_embedding(i, c, xn, ar);
      const float* out = attention(i, c, xn, aux, ar);
      const float r = resid_[size_t(2 * i)];
      const float o_scale = scalars_[size_t(2 * i + 1)] * post_[size_t(2 * i)];
      for_each(N, 16, [&](int64_t t) {
        float* x = h + t * S;
        for (int64_t k = 0; k < C; ++k) x[k] = r * x[k] + o_scale * out[t * C + k];
        inject(i, x);
      });
    }
    mlp(i, c, ar, nullptr, nullptr);
    if (lanes_.cache[size_t(i)] >= 0 && i > 0) save_cache(i, c);
  }

  void final_norm(const Exec& /*x*/, const float* h, float* out, int64_t n) const override {
    norm_rows(h, cfg_.model_dim, out, cfg_.model_dim, n);
  }

  void finish_logits(const Exec& /*x*/, float* logits, int64_t n) const override {
    const float a = cfg_.softcap_a, b = cfg_.softcap_b, c = cfg_.softcap_c;
    parallel_for(
        n,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) logits[i] = a * sigmoid((logits[i] + b) / c);
        },
        4096);
  }

 private:
  bool uses_late(int i) const { return cfg_.late_layer >= 0 && i > cfg_.late_layer; }

  // y [n, C] at stride ldy = RMS norm of x [n, C] at stride ldx (no weight).
  void norm_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n) const {
    cpu_ops().rms_norm({.x = x,
                        .ldx = ldx,
                        .y = y,
                        .ldy = ldy,
                        .rows = n,
                        .dim = cfg_.model_dim,
                        .w = ones_.data(),
                        .eps = cfg_.norm_eps,
                        .scale = NormScale::w});
  }

  // x0_ngram [Dn] of the token at `pos` with id x after p1, p2 (train ngram_hash per token).
  void ngram_embed(int64_t pos, int32_t x, int32_t p1, int32_t p2, float* out, float* tmp) const {
    const GptConfig& c = cfg_;
    const int32_t half = int32_t(c.ngram_vocab / 2), bmod = half - 1;
    const int32_t tmod = int32_t(c.ngram_vocab) - half - 1, mask = int32_t(c.ngram_sign_rows - 1);
    const auto& br = c.bigram_row_muls;
    const auto& tr = c.trigram_row_muls;
    const auto& bs = c.bigram_sign_muls;
    const auto& ts = c.trigram_sign_muls;
    // Position 0 takes the reserved bigram row; position 1 hashes the reserved id as its
    // previous token (the seed hashes in place after setting row 0).
    const int32_t prev = pos == 1 ? bmod : p1;
    const int32_t rows[2] = {
        pos == 0 ? bmod : py_mod(wrap_mul(br[0], x) ^ wrap_mul(br[1], prev), bmod),
        pos < 2
            ? half + tmod
            : py_mod(wrap_mul(tr[0], x) ^ wrap_mul(tr[1], p1) ^ wrap_mul(tr[2], p2), tmod) + half};
    const int32_t signs[2] = {
        pos < 1 ? 0 : (wrap_mul(bs[1], p1) ^ wrap_mul(bs[0], x)) & mask,
        pos < 2 ? 0 : (wrap_mul(ts[2], p2) ^ wrap_mul(ts[1], p1) ^ wrap_mul(ts[0], x)) & mask};
    const int64_t Dn = c.ngram_dim;
    std::fill(out, out + Dn, 0.0f);
    for (int ch = 0; ch < 2; ++ch) {
      const float* row = table_row(ngram_, rows[ch], tmp);
      const float* sign = sign_pool_.data() + int64_t(signs[ch]) * Dn;
      for (int64_t d = 0; d < Dn; ++d) out[d] += row[d] * sign[d];
    }
  }

  // out [N, n] at stride ldo (and deltas [N, n G] when the head has w2g) of x [N, C] at ldx.
  void head_run(const HeadWeights& w, const float* x, int64_t ldx, int64_t N, float* out,
                int64_t ldo, float* deltas, GemmPrecision precision) const {
    const int64_t M = w.w1.dim(0), n = w.w2.dim(0), C = cfg_.model_dim;
    SlotArena ar(kLayerSlots + 1, size_t(N * (M + n)));
    float* pre = ar.take(N * M);
    GemmOutput o1{.w = &w.w1, .y = pre, .ldy = M};
    gemm({.x = x, .m = N, .k = C, .ldx = ldx, .outputs = {&o1, 1}, .precision = precision});
    for_each(N, 16, [&](int64_t t) {
      for (int64_t k = 0; k < M; ++k) pre[t * M + k] = gelu(pre[t * M + k]);
    });
    float* u = ar.take(N * n);
    GemmOutput o2[] = {{.w = &w.w2, .y = u, .ldy = n}, {.w = &w.w2g, .y = deltas, .ldy = 0}};
    if (deltas) o2[1].ldy = w.w2g.dim(0);
    gemm({.x = pre,
          .m = N,
          .k = M,
          .ldx = M,
          .outputs = {o2, size_t(deltas ? 2 : 1)},
          .precision = precision});
    for_each(N, 16, [&](int64_t t) {
      for (int64_t k = 0; k < n; ++k) out[t * ldo + k] = (u[t * n + k] + w.b2[size_t(k)]) * w.scale;
      if (deltas) {
        const int64_t nd = w.w2g.dim(0);
        for (int64_t k = 0; k < nd; ++k) deltas[t * nd + k] *= w.scale;
      }
    });
  }

  // x0 and n-gram injections of layer i into one token's stream x [S].
  void inject(int i, float* x) const {
    const float* g = x + lanes_.gate[gl_.gate_id[size_t(i)]];
    if (gl_.x0[size_t(i)] >= 0) axpy(g[gl_.x0[size_t(i)]], x + lanes_.x0, x, cfg_.model_dim);
    if (gl_.ngram[size_t(i)] >= 0 && i != 0)
      axpy(g[gl_.ngram[size_t(i)]], x + lanes_.ngram, x, cfg_.ngram_dim);
  }

  void save_cache(int i, const LayerCall& c) const {
    const int64_t S = lanes_.width, at = lanes_.cache[size_t(i)];
    for_each(c.rows.n(), 64, [&](int64_t t) {
      std::memcpy(c.h + t * S + at, c.h + t * S, size_t(cfg_.model_dim) * sizeof(float));
    });
  }

  // Value embedding added to V on layer i (2 sigmoid-gated per head where gated), or null.
  const float* value_embedding(int i, const LayerCall& c, const float* xn, SlotArena& ar) const {
    const int ve = cfg_.value_embed_index(i), veg = cfg_.value_embed_gate_index(i);
    if (ve < 0) return nullptr;
    const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
    const int64_t H = cfg_.num_heads, hd = cfg_.head_dim, gc = cfg_.value_embed_gate_channels;
    float* aux = ar.take(N * C);
    for_each(N, 16, [&](int64_t t) {
      float* a = aux + t * C;
      const float* row = table_row(ve_[size_t(ve)], int64_t(c.h[t * S + lanes_.id]), a);
      if (row != a) std::memcpy(a, row, size_t(C) * sizeof(float));
      if (veg < 0) return;
      // Every head's gate reads the ungated plane.
      const float* gw = ve_gate_.data() + veg * H * 2 * gc;
      float* gv = scratch_floats(kTokenSlot, size_t(H));
      for (int64_t hh = 0; hh < H; ++hh) {
        const float z = dot(gw + hh * 2 * gc, xn + t * C, gc) + dot(gw + hh * 2 * gc + gc, a, gc);
        gv[hh] = 2.0f * sigmoid(z);
      }
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t d = 0; d < hd; ++d) a[hh * hd + d] *= gv[hh];
    });
    return aux;
  }

  // The attention sublayer of layer i before its output scale: y W_o^T [N, C] (padded rows 0).
  const float* attention(int i, const LayerCall& c, const float* xn, const float* aux,
                         SlotArena& ar) const {
    const int xsa = gl_.xsa[size_t(i)], gate = gl_.attn_gate[size_t(i)];
    return gpt_detail::attention(
        layers_[size_t(i)].at,
        {.call = &c,
         .xn = xn,
         .aux = aux,
         .ones = ones_.data(),
         .sa0 = scalars_[size_t(2 * i)],
         .eps = cfg_.norm_eps,
         .model_dim = cfg_.model_dim,
         .heads = cfg_.num_heads,
         .rotary_dim = cfg_.rotary_dim,
         .stream = lanes_.width,
         .xsa = xsa >= 0 ? lanes_.gate[0] + xsa : -1,
         .gate = gate >= 0 ? lanes_.gate[gl_.gate_id[size_t(i)]] + gate : -1},
        ar);
  }

  // The MLP sublayer of layer i in place on the stream: x = rm x + pm mlp(norm(x)) (+ the
  // parallel MLP). MUDD layer: mu = its coefficients, x = mu12 x + mu13 mlp(norm(x)); mlp_xn
  // receives norm(x) (the post mix reads it).
  void mlp(int i, const LayerCall& c, SlotArena& ar, const float* mu, float** mlp_xn) const;

  void mudd_layer(const LayerCall& c, SlotArena& ar) const;

  GptConfig cfg_;
  GptConfig::GateLanes gl_;
  int64_t nm_ = 0, ng_ = 0;  // MUDD / MUDD-gate coefficients
  BackboneSpec spec_;
  StreamLanes lanes_;
  Tensor embed_, head_, ngram_;
  std::vector<Tensor> ve_;  // per plane [V, C]
  std::vector<float> sign_pool_, smear_, ve_gate_, scalars_, resid_, post_, ones_;
  std::vector<std::vector<float>> freq_;  // narrow, wide
  std::vector<float> attn_scale_;
  std::vector<LayerWeights> layers_;
  Tensor par_fc_, par_proj_;
  HeadWeights mudd_[2], gate_[2];
  int64_t arena_per_token_ = 0;
};

void Gpt::mlp(int i, const LayerCall& c, SlotArena& ar, const float* mu, float** mlp_xn) const {
  const LayerWeights& lw = layers_[size_t(i)];
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim, F = cfg_.mlp_hidden;
  float* h = c.h;
  if (!lw.mlp) {
    const float r = resid_[size_t(2 * i + 1)];
    for_each(N, 16, [&](int64_t t) {
      for (int64_t k = 0; k < C; ++k) h[t * S + k] *= r;
    });
    return;
  }
  float* xn = ar.take(N * C);
  norm_rows(h, S, xn, C, N);
  if (mlp_xn) *mlp_xn = xn;
  // relu(xn fc^T)^2 proj for (fc, proj) -> out [N, C]
  auto run = [&](const Tensor& fc, const Tensor& proj) {
    float* act = ar.take(N * F);
    GemmOutput o1{.w = &fc, .y = act, .ldy = F};
    gemm({.x = xn, .m = N, .k = C, .ldx = C, .outputs = {&o1, 1}, .precision = c.precision});
    for_each(N, 16, [&](int64_t t) {
      for (int64_t k = 0; k < F; ++k) {
        const float r = act[t * F + k] > 0 ? act[t * F + k] : 0.0f;
        act[t * F + k] = r * r;
      }
    });
    float* out = ar.take(N * C);
    GemmOutput o2{.w = &proj, .y = out, .ldy = C};
    gemm({.x = act, .m = N, .k = F, .ldx = F, .outputs = {&o2, 1}, .precision = c.precision});
    return out;
  };
  const float* out = run(lw.fc, lw.proj);
  const float* par = i == cfg_.parallel_mlp_layer ? run(par_fc_, par_proj_) : nullptr;
  const float rm = resid_[size_t(2 * i + 1)], pm = post_[size_t(2 * i + 1)];
  for_each(N, 16, [&](int64_t t) {
    float* x = h + t * S;
    const float* o = out + t * C;
    if (mu) {
      const float* m = mu + t * nm_;
      for (int64_t k = 0; k < C; ++k) x[k] = m[12] * x[k] + m[13] * o[k];
      return;
    }
    for (int64_t k = 0; k < C; ++k) x[k] = rm * x[k] + pm * o[k];
    if (par) axpy(pm, par + t * C, x, C);
  });
}

// The last layer: MUDD coefficients from x, V = gated VE + mu0 c0 + mu1 c_late + mu2 x,
// x <- (1 + mu5) x + mu3 c0 + mu4 c_late, attention over norm(c_late), then
// mu8 x + mu9 attn + mu10 c0 (+ mu11 n-gram), the MLP with mu12 / mu13, and the post-loop mix
// x + sum_k (mu_k + delta_kg) src_k per channel group.
void Gpt::mudd_layer(const LayerCall& c, SlotArena& ar) const {
  const int i = cfg_.mudd_layer();
  const int64_t N = c.rows.n(), S = lanes_.width, C = cfg_.model_dim;
  const int64_t H = cfg_.num_heads, hd = cfg_.head_dim, Dn = cfg_.ngram_dim;
  float* h = c.h;
  const int64_t late = lanes_.cache[size_t(cfg_.late_layer)];
  float* mu = ar.take(N * nm_);
  head_run(mudd_[0], h, S, N, mu, nm_, nullptr, c.precision);
  float* xn = ar.take(N * C);  // norm(cache[late]): the attention input
  norm_rows(h + late, S, xn, C, N);
  float* aux = ar.take(N * C);
  float* recomb = ar.take(N * C);
  const Tensor& ve = ve_[size_t(cfg_.value_embed_index(i))];
  for_each(N, 16, [&](int64_t t) {
    const float* m = mu + t * nm_;
    const float* x = h + t * S;
    const float* c0 = x + lanes_.c0;
    const float* cl = x + late;
    float* a = aux + t * C;
    const float* vrow = table_row(ve, int64_t(x[lanes_.id]), a);
    for (int64_t k = 0; k < C; ++k) {
      const float gv = (k / hd) < H / 2 ? m[6] : m[7];
      a[k] = gv * vrow[k] + m[0] * c0[k] + m[1] * cl[k] + m[2] * x[k];
      recomb[t * C + k] = (1 + m[5]) * x[k] + m[3] * c0[k] + m[4] * cl[k];
    }
  });
  const float* out = attention(i, c, xn, aux, ar);
  const float o_scale = scalars_[size_t(2 * i + 1)];
  for_each(N, 16, [&](int64_t t) {
    const float* m = mu + t * nm_;
    float* x = h + t * S;
    const float* c0 = x + lanes_.c0;
    for (int64_t k = 0; k < C; ++k)
      x[k] = m[8] * recomb[t * C + k] + m[9] * (o_scale * out[t * C + k]) + m[10] * c0[k];
    axpy(m[11], x + lanes_.ngram, x, Dn);
  });
  float* mlp_xn = nullptr;
  mlp(i, c, ar, mu, &mlp_xn);
  // Post-loop mix.
  const int64_t G = cfg_.mudd_groups, cg = C / G;
  float* coef = ar.take(N * nm_);
  float* deltas = ar.take(N * nm_ * G);
  head_run(mudd_[1], h, S, N, coef, nm_, deltas, c.precision);
  for_each(N, 16, [&](int64_t t) {
    float* x = h + t * S;
    float* tmp = scratch_floats(kTokenSlot, size_t(C));
    for (size_t k = 0; k < cfg_.post_mix_sources.size(); ++k) {
      const GptMixSource& s = cfg_.post_mix_sources[k];
      const float* src = nullptr;
      switch (s.kind) {
        case GptMixSource::Kind::cache: src = x + lanes_.cache[size_t(s.layer)]; break;
        case GptMixSource::Kind::value_embed:
          src = table_row(ve_[size_t(cfg_.value_embed_index(s.layer))], int64_t(x[lanes_.id]), tmp);
          break;
        case GptMixSource::Kind::last_mlp_in: src = mlp_xn + t * C; break;
        case GptMixSource::Kind::late_attn_in: src = xn + t * C; break;
      }
      for (int64_t g = 0; g < G; ++g) {
        const float cf = coef[t * nm_ + int64_t(k)] + deltas[(t * nm_ + int64_t(k)) * G + g];
        axpy(cf, src + g * cg, x + g * cg, cg);
      }
    }
  });
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

std::unique_ptr<Family> gpt_family(const GptConfig& cfg, const TensorMap& weights) {
  return std::make_unique<Gpt>(cfg, weights);
}

}  // namespace deg
