// Scalar CPU kernels of the training ops (kernels/ops.h "training"): the general f32 product and
// the backward of the forward ops, over index ranges the backend hands each thread. A gradient
// that sums over rows is computed per output element by one range, rows in order; one that
// scatters into table rows walks each table row's positions in order.
#include "kernels/cpu/backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/scalar_ops.h"
#include "kernels/gemm.h"

namespace deg {

namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

double dot_f64(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

float activation_slope(const ActivationBackwardArgs& a, float x) {
  switch (a.act) {
    case Activation::relu_squared: return x > 0 ? 2.0f * x : 0.0f;
    case Activation::gelu_erf:
      return 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) +
             x * 0.39894228040143268f * std::exp(-0.5f * x * x);
    case Activation::scaled_sigmoid: {
      const float u = sigmoid((x + a.b) / a.c);
      return a.a / a.c * u * (1.0f - u);
    }
    default: DEG_CHECK(false, "activation_backward: activation {}", int(a.act));
  }
  return 0.0f;
}

}  // namespace

void matmul_range(const MatmulOpArgs& a, int64_t i0, int64_t i1) {
  // Rows [i0, i1) of c through the single-threaded kernels of kernels/gemm.h (each element's
  // order depends on k only); a transposed a is first gathered into rows.
  std::vector<float> rows;
  const float* x = a.a + i0 * a.lda;
  int64_t ldx = a.lda;
  if (a.ta) {
    rows.resize(size_t((i1 - i0) * a.k));
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t k = 0; k < a.k; ++k) rows[size_t((i - i0) * a.k + k)] = a.a[k * a.lda + i];
    x = rows.data();
    ldx = a.k;
  }
  const MatmulArgs m{.a = x,
                     .lda = ldx,
                     .b = a.b,
                     .ldb = a.ldb,
                     .m = i1 - i0,
                     .n = a.n,
                     .k = a.k,
                     .c = a.c + i0 * a.ldc,
                     .ldc = a.ldc,
                     .accumulate = a.accumulate};
  if (a.tb) {
    matmul_nt(m);
  } else {
    matmul_nn(m);
  }
}

MatmulOpArgs rounded_operands(const MatmulOpArgs& a, std::vector<float>& ra,
                              std::vector<float>& rb) {
  if (a.precision != GemmPrecision::bf16_all) return a;
  auto round = [](const float* x, int64_t ld, int64_t rows, int64_t cols, std::vector<float>& r) {
    r.resize(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        r[size_t(i * cols + j)] = bf16_to_f32(f32_to_bf16(x[i * ld + j]));
  };
  MatmulOpArgs f = a;
  round(a.a, a.lda, a.ta ? a.k : a.m, a.ta ? a.m : a.k, ra);
  round(a.b, a.ldb, a.tb ? a.n : a.k, a.tb ? a.k : a.n, rb);
  f.a = ra.data(), f.lda = a.ta ? a.m : a.k;
  f.b = rb.data(), f.ldb = a.tb ? a.k : a.n;
  f.precision = GemmPrecision::exact;
  return f;
}

void rms_norm_backward_range(const NormBackwardArgs& a, int64_t v0, int64_t v1) {
  const int64_t hx = a.hx ? a.hx : a.dim, hy = a.hy ? a.hy : a.dim, hd = a.hdx ? a.hdx : a.dim;
  for (int64_t v = v0; v < v1; ++v) {
    const int64_t r = v / a.heads, h = v % a.heads;
    const float* x = a.x + r * a.ldx + h * hx;
    const float* dy = a.dy + r * a.ldy + h * hy;
    float* dx = a.dx + r * a.lddx + h * hd;
    const float rstd = float(1.0 / std::sqrt(dot_f64(x, x, a.dim) / double(a.dim) + a.eps));
    double m = 0;
    for (int64_t d = 0; d < a.dim; ++d) m += double(dy[d]) * double(x[d] * rstd);
    const float mean = float(m / double(a.dim));
    for (int64_t d = 0; d < a.dim; ++d) dx[d] += rstd * (dy[d] - x[d] * rstd * mean);
  }
}

void activation_backward_range(const ActivationBackwardArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * a.ldx;
    const float* dy = a.dy + r * a.ldy;
    float* dx = a.dx + r * a.lddx;
    for (int64_t j = 0; j < a.n; ++j) {
      const float g = dy[j] * activation_slope(a, x[j]);
      dx[j] = a.accumulate ? dx[j] + g : g;
    }
  }
}

