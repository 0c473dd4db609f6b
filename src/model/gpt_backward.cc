// The backward of the gpt model's training forward (GptNet::train_forward, gpt.cc), over the
// training ops of kernels/ops.h: the final norm, the layers in reverse (the post-loop mix and
// the MUDD layer, the MLP, the attention / skip sublayer with its gates and injections), then
// the embeddings. The gradient of a call's stream has the stream's lanes: a lane written once in
// the forward (x0, cache 0, the n-gram embedding, gate outputs, saved layer outputs) gathers the
// gradients of every reader and is handed back to where it was written. Gradients are added to
// the caller's buffers, never overwritten.
//
// Letters as in gpt_internal.h.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "core/error.h"
#include "model/family_common.h"
#include "model/gpt_internal.h"

namespace deg::gpt_detail {

// Training helpers over ops, bound to a pass.
class GradOps {
 public:
  // precision: the forward's products' (GptTrainCall::precision), which their backward's take.
  GradOps(const GptNet& net, const Exec& x, const GptGrads& grads, GemmPrecision precision)
      : n_(net), x_(x), grads_(grads), precision_(precision) {}

  GemmPrecision precision() const { return precision_; }

  float* grad(const std::string& name) const {
    auto it = grads_.find(name);
    DEG_CHECK(it != grads_.end() && it->second, "gpt training: no gradient buffer for {}", name);
    return it->second;
  }
  float* scalar(const char* name, int64_t i) const { return grad(name) + i; }

  // n zeros from the arena.
  float* zeros(int64_t n) const {
    float* p = x_.arena.floats(std::max<int64_t>(n, 1));
    const int64_t w = std::min(n, n_.zeros_.numel());
    if (n == 0) return p;
    const int64_t rows = n / w, tail = n - rows * w;
    x_.ops.copy_rows(n_.zeros_.data<float>(), 0, p, w, rows, w);
    if (tail) x_.ops.copy_rows(n_.zeros_.data<float>(), 0, p + rows * w, tail, 1, tail);
    return p;
  }

  // slot[0] += s sum_{r, j} a[r, j] b[r, j] over rows x n (rows summed in f64 per row, then the
  // rows in order).
  void add_dot(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t n,
               float* slot, float s) const {
    add_dots(a, lda, rows, n, {{.b = b, .ldb = ldb, .slot = slot, .s = s}});
  }

  // add_dot of one a with several b in one pass over a: dots[k].slot += dots[k].s a . dots[k].b
  // (and slot2 += s2 the same dot), each the same bits as its own add_dot.
  struct Dot {
    const float* b;
    int64_t ldb;
    float* slot;
    float s = 1.0f;
    float* slot2 = nullptr;
    float s2 = 1.0f;
  };
  void add_dots(const float* a, int64_t lda, int64_t rows, int64_t n,
                std::initializer_list<Dot> dots) const {
    if (rows == 0 || n == 0 || dots.size() == 0) return;
    DEG_CHECK(dots.size() <= 4, "add_dots: {} dots", dots.size());
    CombineTerm t[4];
    CombineGrad g[4];
    float* partial[4];
    size_t k = 0;
    for (const Dot& d : dots) {
      partial[k] = zeros(rows);
      t[k] = {.x = d.b, .ldx = d.ldb, .lane = n_.ones_.data<float>()};
      g[k] = {.dcoef = partial[k], .ldc = 1};
      ++k;
    }
    x_.ops.combine_backward(
        {.forward = {.rows = rows, .n = n, .terms = {t, k}}, .dy = a, .ldy = lda, .grads = {g, k}});
    k = 0;
    for (const Dot& d : dots) {
      for (auto [slot, s] : {std::pair{d.slot, d.s}, std::pair{d.slot2, d.s2}})
        if (slot)
          x_.ops.column_sum({.x = partial[k], .ldx = 1, .rows = rows, .n = 1, .s = s, .out = slot});
      ++k;
    }
  }

  // y = in W^T (W [O, K] f32) at `precision`: din += dy W (ldd; din = dy W with
  // overwrite_din), dw += dy^T in. bf16_all: in_b is in as the forward's product rounded it (or
  // null), and dy is rounded once for both products; returns that rounding (valid until the
  // next linear), or null.
  const bf16* linear(const float* in, int64_t ldi, int64_t N, const Tensor& w, const float* dy,
                     int64_t ldy, float* din, int64_t ldd, float* dw, GemmPrecision precision,
                     bool overwrite_din = false, const bf16* in_b = nullptr) const {
    const int64_t O = w.dim(0), K = w.dim(1);
    bf16* dy_b = din && precision == GemmPrecision::bf16_all ? rounded_rows(N * O) : nullptr;
    if (din)
      x_.ops.matmul({.a = dy,
                     .lda = ldy,
                     .b = w.data<float>(),
                     .ldb = K,
                     .c = din,
                     .ldc = ldd,
                     .m = N,
                     .n = K,
                     .k = O,
                     .accumulate = !overwrite_din,
                     .precision = precision,
                     .ab_out = dy_b});
    if (dw)
      x_.ops.matmul({.a = dy,
                     .lda = ldy,
                     .ta = true,
                     .b = in,
                     .ldb = ldi,
                     .c = dw,
                     .ldc = K,
                     .m = O,
                     .n = K,
                     .k = N,
                     .accumulate = true,
                     .precision = precision,
                     .ab = dy_b,
                     .bb = in_b});
    return dy_b;
  }

