// The reference backend (kernels/reference_ops.h): each op written as its contract in
// kernels/ops.h reads, one element at a time, sums in double, results rounded to f32 once. Inputs
// that may alias outputs are read into a local copy before anything is written. Nothing here is
// fast and nothing here is shared with kernels/cpu.
#include "kernels/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace deg {

namespace {

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double silu(double x) {
  return x * sigmoid(x);
}
// PyTorch's gelu(approximate="tanh").
double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double softplus(double x) {
  return x > 30.0 ? x : std::log1p(std::exp(x));
}

double table_at(const Tensor& t, int64_t index) {
  if (t.dtype() == DType::bf16) return bf16_to_f32(t.data<bf16>()[index]);
  return t.data<float>()[index];
}

bool is_real(const RowTable& r, int64_t b, int64_t t) {
  return t < r.lengths[b];
}

// Key or value j of KV head h as a row sees them: prefix [0, prefix_len), then own.
const float* key_row(const float* prefix, const float* own, const RowView& v, int64_t h, int64_t j,
                     int64_t d) {
  if (j < v.prefix_len) return prefix + h * v.prefix_stride + j * d;
  return own + h * v.own_stride + (j - v.prefix_len) * d;
}

class ReferenceOps final : public Ops {
 public:
  Device device() const override { return Device::cpu; }
  const char* name() const override { return "reference"; }
  Tensor alloc(const Shape& shape, DType dtype) const override {
    return Tensor::zeros(shape, dtype);
  }

  // y[m, n] (+)= Σ_k x[m, k] W[n, k]; with bf16 precision and a bf16 weight (bf16_all: any
  // weight, rounded too), x is rounded to bf16 first (the products are then exact in double,
  // as in a bf16 dot product).
  void gemm(const GemmArgs& a) const override {
    if (a.xb) return gemm_via_f32(a, [&](const GemmArgs& f) { gemm(f); });
    for (const GemmOutput& o : a.outputs) {
      const Tensor& w = *o.w;
      DEG_CHECK(w.rank() == 2 && w.dim(1) == a.k && w.is_contiguous(),
                "reference gemm: weight {} does not match K {}", w.describe(), a.k);
      const bool round = rounds_to_bf16(a.precision, w.dtype());
      auto r = [&](float v) { return round ? double(bf16_to_f32(f32_to_bf16(v))) : double(v); };
      for (int64_t m = 0; m < a.m; ++m) {
        const float* x = a.x + m * a.ldx;
        for (int64_t n = 0; n < w.dim(0); ++n) {
          double acc = 0;
          for (int64_t k = 0; k < a.k; ++k) acc += r(x[k]) * r(float(table_at(w, n * a.k + k)));
          float* y = o.y + m * o.ldy + n;
          *y = float(o.accumulate ? double(*y) + acc : acc);
        }
      }
    }
  }

  // y = x / sqrt(mean(x²) + eps) * (w | 1 + w | 1) [* silu(gate)] per vector (r, h).
  void rms_norm(const NormArgs& a) const override {
    if (a.yb) return rms_norm_via_f32(a, [&](const NormArgs& f) { rms_norm(f); });
    const int64_t hx = a.hx ? a.hx : a.dim, hy = a.hy ? a.hy : a.dim, hg = a.hg ? a.hg : a.dim;
    std::vector<double> out(size_t(a.dim));
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t h = 0; h < a.heads; ++h) {
        const float* x = a.x + r * a.ldx + h * hx;
        double ss = 0;
        for (int64_t i = 0; i < a.dim; ++i) ss += double(x[i]) * x[i];
        const double inv = 1.0 / std::sqrt(ss / double(a.dim) + a.eps);
        for (int64_t i = 0; i < a.dim; ++i) {
          double w = 1.0;
          if (a.w) w = a.scale == NormScale::one_plus_w ? 1.0 + a.w[i] : a.w[i];
          double v = x[i] * inv * w;
          if (a.gate) v *= silu(a.gate[r * a.ldg + h * hg + i]);
          out[size_t(i)] = v;
        }
        float* y = a.y + r * a.ldy + h * hy;
        for (int64_t i = 0; i < a.dim; ++i) y[i] = float(out[size_t(i)]);
      }
  }