void column_sum_range(const ColumnSumArgs& a, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    double s = 0;
    for (int64_t r = 0; r < a.rows; ++r) s += a.x[r * a.ldx + j];
    const float v = a.s * float(s);
    a.out[j] = a.accumulate ? a.out[j] + v : v;
  }
}

void combine_backward_range(const CombineBackwardArgs& a, int64_t r0, int64_t r1) {
  const CombineArgs& f = a.forward;
  const size_t K = f.terms.size();
  DEG_CHECK(a.grads.size() == K, "combine_backward: {} gradients for {} terms", a.grads.size(), K);
  const int64_t group = f.group > 0 ? f.group : f.n;
  std::vector<float> dy(size_t(f.n));
  for (int64_t r = r0; r < r1; ++r) {
    std::copy(a.dy + r * a.ldy, a.dy + r * a.ldy + f.n, dy.begin());  // dy_before may be dy
    bool self = false;
    for (size_t k = 0; k < K; ++k) self = self || !f.terms[k].x;
    // In place (dy_before is dy): the old output's gradient replaces dy; else it is added.
    if (self && a.dy_before + r * a.lddb == a.dy + r * a.ldy)
      std::fill(a.dy_before + r * a.lddb, a.dy_before + r * a.lddb + f.n, 0.0f);
    for (int64_t j0 = 0; j0 < f.n; j0 += group) {
      const int64_t g = j0 / group, w = std::min(group, f.n - j0);
      for (size_t k = 0; k < K; ++k) {
        const CombineTerm& t = f.terms[k];
        const CombineGrad& gk = a.grads[k];
        const float c = term_coef(t, r, g);
        const float* x = t.x ? t.x + r * t.ldx : a.y_before + r * a.ldb;
        float* dx = t.x ? gk.dx ? gk.dx + r * gk.lddx : nullptr : a.dy_before + r * a.lddb;
        double s = 0;
        for (int64_t j = j0; j < j0 + w; ++j) {
          if (dx) dx[j] += c * dy[size_t(j)];
          if (gk.dcoef) s += double(dy[size_t(j)]) * x[j];
        }
        if (gk.dcoef) gk.dcoef[r * gk.ldc + g] += float(s);
      }
    }
  }
}

std::vector<int64_t> gather_order(const int32_t* ids, int64_t n, int64_t rows,
                                  std::vector<int64_t>& starts) {
  starts.assign(size_t(rows + 1), 0);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < rows) ++starts[size_t(ids[i]) + 1];
  for (int64_t v = 0; v < rows; ++v) starts[size_t(v + 1)] += starts[size_t(v)];
  std::vector<int64_t> order(static_cast<size_t>(starts[size_t(rows)]));
  std::vector<int64_t> at(starts.begin(), starts.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < rows) order[size_t(at[size_t(ids[i])]++)] = i;
  return order;  // positions of each table row in increasing order
}

void gather_backward_rows(const GatherBackwardArgs& a, const std::vector<int64_t>& order,
                          const std::vector<int64_t>& starts, int64_t v0, int64_t v1) {
  const GatherArgs& f = a.forward;
  const int64_t C = f.table->dim(1);
  for (int64_t v = v0; v < v1; ++v) {
    float* dt = a.dtable + v * C;
    for (int64_t q = starts[size_t(v)]; q < starts[size_t(v + 1)]; ++q) {
      const int64_t i = order[size_t(q)];
      const float s = f.row_scale ? f.row_scale[i * f.ld_scale] : f.scale;
      const float* dy = a.dy + i * a.ldy;
      for (int64_t c = 0; c < C; ++c) dt[c] += s * dy[c];
    }
  }
}

void gather_row_scale_range(const GatherBackwardArgs& a, const int32_t* ids, int64_t i0,
                            int64_t i1) {
  const GatherArgs& f = a.forward;
  const int64_t C = f.table->dim(1);
  const float* table = f.table->data<float>();
  for (int64_t i = i0; i < i1; ++i) {
    if (ids[i] < 0) continue;
    a.drow_scale[i * a.ld_drow] += float(dot_f64(a.dy + i * a.ldy, table + ids[i] * C, C));
  }
}

