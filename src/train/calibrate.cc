// Temperature fitting and calibration error (see calibrate.h).
#include "train/calibrate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/decode.h"

namespace deg::train {
namespace {

// -log softmax(logits / t)[target].
double nll(const std::vector<float>& logits, int64_t target, double t) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : logits)
    if (std::isfinite(v)) mx = std::max(mx, double(v) / t);
  double sum = 0;
  for (float v : logits)
    if (std::isfinite(v)) sum += std::exp(double(v) / t - mx);
  return mx + std::log(sum) - double(logits[size_t(target)]) / t;
}

constexpr int64_t kMaxSpanTokens = 64;  // engine::SpanSearch's default

}  // namespace

double calibration_nll(HeadKind kind, const std::vector<CalibrationItem>& items, double t) {
  double s = 0;
  for (const CalibrationItem& it : items) {
    s += nll(it.a, it.target, t);
    if (kind == HeadKind::extract) s += nll(it.b, it.target_end, t);
  }
  return s;
}

double fit_temperature(HeadKind kind, const std::vector<CalibrationItem>& items) {
  if (items.empty()) return 1.0;
  double lo = std::log(0.05), hi = std::log(20.0);
  const double r = (std::sqrt(5.0) - 1) / 2;
  double x1 = hi - r * (hi - lo), x2 = lo + r * (hi - lo);
  double f1 = calibration_nll(kind, items, std::exp(x1));
  double f2 = calibration_nll(kind, items, std::exp(x2));
  for (int it = 0; it < 60; ++it) {
    if (f1 <= f2) {
      hi = x2, x2 = x1, f2 = f1;
      x1 = hi - r * (hi - lo);
      f1 = calibration_nll(kind, items, std::exp(x1));
    } else {
      lo = x1, x1 = x2, f1 = f2;
      x2 = lo + r * (hi - lo);
      f2 = calibration_nll(kind, items, std::exp(x2));
    }
  }
  return std::exp((lo + hi) / 2);
}

Decision decide(HeadKind kind, const CalibrationItem& it, double t) {
  if (kind != HeadKind::extract) {
    const engine::Pick p = engine::pick_best(it.a.data(), int64_t(it.a.size()), t);
    return {p.probability, p.index == it.target};
  }
  const int64_t T = int64_t(it.a.size()) - 1;
  const std::vector<double> ps = engine::softmax(it.a.data(), T + 1, t);
  const std::vector<double> pe = engine::softmax(it.b.data(), T + 1, t);
  int64_t bs = T, be = T;
  float best = it.a[size_t(T)] + it.b[size_t(T)];
  for (int64_t s = 0; s < T; ++s)
    for (int64_t e = s; e < std::min(T, s + kMaxSpanTokens); ++e)
      if (it.a[size_t(s)] + it.b[size_t(e)] > best)
        best = it.a[size_t(s)] + it.b[size_t(e)], bs = s, be = e;
  return {ps[size_t(bs)] * pe[size_t(be)], bs == it.target && be == it.target_end};
}

double expected_calibration_error(const std::vector<Decision>& ds) {
  if (ds.empty()) return 0;
  double conf[10] = {}, acc[10] = {};
  int64_t n[10] = {};
  for (const Decision& d : ds) {
    const int b = std::min(9, int(d.confidence * 10));
    conf[b] += d.confidence;
    acc[b] += d.correct ? 1 : 0;
    ++n[b];
  }
  double e = 0;
  for (int b = 0; b < 10; ++b)
    if (n[b]) e += std::fabs(acc[b] - conf[b]) / double(ds.size());
  return e;
}

}  // namespace deg::train