  // Room for n bf16 values that a product's rounding of its operand goes to (ab_out), one
  // buffer reused by every linear: stream order keeps a use after the products before it.
  bf16* rounded_rows(int64_t n) const {
    if (n > rounded_cap_) {
      rounded_ = reinterpret_cast<bf16*>(x_.arena.floats((n + 1) / 2));
      rounded_cap_ = n;
    }
    return rounded_;
  }

  // y (ld S) += x over rows x n: a gradient handed from a lane back to its source.
  void add_rows(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows,
                int64_t n) const {
    const CombineTerm t[] = {{}, {.x = src, .ldx = lds}};
    x_.ops.combine({.y = dst, .ldy = ldd, .rows = rows, .n = n, .terms = t});
  }

  // The backward of GptNet::add_ngram (h[:, :Dn] += coef n-gram) in place on d: the n-gram
  // lane's gradient and the coefficient's (dcoef, at stride ldd).
  void add_ngram(const float* h, float* d, int64_t N, const float* coef, int64_t ldc, float* dcoef,
                 int64_t ldd) const {
    const int64_t S = n_.lanes_.width, ng = n_.lanes_.ngram;
    const CombineTerm t[] = {{}, {.x = h + ng, .ldx = S, .lane = coef, .ldl = ldc}};
    const CombineGrad g[] = {{}, {.dx = d + ng, .lddx = S, .dcoef = dcoef, .ldc = ldd}};
    x_.ops.combine_backward({.forward = {.rows = N, .n = n_.cfg_.ngram_dim, .terms = t},
                             .dy = d,
                             .ldy = S,
                             .y_before = d,
                             .ldb = S,
                             .dy_before = d,
                             .lddb = S,
                             .grads = g});
  }

  // The unit-weight RMS norm's backward: dx += from x and dy.
  void norm(const float* in, int64_t ldx, const float* dy, int64_t ldy, float* dx, int64_t lddx,
            int64_t rows) const {
    x_.ops.rms_norm_backward({.x = in,
                              .ldx = ldx,
                              .dy = dy,
                              .ldy = ldy,
                              .dx = dx,
                              .lddx = lddx,
                              .rows = rows,
                              .dim = n_.cfg_.model_dim,
                              .eps = n_.cfg_.norm_eps});
  }

  struct HeadGrads {
    float* w1 = nullptr;
    float* w2 = nullptr;
    float* b2 = nullptr;
    float* w2g = nullptr;
    float* scale = nullptr;  // a learned scale's gradient, or null
  };
  HeadGrads mudd(int id) const {
    const GptConfig& c = n_.cfg_;
    const int64_t M = c.mudd_dim, nm = n_.nm_, C = c.model_dim;
    return {.w1 = grad("mudd_w1") + id * M * C,
            .w2 = grad("mudd_w2") + id * nm * M,
            .b2 = grad("mudd_b2") + id * nm,
            .w2g = id == 1 ? grad("mudd_w2g") : nullptr};
  }
  HeadGrads gate(int id) const {
    const GptConfig& c = n_.cfg_;
    const int64_t M = c.mudd_gate_dim, ng = n_.ng_, C = c.model_dim;
    return {.w1 = grad("mudd_gate_w1") + id * M * C,
            .w2 = grad("mudd_gate_w2") + id * ng * M,
            .b2 = grad("mudd_gate_b2") + id * ng,
            .scale = grad("mudd_gate_scale")};
  }

  // The backward of head_run over input rows `in` (ldi): dout [N, n] (ldo), ddeltas [N, n G] or
  // null; dx (lddx) +=.
  void head(const HeadWeights& w, const HeadTape& t, const float* in, int64_t ldi, int64_t N,
            const float* dout, int64_t ldo, const float* ddeltas, float* dx, int64_t lddx,
            const HeadGrads& g, GemmPrecision precision) const {
    const int64_t M = w.w1.dim(0), n = w.w2.dim(0);
    float* du = x_.arena.floats(N * n);
    x_.ops.bias_scale({.x = dout, .ldx = ldo, .y = du, .ldy = n, .rows = N, .n = n, .s = w.scale});
    if (g.scale) {  // out = (u + b2) scale
      float* ub = x_.arena.floats(N * n);
      x_.ops.bias_scale(
          {.x = t.u, .ldx = n, .y = ub, .ldy = n, .rows = N, .n = n, .bias = w.b2.data<float>()});
      add_dot(dout, ldo, ub, n, N, n, g.scale, 1.0f);
    }
    x_.ops.column_sum({.x = du, .ldx = n, .rows = N, .n = n, .out = g.b2});
    float* dact = x_.arena.floats(N * M);
    linear(t.act, M, N, w.w2, du, n, dact, M, g.w2, precision, true);
    if (ddeltas) {
      const int64_t nd = w.w2g.dim(0);
      float* dd = x_.arena.floats(N * nd);
      x_.ops.bias_scale(
          {.x = ddeltas, .ldx = nd, .y = dd, .ldy = nd, .rows = N, .n = nd, .s = w.scale});
      linear(t.act, M, N, w.w2g, dd, nd, dact, M, g.w2g, precision);
    }
    x_.ops.activation_backward({.x = t.pre,
                                .ldx = M,
                                .dy = dact,
                                .ldy = M,
                                .dx = dact,
                                .lddx = M,
                                .rows = N,
                                .n = M,
                                .act = Activation::gelu_erf,
                                .accumulate = false});
    linear(in, ldi, N, w.w1, dact, M, dx, lddx, g.w1, precision);
  }

