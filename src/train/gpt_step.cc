// The gpt forward (seed 003 GPT.forward, plain-torch semantics: no fp8, f32 throughout) and its
// explicit backward. Layer by layer, the backward mirrors the forward's code paths in reverse.
#include "train/gpt_step.h"

#include <cstring>
#include <map>

#include "core/error.h"
#include "train/gpt_internal.h"

namespace deg::train {
using namespace detail;

void gpt_forward(const GptParams& p, const GptBatch& b, const GptStepOptions& o, GptActs& a) {
  const GptConfig& c = p.config();
  const Weights w{p, c};
  const int64_t T = b.size(), C = c.model_dim, H = c.num_heads, Dn = c.ngram_dim, V = c.vocab_size,
                F = c.mlp_hidden, hd = c.head_dim;
  const int L = c.num_layers;
  DEG_CHECK(int64_t(b.seg_start.size()) == T && int64_t(b.targets.size()) == T, "batch shapes");
  DEG_CHECK((b.prev.empty() || int64_t(b.prev.size()) == T) &&
                (b.pos.empty() || int64_t(b.pos.size()) == T) &&
                b.ctx_lo.size() == b.ctx_hi.size() &&
                (b.ctx_lo.empty() || int64_t(b.ctx_lo.size()) == T),
            "fork layout shapes");
  for (int64_t t = 0; t < T; ++t)
    if (b.inputs[size_t(t)] < 0 || b.inputs[size_t(t)] >= V)
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("token id {} at position {} is outside the vocabulary [0, {})",
                              b.inputs[size_t(t)], t, V));
  a = GptActs{};
  a.T = T;
  // Embeddings, n-gram embedding, value-embedding planes.
  a.emb = zeros(T * C);
  const float* embed = w.get("embed");
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(&a.emb[size_t(t * C)], embed + b.inputs[size_t(t)] * C, sizeof(float) * size_t(C));
  a.ngram_rows.resize(size_t(2 * T));
  a.ngram_signs.resize(size_t(2 * T));
  ngram_hash(c, b, a.ngram_rows.data(), a.ngram_signs.data());
  a.x0_ngram = zeros(T * Dn);
  const float* table = w.get("ngram_table");
  for (int64_t t = 0; t < T; ++t)
    for (int ch = 0; ch < 2; ++ch) {
      const float* row = table + int64_t(a.ngram_rows[size_t(ch * T + t)]) * Dn;
      const float* sign = p.sign_pool.data() + int64_t(a.ngram_signs[size_t(ch * T + t)]) * Dn;
      for (int64_t d = 0; d < Dn; ++d) a.x0_ngram[size_t(t * Dn + d)] += row[d] * sign[d];
    }
  a.ve.assign(c.value_embed_layers.size(), Buf{});
  for (size_t j = 0; j < a.ve.size(); ++j) {
    a.ve[j] = zeros(T * C);
    const float* plane = w.get("value_embeds") + int64_t(j) * V * C;
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(&a.ve[j][size_t(t * C)], plane + b.inputs[size_t(t)] * C,
                  sizeof(float) * size_t(C));
  }
  // Smear: token t takes smear_lambda * sigmoid(gate . emb[t, :12]) of the token before it.
  a.smeared = a.emb;
  a.smear_z = zeros(T);
  const float* smear_w = w.get("smear_gate");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tp = b.prev_of(t);
    if (tp < 0) continue;
    a.smear_z[size_t(t)] = dot(&a.emb[size_t(t * C)], smear_w, c.smear_channels);
    const float g = w.smear_lambda() * sigmoid(a.smear_z[size_t(t)]);
    axpy(g, &a.emb[size_t(tp * C)], &a.smeared[size_t(t * C)], C);
  }
  a.x0 = zeros(T * C);
  a.x0_rstd = zeros(T);
  rmsnorm_forward(a.smeared.data(), a.x0.data(), a.x0_rstd.data(), T, C, c.norm_eps);
  head_forward(w.gate(0), a.x0.data(), T, C, a.gate[0]);
  const auto lanes = c.gate_lanes();
  const int64_t ng = c.mudd_gate_coefs();
  auto gate_at = [&](int i, int lane, int64_t t) {
    return a.gate[lanes.gate_id[size_t(i)]].out[size_t(t * ng + lane)];
  };
  a.cache0 = a.x0;
  if (lanes.ngram[0] >= 0)
    for (int64_t t = 0; t < T; ++t)
      axpy(gate_at(0, lanes.ngram[0], t), &a.x0_ngram[size_t(t * Dn)], &a.cache0[size_t(t * C)],
           Dn);
  auto inject = [&](int i, Buf& x) {
    if (lanes.x0[size_t(i)] >= 0)
      for (int64_t t = 0; t < T; ++t)
        axpy(gate_at(i, lanes.x0[size_t(i)], t), &a.x0[size_t(t * C)], &x[size_t(t * C)], C);
    if (lanes.ngram[size_t(i)] >= 0 && i != 0)
      for (int64_t t = 0; t < T; ++t)
        axpy(gate_at(i, lanes.ngram[size_t(i)], t), &a.x0_ngram[size_t(t * Dn)], &x[size_t(t * C)],
             Dn);
  };

  a.layers.assign(size_t(L), LayerActs{});
  Buf x = a.cache0;
  for (int i = 0; i < L; ++i) {
    LayerActs& la = a.layers[size_t(i)];
    const bool mudd_layer = i == c.mudd_layer();
    la.x_in = x;
    if (i == c.post_gate_layer) head_forward(w.gate(1), x.data(), T, C, a.gate[1]);
    if (uses_late(c, i) && a.late_xn.empty()) {
      a.late_xn = zeros(T * C);
      a.late_rstd = zeros(T);
      rmsnorm_forward(cache_of(a, c.late_layer), a.late_xn.data(), a.late_rstd.data(), T, C,
                      c.norm_eps);
    }
    // ---- attention sublayer ----
    if (i == c.skip_layer) {
      const float sl = sigmoid(w.skip_lambda());
      la.x_attn = x;
      const float* src = cache_of(a, c.skip_source);
      for (int64_t t = 0; t < T; ++t)
        axpy(sl * a.gate[1].out[size_t(t * ng + lanes.skip)], src + t * C,
             &la.x_attn[size_t(t * C)], C);
    } else if (!c.has_attn(i)) {
      la.x_attn = x;
      for (auto& v : la.x_attn) v *= w.resid(i, 0);
      inject(i, la.x_attn);
    } else {
      if (!uses_late(c, i)) {
        la.attn_xn = zeros(T * C);
        la.attn_rstd = zeros(T);
        rmsnorm_forward(x.data(), la.attn_xn.data(), la.attn_rstd.data(), T, C, c.norm_eps);
      }
      const float* xn = uses_late(c, i) ? a.late_xn.data() : la.attn_xn.data();
      const int ve = c.value_embed_index(i), veg = c.value_embed_gate_index(i);
      const float* c0 = a.cache0.data();
      const float* cl = mudd_layer ? cache_of(a, c.late_layer) : nullptr;
      if (mudd_layer) {
        head_forward(w.mudd(0), x.data(), T, C, la.mudd);
        const int64_t nm = c.mudd_coefs();
        la.aux_v = zeros(T * C);
        la.x_recomb = zeros(T * C);
        for (int64_t t = 0; t < T; ++t) {
          const float* mu = &la.mudd.out[size_t(t * nm)];
          for (int64_t k = 0; k < C; ++k) {
            const size_t e = size_t(t * C + k);
            const float gv = (k / hd) < H / 2 ? mu[6] : mu[7];
            la.aux_v[e] = gv * a.ve[size_t(ve)][e] + mu[0] * c0[e] + mu[1] * cl[e] + mu[2] * x[e];
            la.x_recomb[e] = (1 + mu[5]) * x[e] + mu[3] * c0[e] + mu[4] * cl[e];
          }
        }
      } else if (ve >= 0) {
        la.aux_v = a.ve[size_t(ve)];
        if (veg >= 0) {
          const int64_t gc = c.value_embed_gate_channels;
          const float* gw = w.get("ve_gate") + veg * H * 2 * gc;
          la.ve_gate_z = zeros(T * H);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              const float z = dot(gw + h * 2 * gc, xn + t * C, gc) +
                              dot(gw + h * 2 * gc + gc, &a.ve[size_t(ve)][size_t(t * C)], gc);
              la.ve_gate_z[size_t(t * H + h)] = z;
              const float gv = 2.0f * sigmoid(z);
              for (int64_t d = 0; d < hd; ++d) la.aux_v[size_t(t * C + h * hd + d)] *= gv;
            }
        }
      }
      const float o_scale = mudd_layer ? w.sa(i, 1) : w.sa(i, 1) * w.post(i, 0);
      la.attn_out = zeros(T * C);
      attention_layer_forward(attn_shape(p, b, o, i), attn_inputs(w, a, i, o_scale), la.attn,
                              la.attn_out.data());
      la.x_attn = zeros(T * C);
      if (mudd_layer) {
        const int64_t nm = c.mudd_coefs();
        for (int64_t t = 0; t < T; ++t) {
          const float* mu = &la.mudd.out[size_t(t * nm)];
          for (int64_t k = 0; k < C; ++k) {
            const size_t e = size_t(t * C + k);
            la.x_attn[e] = mu[8] * la.x_recomb[e] + mu[9] * la.attn_out[e] + mu[10] * c0[e];
          }
          axpy(mu[11], &a.x0_ngram[size_t(t * Dn)], &la.x_attn[size_t(t * C)], Dn);
        }
      } else {
        for (int64_t e = 0; e < T * C; ++e)
          la.x_attn[size_t(e)] = w.resid(i, 0) * x[size_t(e)] + la.attn_out[size_t(e)];
        inject(i, la.x_attn);
      }
    }
    // ---- MLP sublayer ----
    la.x_out = la.x_attn;
    if (!c.has_mlp(i)) {
      for (auto& v : la.x_out) v *= w.resid(i, 1);
    } else {
      la.mlp_xn = zeros(T * C);
      la.mlp_rstd = zeros(T);
      rmsnorm_forward(la.x_attn.data(), la.mlp_xn.data(), la.mlp_rstd.data(), T, C, c.norm_eps);
      mlp_forward(la.mlp_xn.data(), w.get(w.layer(i, "mlp.fc")), w.get(w.layer(i, "mlp.proj")), T,
                  C, F, la.mlp);
      if (mudd_layer) {
        const int64_t nm = c.mudd_coefs();
        for (int64_t t = 0; t < T; ++t) {
          const float* mu = &la.mudd.out[size_t(t * nm)];
          for (int64_t k = 0; k < C; ++k) {
            const size_t e = size_t(t * C + k);
            la.x_out[e] = mu[12] * la.x_attn[e] + mu[13] * la.mlp.out[e];
          }
        }
      } else {
        const float rm = w.resid(i, 1), pm = w.post(i, 1);
        for (int64_t e = 0; e < T * C; ++e)
          la.x_out[size_t(e)] = rm * la.x_attn[size_t(e)] + pm * la.mlp.out[size_t(e)];
        if (i == c.parallel_mlp_layer) {
          mlp_forward(la.mlp_xn.data(), w.get("parallel_mlp.fc"), w.get("parallel_mlp.proj"), T, C,
                      F, la.par);
          axpy(pm, la.par.out.data(), la.x_out.data(), T * C);
        }
      }
    }
    x = la.x_out;
  }
  // Post-loop MUDD: x + sum_k (mu_k + delta_kg) * source_k, per channel group g.
  head_forward(w.mudd(1), x.data(), T, C, a.post);
  a.mixed = x;
  const int64_t nm = c.mudd_coefs(), G = c.mudd_groups, cg = C / G;
  for (size_t k = 0; k < c.post_mix_sources.size(); ++k) {
    const float* src = mix_source(c, a, c.post_mix_sources[k]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const float coef =
            a.post.out[size_t(t * nm) + k] + a.post.deltas[size_t((t * nm + int64_t(k)) * G + g)];
        axpy(coef, src + t * C + g * cg, &a.mixed[size_t(t * C + g * cg)], cg);
      }
  }
  a.final_xn = zeros(T * C);
  a.final_rstd = zeros(T);
  rmsnorm_forward(a.mixed.data(), a.final_xn.data(), a.final_rstd.data(), T, C, c.norm_eps);
}

