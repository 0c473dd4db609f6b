// Attention sublayer forward/backward for training (see attention.h). The core recomputes the
// softmax in the backward from the saved log-sum-exp (no [N, N] matrix is kept).
#include "train/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"

namespace deg::train {
namespace {

// A head-width dot product in f32 with four running sums (fixed order; the compiler
// vectorises it, where the double-precision dot of ops.h stays scalar).
float head_dot(const float* a, const float* b, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) s[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Calls f(j) for every key j visible to query i, in order: the context range, then the own
// segment (whose positions run contiguously, so the window cuts it at i - window).
template <class F>
void for_each_key(const AttnCore& a, int64_t i, F&& f) {
  if (a.ctx_lo) {
    const int64_t pi = a.apos ? a.apos[i] : i;
    for (int64_t j = a.ctx_lo[i]; j < a.ctx_hi[i]; ++j)
      if (pi - (a.apos ? a.apos[j] : j) <= a.window) f(j);
  }
  for (int64_t j = std::max<int64_t>(a.seg_start[i], i - a.window); j <= i; ++j) f(j);
}

// Where head h of token t lives in the attention layout, and its rotary position.
struct Placement {
  int64_t pos, slot, rot;
};
Placement place(const AttnLayerShape& s, int64_t t, int64_t h) {
  const int64_t p = s.pos ? s.pos[t] : t;
  if (!s.paired) return {t, h, p};
  const int64_t half = s.H / 2;
  return {2 * t + h / half, h % half, 2 * p + h % 2};
}

// The token before t (the key offset reads its key), or -1.
int64_t prev_of(const AttnLayerShape& s, int64_t t) {
  return s.prev ? s.prev[t] : t - 1;
}

// Rotates pairs (2i, 2i+1) by angle pos * freq[2i]: y0 = c x0 + s x1, y1 = c x1 - s x0.
void rotate(const float* x, float* y, const float* freq, int64_t d, int64_t pos, bool inverse) {
  for (int64_t i = 0; i + 1 < d; i += 2) {
    const double th = double(pos) * double(freq[i]);
    const float c = float(std::cos(th)), sn = float(inverse ? -std::sin(th) : std::sin(th));
    const float x0 = x[i], x1 = x[i + 1];
    y[i] = c * x0 + sn * x1;
    y[i + 1] = c * x1 - sn * x0;
  }
}

AttnCore core_of(const AttnLayerShape& s, const AttnSaved& sv, int64_t N, int64_t S) {
  return {.N = N,
          .S = S,
          .dq = s.dq,
          .dv = s.dv,
          .seg_start = sv.seg_start.data(),
          .window = s.window,
          .scale = s.attn_scale,
          .apos = sv.apos.empty() ? nullptr : sv.apos.data(),
          .ctx_lo = s.ctx_lo ? sv.ctx_lo.data() : nullptr,
          .ctx_hi = s.ctx_lo ? sv.ctx_hi.data() : nullptr};
}

}  // namespace

void attention_core_forward(const AttnCore& a, const float* q, const float* k, const float* v,
                            float* out, float* lse, AttnProbs* probs) {
  if (probs) {
    probs->offsets.assign(size_t(a.N + 1), 0);
    for (int64_t i = 0; i < a.N; ++i) {
      int64_t n = 0;
      for_each_key(a, i, [&](int64_t) { ++n; });
      probs->offsets[size_t(i + 1)] = probs->offsets[size_t(i)] + n * a.S;
    }
    probs->p.assign(size_t(probs->offsets.back()), 0.0f);
  }
  parallel_for(
      a.N,
      [&](int64_t begin, int64_t end) {
        std::vector<float> p;
        std::vector<int64_t> keys;
        for (int64_t i = begin; i < end; ++i) {
          keys.clear();
          for_each_key(a, i, [&](int64_t j) { keys.push_back(j); });
          p.resize(keys.size());
          for (int64_t h = 0; h < a.S; ++h) {
            const float* qi = q + (i * a.S + h) * a.dq;
            float mx = -std::numeric_limits<float>::infinity();
            for (size_t n = 0; n < keys.size(); ++n) {
              p[n] = a.scale * head_dot(qi, k + (keys[n] * a.S + h) * a.dq, a.dq);
              mx = std::max(mx, p[n]);
            }
            double sum = 0;
            for (float& e : p) {
              e = std::exp(e - mx);
              sum += e;
            }
            float* o = out + (i * a.S + h) * a.dv;
            std::memset(o, 0, sizeof(float) * size_t(a.dv));
            const float inv = float(1.0 / sum);
            for (size_t n = 0; n < keys.size(); ++n)
              axpy(p[n] * inv, v + (keys[n] * a.S + h) * a.dv, o, a.dv);
            if (probs) {
              float* kept = probs->p.data() + probs->offsets[size_t(i)] + h * int64_t(keys.size());
              for (size_t n = 0; n < keys.size(); ++n) kept[n] = p[n] * inv;
            }
            lse[i * a.S + h] = mx + float(std::log(sum));
          }
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(1, (a.window + 1) * a.S * a.dq)));
}

void attention_core_backward(const AttnCore& a, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, const float* dout, float* dq,
                             float* dk, float* dv, const AttnProbs* probs) {
  std::memset(dq, 0, sizeof(float) * size_t(a.N * a.S * a.dq));
  std::memset(dk, 0, sizeof(float) * size_t(a.N * a.S * a.dq));
  std::memset(dv, 0, sizeof(float) * size_t(a.N * a.S * a.dv));
  // One thread per head slot: dk/dv of a key gather from many queries.
  parallel_for(a.S, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      for (int64_t i = 0; i < a.N; ++i) {
        const size_t qi = size_t((i * a.S + h) * a.dq), oi = size_t((i * a.S + h) * a.dv);
        const float di = head_dot(dout + oi, out + oi, a.dv);
        const float l = lse[i * a.S + h];
        const float* kept = nullptr;
        if (probs) {
          const int64_t nk = (probs->offsets[size_t(i + 1)] - probs->offsets[size_t(i)]) / a.S;
          kept = probs->p.data() + probs->offsets[size_t(i)] + h * nk;
        }
        int64_t n = 0;
        for_each_key(a, i, [&](int64_t j) {
          const size_t kj = size_t((j * a.S + h) * a.dq), vj = size_t((j * a.S + h) * a.dv);
          const float p = kept ? kept[n++] : std::exp(a.scale * head_dot(q + qi, k + kj, a.dq) - l);
          const float dp = head_dot(dout + oi, v + vj, a.dv);
          const float ds = p * (dp - di) * a.scale;
          axpy(ds, k + kj, dq + qi, a.dq);
          axpy(ds, q + qi, dk + kj, a.dq);
          axpy(p, dout + oi, dv + vj, a.dv);
        });
      }
    }
  });
}

void attention_layer_forward(const AttnLayerShape& s, const AttnLayerInputs& in, AttnSaved& sv,
                             float* out) {
  const int64_t T = s.T, C = s.C, H = s.H, dq = s.dq, dv = s.dv;
  const int64_t N = s.paired ? 2 * T : T, S = s.paired ? H / 2 : H;
  DEG_CHECK(!(s.paired && s.key_offset), "paired heads take no key offset");
  sv.p_qk = zeros(T * 2 * H * dq);
  sv.p_v = zeros(T * H * dv);
  matmul_nt(in.xn, in.w_qk, sv.p_qk.data(), T, C, 2 * H * dq);
  matmul_nt(in.xn, in.w_v, sv.p_v.data(), T, C, H * dv);
  // QK norm per head on sa0 * projection, then rotary / key offset into the attention layout.
  sv.normed = zeros(T * 2 * H * dq);
  sv.rstd = zeros(T * 2 * H);
  Buf scaled = zeros(T * 2 * H * dq);
  for (size_t i = 0; i < scaled.size(); ++i) scaled[i] = in.sa0 * sv.p_qk[i];
  rmsnorm_forward(scaled.data(), sv.normed.data(), sv.rstd.data(), T * 2 * H, dq, s.eps);
  sv.q = zeros(N * S * dq);
  sv.k = zeros(N * S * dq);
  sv.v = zeros(N * S * dv);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g = 0; g < 2 * H; ++g) {
      const int64_t h = g % H;
      const Placement pl = place(s, t, h);
      float* dst = (g < H ? sv.q.data() : sv.k.data()) + (pl.pos * S + pl.slot) * dq;
      const float* src = sv.normed.data() + (t * 2 * H + g) * dq;
      rotate(src, dst, s.freq, s.rotary_dim, pl.rot, false);
      for (int64_t d = s.rotary_dim; d < dq; ++d) dst[d] = src[d];
      if (const int64_t tp = prev_of(s, t); s.key_offset && g >= H && tp >= 0) {
        const float* prev = sv.normed.data() + (tp * 2 * H + g) * dq;
        for (int64_t d = s.rotary_dim; d < dq; ++d) dst[d] = prev[d];
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const Placement pl = place(s, t, h);
      float* dst = sv.v.data() + (pl.pos * S + pl.slot) * dv;
      const float* src = sv.p_v.data() + (t * H + h) * dv;
      const float* aux = in.aux_v ? in.aux_v + (t * H + h) * s.aux_width : nullptr;
      for (int64_t d = 0; d < dv; ++d) dst[d] = in.sa0 * src[d] + (aux ? aux[d] : 0.0f);
    }
  }
  // The core's per-position arrays: a paired token t holds positions 2t and 2t + 1.
  const int64_t f = s.paired ? 2 : 1;
  sv.seg_start.resize(size_t(N));
  for (int64_t i = 0; i < N; ++i) sv.seg_start[size_t(i)] = int32_t(f * s.seg_start[i / f]);
  if (s.pos || s.ctx_lo) {
    sv.apos.resize(size_t(N));
    sv.ctx_lo.assign(size_t(N), 0);
    sv.ctx_hi.assign(size_t(N), 0);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = i / f;
      sv.apos[size_t(i)] = int32_t(f * (s.pos ? s.pos[t] : t) + i % f);
      if (s.ctx_lo) {
        sv.ctx_lo[size_t(i)] = int32_t(f * s.ctx_lo[t]);
        sv.ctx_hi[size_t(i)] = int32_t(f * s.ctx_hi[t]);
      }
    }
  }
  const AttnCore core = core_of(s, sv, N, S);
  sv.core = zeros(N * S * dv);
  sv.lse = zeros(N * S);
  attention_core_forward(core, sv.q.data(), sv.k.data(), sv.v.data(), sv.core.data(), sv.lse.data(),
                         &sv.probs);
  // Back to [T, H, Dv]; XSA (unpaired only) and the output gate.
  sv.y2 = zeros(T * H * dv);
  sv.y3 = zeros(T * H * dv);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const Placement pl = place(s, t, h);
      const float* y = sv.core.data() + (pl.pos * S + pl.slot) * dv;
      float* y2 = sv.y2.data() + (t * H + h) * dv;
      std::memcpy(y2, y, sizeof(float) * size_t(dv));
      if (in.xsa.data && !s.paired) {
        const float* vv = sv.v.data() + (pl.pos * S + pl.slot) * dv;
        const float den = std::max(dot(vv, vv, dv), 1e-8f);
        const float c = std::tanh(in.xsa.at(t, h)) * dot(y, vv, dv) / den;
        axpy(-c, vv, y2, dv);
      }
      const float gt = in.gate.data ? in.gate.at(t, h) : 1.0f;
      float* y3 = sv.y3.data() + (t * H + h) * dv;
      for (int64_t d = 0; d < dv; ++d) y3[d] = y2[d] * gt;
    }
  }
  sv.out_lin = zeros(T * C);
  matmul_nt(sv.y3.data(), in.w_o, sv.out_lin.data(), T, H * dv, C);
  for (int64_t i = 0; i < T * C; ++i) out[i] = in.o_scale * sv.out_lin[size_t(i)];
}

