// The gpt family's attention sublayer for inference (see gpt_internal.h): the trainer's
// attention_layer_forward (src/train/attention.cc) for one call of rows over their prefixes, as
// ops. K holds each token's own rotated key; the long-window layers' key offset (a key's
// non-rotating dims come from the previous position) is applied when keys are read
// (attention_f64's key_offset), so chunk and fork boundaries need no extra state. Scores are
// double-accumulated dot products and outputs sum their keys in index order, as the trainer
// does, so a query's result depends on its keys only (batch invariant, chunking invariant).
//
// Letters: B rows, L tokens, N = B L, C model dim, H heads, Dq / Dv q-k / v head widths, D K/V
// storage width per head, S stream width.
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/gpt_internal.h"

namespace deg::gpt_detail {

float* attention(const Exec& x, const AttnWeights& a, const AttnInputs& in) {
  const LayerCall& c = *in.call;
  const int64_t N = c.rows.n(), C = in.model_dim, H = in.heads;
  const int64_t dq = a.dq, dv = a.dv, hd = C / H, S = in.stream, ldp = 2 * H * dq;
  float* qk = x.arena.floats(N * ldp);  // [N, 2H, Dq]: q heads then k heads
  float* pv = x.arena.floats(N * H * dv);
  GemmOutput outs[] = {{.w = &a.qk, .y = qk, .ldy = ldp}, {.w = &a.v, .y = pv, .ldy = H * dv}};
  x.ops.gemm({.x = in.xn, .m = N, .k = C, .ldx = C, .outputs = outs, .precision = c.precision});
  // q, k = rotary(norm(sa0 p)) per head, in place; v = sa0 p + aux per (token, head) row.
  x.ops.scale({.y = qk, .ldy = ldp, .rows = N, .n = ldp, .s = in.sa0});
  x.ops.rms_norm({.x = qk,
                  .ldx = ldp,
                  .hx = dq,
                  .y = qk,
                  .ldy = ldp,
                  .hy = dq,
                  .rows = N,
                  .heads = 2 * H,
                  .dim = dq,
                  .w = in.ones,
                  .eps = in.eps,
                  .scale = NormScale::w});
  float* v = x.arena.floats(N * H * dv);
  const CombineTerm vt[] = {{.x = pv, .ldx = dv, .s = in.sa0},
                            {.x = in.aux ? in.aux : in.zeros, .ldx = in.aux ? hd : 0}};
  x.ops.combine({.y = v, .ldy = dv, .rows = N * H, .n = dv, .terms = vt});
  float* q = qk;
  float* k = qk + H * dq;
  // q and k heads apart: paired heads rotate head h (of H) at 2 p + h % 2 in both.
  const RopePairsArgs rope{.rows = c.rows,
                           .freq = a.freq,
                           .x = q,
                           .ldx = ldp,
                           .heads = H,
                           .hs = dq,
                           .dims = in.rotary_dim,
                           .paired_heads = a.paired};
  x.ops.rope_pairs(rope);
  RopePairsArgs rope_k = rope;
  rope_k.x = k;
  x.ops.rope_pairs(rope_k);
  // The real tokens' K (unshifted: the key offset is applied when keys are read) and V.
  x.ops.kv_write({.rows = c.rows,
                  .views = c.views,
                  .k = k,
                  .ldk = ldp,
                  .v = v,
                  .ldv = H * dv,
                  .kv_heads = H,
                  .dim = a.d,
                  .k_dim = dq,
                  .v_dim = dv,
                  .hk = dq,
                  .hv = dv});
  float* y = x.arena.floats(N * H * dv);
  x.ops.attention_f64({.rows = c.rows,
                       .views = c.views,
                       .q = q,
                       .ldq = ldp,
                       .hq = dq,
                       .out = y,
                       .ldo = H * dv,
                       .ho = dv,
                       .heads = H,
                       .qk_dim = dq,
                       .v_dim = dv,
                       .kv_dim = a.d,
                       .scale = a.scale,
                       .window = a.window,
                       .paired_heads = a.paired,
                       .key_offset = a.key_offset,
                       .offset_from = in.rotary_dim});
  if (in.xsa >= 0 && !a.paired) {
    x.ops.subtract_projection({.rows = c.rows,
                               .y = y,
                               .ldy = H * dv,
                               .hy = dv,
                               .v = v,
                               .ldv = H * dv,
                               .hv = dv,
                               .strength = c.h + in.xsa,
                               .lds = S,
                               .heads = H,
                               .dim = dv});
  }
  if (in.gate >= 0) {  // y_h *= gate_h
    const CombineTerm gt[] = {{.lane = c.h + in.gate, .ldl = S, .gl = 1}};
    x.ops.combine({.y = y, .ldy = H * dv, .rows = N, .n = H * dv, .group = dv, .terms = gt});
  }
  float* out = x.arena.floats(N * C);
  GemmOutput o{.w = &a.o, .y = out, .ldy = C};
  x.ops.gemm(
      {.x = y, .m = N, .k = H * dv, .ldx = H * dv, .outputs = {&o, 1}, .precision = c.precision});
  return out;
}

}  // namespace deg::gpt_detail