void sigmoid_gates_dz_range(const SigmoidGatesBackwardArgs& a, float* dz, int64_t r0, int64_t r1) {
  const SigmoidGateArgs& f = a.forward;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t h = 0; h < f.heads; ++h) {
      const float* w = f.w + h * f.ldw;
      float z = float(dot_f64(w, f.x + r * f.ldx, f.n));
      if (f.x2) z += float(dot_f64(w + f.n, f.x2 + r * f.ldx2, f.n));
      const float sg = sigmoid(z);
      const float d = a.dout[r * a.lddo + h] * f.s * sg * (1.0f - sg);
      dz[r * f.heads + h] = d;
      if (a.dx)
        for (int64_t j = 0; j < f.n; ++j) a.dx[r * a.lddx + j] += d * w[j];
      if (a.dx2)
        for (int64_t j = 0; j < f.n; ++j) a.dx2[r * a.lddx2 + j] += d * w[f.n + j];
    }
  }
}

void sigmoid_gates_dw_range(const SigmoidGatesBackwardArgs& a, const float* dz, int64_t e0,
                            int64_t e1) {
  const SigmoidGateArgs& f = a.forward;
  const int64_t width = f.x2 ? 2 * f.n : f.n;
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t h = e / width, j = e % width;
    const float* x = j < f.n ? f.x + j : f.x2 + (j - f.n);
    const int64_t ld = j < f.n ? f.ldx : f.ldx2;
    double s = 0;
    for (int64_t r = 0; r < f.rows; ++r) s += double(dz[r * f.heads + h]) * x[r * ld];
    a.dw[h * f.ldw + j] += float(s);
  }
}

void subtract_projection_backward_range(const ProjectionBackwardArgs& a, int64_t i0, int64_t i1) {
  const ProjectionArgs& f = a.forward;
  const RowTable& rows = f.rows;
  std::vector<float> g(size_t(f.dim));
  for (int64_t i = i0; i < i1; ++i) {
    if (i % rows.tokens >= rows.lengths[i / rows.tokens]) continue;
    for (int64_t h = 0; h < f.heads; ++h) {
      const float* y = f.y + i * f.ldy + h * f.hy;
      const float* v = f.v + i * f.ldv + h * f.hv;
      const float* go = a.dy_out + i * a.lddo + h * f.hy;
      std::copy(go, go + f.dim, g.begin());  // dy may be dy_out
      const float vv_raw = float(dot_f64(v, v, f.dim));
      const bool clamped = vv_raw <= f.eps;
      const float vv = clamped ? f.eps : vv_raw;
      const float yv = float(dot_f64(y, v, f.dim));
      const float t = std::tanh(f.strength[i * f.lds + h]);
      const float coef = t * yv / vv;
      const float gv = float(dot_f64(g.data(), v, f.dim));
      // y' = y - coef v: dcoef = -g.v; coef = t yv / vv.
      const float dcoef = -gv;
      if (a.dy) {
        float* dy = a.dy + i * a.lddy + h * f.hy;
        const float k = dcoef * t / vv;
        for (int64_t d = 0; d < f.dim; ++d)
          dy[d] = (a.dy == a.dy_out ? 0.0f : dy[d]) + g[size_t(d)] + k * v[d];
      }
      if (a.dv) {
        float* dv = a.dv + i * a.lddv + h * f.hv;
        const float ky = dcoef * t / vv;
        const float kv = clamped ? 0.0f : -2.0f * dcoef * t * yv / (vv * vv);
        for (int64_t d = 0; d < f.dim; ++d) dv[d] += -coef * g[size_t(d)] + ky * y[d] + kv * v[d];
      }
      if (a.dstrength) a.dstrength[i * a.ldds + h] += dcoef * (1.0f - t * t) * yv / vv;
    }
  }
}

void ngram_rows_of(const NgramEmbedArgs& a, int64_t i, int32_t rows[2], int32_t signs[2]) {
  const int64_t V = a.table->dim(0), L = a.rows.tokens;
  const int32_t half = int32_t(V / 2), bmod = half - 1, tmod = int32_t(V) - half - 1;
  const int32_t mask = int32_t(a.sign_rows - 1);
  const int32_t *br = a.bigram_rows.data(), *tr = a.trigram_rows.data();
  const int32_t *bs = a.bigram_signs.data(), *ts = a.trigram_signs.data();
  auto wrap_mul = [](int32_t m, int32_t x) { return int32_t(uint32_t(m) * uint32_t(x)); };
  auto py_mod = [](int32_t x, int32_t m) {
    const int32_t r = x % m;
    return r < 0 ? r + m : r;
  };
  const int64_t pos = a.rows.positions[i / L] + i % L;
  const int32_t x = a.ids[i], p1 = a.prev1[i], p2 = a.prev2[i];
  const int32_t prev = pos == 1 ? bmod : p1;
  rows[0] = pos == 0 ? bmod : py_mod(wrap_mul(br[0], x) ^ wrap_mul(br[1], prev), bmod);
  rows[1] =
      pos < 2 ? half + tmod
              : py_mod(wrap_mul(tr[0], x) ^ wrap_mul(tr[1], p1) ^ wrap_mul(tr[2], p2), tmod) + half;
  signs[0] = pos < 1 ? 0 : (wrap_mul(bs[1], p1) ^ wrap_mul(bs[0], x)) & mask;
  signs[1] = pos < 2 ? 0 : (wrap_mul(ts[2], p2) ^ wrap_mul(ts[1], p1) ^ wrap_mul(ts[0], x)) & mask;
}

