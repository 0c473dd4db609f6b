// Calibration of the heads (the seed's per-kind temperatures): for each head kind, the
// temperature T that minimises the negative log-likelihood of the expected answers under
// softmax(logits / T) on one set of queries, and the expected calibration error (10 equal-width
// confidence bins) of the engine's decisions before and after on another.
//
// A decision and its confidence are the engine's (engine/decode.h): the most probable option,
// count or outcome; for an extract the best span (start <= end, at most 64 tokens) against the
// null outcome, with confidence p(start) p(end).
#pragma once

#include <cstdint>
#include <vector>

#include "model/heads.h"

namespace deg::train {

// The logits of one query of a head kind and its expected answer. Choice, score, noul, count:
// one distribution (`a`, masked entries -inf) and its target. Extract: start logits `a` and end
// logits `b` over T + 1 (index T = null), targets (start, end), both T for the null outcome.
struct CalibrationItem {
  std::vector<float> a, b;
  int64_t target = 0, target_end = 0;
};

// NLL of the items at temperature t (extract: start and end terms).
double calibration_nll(HeadKind kind, const std::vector<CalibrationItem>& items, double t);
// The temperature in [0.05, 20] minimising calibration_nll (golden-section search over log t;
// the NLL is convex in 1 / t).
double fit_temperature(HeadKind kind, const std::vector<CalibrationItem>& items);

// The engine's decision on one item at temperature t: its confidence and whether it is right.
struct Decision {
  double confidence = 0;
  bool correct = false;
};
Decision decide(HeadKind kind, const CalibrationItem& item, double t);
// Expected calibration error over 10 equal-width confidence bins.
double expected_calibration_error(const std::vector<Decision>& decisions);

}  // namespace deg::train
