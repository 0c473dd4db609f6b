// Head losses and their backward (see head_loss.h).
#include "train/head_loss.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "train/ops.h"

namespace deg::train {
namespace {

const float kScale = 1.0f / std::sqrt(float(kHeadDim));

float* grad_of(Tensor& t) {
  return t.mutable_data<float>();
}

// y [n, out] = x [n, in] W^T + b.
Buf forward(const Linear& l, const float* x, int64_t n) {
  Buf y = zeros(n * l.out());
  l.apply(x, n, y.data());
  return y;
}

// The backward of y = x W^T + b: adds dW += dy^T x, db += sum dy and, when dx, dx += dy W.
void backward(const Linear& l, Linear& g, const float* x, int64_t n, const float* dy, float* dx) {
  const int64_t in = l.in(), out = l.out();
  matmul_tn(dy, x, grad_of(g.weight), n, out, in, true);
  float* db = grad_of(g.bias);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < out; ++j) db[j] += dy[i * out + j];
  if (dx) matmul_nn(dy, l.weight.data<float>(), dx, n, out, in, true);
}

// Cross-entropy of `target` over the finite logits; writes weight * d loss / d logits (0 where
// masked).
double cross_entropy(const float* logits, int64_t n, int64_t target, float* dlogits, float weight) {
  DEG_CHECK(target >= 0 && target < n && std::isfinite(logits[target]),
            "a training target (index {} of {}) that the head masks", target, n);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(logits[i])) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(logits[i])) sum += std::exp(double(logits[i]) - mx);
  for (int64_t i = 0; i < n; ++i) {
    const double p = std::isfinite(logits[i]) ? std::exp(double(logits[i]) - mx) / sum : 0.0;
    dlogits[i] = weight * float(p - (i == target ? 1.0 : 0.0));
  }
  return mx + std::log(sum) - double(logits[target]);
}

// log(1 + e^x) without overflow.
double stable_softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

}  // namespace

double pointer_loss(const PointerHeadWeights& head, PointerHeadWeights& grad, const float* answer,
                    const float* options, int64_t O, int64_t target, float* da, float* doptions,
                    float weight) {
  const std::vector<float> logits = pointer_logits(head, answer, options, O);
  Buf dl = zeros(O);
  const double loss = cross_entropy(logits.data(), O, target, dl.data(), weight);
  // logit_i = q . k_i / sqrt(d) + prior(o_i)
  const Buf q = forward(head.query, answer, 1);
  const Buf k = forward(head.key, options, O);
  Buf dq = zeros(kHeadDim), dk = zeros(O * kHeadDim);
  for (int64_t i = 0; i < O; ++i) {
    axpy(dl[size_t(i)] * kScale, &k[size_t(i * kHeadDim)], dq.data(), kHeadDim);
    axpy(dl[size_t(i)] * kScale, q.data(), &dk[size_t(i * kHeadDim)], kHeadDim);
  }
  backward(head.query, grad.query, answer, 1, dq.data(), da);
  backward(head.key, grad.key, options, O, dk.data(), doptions);
  backward(head.prior, grad.prior, options, O, dl.data(), doptions);
  return loss;
}

double noul_loss(const Heads& heads, Heads& grad, const float* answer, bool target, float* da,
                 float weight) {
  const float two[2] = {noul_logits(heads, answer, 1)[0], 0.0f};
  float d2[2];
  const double loss = cross_entropy(two, 2, target ? 0 : 1, d2, weight);
  backward(heads.noul, grad.noul, answer, 1, &d2[0], da);
  return loss;
}

double count_loss(const Heads& heads, Heads& grad, const float* answer, int64_t lo, int64_t hi,
                  int64_t target, float* da, float weight) {
  std::vector<float> logits = count_logits(heads, answer, 1);
  for (int64_t i = 0; i <= kMaxCount; ++i)
    if (i < lo || i > hi) logits[size_t(i)] = -std::numeric_limits<float>::infinity();
  Buf dl = zeros(kMaxCount + 1);
  const double loss = cross_entropy(logits.data(), kMaxCount + 1, target, dl.data(), weight);
  backward(heads.count, grad.count, answer, 1, dl.data(), da);
  return loss;
}