void attention_layer_backward(const AttnLayerShape& s, const AttnLayerInputs& in,
                              const AttnSaved& sv, const float* dout, AttnLayerGrads& g) {
  const int64_t T = s.T, C = s.C, H = s.H, dq = s.dq, dv = s.dv;
  const int64_t N = s.paired ? 2 * T : T, S = s.paired ? H / 2 : H;
  g.do_scale += dot(dout, sv.out_lin.data(), T * C);
  Buf dsc = zeros(T * C);
  for (int64_t i = 0; i < T * C; ++i) dsc[size_t(i)] = in.o_scale * dout[i];
  Buf dy3 = zeros(T * H * dv);
  linear_backward(sv.y3.data(), in.w_o, dsc.data(), dy3.data(), g.dw_o, T, H * dv, C);
  // Gate and XSA backward, into the core's layout; XSA also feeds dv.
  Buf dcore = zeros(N * S * dv), dvv = zeros(N * S * dv);
  Buf dy2 = zeros(dv);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const Placement pl = place(s, t, h);
      const size_t ti = size_t((t * H + h) * dv), ci = size_t((pl.pos * S + pl.slot) * dv);
      const float gt = in.gate.data ? in.gate.at(t, h) : 1.0f;
      if (in.gate.data)
        g.dgate.data[t * g.dgate.stride + h] += dot(dy3.data() + ti, sv.y2.data() + ti, dv);
      for (int64_t d = 0; d < dv; ++d) dy2[size_t(d)] = dy3[ti + size_t(d)] * gt;
      float* dy = dcore.data() + ci;
      std::memcpy(dy, dy2.data(), sizeof(float) * size_t(dv));
      if (in.xsa.data && !s.paired) {
        const float* y = sv.core.data() + ci;
        const float* vv = sv.v.data() + ci;
        const float vsq = dot(vv, vv, dv);
        const bool clamped = vsq < 1e-8f;
        const float den = clamped ? 1e-8f : vsq;
        const float a = std::tanh(in.xsa.at(t, h));
        const float yv = dot(y, vv, dv), gv = dot(dy2.data(), vv, dv);
        const float c = yv / den;
        axpy(-a * gv / den, vv, dy, dv);  // through dot(y, v)
        float* dvi = dvv.data() + ci;
        axpy(-a * c, dy2.data(), dvi, dv);                                  // v itself
        axpy(-a * gv / den, y, dvi, dv);                                    // v inside dot(y, v)
        if (!clamped) axpy(2.0f * a * gv * yv / (den * den), vv, dvi, dv);  // v inside |v|^2
        g.dxsa.data[t * g.dxsa.stride + h] += -(1.0f - a * a) * c * gv;
      }
    }
  }
  const AttnCore core = core_of(s, sv, N, S);
  Buf dQ = zeros(N * S * dq), dK = zeros(N * S * dq), dV = zeros(N * S * dv);
  attention_core_backward(core, sv.q.data(), sv.k.data(), sv.v.data(), sv.core.data(),
                          sv.lse.data(), dcore.data(), dQ.data(), dK.data(), dV.data(), &sv.probs);
  for (size_t i = 0; i < dV.size(); ++i) dV[i] += dvv[i];
  // Undo the layout: rotary, key offset and v placement.
  Buf dnormed = zeros(T * 2 * H * dq), dp_v = zeros(T * H * dv);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t gi = 0; gi < 2 * H; ++gi) {
      const int64_t h = gi % H;
      const Placement pl = place(s, t, h);
      const float* src = (gi < H ? dQ.data() : dK.data()) + (pl.pos * S + pl.slot) * dq;
      float* dst = dnormed.data() + (t * 2 * H + gi) * dq;
      Buf rot = zeros(s.rotary_dim);
      rotate(src, rot.data(), s.freq, s.rotary_dim, pl.rot, true);
      for (int64_t d = 0; d < s.rotary_dim; ++d) dst[d] += rot[size_t(d)];
      if (const int64_t tp = prev_of(s, t); s.key_offset && gi >= H && tp >= 0) {
        float* prev = dnormed.data() + (tp * 2 * H + gi) * dq;
        for (int64_t d = s.rotary_dim; d < dq; ++d) prev[d] += src[d];
      } else {
        for (int64_t d = s.rotary_dim; d < dq; ++d) dst[d] += src[d];
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const Placement pl = place(s, t, h);
      const float* src = dV.data() + (pl.pos * S + pl.slot) * dv;
      float* daux = g.daux_v && in.aux_v ? g.daux_v + (t * H + h) * s.aux_width : nullptr;
      for (int64_t d = 0; d < dv; ++d) {
        dp_v[size_t((t * H + h) * dv + d)] = in.sa0 * src[d];
        g.dsa0 += src[d] * sv.p_v[size_t((t * H + h) * dv + d)];
        if (daux) daux[d] += src[d];
      }
    }
  }
  Buf dscaled = zeros(T * 2 * H * dq);
  rmsnorm_backward(sv.normed.data(), sv.rstd.data(), dnormed.data(), dscaled.data(), T * 2 * H, dq,
                   false);
  g.dsa0 += dot(dscaled.data(), sv.p_qk.data(), T * 2 * H * dq);
  for (auto& x : dscaled) x *= in.sa0;
  linear_backward(in.xn, in.w_qk, dscaled.data(), g.dxn, g.dw_qk, T, C, 2 * H * dq);
  linear_backward(in.xn, in.w_v, dp_v.data(), g.dxn, g.dw_v, T, C, H * dv);
}

}  // namespace deg::train
