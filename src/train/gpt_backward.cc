// The explicit backward of gpt_forward (gpt_step.cc): the post-loop mix, the layers in reverse
// (MLP, then the attention / skip / MUDD sublayer and its gates and injections), the MUDD gates,
// the smear and the embedding scatters. Gradients are added, never overwritten.
#include <cstring>
#include <map>

#include "train/gpt_internal.h"
#include "train/gpt_step.h"

namespace deg::train {

using namespace detail;

void gpt_backward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, const GptActs& a,
                  const float* dfinal, std::vector<ParamTensor>& grads) {
  const GptConfig& c = p.config();
  const Weights w{p, c};
  const int64_t T = b.size(), C = c.model_dim, H = c.num_heads, Dn = c.ngram_dim, V = c.vocab_size,
                F = c.mlp_hidden, hd = c.head_dim, TC = T * C;
  const int L = c.num_layers;
  std::map<std::string, float*> gmap;
  for (auto& g : grads) gmap[g.name] = g.data.data();
  auto G = [&](const std::string& n) {
    auto it = gmap.find(n);
    DEG_CHECK(it != gmap.end(), "no gradient slot for {}", n);
    return it->second;
  };
  float* g_scalars = G("scalars");
  float* g_resid = G("resid_lambdas");
  float* g_post = G("post_lambdas");
  const auto lanes = c.gate_lanes();
  const int64_t ng = c.mudd_gate_coefs(), nm = c.mudd_coefs();
  const HeadWeights mw[2] = {w.mudd(0), w.mudd(1)};
  const HeadGrads mg[2] = {{.w1 = G("mudd_w1"), .w2 = G("mudd_w2"), .b2 = G("mudd_b2")},
                           {.w1 = G("mudd_w1") + c.mudd_dim * C,
                            .w2 = G("mudd_w2") + nm * c.mudd_dim,
                            .b2 = G("mudd_b2") + nm,
                            .w2g = G("mudd_w2g")}};
  const HeadGrads gg[2] = {{.w1 = G("mudd_gate_w1"),
                            .w2 = G("mudd_gate_w2"),
                            .b2 = G("mudd_gate_b2"),
                            .scale = G("mudd_gate_scale")},
                           {.w1 = G("mudd_gate_w1") + c.mudd_gate_dim * C,
                            .w2 = G("mudd_gate_w2") + ng * c.mudd_gate_dim,
                            .b2 = G("mudd_gate_b2") + ng,
                            .scale = G("mudd_gate_scale")}};

  // Gradients of values used downstream of where they were made.
  std::vector<Buf> d_cache;
  d_cache.resize(size_t(L));
  auto dcache = [&](int j) -> Buf& {
    if (d_cache[size_t(j)].empty()) d_cache[size_t(j)] = zeros(TC);
    return d_cache[size_t(j)];
  };
  std::vector<Buf> d_ve(c.value_embed_layers.size(), zeros(TC));
  Buf d_x0 = zeros(TC), d_ngram = zeros(T * Dn), d_late = zeros(TC), d_last_mlp_in = zeros(TC);
  Buf d_gate[2] = {zeros(T * ng), zeros(T * ng)};

  // ---- final norm and post-loop mix ----
  Buf dmixed = zeros(TC);
  rmsnorm_backward(a.final_xn.data(), a.final_rstd.data(), dfinal, dmixed.data(), T, C, false);
  Buf dx = dmixed;
  {
    const int64_t Gr = c.mudd_groups, cg = C / Gr;
    Buf dmu = zeros(T * nm), ddelta = zeros(T * nm * Gr);
    for (size_t k = 0; k < c.post_mix_sources.size(); ++k) {
      const GptMixSource& s = c.post_mix_sources[k];
      const float* src = mix_source(c, a, s);
      float* dsrc = nullptr;
      switch (s.kind) {
        case GptMixSource::Kind::cache: dsrc = dcache(s.layer).data(); break;
        case GptMixSource::Kind::value_embed:
          dsrc = d_ve[size_t(c.value_embed_index(s.layer))].data();
          break;
        case GptMixSource::Kind::last_mlp_in: dsrc = d_last_mlp_in.data(); break;
        case GptMixSource::Kind::late_attn_in: dsrc = d_late.data(); break;
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < Gr; ++g) {
          const size_t di = size_t((t * nm + int64_t(k)) * Gr + g);
          const float coef = a.post.out[size_t(t * nm) + k] + a.post.deltas[di];
          const int64_t off = t * C + g * cg;
          axpy(coef, dmixed.data() + off, dsrc + off, cg);
          const float s_dot = dot(dmixed.data() + off, src + off, cg);
          dmu[size_t(t * nm) + k] += s_dot;
          ddelta[di] += s_dot;
        }
    }
    head_backward(mw[1], a.layers.back().x_out.data(), T, C, a.post, dmu.data(), ddelta.data(),
                  dx.data(), mg[1]);
  }

  auto gate_at = [&](int i, int lane, int64_t t) {
    return a.gate[lanes.gate_id[size_t(i)]].out[size_t(t * ng + lane)];
  };
  auto dgate_at = [&](int i, int lane, int64_t t) -> float& {
    return d_gate[lanes.gate_id[size_t(i)]][size_t(t * ng + lane)];
  };

  // ---- layers in reverse; dx is the gradient of layer i's output ----
  for (int i = L - 1; i >= 0; --i) {
    const LayerActs& la = a.layers[size_t(i)];
    const bool mudd_layer = i == c.mudd_layer();
    if (i == c.late_layer && !a.late_xn.empty())
      rmsnorm_backward(a.late_xn.data(), a.late_rstd.data(), d_late.data(), dcache(i).data(), T, C,
                       true);
    if (i >= 1 && !d_cache[size_t(i)].empty()) axpy(1.0f, d_cache[size_t(i)].data(), dx.data(), TC);
    const float* mu_all = mudd_layer ? la.mudd.out.data() : nullptr;
    Buf dmu = mudd_layer ? zeros(T * nm) : Buf{};

    // ---- MLP sublayer: dx -> dxa (gradient of x_attn) ----
    Buf dxa = zeros(TC);
    if (!c.has_mlp(i)) {
      g_resid[2 * i + 1] += dot(dx.data(), la.x_attn.data(), TC);
      for (int64_t e = 0; e < TC; ++e) dxa[size_t(e)] = w.resid(i, 1) * dx[size_t(e)];
    } else {
      Buf dmo = zeros(TC);
      if (mudd_layer) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t off = t * C;
          dmu[size_t(t * nm + 12)] += dot(dx.data() + off, la.x_attn.data() + off, C);
          dmu[size_t(t * nm + 13)] += dot(dx.data() + off, la.mlp.out.data() + off, C);
          for (int64_t k = 0; k < C; ++k) {
            dxa[size_t(off + k)] = mu_all[t * nm + 12] * dx[size_t(off + k)];
            dmo[size_t(off + k)] = mu_all[t * nm + 13] * dx[size_t(off + k)];
          }
        }
      } else {
        const float rm = w.resid(i, 1), pm = w.post(i, 1);
        g_resid[2 * i + 1] += dot(dx.data(), la.x_attn.data(), TC);
        g_post[2 * i + 1] += dot(dx.data(), la.mlp.out.data(), TC);
        if (i == c.parallel_mlp_layer) g_post[2 * i + 1] += dot(dx.data(), la.par.out.data(), TC);
        for (int64_t e = 0; e < TC; ++e) {
          dxa[size_t(e)] = rm * dx[size_t(e)];
          dmo[size_t(e)] = pm * dx[size_t(e)];
        }
      }
      Buf dmn = i == L - 1 ? d_last_mlp_in : zeros(TC);
      mlp_backward(la.mlp_xn.data(), w.get(w.layer(i, "mlp.fc")), w.get(w.layer(i, "mlp.proj")), T,
                   C, F, la.mlp, dmo.data(), dmn.data(), G(w.layer(i, "mlp.fc")),
                   G(w.layer(i, "mlp.proj")));
      if (i == c.parallel_mlp_layer)
        mlp_backward(la.mlp_xn.data(), w.get("parallel_mlp.fc"), w.get("parallel_mlp.proj"), T, C,
                     F, la.par, dmo.data(), dmn.data(), G("parallel_mlp.fc"),
                     G("parallel_mlp.proj"));
      rmsnorm_backward(la.mlp_xn.data(), la.mlp_rstd.data(), dmn.data(), dxa.data(), T, C, true);
    }

    // ---- attention sublayer: dxa -> dx_in ----
    Buf dx_in = zeros(TC);
    if (!mudd_layer && i != c.skip_layer) {  // the gated x0 / n-gram injections
      if (lanes.x0[size_t(i)] >= 0)
        for (int64_t t = 0; t < T; ++t) {
          const int lane = lanes.x0[size_t(i)];
          axpy(gate_at(i, lane, t), dxa.data() + t * C, d_x0.data() + t * C, C);
          dgate_at(i, lane, t) += dot(dxa.data() + t * C, a.x0.data() + t * C, C);
        }
      if (lanes.ngram[size_t(i)] >= 0 && i != 0)
        for (int64_t t = 0; t < T; ++t) {
          const int lane = lanes.ngram[size_t(i)];
          axpy(gate_at(i, lane, t), dxa.data() + t * C, d_ngram.data() + t * Dn, Dn);
          dgate_at(i, lane, t) += dot(dxa.data() + t * C, a.x0_ngram.data() + t * Dn, Dn);
        }
    }
    if (i == c.skip_layer) {
      const float sl = sigmoid(w.skip_lambda());
      const float* src = cache_of(a, c.skip_source);
      Buf& dsrc = dcache(c.skip_source);
      dx_in = dxa;
      for (int64_t t = 0; t < T; ++t) {
        const float gt = a.gate[1].out[size_t(t * ng + lanes.skip)];
        axpy(sl * gt, dxa.data() + t * C, dsrc.data() + t * C, C);
        const float dsg = dot(dxa.data() + t * C, src + t * C, C);
        d_gate[1][size_t(t * ng + lanes.skip)] += dsg * sl;
        g_scalars[2 * L + 1] += dsg * gt * sl * (1.0f - sl);
      }
    } else if (!c.has_attn(i)) {
      g_resid[2 * i] += dot(dxa.data(), la.x_in.data(), TC);
      for (int64_t e = 0; e < TC; ++e) dx_in[size_t(e)] = w.resid(i, 0) * dxa[size_t(e)];
    } else {
      const float* c0 = a.cache0.data();
      const float* cl = mudd_layer ? cache_of(a, c.late_layer) : nullptr;
      Buf dout = zeros(TC), dxr = mudd_layer ? zeros(TC) : Buf{};
      if (mudd_layer) {
        Buf& dc0 = dcache(0);
        for (int64_t t = 0; t < T; ++t) {
          const float* mu = mu_all + t * nm;
          const int64_t off = t * C;
          float* dm = &dmu[size_t(t * nm)];
          dm[8] += dot(dxa.data() + off, la.x_recomb.data() + off, C);
          dm[9] += dot(dxa.data() + off, la.attn_out.data() + off, C);
          dm[10] += dot(dxa.data() + off, c0 + off, C);
          dm[11] += dot(dxa.data() + off, a.x0_ngram.data() + t * Dn, Dn);
          for (int64_t k = 0; k < C; ++k) {
            const float d = dxa[size_t(off + k)];
            dxr[size_t(off + k)] = mu[8] * d;
            dout[size_t(off + k)] = mu[9] * d;
            dc0[size_t(off + k)] += mu[10] * d;
          }
          axpy(mu[11], dxa.data() + off, d_ngram.data() + t * Dn, Dn);
        }
      } else {
        g_resid[2 * i] += dot(dxa.data(), la.x_in.data(), TC);
        for (int64_t e = 0; e < TC; ++e) dx_in[size_t(e)] = w.resid(i, 0) * dxa[size_t(e)];
        dout = dxa;
      }
      const float o_scale = mudd_layer ? w.sa(i, 1) : w.sa(i, 1) * w.post(i, 0);
      const AttnLayerInputs in = attn_inputs(w, a, i, o_scale);
      Buf dxn = zeros(TC), daux = la.aux_v.empty() ? Buf{} : zeros(TC);
      AttnLayerGrads ag{.dxn = dxn.data(),
                        .dw_qk = G(w.layer(i, "attn.qk")),
                        .dw_v = G(w.layer(i, "attn.v")),
                        .dw_o = G(w.layer(i, "attn.o")),
                        .daux_v = daux.empty() ? nullptr : daux.data()};
      if (in.xsa.data) ag.dxsa = {d_gate[0].data() + lanes.xsa[size_t(i)], ng};
      if (in.gate.data)
        ag.dgate = {d_gate[lanes.gate_id[size_t(i)]].data() + lanes.attn_gate[size_t(i)], ng};
      attention_layer_backward(attn_shape(p, b, o, i), in, la.attn, dout.data(), ag);
      g_scalars[2 * i] += ag.dsa0;
      if (mudd_layer) {
        g_scalars[2 * i + 1] += ag.do_scale;
      } else {
        g_scalars[2 * i + 1] += ag.do_scale * w.post(i, 0);
        g_post[2 * i] += ag.do_scale * w.sa(i, 1);
      }
      const int ve = c.value_embed_index(i), veg = c.value_embed_gate_index(i);
      if (mudd_layer) {
        // aux = gv * ve + v_mudd;  x_recomb = (1 + mu5) x + mu3 c0 + mu4 c_late.
        Buf& dc0 = dcache(0);
        Buf& dcl = dcache(c.late_layer);
        const float* x = la.x_in.data();
        for (int64_t t = 0; t < T; ++t) {
          const float* mu = mu_all + t * nm;
          float* dm = &dmu[size_t(t * nm)];
          const int64_t off = t * C;
          for (int64_t k = 0; k < C; ++k) {
            const size_t e = size_t(off + k);
            const float da = daux[e], dr = dxr[e];
            const float gv = (k / hd) < H / 2 ? mu[6] : mu[7];
            d_ve[size_t(ve)][e] += gv * da;
            dm[(k / hd) < H / 2 ? 6 : 7] += da * a.ve[size_t(ve)][e];
            dm[0] += da * c0[e];
            dm[1] += da * cl[e];
            dm[2] += da * x[e];
            dm[3] += dr * c0[e];
            dm[4] += dr * cl[e];
            dm[5] += dr * x[e];
            dc0[e] += mu[0] * da + mu[3] * dr;
            dcl[e] += mu[1] * da + mu[4] * dr;
            dx_in[e] += mu[2] * da + (1 + mu[5]) * dr;
          }
        }
        head_backward(mw[0], x, T, C, la.mudd, dmu.data(), nullptr, dx_in.data(), mg[0]);
      } else if (ve >= 0 && veg >= 0) {
        const int64_t gc = c.value_embed_gate_channels;
        const float* gw = w.get("ve_gate") + veg * H * 2 * gc;
        float* dgw = G("ve_gate") + veg * H * 2 * gc;
        const float* xn = in.xn;
        Buf& dve = d_ve[size_t(ve)];
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h) {
            const float s = sigmoid(la.ve_gate_z[size_t(t * H + h)]);
            const int64_t off = t * C + h * hd;
            const float dgv = dot(daux.data() + off, a.ve[size_t(ve)].data() + off, hd);
            axpy(2.0f * s, daux.data() + off, dve.data() + off, hd);
            const float dz = dgv * 2.0f * s * (1.0f - s);
            axpy(dz, xn + t * C, dgw + h * 2 * gc, gc);
            axpy(dz, a.ve[size_t(ve)].data() + t * C, dgw + h * 2 * gc + gc, gc);
            axpy(dz, gw + h * 2 * gc, dxn.data() + t * C, gc);
            axpy(dz, gw + h * 2 * gc + gc, dve.data() + t * C, gc);
          }
      } else if (ve >= 0) {
        axpy(1.0f, daux.data(), d_ve[size_t(ve)].data(), TC);
      }
      if (uses_late(c, i))
        axpy(1.0f, dxn.data(), d_late.data(), TC);
      else
        rmsnorm_backward(la.attn_xn.data(), la.attn_rstd.data(), dxn.data(), dx_in.data(), T, C,
                         true);
    }
    if (i == c.post_gate_layer)
      head_backward(w.gate(1), la.x_in.data(), T, C, a.gate[1], d_gate[1].data(), nullptr,
                    dx_in.data(), gg[1]);
    dx = std::move(dx_in);
  }

  // ---- the stream entering layer 0: x0 plus the layer-0 n-gram injection ----
  if (!d_cache[0].empty()) axpy(1.0f, d_cache[0].data(), dx.data(), TC);
  axpy(1.0f, dx.data(), d_x0.data(), TC);
  if (lanes.ngram[0] >= 0)
    for (int64_t t = 0; t < T; ++t) {
      axpy(gate_at(0, lanes.ngram[0], t), dx.data() + t * C, d_ngram.data() + t * Dn, Dn);
      dgate_at(0, lanes.ngram[0], t) += dot(dx.data() + t * C, a.x0_ngram.data() + t * Dn, Dn);
    }
  head_backward(w.gate(0), a.x0.data(), T, C, a.gate[0], d_gate[0].data(), nullptr, d_x0.data(),
                gg[0]);
  // ---- x0 = norm(smear(embed)) ----
  Buf dsm = zeros(TC);
  rmsnorm_backward(a.x0.data(), a.x0_rstd.data(), d_x0.data(), dsm.data(), T, C, false);
  Buf demb = dsm;
  const float* smear_w = w.get("smear_gate");
  float* g_smear = G("smear_gate");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tp = b.prev_of(t);
    if (tp < 0) continue;
    const float s = sigmoid(a.smear_z[size_t(t)]), lam = w.smear_lambda();
    const float* prev = a.emb.data() + tp * C;
    axpy(lam * s, dsm.data() + t * C, demb.data() + tp * C, C);
    const float dg = dot(dsm.data() + t * C, prev, C);
    g_scalars[2 * L] += dg * s;
    const float dz = dg * lam * s * (1.0f - s);
    axpy(dz, a.emb.data() + t * C, g_smear, c.smear_channels);
    axpy(dz, smear_w, demb.data() + t * C, c.smear_channels);
  }
  // ---- scatters into the tables ----
  float* g_embed = G("embed");
  float* g_ve = G("value_embeds");
  float* g_table = G("ngram_table");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = b.inputs[size_t(t)];
    axpy(1.0f, demb.data() + t * C, g_embed + id * C, C);
    for (size_t j = 0; j < d_ve.size(); ++j)
      axpy(1.0f, d_ve[j].data() + t * C, g_ve + (int64_t(j) * V + id) * C, C);
    for (int ch = 0; ch < 2; ++ch) {
      float* row = g_table + int64_t(a.ngram_rows[size_t(ch * T + t)]) * Dn;
      const float* sign = p.sign_pool.data() + int64_t(a.ngram_signs[size_t(ch * T + t)]) * Dn;
      for (int64_t d = 0; d < Dn; ++d) row[d] += d_ngram[size_t(t * Dn + d)] * sign[d];
    }
  }
}

}  // namespace deg::train