  // The backward of one MLP run (relu(xn fc^T)^2 proj): dxn += from dmo [N, C].
  // xn_b, act_b: the forward products' roundings (MlpTape), or null.
  void mlp_run(const Tensor& fc, const Tensor& proj_t, const float* xn, const float* pre,
               const float* act, const bf16* xn_b, const bf16* act_b, const float* dmo, int64_t N,
               float* dxn, float* dfc, float* dproj, bool overwrite_dxn = false) const {
    const int64_t C = n_.cfg_.model_dim, F = n_.cfg_.mlp_hidden;
    // out = act proj_t^T with proj_t [C, F]; the checkpoint's proj is [F, C]: dproj = act^T dmo.
    float* dact = x_.arena.floats(N * F);
    const bf16* dmo_b = linear(act, F, N, proj_t, dmo, C, dact, F, nullptr, precision_, true);
    x_.ops.matmul({.a = act,
                   .lda = F,
                   .ta = true,
                   .b = dmo,
                   .ldb = C,
                   .c = dproj,
                   .ldc = C,
                   .m = F,
                   .n = C,
                   .k = N,
                   .accumulate = true,
                   .precision = precision_,
                   .ab = act_b,
                   .bb = dmo_b});
    x_.ops.activation_backward({.x = pre,
                                .ldx = F,
                                .dy = dact,
                                .ldy = F,
                                .dx = dact,
                                .lddx = F,
                                .rows = N,
                                .n = F,
                                .act = Activation::relu_squared,
                                .accumulate = false});
    linear(xn, C, N, fc, dact, F, dxn, C, dfc, precision_, overwrite_dxn, xn_b);
  }

  // The backward of a value-embedding lookup of plane `plane` by the id lane: dtable +=.
  void ve_rows(int plane, const float* h, int64_t N, const float* dve) const {
    const int64_t S = n_.lanes_.width, C = n_.cfg_.model_dim, V = n_.cfg_.vocab_size;
    x_.ops.gather_backward({.forward = {.table = &n_.ve_[size_t(plane)],
                                        .n = N,
                                        .id_lane = h + n_.lanes_.id,
                                        .ld_id = S},
                            .dy = dve,
                            .ldy = C,
                            .dtable = grad("value_embeds") + int64_t(plane) * V * C});
  }

