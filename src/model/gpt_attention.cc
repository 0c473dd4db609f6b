// The gpt family's attention sublayer for inference (see gpt_internal.h): the trainer's
// attention_layer_forward (src/train/attention.cc) for one call of rows over their prefixes. K
// holds each token's own rotated key; the long-window layers' key offset (a key's non-rotating
// dims come from the previous position) is applied when keys are read, so chunk and fork
// boundaries need no extra state. Per (row, head, block of queries) tasks; every score is one
// double-accumulated dot product and every output sums its keys in index order, as the trainer
// does, so a query's result depends on its keys only (batch invariant, chunking invariant).
//
// Letters: B rows, L tokens, N = B L, C model dim, H heads, Dq / Dv q-k / v head widths, D K/V
// storage width per head, S stream width.
#include <algorithm>
#include <cstring>

#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/gpt_internal.h"

namespace deg::gpt_detail {

namespace {

// Rotates pairs (2i, 2i+1) of the first `d` dims by pos * freq[2i]; the trainer's rotate().
void rotate(const float* x, float* y, const float* freq, int64_t d, int64_t pos) {
  for (int64_t i = 0; i + 1 < d; i += 2) {
    const double th = double(pos) * double(freq[i]);
    const float c = float(std::cos(th)), s = float(std::sin(th));
    const float x0 = x[i], x1 = x[i + 1];
    y[i] = c * x0 + s * x1;
    y[i + 1] = c * x1 - s * x0;
  }
}

}  // namespace

const float* attention(const AttnWeights& a, const AttnInputs& in, SlotArena& ar) {
  const LayerCall& c = *in.call;
  const float *xn = in.xn, *aux = in.aux;
  const int64_t B = c.rows.rows, L = c.rows.tokens, N = B * L, C = in.model_dim, H = in.heads;
  const int64_t dq = a.dq, dv = a.dv, D = a.d, rot = in.rotary_dim, hd = C / H;
  const int64_t S = in.stream, half = H / 2;
  const float sa0 = in.sa0;
  float* qk = ar.take(N * 2 * H * dq);
  float* pv = ar.take(N * H * dv);
  GemmOutput outs[] = {{.w = &a.qk, .y = qk, .ldy = 2 * H * dq},
                       {.w = &a.v, .y = pv, .ldy = H * dv}};
  gemm({.x = xn, .m = N, .k = C, .ldx = C, .outputs = outs, .precision = c.precision});
  // Per token: q/k = rotary(norm(sa0 p)) per head, v = sa0 p + aux; real tokens' K/V into the
  // row's own buffers (K unshifted: the key offset is applied when keys are read).
  float* q = ar.take(N * H * dq);
  float* v = ar.take(N * H * dv);
  for_each(N, 16, [&](int64_t n) {
    const int64_t b = n / L, t = n % L, pos = c.rows.positions[b] + t;
    float* p = qk + n * 2 * H * dq;
    for (int64_t k = 0; k < 2 * H * dq; ++k) p[k] *= sa0;
    rms_norm({.x = p,
              .ldx = dq,
              .y = p,
              .ldy = dq,
              .rows = 2 * H,
              .dim = dq,
              .w = in.ones,
              .eps = in.eps,
              .scale = NormScale::w});
    for (int64_t h = 0; h < H; ++h) {
      float* vh = v + (n * H + h) * dv;
      const float* ah = aux ? aux + n * C + h * hd : nullptr;
      for (int64_t d = 0; d < dv; ++d) vh[d] = sa0 * pv[(n * H + h) * dv + d] + (ah ? ah[d] : 0.0f);
    }
    const bool real = t < c.rows.lengths[b];
    const RowView& rv = c.views[b];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t rpos = a.paired ? 2 * pos + h % 2 : pos;
      float* qh = q + (n * H + h) * dq;
      rotate(p + h * dq, qh, a.freq, rot, rpos);
      std::memcpy(qh + rot, p + h * dq + rot, size_t(dq - rot) * sizeof(float));
      if (!real) continue;
      const int64_t at = h * rv.own_stride + (rv.own_before + t) * D;
      rotate(p + (H + h) * dq, rv.own_k + at, a.freq, rot, rpos);
      std::memcpy(rv.own_k + at + rot, p + (H + h) * dq + rot, size_t(dq - rot) * sizeof(float));
      std::memcpy(rv.own_v + at, v + (n * H + h) * dv, size_t(dv) * sizeof(float));
    }
  });
  // Per (row, head, block of queries): sliding-window softmax attention in key order, then XSA
  // and the output gate.
  float* y = ar.take(N * H * dv);
  struct Task {
    int64_t b, h, t0, t1;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    std::memset(y + (b * L + c.rows.lengths[b]) * H * dv, 0,
                size_t((L - c.rows.lengths[b]) * H * dv) * sizeof(float));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < c.rows.lengths[b]; t += kQueryBlock)
        tasks.push_back({b, h, t, std::min(c.rows.lengths[b], t + kQueryBlock)});
  }
  for_each(int64_t(tasks.size()), 1, [&](int64_t ti) {
    const Task& tk = tasks[size_t(ti)];
    const RowView& rv = c.views[tk.b];
    auto key = [&](int64_t head, int64_t p) {  // K or V row of position p of this row
      return p < rv.prefix_len ? head * rv.prefix_stride + p * D
                               : head * rv.own_stride + (p - rv.prefix_len) * D;
    };
    auto kbuf = [&](int64_t p) { return p < rv.prefix_len ? rv.prefix_k : rv.own_k; };
    auto vbuf = [&](int64_t p) { return p < rv.prefix_len ? rv.prefix_v : rv.own_v; };
    float* score = scratch_floats(kScoreSlot, size_t(a.window + 2));
    for (int64_t t = tk.t0; t < tk.t1; ++t) {
      const int64_t n = tk.b * L + t, pos = c.rows.positions[tk.b] + t;
      // Query position and its keys (paired: 2 positions per token, head h at 2t + h / (H/2),
      // slot h % (H/2); key position j is token j / 2, head slot + (j % 2) (H/2)).
      const int64_t qpos = a.paired ? 2 * pos + tk.h / half : pos;
      const int64_t slot = a.paired ? tk.h % half : tk.h;
      const int64_t j0 = std::max<int64_t>(0, qpos - a.window);
      auto token_of = [&](int64_t j) { return a.paired ? j / 2 : j; };
      auto head_of = [&](int64_t j) { return a.paired ? slot + (j % 2) * half : slot; };
      const float* qh = q + (n * H + tk.h) * dq;
      float mx = -INFINITY;
      for (int64_t j = j0; j <= qpos; ++j) {
        const int64_t p = token_of(j), g = head_of(j);
        const float* kj = kbuf(p) + key(g, p);
        double s = 0;
        if (a.key_offset && p > 0) {  // non-rotating dims from the previous token's key
          const float* kp = kbuf(p - 1) + key(g, p - 1);
          for (int64_t d = 0; d < rot; ++d) s += double(qh[d]) * kj[d];
          for (int64_t d = rot; d < dq; ++d) s += double(qh[d]) * kp[d];
        } else {
          for (int64_t d = 0; d < dq; ++d) s += double(qh[d]) * kj[d];
        }
        score[j - j0] = a.scale * float(s);
        mx = std::max(mx, score[j - j0]);
      }
      double sum = 0;
      for (int64_t j = j0; j <= qpos; ++j) {
        score[j - j0] = std::exp(score[j - j0] - mx);
        sum += score[j - j0];
      }
      const float inv = float(1.0 / sum);
      float* yh = y + (n * H + tk.h) * dv;
      std::fill(yh, yh + dv, 0.0f);
      for (int64_t j = j0; j <= qpos; ++j) {
        const int64_t p = token_of(j);
        axpy(score[j - j0] * inv, vbuf(p) + key(head_of(j), p), yh, dv);
      }
      if (in.xsa >= 0 && !a.paired) {
        const float* vv = v + (n * H + tk.h) * dv;
        const float den = std::max(dot(vv, vv, dv), 1e-8f);
        const float coef = std::tanh(c.h[n * S + in.xsa + tk.h]) * dot(yh, vv, dv) / den;
        axpy(-coef, vv, yh, dv);
      }
      if (in.gate >= 0) {
        const float gt = c.h[n * S + in.gate + tk.h];
        for (int64_t d = 0; d < dv; ++d) yh[d] *= gt;
      }
    }
  });
  float* out = ar.take(N * C);
  GemmOutput o{.w = &a.o, .y = out, .ldy = C};
  gemm({.x = y, .m = N, .k = H * dv, .ldx = H * dv, .outputs = {&o, 1}, .precision = c.precision});
  return out;
}

}  // namespace deg::gpt_detail