double span_loss(const Heads& heads, Heads& grad, const float* answers, int64_t n,
                 const std::vector<SpanQuery>& queries, const std::vector<SpanTarget>& targets,
                 const float* context, int64_t T, float* da, float* dcontext, float weight) {
  DEG_CHECK(int64_t(targets.size()) == n, "{} span targets for {} queries", targets.size(), n);
  const SpanLogits lg = span_logits(heads, answers, n, queries, context, T);
  const int64_t W = T + 1, nb = int64_t(kRelEdges.size()) + 1;
  const SpanHeadWeights& sp = heads.span;
  double loss = 0;
  Buf d_start = zeros(n * W), d_end = zeros(n * W);
  float* dbias = grad_of(grad.span_bias);
  for (int64_t i = 0; i < n; ++i) {
    const SpanTarget& t = targets[size_t(i)];
    const bool null = t.start < 0;
    DEG_CHECK(null || (t.start <= t.end && t.end < T), "span target [{}, {}] outside {} tokens",
              t.start, t.end, T);
    float* ds = &d_start[size_t(i * W)];
    float* de = &d_end[size_t(i * W)];
    loss += cross_entropy(&lg.start[size_t(i * W)], W, null ? T : t.start, ds, weight);
    loss += cross_entropy(&lg.end[size_t(i * W)], W, null ? T : t.end, de, weight);
    const SpanQuery& q = queries[size_t(i)];
    if (q.anchor < 0) continue;
    const int64_t hi = q.region_end < 0 ? T : std::min(q.region_end, T);
    for (int64_t c = 0; c < T; ++c) {
      const int64_t inside = c >= q.anchor && c < hi;
      const int b = rel_bucket(c - q.anchor);
      dbias[(0 * 2 + inside) * nb + b] += ds[c];
      dbias[(1 * 2 + inside) * nb + b] += de[c];
    }
  }
  // Null logits: ns(a), ne(a).
  for (auto [lin, g, d] : {std::tuple{&sp.null_start, &grad.span.null_start, &d_start},
                           std::tuple{&sp.null_end, &grad.span.null_end, &d_end}}) {
    Buf dnull = zeros(n);
    for (int64_t i = 0; i < n; ++i) dnull[size_t(i)] = (*d)[size_t(i * W + T)];
    backward(*lin, *g, answers, n, dnull.data(), da);
  }
  // Token logits: q(a) . k(c_t) / sqrt(d) for start and end.
  for (auto [qlin, klin, gq, gk, d] :
       {std::tuple{&sp.q_start, &sp.k_start, &grad.span.q_start, &grad.span.k_start, &d_start},
        std::tuple{&sp.q_end, &sp.k_end, &grad.span.q_end, &grad.span.k_end, &d_end}}) {
    const Buf q = forward(*qlin, answers, n);
    const Buf k = forward(*klin, context, T);
    Buf dtok = zeros(n * T);  // [n, T] scaled token-logit gradients
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < T; ++c) dtok[size_t(i * T + c)] = (*d)[size_t(i * W + c)] * kScale;
    Buf dq = zeros(n * kHeadDim), dk = zeros(T * kHeadDim);
    matmul_nn(dtok.data(), k.data(), dq.data(), n, T, kHeadDim);
    matmul_tn(dtok.data(), q.data(), dk.data(), n, T, kHeadDim);
    backward(*qlin, *gq, answers, n, dq.data(), da);
    backward(*klin, *gk, context, T, dk.data(), dcontext);
  }
  return loss;
}

double anchor_loss(const Heads& heads, Heads& grad, const float* answers, int64_t n,
                   const std::vector<Region>& regions,
                   const std::vector<std::vector<int64_t>>& starts, const float* context, int64_t T,
                   float* da, float* dcontext, float weight, float pos_weight) {
  DEG_CHECK(int64_t(starts.size()) == n, "{} anchor targets for {} queries", starts.size(), n);
  const std::vector<float> lg = anchor_logits(heads, answers, n, regions, context, T);
  const PointerHeadWeights& an = heads.anchor;
  double loss = 0;
  Buf dl = zeros(n * T);  // [n, T], 0 outside each region
  for (int64_t i = 0; i < n; ++i) {
    std::vector<bool> is_start(size_t(T), false);
    for (int64_t s : starts[size_t(i)]) {
      DEG_CHECK(s >= 0 && s < T && std::isfinite(lg[size_t(i * T + s)]),
                "an anchor target (token {}) outside the query's region", s);
      is_start[size_t(s)] = true;
    }
    for (int64_t c = 0; c < T; ++c) {
      const double l = lg[size_t(i * T + c)];
      if (!std::isfinite(l)) continue;
      const bool pos = is_start[size_t(c)];
      loss += pos ? pos_weight * stable_softplus(-l) : stable_softplus(l);
      const float d = float(1.0 / (1.0 + std::exp(-l)) - (pos ? 1 : 0));
      dl[size_t(i * T + c)] = weight * (pos ? pos_weight * d : d);
    }
  }
  // logit = q(a) . k(c_t) / sqrt(d) + prior(c_t)
  const Buf q = forward(an.query, answers, n);
  const Buf k = forward(an.key, context, T);
  Buf dtok = dl;
  for (float& v : dtok) v *= kScale;
  Buf dq = zeros(n * kHeadDim), dk = zeros(T * kHeadDim);
  matmul_nn(dtok.data(), k.data(), dq.data(), n, T, kHeadDim);
  matmul_tn(dtok.data(), q.data(), dk.data(), n, T, kHeadDim);
  backward(an.query, grad.anchor.query, answers, n, dq.data(), da);
  backward(an.key, grad.anchor.key, context, T, dk.data(), dcontext);
  Buf dprior = zeros(T);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < T; ++c) dprior[size_t(c)] += dl[size_t(i * T + c)];
  backward(an.prior, grad.anchor.prior, context, T, dprior.data(), dcontext);
  return loss;
}

}  // namespace deg::train