  void l2_norm(const L2NormArgs& a) const override {
    const int64_t scaled = scaled_heads(a);
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t h = 0; h < a.heads; ++h) {
        float* x = a.x + r * a.ldx + h * a.dim;
        double ss = 0;
        for (int64_t i = 0; i < a.dim; ++i) ss += double(x[i]) * x[i];
        const double scale = h < scaled ? a.post_scale : 1.0;
        const double f = scale / std::sqrt(ss + a.eps);
        for (int64_t i = 0; i < a.dim; ++i) x[i] = float(x[i] * f);
      }
  }

  // Rotate-half over the first `rot` dims: (a, b) = (x[i], x[i + rot/2]) turns by angle
  // pos * inv_freq[i], the angle taken in f32 as HF does (kernels/rope.h), cos / sin in double.
  void rope(const RopeArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t half = a.table->rot / 2;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t t = 0; t < r.lengths[b]; ++t) {
        const int64_t pos = r.positions[b] + t;
        for (int64_t h = 0; h < a.heads; ++h) {
          float* v = a.x + (b * r.tokens + t) * a.ldx + h * a.hs;
          for (int64_t i = 0; i < half; ++i) {
            const float angle = float(pos) * a.table->inv_freq[size_t(i)];
            const double c = std::cos(double(angle)), s = std::sin(double(angle));
            const double x0 = v[i], x1 = v[i + half];
            v[i] = float(x0 * c - x1 * s);
            v[i + half] = float(x1 * c + x0 * s);
          }
        }
      }
  }

  // Head h of K (k_dim floats at k + i ldk + h hk) and of V (v_dim at hv) into own position
  // own_before + t, positions `dim` wide.
  void kv_write(const KvWriteArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t dk = a.k_dim ? a.k_dim : a.dim, dv = a.v_dim ? a.v_dim : a.dim;
    const int64_t hk = a.hk ? a.hk : dk, hv = a.hv ? a.hv : dv;
    for (int64_t b = 0; b < r.rows; ++b) {
      const RowView& v = a.views[b];
      for (int64_t t = 0; t < r.lengths[b]; ++t) {
        const int64_t i = b * r.tokens + t;
        for (int64_t h = 0; h < a.kv_heads; ++h) {
          const int64_t at = h * v.own_stride + (v.own_before + t) * a.dim;
          for (int64_t d = 0; d < dk; ++d) v.own_k[at + d] = a.k[i * a.ldk + h * hk + d];
          for (int64_t d = 0; d < dv; ++d) v.own_v[at + d] = a.v[i * a.ldv + h * hv + d];
        }
      }
    }
  }

  // Query t of row b is key index i = prefix_len + own_before + t of the row's one key sequence
  // (prefix, then own keys); it sees keys [0, i], or (i - window, i] when sliding. Softmax of
  // scale q·k over those keys, weights times values. Padded positions are zero.
  void attention(const AttendArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t D = a.head_dim, G = a.group;
    for (int64_t b = 0; b < r.rows; ++b) {
      const RowView& v = a.views[b];
      for (int64_t t = 0; t < r.tokens; ++t) {
        float* out = a.out + (b * r.tokens + t) * a.ldo;
        if (!is_real(r, b, t)) {
          std::fill(out, out + a.kv_heads * G * D, 0.0f);
          continue;
        }
        const int64_t nk = v.prefix_len + v.own_before + t + 1;
        const int64_t lo = a.window > 0 ? std::max<int64_t>(0, nk - a.window) : 0;
        std::vector<double> p(size_t(nk - lo));
        for (int64_t h = 0; h < a.kv_heads; ++h)
          for (int64_t g = 0; g < G; ++g) {
            const float* q = a.q + (b * r.tokens + t) * a.ldq + (h * G + g) * D;
            double mx = -INFINITY;
            for (int64_t j = lo; j < nk; ++j) {
              const float* k = key_row(v.prefix_k, v.own_k, v, h, j, D);
              double s = 0;
              for (int64_t d = 0; d < D; ++d) s += double(q[d]) * k[d];
              p[size_t(j - lo)] = s * a.scale;
              mx = std::max(mx, p[size_t(j - lo)]);
            }
            double total = 0;
            for (double& x : p) total += (x = std::exp(x - mx));
            for (int64_t d = 0; d < D; ++d) {
              double acc = 0;
              for (int64_t j = lo; j < nk; ++j)
                acc += p[size_t(j - lo)] * key_row(v.prefix_v, v.own_v, v, h, j, D)[d];
              out[(h * G + g) * D + d] = float(acc / total);
            }
          }
      }
    }
  }

  // ext = tail_in (K-1 rows) ++ the row's real x; y[t, c] = Σ_k ext[t + k, c] w[c, k] (then
  // SiLU); tail_out = the last K-1 rows of ext. Padded positions of y are zero.
  void causal_conv(const ConvArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t C = a.channels, K = a.kernel, ldt = a.ldt ? a.ldt : C;
    for (int64_t b = 0; b < r.rows; ++b) {
      const RowView& v = a.views[b];
      const int64_t n = r.lengths[b];
      DEG_CHECK(K == 1 || v.tail_in, "reference conv: row {} has no tail_in", b);
      std::vector<float> ext(size_t((K - 1 + n) * C));
      for (int64_t e = 0; e < K - 1 + n; ++e)
        for (int64_t c = 0; c < C; ++c)
          ext[size_t(e * C + c)] =
              e < K - 1 ? v.tail_in[e * ldt + c] : a.x[(b * r.tokens + e - (K - 1)) * a.ldx + c];
      for (int64_t t = 0; t < r.tokens; ++t)
        for (int64_t c = 0; c < C; ++c) {
          double y = 0;
          if (t < n) {
            for (int64_t k = 0; k < K; ++k)
              y += double(ext[size_t((t + k) * C + c)]) * a.w[c * K + k];
            if (a.silu) y = silu(y);
          }
          a.y[(b * r.tokens + t) * a.ldy + c] = float(y);
        }
      if (v.tail_out)
        for (int64_t e = 0; e < K - 1; ++e)
          for (int64_t c = 0; c < C; ++c) v.tail_out[e * ldt + c] = ext[size_t((n + e) * C + c)];
    }
  }

  void delta_gates(const DeltaGatesArgs& a) const override {
    const RowTable& r = a.rows;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t t = 0; t < r.tokens; ++t) {
        const bool real = is_real(r, b, t);
        float* beta = a.beta + (b * r.tokens + t) * a.ld;
        float* g = a.g + (b * r.tokens + t) * a.ld;
        for (int64_t h = 0; h < a.heads; ++h) {
          beta[h] = real ? float(sigmoid(beta[h])) : 0.0f;
          g[h] = real ? float(a.neg_decay[h] * softplus(double(g[h]) + a.dt_bias[h])) : 0.0f;
        }
      }
  }

  // The recurrence of kernels/delta_rule.h in double, token by token, from rec_in with the row's
  // history replayed:  S <- S exp(g_t);  S <- S + k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t.
  void delta_rule(const DeltaRuleOpArgs& a) const override {
    const RowTable& r = a.rows;
    const int64_t Dk = a.dk, Dv = a.dv, per_key = a.v_heads / a.k_heads;
    std::vector<double> S(static_cast<size_t>(Dk * Dv)), u(static_cast<size_t>(Dv));
    for (int64_t b = 0; b < r.rows; ++b) {
      const RowView& view = a.views[b];
      for (int64_t t = r.lengths[b]; t < r.tokens; ++t)
        std::fill_n(a.out + (b * r.tokens + t) * a.ldo, a.v_heads * Dv, 0.0f);
      for (int64_t h = 0; h < a.v_heads; ++h) {
        const int64_t kh = h / per_key;
        for (int64_t i = 0; i < Dk * Dv; ++i) S[size_t(i)] = view.rec_in[h * Dk * Dv + i];
        const DeltaRuleHistory& hs = view.hist;
        DEG_CHECK(!hs.append || hs.len + r.lengths[b] <= hs.cap,
                  "delta_rule: {} + {} history entries of {}", hs.len, r.lengths[b], hs.cap);
        for (int64_t j = 0; j < hs.len; ++j) {  // the row's history over the shared state
          const float* k = hs.k + (kh * hs.cap + j) * Dk;
          const float* d = hs.d + (h * hs.cap + j) * Dv;
          const double decay = std::exp(double(hs.g[h * hs.cap + j]));
          for (int64_t i = 0; i < Dk; ++i)
            for (int64_t c = 0; c < Dv; ++c)
              S[size_t(i * Dv + c)] = S[size_t(i * Dv + c)] * decay + double(k[i]) * d[c];
        }
        for (int64_t t = 0; t < r.lengths[b]; ++t) {
          const int64_t row = b * r.tokens + t;
          const float* q = a.q + row * a.ld + kh * Dk;
          const float* k = a.k + row * a.ld + kh * Dk;
          const float* v = a.v + row * a.ld + h * Dv;
          const double decay = std::exp(double(a.g[row * a.ldg + h]));
          const double beta = a.beta[row * a.ldg + h];
          for (double& s : S) s *= decay;
          for (int64_t j = 0; j < Dv; ++j) {
            double kv = 0;
            for (int64_t i = 0; i < Dk; ++i) kv += S[size_t(i * Dv + j)] * k[i];
            u[size_t(j)] = beta * (v[j] - kv);
          }
          for (int64_t i = 0; i < Dk; ++i)
            for (int64_t j = 0; j < Dv; ++j) S[size_t(i * Dv + j)] += k[i] * u[size_t(j)];
          if (hs.append) {
            const int64_t at = hs.len + t;
            if (h % per_key == 0) std::copy(k, k + Dk, hs.k + (kh * hs.cap + at) * Dk);
            for (int64_t j = 0; j < Dv; ++j) hs.d[(h * hs.cap + at) * Dv + j] = float(u[size_t(j)]);
            hs.g[h * hs.cap + at] = a.g[row * a.ldg + h];
          }
          for (int64_t j = 0; j < Dv; ++j) {
            double o = 0;
            for (int64_t i = 0; i < Dk; ++i) o += S[size_t(i * Dv + j)] * q[i];
            a.out[row * a.ldo + h * Dv + j] = float(o);
          }
        }
        for (int64_t i = 0; i < Dk * Dv; ++i) view.rec_out[h * Dk * Dv + i] = float(S[size_t(i)]);
      }
    }
  }

  void glu(const GluArgs& a) const override {
    if (a.outb) return glu_via_f32(a, [&](const GluArgs& f) { glu(f); });
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t i = 0; i < a.n; ++i) {
        const double x = a.gate[r * a.ldg + i];
        const double act = a.act == Activation::silu        ? silu(x)
                           : a.act == Activation::gelu_tanh ? gelu_tanh(x)
                                                            : sigmoid(x);
        const double up = a.up ? a.up[r * a.ldu + i] : a.out[r * a.ldo + i];
        a.out[r * a.ldo + i] = float(act * up);
      }
  }

  void binary(const BinaryArgs& a) const override {
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t i = 0; i < a.n; ++i) {
        const double x = a.a[r * a.lda + i];
        float& y = a.y[r * a.ldy + i];
        y = float(a.mul ? y * x : y + x);
      }
  }

  void scale(const ScaleArgs& a) const override {
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t i = 0; i < a.n; ++i) {
        float& y = a.y[r * a.ldy + i];
        y = float(double(y) * a.s);
      }
  }

  void gather(const GatherArgs& a) const override {
    const Tensor& t = *a.table;
    const int64_t C = t.dim(1);
    for (int64_t i = 0; i < a.n; ++i) {
      float* y = a.y + i * a.ldy;
      if (a.soft_rows && a.soft_rows[i] >= 0) {
        for (int64_t c = 0; c < C; ++c) y[c] = a.soft[int64_t(a.soft_rows[i]) * C + c];
        continue;
      }
      const double fid = a.id_lane ? double(a.id_lane[i * a.ld_id]) : double(a.ids[i]);
      DEG_CHECK(fid == std::floor(fid), "reference gather: id {} is not an integer", fid);
      const int64_t id = int64_t(fid);
      if (id < 0) continue;
      DEG_CHECK(id < t.dim(0), "reference gather: id {} of {}", id, t.dim(0));
      const double s = a.row_scale ? double(a.row_scale[i * a.ld_scale]) : double(a.scale);
      for (int64_t c = 0; c < C; ++c) {
        const double kept = a.keep ? double(y[c]) : 0.0;
        y[c] = float((kept + table_at(t, id * C + c) * s) * a.mix);
      }
    }
  }

  void logit_picks(const LogitPicksArgs& a) const override {
    for (int64_t r = 0; r < a.rows; ++r) logit_picks_row(a, r);
  }

  void softcap(const SoftcapArgs& a) const override {
    for (int64_t i = 0; i < a.n; ++i) a.y[i] = float(a.cap * std::tanh(double(a.y[i]) / a.cap));
  }

  // Row by row in order, so packing rows toward the front of their own buffer is safe.
  void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t n) const override {
    for (int64_t r = 0; r < rows; ++r)
      std::memmove(y + r * ldy, x + r * ldx, size_t(n) * sizeof(float));
  }

  void gather_rows(const float* x, int64_t ldx, const int32_t* index, float* y, int64_t ldy,
                   int64_t rows, int64_t n) const override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) y[r * ldy + j] = x[int64_t(index[r]) * ldx + j];
  }

  void transpose(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                 int64_t cols) const override {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) y[j * ldy + i] = x[i * ldx + j];
  }

  void activation(const ActivationArgs& a) const override {
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t j = 0; j < a.n; ++j) {
        const double x = a.x[r * a.ldx + j];
        double y = 0;
        switch (a.act) {
          case Activation::relu_squared: y = x > 0 ? x * x : 0.0; break;
          case Activation::gelu_erf: y = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); break;
          case Activation::scaled_sigmoid:
            y = double(a.a) * sigmoid((x + double(a.b)) / double(a.c));
            break;
          case Activation::sigmoid: y = sigmoid(x); break;
          case Activation::silu: y = silu(x); break;
          case Activation::gelu_tanh: y = gelu_tanh(x); break;
        }
        a.y[r * a.ldy + j] = float(y);
      }
  }

  void bias_scale(const BiasScaleArgs& a) const override {
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t j = 0; j < a.n; ++j) {
        const double b = a.bias ? double(a.bias[j]) : 0.0;
        a.y[r * a.ldy + j] = float((double(a.x[r * a.ldx + j]) + b) * a.s);
      }
  }

  // y[r, j] = Σ_k coef_k(r, j / group) x_k[r, j], x_k null: y's value before the op (read
  // into a copy of the row first).
  void combine(const CombineArgs& a) const override {
    const int64_t group = a.group > 0 ? a.group : a.n;
    std::vector<double> before(size_t(a.n));
    for (int64_t r = 0; r < a.rows; ++r) {
      float* y = a.y + r * a.ldy;
      for (int64_t j = 0; j < a.n; ++j) before[size_t(j)] = y[j];
      for (int64_t j = 0; j < a.n; ++j) {
        const int64_t g = j / group;
        double acc = 0;
        for (const CombineTerm& t : a.terms) {
          double coef = t.s;
          if (t.lane) {
            coef = double(t.s) * t.lane[r * t.ldl + g * t.gl];
            if (t.add) coef += t.add[r * t.lda + g * t.ga];
            coef += t.offset;
          }
          acc += coef * (t.x ? double(t.x[r * t.ldx + j]) : before[size_t(j)]);
        }
        y[j] = float(acc);
      }
    }
  }

  void shift_ids(const ShiftIdsArgs& a) const override {
    const RowTable& r = a.rows;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t t = 0; t < r.tokens; ++t) {
        const int64_t i = b * r.tokens + t;
        int32_t id = -1;
        if (t >= a.back) {
          id = a.ids[i - a.back];
        } else if (r.positions[b] + t >= a.back) {
          DEG_CHECK(a.back - t <= a.history_len, "reference shift_ids: {} back past {} history",
                    a.back - t, a.history_len);
          id = a.history[b * a.history_len + a.history_len - (a.back - t)];
        }
        if (a.out) a.out[i] = id;
        if (a.lane) a.lane[i * a.ld_lane] = float(id);
      }
  }

  // Hashes in 64-bit arithmetic reduced to int32 (wrapping), Python's modulo written out.
  void ngram_embed(const NgramEmbedArgs& a) const override {
    const Tensor& tab = *a.table;
    const int64_t V = tab.dim(0), dim = tab.dim(1), P = a.sign_rows;
    const int64_t bmod = V / 2 - 1, tmod = V - V / 2 - 1;
    auto wrap = [](int64_t m, int64_t x) {  // int32 product, wrapped
      return int64_t(int32_t(uint32_t(uint64_t(m * x) & 0xffffffffu)));
    };
    auto pymod = [](int64_t v, int64_t m) { return ((v % m) + m) % m; };
    const RowTable& r = a.rows;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t t = 0; t < r.tokens; ++t) {
        const int64_t i = b * r.tokens + t, pos = r.positions[b] + t;
        const int64_t x = a.ids[i], p1 = a.prev1[i], p2 = a.prev2[i];
        const auto& br = a.bigram_rows;
        const auto& tr = a.trigram_rows;
        const auto& bs = a.bigram_signs;
        const auto& ts = a.trigram_signs;
        int64_t brow = bmod, trow = V - 1, bsign = 0, tsign = 0;
        if (pos >= 1) {
          const int64_t q = pos == 1 ? bmod : p1;
          brow = pymod(int64_t(int32_t(wrap(br[0], x) ^ wrap(br[1], q))), bmod);
          bsign = (wrap(bs[1], p1) ^ wrap(bs[0], x)) & (P - 1);
        }
        if (pos >= 2) {
          trow = V / 2 + pymod(wrap(tr[0], x) ^ wrap(tr[1], p1) ^ wrap(tr[2], p2), tmod);
          tsign = (wrap(ts[2], p2) ^ wrap(ts[1], p1) ^ wrap(ts[0], x)) & (P - 1);
        }
        for (int64_t d = 0; d < dim; ++d) {
          const double v = table_at(tab, brow * dim + d) * a.sign_pool[bsign * dim + d] +
                           table_at(tab, trow * dim + d) * a.sign_pool[tsign * dim + d];
          a.y[i * a.ldy + d] = float(v);
        }
      }
  }

  void sigmoid_gates(const SigmoidGateArgs& a) const override {
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t h = 0; h < a.heads; ++h) {
        const float* w = a.w + h * a.ldw;
        double z = 0;
        for (int64_t i = 0; i < a.n; ++i) z += double(w[i]) * a.x[r * a.ldx + i];
        if (a.x2)
          for (int64_t i = 0; i < a.n; ++i) z += double(w[a.n + i]) * a.x2[r * a.ldx2 + i];
        a.out[r * a.ldo + h] = float(a.s * sigmoid(z));
      }
  }

  void rope_pairs(const RopePairsArgs& a) const override {
    const RowTable& r = a.rows;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t t = 0; t < r.lengths[b]; ++t) {
        const int64_t pos = r.positions[b] + t;
        for (int64_t h = 0; h < a.heads; ++h) {
          const int64_t p = a.paired_heads ? 2 * pos + h % 2 : pos;
          float* x = a.x + (b * r.tokens + t) * a.ldx + h * a.hs;
          for (int64_t i = 0; 2 * i + 1 < a.dims; ++i) {
            const double th = double(p) * double(a.freq[2 * i]);
            const double c = std::cos(th), s = a.inverse ? -std::sin(th) : std::sin(th);
            const double x0 = x[2 * i], x1 = x[2 * i + 1];
            x[2 * i] = float(c * x0 + s * x1);
            x[2 * i + 1] = float(c * x1 - s * x0);
          }
        }
      }
  }

  // Attention positions of a row: token p is position p (paired heads: positions 2p and 2p + 1).
  // Query head h at attention position qp sees positions j in [qp - window, qp]; position j's
  // key and value are those of token j (paired: token j / 2, K/V head h % (H/2) + (j % 2) H/2);
  // with key_offset the key's dims from offset_from on come from token - 1 (token 0: its own).
  void attention_f64(const AttendF64Args& a) const override {
    const RowTable& r = a.rows;
    const int64_t H = a.heads, half = H / 2, D = a.kv_dim;
    for (int64_t b = 0; b < r.rows; ++b) {
      const RowView& v = a.views[b];
      for (int64_t t = 0; t < r.tokens; ++t) {
        const int64_t i = b * r.tokens + t;
        for (int64_t h = 0; h < H; ++h) {
          float* out = a.out + i * a.ldo + h * a.ho;
          if (!is_real(r, b, t)) {
            std::fill(out, out + a.v_dim, 0.0f);
            continue;
          }
          const int64_t pos = r.positions[b] + t;
          const int64_t qp = a.paired_heads ? 2 * pos + h / half : pos;
          const int64_t lo = std::max<int64_t>(0, qp - a.window);
          const float* q = a.q + i * a.ldq + h * a.hq;
          std::vector<double> p(size_t(qp - lo + 1));
          std::vector<const float*> vals(p.size());
          double mx = -INFINITY;
          for (int64_t j = lo; j <= qp; ++j) {
            const int64_t tok = a.paired_heads ? j / 2 : j;
            const int64_t kh = a.paired_heads ? h % half + (j % 2) * half : h;
            const float* k = key_row(v.prefix_k, v.own_k, v, kh, tok, D);
            const float* k_prev =
                a.key_offset && tok > 0 ? key_row(v.prefix_k, v.own_k, v, kh, tok - 1, D) : k;
            double s = 0;
            for (int64_t d = 0; d < a.qk_dim; ++d)
              s += double(q[d]) * (a.key_offset && d >= a.offset_from ? k_prev[d] : k[d]);
            p[size_t(j - lo)] = s * a.scale;
            vals[size_t(j - lo)] = key_row(v.prefix_v, v.own_v, v, kh, tok, D);
            mx = std::max(mx, p[size_t(j - lo)]);
          }
          double total = 0;
          for (double& x : p) total += (x = std::exp(x - mx));
          for (int64_t d = 0; d < a.v_dim; ++d) {
            double acc = 0;
            for (size_t j = 0; j < p.size(); ++j) acc += p[j] * vals[j][d];
            out[d] = float(acc / total);
          }
        }
      }
    }
  }

  void subtract_projection(const ProjectionArgs& a) const override {
    const RowTable& r = a.rows;
    for (int64_t b = 0; b < r.rows; ++b)
      for (int64_t t = 0; t < r.lengths[b]; ++t) {
        const int64_t i = b * r.tokens + t;
        for (int64_t h = 0; h < a.heads; ++h) {
          float* y = a.y + i * a.ldy + h * a.hy;
          const float* v = a.v + i * a.ldv + h * a.hv;
          double yv = 0, vv = 0;
          for (int64_t d = 0; d < a.dim; ++d) {
            yv += double(y[d]) * v[d];
            vv += double(v[d]) * v[d];
          }
          const double c =
              std::tanh(double(a.strength[i * a.lds + h])) * yv / std::max(vv, double(a.eps));
          for (int64_t d = 0; d < a.dim; ++d) y[d] = float(y[d] - c * v[d]);
        }
      }
  }

  // ---- softcap_cross_entropy: every row's logits, loss and gradient in double ----
  void softcap_cross_entropy(const SoftcapCrossEntropyArgs& a) const override {
    const Tensor& w = *a.w;
    const int64_t T = a.rows, V = w.dim(0), C = w.dim(1);
    std::vector<double> dw(a.dw ? size_t(V * C) : 0, 0.0), u(static_cast<size_t>(V), 0.0),
        dz(static_cast<size_t>(V), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const float* x = a.xn + t * a.ldx;
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) {
        double z = 0;
        for (int64_t c = 0; c < C; ++c) z += double(x[c]) * table_at(w, v * C + c);
        u[size_t(v)] = sigmoid((z + a.b) / a.c);
        sum += std::exp(a.a * u[size_t(v)]);
      }
      const double lse = std::log(sum);
      std::vector<std::pair<int64_t, double>> terms;  // (target, weight)
      for (int64_t k = 0; k < a.mtp && t + k < T; ++k)
        if (a.targets[t + k] >= 0 && a.targets[t + k] < V)
          terms.emplace_back(a.targets[t + k], a.mtp_weights[size_t(k)]);
      if (a.prefix && a.prefix_weight != 0.0f && a.prefix[t] >= 0 && a.prefix[t] < V)
        terms.emplace_back(a.prefix[t], a.prefix_weight);
      double loss = 0, weights = 0;
      for (auto [target, weight] : terms) {
        loss += weight * (lse - a.a * u[size_t(target)]);
        weights += weight;
      }
      a.loss[t] = float(loss);
      if (!a.dxn && !a.dw) continue;
      for (int64_t v = 0; v < V; ++v) dz[size_t(v)] = weights * std::exp(a.a * u[size_t(v)] - lse);
      for (auto [target, weight] : terms) dz[size_t(target)] -= weight;
      for (int64_t v = 0; v < V; ++v)
        dz[size_t(v)] *= a.a / a.c * u[size_t(v)] * (1.0 - u[size_t(v)]) / double(T);
      if (a.dxn) {
        for (int64_t c = 0; c < C; ++c) {
          double g = 0;
          for (int64_t v = 0; v < V; ++v) g += dz[size_t(v)] * table_at(w, v * C + c);
          a.dxn[t * a.lddx + c] = float(a.dxn[t * a.lddx + c] + g);
        }
      }
      for (int64_t v = 0; a.dw && v < V; ++v)
        for (int64_t c = 0; c < C; ++c) dw[size_t(v * C + c)] += dz[size_t(v)] * x[c];
    }
    for (int64_t i = 0; a.dw && i < V * C; ++i) a.dw[i] = float(a.dw[i] + dw[size_t(i)]);
  }
};

}  // namespace

const Ops& reference_ops() {
  static const ReferenceOps ops;
  return ops;
}

}  // namespace deg