  const GptNet& n_;
  const Exec& x_;
  const GptGrads& grads_;
  GemmPrecision precision_;
  mutable bf16* rounded_ = nullptr;  // rounded_rows'
  mutable int64_t rounded_cap_ = 0;
};

void attention_backward(const GradOps& go, const AttnWeights& a, const AttnInputs& in,
                        const float* dout, const AttnGrads& g) {
  const Exec& x = go.x_;
  const LayerCall& c = *in.call;
  const AttnTape& t = *in.tape;
  const int64_t N = c.rows.n(), C = in.model_dim, H = in.heads, hd = C / H;
  const int64_t dq = a.dq, dv = a.dv, D = a.d, S = in.stream, P = qkv_width(a, H);
  const int64_t ldp = 2 * H * dq;
  // out = y W_o^T
  float* dy = x.arena.floats(N * H * dv);
  go.linear(t.y, H * dv, N, a.o, dout, C, dy, H * dv, g.dout_w, go.precision(), true, t.y_b);
  if (in.gate >= 0) {  // y_h *= gate_h
    const float* before = t.y_xsa ? t.y_xsa : t.y_att;
    const CombineTerm gt[] = {{.lane = c.h + in.gate, .ldl = S, .gl = 1}};
    const CombineGrad gg[] = {{.dcoef = g.dstream + in.gate, .ldc = S}};
    x.ops.combine_backward({.forward = {.rows = N, .n = H * dv, .group = dv, .terms = gt},
                            .dy = dy,
                            .ldy = H * dv,
                            .y_before = before,
                            .ldb = H * dv,
                            .dy_before = dy,
                            .lddb = H * dv,
                            .grads = gg});
  }
  if (in.xsa >= 0 && !a.paired) {
    x.ops.subtract_projection_backward({.forward = xsa_args(a, in, t.y_att, t.qkv),
                                        .dy_out = dy,
                                        .lddo = H * dv,
                                        .dy = dy,
                                        .lddy = H * dv,
                                        .dv = g.dqkv + 2 * H * D,
                                        .lddv = P,
                                        .dstrength = g.dstream + in.xsa,
                                        .ldds = S});
  }
  x.ops.attention_f64_backward({.forward = attend_args(a, in, t.views.data(), t.qkv, P, nullptr),
                                .dout = dy,
                                .lddo = H * dv,
                                .hdo = dv,
                                .dq = g.dqkv,
                                .lddq = P,
                                .hdq = D,
                                .dviews = g.dviews});
  // Rotations undone on dq and dk (this call's keys: every reader has added to them by now).
  RopePairsArgs rope{.rows = c.rows,
                     .freq = a.freq,
                     .x = g.dqkv,
                     .ldx = P,
                     .heads = H,
                     .hs = D,
                     .dims = in.rotary_dim,
                     .paired_heads = a.paired,
                     .inverse = true};
  x.ops.rope_pairs(rope);
  rope.x = g.dqkv + H * D;
  x.ops.rope_pairs(rope);
  // v_h = sa0 pv_h + aux_h
  float* dpv = go.zeros(N * H * dv);
  for (int64_t h = 0; h < H; ++h) {
    CombineTerm vt[2];
    const CombineArgs f = v_head(a, in, t.qkv, t.pv, h, vt);
    const CombineGrad vg[] = {{.dx = dpv + h * dv, .lddx = H * dv},
                              {.dx = g.daux ? g.daux + h * hd : nullptr, .lddx = C}};
    const float* dvh = g.dqkv + 2 * H * D + h * D;
    x.ops.combine_backward({.forward = f, .dy = dvh, .ldy = P, .grads = vg});
    go.add_dot(dvh, P, t.pv + h * dv, H * dv, N, dv, g.dsa0, 1.0f);
  }
  // q, k = norm(sa0 pqk) per head
  float* qs = x.arena.floats(N * ldp);
  x.ops.bias_scale({.x = t.pqk, .ldx = ldp, .y = qs, .ldy = ldp, .rows = N, .n = ldp, .s = in.sa0});
  float* dqs = go.zeros(N * ldp);
  x.ops.rms_norm_backward({.x = qs,
                           .ldx = ldp,
                           .hx = dq,
                           .dy = g.dqkv,
                           .ldy = P,
                           .hy = D,
                           .dx = dqs,
                           .lddx = ldp,
                           .hdx = dq,
                           .rows = N,
                           .heads = 2 * H,
                           .dim = dq,
                           .eps = in.eps});
  go.add_dot(dqs, ldp, t.pqk, ldp, N, ldp, g.dsa0, 1.0f);
  x.ops.scale({.y = dqs, .ldy = ldp, .rows = N, .n = ldp, .s = in.sa0});
  go.linear(in.xn, C, N, a.qk, dqs, ldp, g.dxn, C, g.dqk, go.precision(), false, t.xn_b);
  go.linear(in.xn, C, N, a.v, dpv, H * dv, g.dxn, C, g.dv, go.precision(), false, t.xn_b);
}

void GptNet::train_backward(const Exec& x, const GptTape& tape,
                            std::span<const float* const> dfinal, const GptGrads& grads) const {
  const GemmPrecision precision =
      tape.calls.empty() ? GemmPrecision::exact : tape.calls.front().call.precision;
  for (const CallTape& ct : tape.calls)
    DEG_CHECK(ct.call.precision == precision, "gpt training: calls of one pass at two precisions");
  const GradOps go(*this, x, grads, precision);
  const GptConfig& cfg = cfg_;
  const int64_t S = lanes_.width, C = cfg.model_dim, H = cfg.num_heads;
  const int L = cfg.num_layers;
  const size_t K = tape.calls.size();
  DEG_CHECK(dfinal.size() == K, "gpt training: {} final gradients for {} calls", dfinal.size(), K);
  std::vector<float*> dh(K);
  for (size_t k = 0; k < K; ++k) {
    const CallTape& ct = tape.calls[k];
    const int64_t N = ct.call.rows.n();
    dh[k] = go.zeros(N * S);
    go.norm(ct.h, S, dfinal[k], C, dh[k], S, N);
  }

  // ---- layers in reverse ----
  for (int i = L - 1; i >= 0; --i) {
    const LayerWeights& lw = layers_[size_t(i)];
    // The gradients of every call's keys of this layer (a fork call adds into its prefix's).
    std::vector<float*> dqkv(K, nullptr);
    std::vector<std::vector<RowView>> dviews(K);
    if (lw.attn) {
      const int64_t P = qkv_width(lw.at, H), D = lw.at.d;
      for (size_t k = 0; k < K; ++k) {
        const GptTrainCall& call = tape.calls[k].call;
        const int64_t Lt = call.rows.tokens;
        dqkv[k] = go.zeros(call.rows.n() * P);
        for (int64_t b = 0; b < call.rows.rows; ++b) {
          RowView v{.own_k = dqkv[k] + b * Lt * P + H * D,
                    .own_v = dqkv[k] + b * Lt * P + 2 * H * D,
                    .own_stride = D};
          if (!call.prefix_calls.empty()) {
            const RowView& p =
                dviews[size_t(call.prefix_calls[size_t(b)])][size_t(call.prefix_rows[size_t(b)])];
            v.prefix_k = p.own_k;
            v.prefix_v = p.own_v;
            v.prefix_len = call.rows.positions[b];
            v.prefix_stride = p.own_stride;
          }
          dviews[k].push_back(v);
        }
      }
    }
    for (size_t kk = K; kk-- > 0;) {
      const CallTape& ct = tape.calls[kk];
      const GptTrainCall& call = ct.call;
      const LayerTape& lt = ct.layers[size_t(i)];
      const int64_t N = call.rows.n();
      float* d = dh[kk];
      const float* h = ct.h;
      const LayerCall lc{.h = ct.h, .rows = call.rows, .precision = call.precision};
      auto attn_backward = [&](const float* xn, const float* aux, const float* dout, float* dxn,
                               float* daux) {
        AttnInputs in = attn_inputs(i, lc, xn, aux);
        in.segment = call.segment;
        in.tape = const_cast<AttnTape*>(&lt.attn);
        attention_backward(go, lw.at, in, dout,
                           {.dxn = dxn,
                            .daux = daux,
                            .dqk = go.grad(layer_name(i, "attn.qk")),
                            .dv = go.grad(layer_name(i, "attn.v")),
                            .dout_w = go.grad(layer_name(i, "attn.o")),
                            .dsa0 = go.scalar("scalars", 2 * i),
                            .dstream = d,
                            .dviews = dviews[kk].data(),
                            .dqkv = dqkv[kk]});
      };
      if (i == cfg.mudd_layer()) {
        const int64_t nm = nm_, G = cfg.mudd_groups, hd = cfg.head_dim;
        const int64_t late = lanes_.cache[size_t(cfg.late_layer)];
        float* dmu = go.zeros(N * nm);
        // Post-loop mix: x += (coef_k + delta_kg) src_k; the sources' gradients.
        float* ddeltas = go.zeros(N * nm * G);
        float* d_mlp_xn = go.zeros(N * C);
        float* d_late_xn = go.zeros(N * C);
        float* dsrc = go.zeros(N * C);  // a value-embedding source's rows
        for (size_t k = 0; k < cfg.post_mix_sources.size(); ++k) {
          const GptMixSource& s = cfg.post_mix_sources[k];
          float* scratch = x.arena.floats(N * C);
          int64_t ld = C;
          const float* src = mix_source(x, lc, k, lt.mlp.xn, lt.xn, scratch, ld);
          float* dx = nullptr;
          int64_t lddx = C;
          switch (s.kind) {
            case GptMixSource::Kind::cache:
              dx = d + lanes_.cache[size_t(s.layer)];
              lddx = S;
              break;
            case GptMixSource::Kind::value_embed:
              dsrc = go.zeros(N * C);
              dx = dsrc;
              break;
            case GptMixSource::Kind::last_mlp_in: dx = d_mlp_xn; break;
            case GptMixSource::Kind::late_attn_in: dx = d_late_xn; break;
          }
          const CombineTerm t[] = {{},
                                   {.x = src,
                                    .ldx = ld,
                                    .lane = lt.coef + k,
                                    .ldl = nm,
                                    .add = lt.deltas + int64_t(k) * G,
                                    .lda = nm * G,
                                    .ga = 1}};
          const CombineGrad g[] = {
              {}, {.dx = dx, .lddx = lddx, .dcoef = ddeltas + int64_t(k) * G, .ldc = nm * G}};
          x.ops.combine_backward({.forward = {.rows = N, .n = C, .group = C / G, .terms = t},
                                  .dy = d,
                                  .ldy = S,
                                  .y_before = d,
                                  .ldb = S,
                                  .dy_before = d,
                                  .lddb = S,
                                  .grads = g});
          if (s.kind == GptMixSource::Kind::value_embed)
            go.ve_rows(cfg.value_embed_index(s.layer), h, N, dsrc);
        }
        // coef_k's gradient: its groups' summed.
        float* dcoef = go.zeros(N * nm);
        x.ops.matmul({.a = ddeltas,
                      .lda = G,
                      .b = ones_.data<float>(),
                      .ldb = 1,
                      .c = dcoef,
                      .ldc = 1,
                      .m = N * nm,
                      .n = 1,
                      .k = G,
                      .accumulate = true});
        go.head(mudd_[1], lt.post, lt.post.x, lt.post.ldx, N, dcoef, nm, ddeltas, d, S, go.mudd(1),
                go.precision());
        // The MLP with mu12 / mu13: x = mu12 x_attn + mu13 mlp(norm(x_attn)).
        {
          const MlpTape& m = lt.mlp;
          float* dmo = go.zeros(N * C);
          const CombineTerm t[] = {{.lane = lt.mu + 12, .ldl = nm},
                                   {.x = m.out, .ldx = C, .lane = lt.mu + 13, .ldl = nm}};
          const CombineGrad g[] = {{.dcoef = dmu + 12, .ldc = nm},
                                   {.dx = dmo, .lddx = C, .dcoef = dmu + 13, .ldc = nm}};
          x.ops.combine_backward({.forward = {.rows = N, .n = C, .terms = t},
                                  .dy = d,
                                  .ldy = S,
                                  .y_before = lt.x_attn,
                                  .ldb = C,
                                  .dy_before = d,
                                  .lddb = S,
                                  .grads = g});
          go.mlp_run(lw.fc, lw.proj, m.xn, m.pre, m.act, m.xn_b, m.act_b, dmo, N, d_mlp_xn,
                     go.grad(layer_name(i, "mlp.fc")), go.grad(layer_name(i, "mlp.proj")));
          go.norm(lt.x_attn, C, d_mlp_xn, C, d, S, N);
        }
        // x[:, :Dn] += mu11 n-gram
        go.add_ngram(h, d, N, lt.mu + 11, nm, dmu + 11, nm);
        // x = mu8 recomb + mu9 sa1 out + mu10 c0: the old x reaches it only through recomb.
        float* drecomb = go.zeros(N * C);
        float* dscaled = go.zeros(N * C);
        {
          const CombineTerm t[] = {{.x = lt.recomb, .ldx = C, .lane = lt.mu + 8, .ldl = nm},
                                   {.x = lt.attn_scaled, .ldx = C, .lane = lt.mu + 9, .ldl = nm},
                                   {.x = h + lanes_.c0, .ldx = S, .lane = lt.mu + 10, .ldl = nm}};
          const CombineGrad g[] = {{.dx = drecomb, .lddx = C, .dcoef = dmu + 8, .ldc = nm},
                                   {.dx = dscaled, .lddx = C, .dcoef = dmu + 9, .ldc = nm},
                                   {.dx = d + lanes_.c0, .lddx = S, .dcoef = dmu + 10, .ldc = nm}};
          x.ops.combine_backward(
              {.forward = {.rows = N, .n = C, .terms = t}, .dy = d, .ldy = S, .grads = g});
          x.ops.copy_rows(zeros_.data<float>(), 0, d, S, N, C);
        }
        // attention over norm(c_late) with aux, its output scaled by sa1.
        const float sa1 = scalars_[size_t(2 * i + 1)];
        float* dout = x.arena.floats(N * C);
        x.ops.bias_scale(
            {.x = dscaled, .ldx = C, .y = dout, .ldy = C, .rows = N, .n = C, .s = sa1});
        go.add_dot(dscaled, C, lt.out, C, N, C, go.scalar("scalars", 2 * i + 1), 1.0f);
        float* daux = go.zeros(N * C);
        attn_backward(lt.xn, lt.aux, dout, d_late_xn, daux);
        // recomb = (1 + mu5) x + mu3 c0 + mu4 c_late
        {
          const CombineTerm t[] = {
              {.x = lt.x_in, .ldx = C, .lane = lt.mu + 5, .ldl = nm, .offset = 1.0f},
              {.x = h + lanes_.c0, .ldx = S, .lane = lt.mu + 3, .ldl = nm},
              {.x = h + late, .ldx = S, .lane = lt.mu + 4, .ldl = nm}};
          const CombineGrad g[] = {{.dx = d, .lddx = S, .dcoef = dmu + 5, .ldc = nm},
                                   {.dx = d + lanes_.c0, .lddx = S, .dcoef = dmu + 3, .ldc = nm},
                                   {.dx = d + late, .lddx = S, .dcoef = dmu + 4, .ldc = nm}};
          x.ops.combine_backward(
              {.forward = {.rows = N, .n = C, .terms = t}, .dy = drecomb, .ldy = C, .grads = g});
        }
        // aux = (mu6 | mu7) VE + mu0 c0 + mu1 c_late + mu2 x, the VE term by head half apart.
        {
          float* dve = go.zeros(N * C);
          const CombineTerm tv[] = {{.x = lt.ve, .ldx = C, .lane = lt.mu + 6, .ldl = nm, .gl = 1}};
          const CombineGrad gv[] = {{.dx = dve, .lddx = C, .dcoef = dmu + 6, .ldc = nm}};
          x.ops.combine_backward({.forward = {.rows = N, .n = C, .group = H / 2 * hd, .terms = tv},
                                  .dy = daux,
                                  .ldy = C,
                                  .grads = gv});
          const CombineTerm t[] = {{.x = h + lanes_.c0, .ldx = S, .lane = lt.mu + 0, .ldl = nm},
                                   {.x = h + late, .ldx = S, .lane = lt.mu + 1, .ldl = nm},
                                   {.x = lt.x_in, .ldx = C, .lane = lt.mu + 2, .ldl = nm}};
          const CombineGrad g[] = {{.dx = d + lanes_.c0, .lddx = S, .dcoef = dmu + 0, .ldc = nm},
                                   {.dx = d + late, .lddx = S, .dcoef = dmu + 1, .ldc = nm},
                                   {.dx = d, .lddx = S, .dcoef = dmu + 2, .ldc = nm}};
          x.ops.combine_backward(
              {.forward = {.rows = N, .n = C, .terms = t}, .dy = daux, .ldy = C, .grads = g});
          go.ve_rows(cfg.value_embed_index(i), h, N, dve);
        }
        go.norm(h + late, S, d_late_xn, C, d + late, S, N);
        go.head(mudd_[0], lt.mudd, lt.x_in, C, N, dmu, nm, nullptr, d, S, go.mudd(0),
                go.precision());
      } else {
        if (lanes_.cache[size_t(i)] >= 0 && i > 0)  // the layer's output was saved
          go.add_rows(d + lanes_.cache[size_t(i)], S, d, S, N, C);
        // ---- MLP sublayer: d becomes the gradient of x_attn ----
        if (!lw.mlp) {
          go.add_dot(d, S, lt.x_attn, C, N, C, go.scalar("resid_lambdas", 2 * i + 1), 1.0f);
          x.ops.scale({.y = d, .ldy = S, .rows = N, .n = C, .s = resid_[size_t(2 * i + 1)]});
        } else {
          const MlpTape& m = lt.mlp;
          const float rm = resid_[size_t(2 * i + 1)], pm = post_[size_t(2 * i + 1)];
          float* dpost = go.scalar("post_lambdas", 2 * i + 1);
          const GradOps::Dot resid{lt.x_attn, C, go.scalar("resid_lambdas", 2 * i + 1)};
          if (m.par_out) {
            go.add_dots(d, S, N, C, {resid, {m.out, C, dpost}, {m.par_out, C, dpost}});
          } else {
            go.add_dots(d, S, N, C, {resid, {m.out, C, dpost}});
          }
          float* dmo = x.arena.floats(N * C);
          x.ops.bias_scale({.x = d, .ldx = S, .y = dmo, .ldy = C, .rows = N, .n = C, .s = pm});
          float* dxn = x.arena.floats(N * C);  // written by the first run, added to by the other
          go.mlp_run(lw.fc, lw.proj, m.xn, m.pre, m.act, m.xn_b, m.act_b, dmo, N, dxn,
                     go.grad(layer_name(i, "mlp.fc")), go.grad(layer_name(i, "mlp.proj")), true);
          if (m.par_out)
            go.mlp_run(par_fc_, par_proj_, m.xn, m.par_pre, m.par_act, m.xn_b, m.par_act_b, dmo, N,
                       dxn, go.grad("parallel_mlp.fc"), go.grad("parallel_mlp.proj"));
          x.ops.scale({.y = d, .ldy = S, .rows = N, .n = C, .s = rm});
          go.norm(lt.x_attn, C, dxn, C, d, S, N);
        }
        // ---- attention / skip sublayer: d becomes the gradient of x_in ----
        const float* g = h + lanes_.gate[gl_.gate_id[size_t(i)]];
        float* dg = d + lanes_.gate[gl_.gate_id[size_t(i)]];
        if (i == cfg.skip_layer) {  // x += sigmoid(skip) gate src
          const float s = sigmoid(scalars_[size_t(2 * L + 1)]);
          const int64_t src = lanes_.cache[size_t(cfg.skip_source)];
          float* dcoef = go.zeros(N);  // of the coefficient s gate
          const CombineTerm t[] = {
              {}, {.x = h + src, .ldx = S, .s = s, .lane = g + gl_.skip, .ldl = S}};
          const CombineGrad gr[] = {{}, {.dx = d + src, .lddx = S, .dcoef = dcoef, .ldc = 1}};
          x.ops.combine_backward({.forward = {.rows = N, .n = C, .terms = t},
                                  .dy = d,
                                  .ldy = S,
                                  .y_before = lt.x_in,
                                  .ldb = C,
                                  .dy_before = d,
                                  .lddb = S,
                                  .grads = gr});
          const CombineTerm tg[] = {{}, {.x = dcoef, .ldx = 1, .s = s}};
          x.ops.combine({.y = dg + gl_.skip, .ldy = S, .rows = N, .n = 1, .terms = tg});
          go.add_dot(dcoef, 1, g + gl_.skip, S, N, 1, go.scalar("scalars", 2 * L + 1),
                     s * (1.0f - s));
        } else {
          // x = r x (+ o_scale out) (+ x0 gate x0), then x[:, :Dn] += n-gram gate n-gram
          if (gl_.ngram[size_t(i)] >= 0 && i != 0) {
            const int lane = gl_.ngram[size_t(i)];
            go.add_ngram(h, d, N, g + lane, S, dg + lane, S);
          }
          const float r = resid_[size_t(2 * i)];
          const GradOps::Dot resid{lt.x_in, C, go.scalar("resid_lambdas", 2 * i)};
          float* dout = nullptr;
          CombineTerm t[3] = {{.s = r}};
          CombineGrad gr[3] = {{}};
          size_t n = 1;
          if (!lw.attn) go.add_dots(d, S, N, C, {resid});
          if (lw.attn) {
            const float sa1 = scalars_[size_t(2 * i + 1)], p0 = post_[size_t(2 * i)];
            go.add_dots(d, S, N, C,
                        {resid,
                         {lt.out, C, go.scalar("scalars", 2 * i + 1), p0,
                          go.scalar("post_lambdas", 2 * i), sa1}});
            dout = go.zeros(N * C);
            t[n] = {.x = lt.out, .ldx = C, .s = sa1 * p0};
            gr[n++] = {.dx = dout, .lddx = C};
          }
          if (gl_.x0[size_t(i)] >= 0) {
            const int lane = gl_.x0[size_t(i)];
            t[n] = {.x = h + lanes_.x0, .ldx = S, .lane = g + lane, .ldl = S};
            gr[n++] = {.dx = d + lanes_.x0, .lddx = S, .dcoef = dg + lane, .ldc = S};
          }
          x.ops.combine_backward({.forward = {.rows = N, .n = C, .terms = {t, n}},
                                  .dy = d,
                                  .ldy = S,
                                  .y_before = lt.x_in,
                                  .ldb = C,
                                  .dy_before = d,
                                  .lddb = S,
                                  .grads = {gr, n}});
          if (lw.attn) {
            float* dxn = go.zeros(N * C);
            float* daux = lt.aux ? go.zeros(N * C) : nullptr;
            attn_backward(lt.xn, lt.aux, dout, dxn, daux);
            const int ve = cfg.value_embed_index(i), veg = cfg.value_embed_gate_index(i);
            if (ve >= 0) {
              float* dve = daux;
              if (veg >= 0) {  // aux = 2 sigmoid(w . [xn, ve]) ve per head
                const int64_t gc = cfg.value_embed_gate_channels;
                dve = go.zeros(N * C);
                float* dgv = go.zeros(N * H);
                const CombineTerm tv[] = {
                    {.x = lt.ve, .ldx = C, .lane = lt.ve_gate, .ldl = H, .gl = 1}};
                const CombineGrad gv[] = {{.dx = dve, .lddx = C, .dcoef = dgv, .ldc = H}};
                x.ops.combine_backward(
                    {.forward = {.rows = N, .n = C, .group = cfg.head_dim, .terms = tv},
                     .dy = daux,
                     .ldy = C,
                     .grads = gv});
                x.ops.sigmoid_gates_backward(
                    {.forward = {.x = lt.xn,
                                 .ldx = C,
                                 .x2 = lt.ve,
                                 .ldx2 = C,
                                 .w = ve_gate_.data<float>() + veg * H * 2 * gc,
                                 .ldw = 2 * gc,
                                 .rows = N,
                                 .heads = H,
                                 .n = gc,
                                 .s = 2.0f},
                     .dout = dgv,
                     .lddo = H,
                     .dx = dxn,
                     .lddx = C,
                     .dx2 = dve,
                     .lddx2 = C,
                     .dw = go.grad("ve_gate") + veg * H * 2 * gc});
              }
              go.ve_rows(ve, h, N, dve);
            }
            if (uses_late(i)) {
              const int64_t late = lanes_.cache[size_t(cfg.late_layer)];
              go.norm(h + late, S, dxn, C, d + late, S, N);
            } else {
              go.norm(lt.x_in, C, dxn, C, d, S, N);
            }
          }
        }
      }
      if (i == cfg.post_gate_layer)
        go.head(gate_[1], lt.post_gate, lt.x_in, C, N, d + lanes_.gate[1], S, nullptr, d, S,
                go.gate(1), go.precision());
    }
  }

  // ---- the embedding of each call ----
  for (size_t k = 0; k < K; ++k) {
    const CallTape& ct = tape.calls[k];
    const GptTrainCall& call = ct.call;
    const int64_t N = call.rows.n();
    float* d = dh[k];
    const float* h = ct.h;
    // cache 0 = x = x0 (+ gate n-gram)
    go.add_rows(d + lanes_.c0, S, d, S, N, C);
    if (gl_.ngram[0] >= 0) {
      const int64_t lane = lanes_.gate[0] + gl_.ngram[0];
      go.add_ngram(h, d, N, h + lane, S, d + lane, S);
    }
    go.add_rows(d, S, d + lanes_.x0, S, N, C);
    go.head(gate_[0], ct.pre_gate, h + lanes_.x0, S, N, d + lanes_.gate[0], S, nullptr,
            d + lanes_.x0, S, go.gate(0), GemmPrecision::exact);  // as its forward
    x.ops.ngram_embed_backward({.forward = {.rows = call.rows,
                                            .ids = call.ids,
                                            .prev1 = ct.prev1,
                                            .prev2 = ct.prev2,
                                            .table = &ngram_,
                                            .sign_pool = sign_pool_.data<float>(),
                                            .sign_rows = cfg.ngram_sign_rows,
                                            .bigram_rows = cfg.bigram_row_muls,
                                            .trigram_rows = cfg.trigram_row_muls,
                                            .bigram_signs = cfg.bigram_sign_muls,
                                            .trigram_signs = cfg.trigram_sign_muls},
                                .dy = d + lanes_.ngram,
                                .ldy = S,
                                .dtable = go.grad("ngram_table")});
    // x0 = norm(smeared); smeared = embed[id] + smear embed[previous id]
    float* dsm = go.zeros(N * C);
    go.norm(ct.smeared, C, d + lanes_.x0, S, dsm, C, N);
    float* dsmear = go.zeros(N);
    x.ops.gather_backward({.forward = {.table = &embed_,
                                       .ids = ct.prev1,
                                       .n = N,
                                       .keep = true,
                                       .row_scale = ct.smear,
                                       .ld_scale = 1},
                           .dy = dsm,
                           .ldy = C,
                           .dtable = go.grad("embed"),
                           .drow_scale = dsmear,
                           .ld_drow = 1});
    const float lambda = scalars_[size_t(2 * L)];
    go.add_dot(dsmear, 1, ct.smear_sig, 1, N, 1, go.scalar("scalars", 2 * L), 1.0f);
    float* dsig = x.arena.floats(N);
    x.ops.bias_scale({.x = dsmear, .ldx = 1, .y = dsig, .ldy = 1, .rows = N, .n = 1, .s = lambda});
    float* emb = x.arena.floats(N * C);
    x.ops.gather({.table = &embed_, .ids = call.ids, .n = N, .y = emb, .ldy = C});
    x.ops.sigmoid_gates_backward({.forward = {.x = emb,
                                              .ldx = C,
                                              .w = smear_.data<float>(),
                                              .ldw = cfg.smear_channels,
                                              .rows = N,
                                              .n = cfg.smear_channels},
                                  .dout = dsig,
                                  .lddo = 1,
                                  .dx = dsm,
                                  .lddx = C,
                                  .dw = go.grad("smear_gate")});
    x.ops.gather_backward({.forward = {.table = &embed_, .ids = call.ids, .n = N},
                           .dy = dsm,
                           .ldy = C,
                           .dtable = go.grad("embed")});
  }
}

}  // namespace deg::gpt_detail

namespace deg {

void GptTapeDeleter::operator()(GptTape* t) const {
  delete t;
}

namespace {

const gpt_detail::GptNet& net_of(const Family& family) {
  const auto* net = dynamic_cast<const gpt_detail::GptNet*>(&family);
  DEG_CHECK(net, "gpt training needs a gpt family");
  return *net;
}

}  // namespace

std::vector<float*> gpt_train_forward(const Family& family, const Exec& x,
                                      std::span<const GptTrainCall> calls, GptTapePtr& tape) {
  tape.reset(new GptTape);
  return net_of(family).train_forward(x, calls, *tape);
}

void gpt_train_backward(const Family& family, const Exec& x, const GptTape& tape,
                        std::span<const float* const> dfinal, const GptGrads& grads) {
  net_of(family).train_backward(x, tape, dfinal, grads);
}

}  // namespace deg