std::vector<int64_t> ngram_order(const NgramEmbedArgs& a, int64_t n, std::vector<int64_t>& starts,
                                 std::vector<int32_t>& signs) {
  const int64_t V = a.table->dim(0);
  std::vector<int32_t> rows(size_t(2 * n));
  signs.resize(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i) ngram_rows_of(a, i, &rows[size_t(2 * i)], &signs[size_t(2 * i)]);
  return gather_order(rows.data(), 2 * n, V, starts);  // entries 2 i + channel, in order
}

void ngram_backward_rows(const NgramBackwardArgs& a, const std::vector<int64_t>& order,
                         const std::vector<int64_t>& starts, const std::vector<int32_t>& signs,
                         int64_t v0, int64_t v1) {
  const int64_t Dn = a.forward.table->dim(1);
  for (int64_t v = v0; v < v1; ++v) {
    float* dt = a.dtable + v * Dn;
    for (int64_t q = starts[size_t(v)]; q < starts[size_t(v + 1)]; ++q) {
      const int64_t e = order[size_t(q)], i = e / 2;
      const float* dy = a.dy + i * a.ldy;
      const float* sign = a.forward.sign_pool + int64_t(signs[size_t(e)]) * Dn;
      for (int64_t d = 0; d < Dn; ++d) dt[d] += dy[d] * sign[d];
    }
  }
}

void adam_step_range(const AdamStepArgs& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float g = a.g[i];
    a.m[i] = a.beta1 * a.m[i] + (1.0f - a.beta1) * g;
    a.v[i] = a.beta2 * a.v[i] + (1.0f - a.beta2) * g * g;
    float upd = a.m[i] / (std::sqrt(a.v[i]) + a.eps) * a.step_size;
    if (upd * a.p[i] > 0.0f) upd += a.p[i] * a.wd;
    a.p[i] -= upd;
    a.g[i] = 0.0f;
  }
}

void nesterov_range(const NesterovArgs& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    a.buf[i] += (1.0f - a.momentum) * (a.g[i] - a.buf[i]);
    a.u[i] = a.g[i] + a.momentum * (a.buf[i] - a.g[i]);
    a.g[i] = 0.0f;
  }
}

double sum_squares_chunk(const float* x, int64_t n, int64_t chunk) {
  const int64_t b = chunk * kSumChunk, e = std::min(n, b + kSumChunk);
  double s = 0;
  for (int64_t i = b; i < e; ++i) s += double(x[i]) * x[i];
  return s;
}

void normuon_step(const NorMuonStepArgs& a) {
  const bool tall = a.rows >= a.cols;
  const int64_t red = tall ? a.cols : a.rows, nsec = tall ? a.rows : a.cols;
  std::vector<float> vmean(static_cast<size_t>(nsec), 0.0f), step(vmean.size());
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) {
      const float x = a.u[i * a.cols + j];
      vmean[size_t(tall ? i : j)] += x * x / float(red);
    }
  double vnorm_sq = 0, scaled = 0;
  for (int64_t s = 0; s < nsec; ++s) {
    vnorm_sq += double(vmean[size_t(s)]) * double(red);
    a.second[s] += (1.0f - a.beta2) * (vmean[size_t(s)] - a.second[s]);
    step[size_t(s)] = 1.0f / std::sqrt(std::max(a.second[s], 1e-10f));
    scaled += double(vmean[size_t(s)]) * double(red) * step[size_t(s)] * step[size_t(s)];
  }
  const float ratio = float(std::sqrt(vnorm_sq) / std::max(std::sqrt(scaled), 1e-10));
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) {
      const int64_t e = i * a.cols + j;
      const float v = a.u[e] * step[size_t(tall ? i : j)] * ratio;
      const float decay = (v * a.p[e] >= 0.0f) ? a.p[e] * a.wd * a.lr : 0.0f;
      a.p[e] = a.p[e] - decay - v * a.lr;
    }
}

}  // namespace deg
