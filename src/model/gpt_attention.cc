// The gpt family's attention sublayer (see gpt_internal.h), forward, as ops (its backward is in
// gpt_backward.cc). A token's q, k and v heads share one row (qkv, P = 3 H D wide, every head D
// apart, so one head stride serves K and V), so
// a training pass reads its keys where the projections put them; inference copies the call's
// real K/V into the State. K holds each token's own rotated key; the long-window layers' key
// offset (a key's non-rotating dims come from the previous position) is applied when keys are
// read (attention_f64's key_offset), so chunk and fork boundaries need no extra state. Scores
// are double-accumulated dot products and outputs sum their keys in index order, so a query's
// result depends on its keys only (batch invariant, chunking invariant).
//
// Letters: B rows, L tokens, N = B L, C model dim, H heads, Dq / Dv q-k / v head widths, D K/V
// storage width per head (max(Dq, Dv)), S stream width, P = 3 H D.
#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/gpt_internal.h"

namespace deg::gpt_detail {

// v head h = sa0 pv_h + (aux_h or 0), head by head into qkv's v heads (aux heads are C / H wide,
// of which V reads the leading Dv).
CombineArgs v_head(const AttnWeights& a, const AttnInputs& in, float* qkv, const float* pv,
                   int64_t h, CombineTerm (&t)[2]) {
  const int64_t N = in.call->rows.n(), H = in.heads, D = a.d, dv = a.dv;
  const int64_t hd = in.model_dim / H, P = qkv_width(a, H);
  t[0] = {.x = pv + h * dv, .ldx = H * dv, .s = in.sa0};
  t[1] = {.x = in.aux ? in.aux + h * hd : in.zeros, .ldx = in.aux ? in.model_dim : 0};
  return {.y = qkv + 2 * H * D + h * D, .ldy = P, .rows = N, .n = dv, .terms = t};
}

AttendF64Args attend_args(const AttnWeights& a, const AttnInputs& in, const RowView* views,
                          float* qkv, int64_t kv_dim, float* y) {
  const int64_t H = in.heads, dv = a.dv;
  return {.rows = in.call->rows,
          .views = views,
          .q = qkv,
          .ldq = qkv_width(a, H),
          .hq = a.d,
          .out = y,
          .ldo = H * dv,
          .ho = dv,
          .heads = H,
          .qk_dim = a.dq,
          .v_dim = dv,
          .kv_dim = kv_dim,
          .scale = a.scale,
          .window = a.window,
          .paired_heads = a.paired,
          .key_offset = a.key_offset,
          .offset_from = in.rotary_dim,
          .segment = in.segment,
          .bf16 = in.call->precision == GemmPrecision::bf16_all};
}

ProjectionArgs xsa_args(const AttnWeights& a, const AttnInputs& in, float* y, const float* qkv) {
  const int64_t H = in.heads, dv = a.dv;
  return {.rows = in.call->rows,
          .y = y,
          .ldy = H * dv,
          .hy = dv,
          .v = qkv + 2 * H * a.d,
          .ldv = qkv_width(a, H),
          .hv = a.d,
          .strength = in.call->h + in.xsa,
          .lds = in.stream,
          .heads = H,
          .dim = dv};
}

float* attention(const Exec& x, const AttnWeights& a, const AttnInputs& in) {
  const LayerCall& c = *in.call;
  const int64_t N = c.rows.n(), C = in.model_dim, H = in.heads;
  const int64_t dq = a.dq, dv = a.dv, D = a.d, S = in.stream, P = qkv_width(a, H);
  const int64_t ldp = 2 * H * dq;
  AttnTape* tape = in.tape;
  float* pqk = x.arena.floats(N * ldp);  // [N, 2H, Dq]: q heads then k heads
  float* pv = x.arena.floats(N * H * dv);
  GemmOutput outs[] = {{.w = &a.qk, .y = pqk, .ldy = ldp}, {.w = &a.v, .y = pv, .ldy = H * dv}};
  bf16* xn_b = kept_bf16(x, c.precision, tape, N * C);
  x.ops.gemm({.x = in.xn,
              .m = N,
              .k = C,
              .ldx = C,
              .outputs = outs,
              .precision = c.precision,
              .xb_out = xn_b});
  // q, k = rotary(norm(sa0 p)) per head; v = sa0 p + aux per (token, head).
  float* qkv = x.arena.floats(N * P);
  for_qk_heads(a, H, [&](int64_t from, int64_t to, int64_t n) {
    x.ops.bias_scale(
        {.x = pqk + from, .ldx = ldp, .y = qkv + to, .ldy = P, .rows = N, .n = n, .s = in.sa0});
  });
  x.ops.rms_norm({.x = qkv,
                  .ldx = P,
                  .hx = D,
                  .y = qkv,
                  .ldy = P,
                  .hy = D,
                  .rows = N,
                  .heads = 2 * H,
                  .dim = dq,
                  .w = in.ones,
                  .eps = in.eps,
                  .scale = NormScale::w});
  for (int64_t h = 0; h < H; ++h) {
    CombineTerm t[2];
    x.ops.combine(v_head(a, in, qkv, pv, h, t));
  }
  // q and k heads apart: paired heads rotate head h (of H) at 2 p + h % 2 in both.
  const RopePairsArgs rope{.rows = c.rows,
                           .freq = a.freq,
                           .x = qkv,
                           .ldx = P,
                           .heads = H,
                           .hs = D,
                           .dims = in.rotary_dim,
                           .paired_heads = a.paired};
  x.ops.rope_pairs(rope);
  RopePairsArgs rope_k = rope;
  rope_k.x = qkv + H * D;
  x.ops.rope_pairs(rope_k);
  const RowView* views = c.views;
  int64_t kv_dim = a.d;
  if (tape) {  // the keys are the pass's own rows (a prefix: another call's)
    const int64_t L = c.rows.tokens;
    tape->views.assign(size_t(c.rows.rows), RowView{});
    for (int64_t b = 0; b < c.rows.rows; ++b) {
      RowView& v = tape->views[size_t(b)];
      if (in.prefix_views) v = in.prefix_views[b];
      v.own_k = qkv + b * L * P + H * D;
      v.own_v = qkv + b * L * P + 2 * H * D;
      v.own_before = 0;
      v.own_stride = D;
    }
    views = tape->views.data();
    kv_dim = P;
  } else {  // the real tokens' K (unshifted: the key offset is applied when keys are read), V
    x.ops.kv_write({.rows = c.rows,
                    .views = c.views,
                    .k = qkv + H * D,
                    .ldk = P,
                    .v = qkv + 2 * H * D,
                    .ldv = P,
                    .kv_heads = H,
                    .dim = D,
                    .k_dim = dq,
                    .v_dim = dv,
                    .hk = D,
                    .hv = D});
  }
  float* y = x.arena.floats(N * H * dv);
  x.ops.attention_f64(attend_args(a, in, views, qkv, kv_dim, y));
  if (tape)
    *tape = {.xn = in.xn,
             .aux = in.aux,
             .pqk = pqk,
             .pv = pv,
             .qkv = qkv,
             .y_att = y,
             .views = std::move(tape->views),
             .xn_b = xn_b};
  auto kept = [&] {  // y before an in-place op, for the backward
    float* copy = x.arena.floats(N * H * dv);
    x.ops.copy_rows(y, H * dv, copy, H * dv, N, H * dv);
    return copy;
  };
  if (in.xsa >= 0 && !a.paired) {
    if (tape) y = tape->y_xsa = kept();
    x.ops.subtract_projection(xsa_args(a, in, y, qkv));
  }
  if (in.gate >= 0) {  // y_h *= gate_h
    if (tape) y = kept();
    const CombineTerm gt[] = {{.lane = c.h + in.gate, .ldl = S, .gl = 1}};
    x.ops.combine({.y = y, .ldy = H * dv, .rows = N, .n = H * dv, .group = dv, .terms = gt});
  }
  bf16* y_b = kept_bf16(x, c.precision, tape, N * H * dv);
  if (tape) tape->y = y, tape->y_b = y_b;
  float* out = x.arena.floats(N * C);
  GemmOutput o{.w = &a.o, .y = out, .ldy = C};
  x.ops.gemm({.x = y,
              .m = N,
              .k = H * dv,
              .ldx = H * dv,
              .outputs = {&o, 1},
              .precision = c.precision,
              .xb_out = y_b});
  return out;
}

}  // namespace deg::gpt_detail