namespace {

SoftcapLoss loss_of(const GptConfig& c, const GptStepOptions& o) {
  return {.a = c.softcap_a,
          .b = c.softcap_b,
          .c = c.softcap_c,
          .mtp_weights = o.mtp_weights,
          .prefix_weight = o.prefix_weight};
}

LossInputs loss_inputs(const GptParams& p, const GptBatch& b, const GptActs& a) {
  const GptConfig& c = p.config();
  return {.xn = a.final_xn.data(),
          .w = p.data("lm_head"),
          .targets = b.targets.data(),
          .prefix = b.prefix.empty() ? nullptr : b.prefix.data(),
          .T = b.size(),
          .C = c.model_dim,
          .V = c.vocab_size};
}

}  // namespace

double gpt_loss(const GptParams& p, const GptBatch& b, const GptStepOptions& o) {
  GptActs a;
  gpt_forward(p, b, o, a);
  return softcap_loss(loss_of(p.config(), o), loss_inputs(p, b, a), nullptr, nullptr);
}

double gpt_loss_and_grad(const GptParams& p, const GptBatch& b, const GptStepOptions& o,
                         std::vector<ParamTensor>& grads) {
  GptActs a;
  gpt_forward(p, b, o, a);
  Buf dfinal = zeros(b.size() * p.config().model_dim);
  float* dlm = nullptr;
  for (auto& g : grads)
    if (g.name == "lm_head") dlm = g.data.data();
  const double loss =
      softcap_loss(loss_of(p.config(), o), loss_inputs(p, b, a), dfinal.data(), dlm);
  gpt_backward(p, b, o, a, dfinal.data(), grads);
  return loss;
}

Buf gpt_logits(const GptParams& p, const GptBatch& b, const GptStepOptions& o) {
  GptActs a;
  gpt_forward(p, b, o, a);
  const GptConfig& c = p.config();
  Buf logits = zeros(b.size() * c.vocab_size);
  softcap_logits(loss_of(c, o), a.final_xn.data(), p.data("lm_head"), b.size(), c.model_dim,
                 c.vocab_size, logits.data());
  return logits;
}

}  // namespace deg::train
