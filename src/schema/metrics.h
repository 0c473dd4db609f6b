// Evaluation metrics of `deg eval` (../shared/data/README.md): accuracy of decisions per kind
// (choice, score, bool), precision/recall/F1 of extracted values (a predicted value counts when
// it equals a gold value of the same field, with multiplicity inside arrays), exact match of
// whole records, and expected calibration error of the confidences over 10 bins. Values are
// compared as JSON (numbers by value, strings exactly); x-generate fields are free text and are
// left out of every metric.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/json.h"
#include "schema/plan.h"

namespace deg::schema {

// One value of a fill report: the concrete pointer of a field, its value (null when the field
// was left empty) and the confidence deg gave it.
struct ScoredValue {
  std::string pointer;
  Json value;
  double confidence = 0;
};

struct DecisionScore {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total ? double(correct) / double(total) : 0.0; }
};

struct SpanScore {
  int64_t true_positives = 0;
  int64_t false_positives = 0;
  int64_t false_negatives = 0;
  double precision() const;
  double recall() const;
  double f1() const;
};

// Confidences in [b/10, (b+1)/10) (the last bin includes 1).
struct CalibrationBin {
  int64_t count = 0;
  double confidence_sum = 0;
  int64_t correct = 0;
};

// How often a choice field answered `predicted` where the gold record says `gold` (both as JSON
// text; "null" for no answer), for the wrong answers of single-valued choice fields.
using Confusions = std::map<std::pair<std::string, std::string>, int64_t>;

struct Metrics {
  std::map<std::string, DecisionScore> decisions;           // "choice", "score", "bool"
  std::map<std::string, DecisionScore> decisions_by_field;  // template pointer -> score
  std::map<std::string, Confusions> confusions;             // choice field -> (gold, predicted)
  SpanScore extract;
  std::map<std::string, SpanScore> extract_by_field;  // template pointer -> score
  int64_t records = 0;
  int64_t exact = 0;
  std::array<CalibrationBin, 10> bins{};

  double exact_match() const { return records ? double(exact) / double(records) : 0.0; }
  int64_t calibrated() const;  // scored values that entered the bins
  // sum over bins of (count / N) * |accuracy - mean confidence|; 0 when nothing was scored.
  double ece() const;
};

// Adds up records; `result()` may be called at any time.
class MetricsAccumulator {
 public:
  explicit MetricsAccumulator(const Plan& plan) : plan_(plan) {}

  // `expected`: the gold record; `predicted`: deg's value for the same document; `scored`: the
  // report's per-field values with confidences (may be empty: then no calibration data).
  // Returns the record's errors: wrong or missing decisions plus extract false positives and
  // false negatives (0: every scored field right).
  int64_t add(const Json& expected, const Json& predicted, const std::vector<ScoredValue>& scored);
  const Metrics& result() const { return metrics_; }

 private:
  void add_calibration(const Json& expected, const std::vector<ScoredValue>& scored);

  const Plan& plan_;
  Metrics metrics_;
};

// A field's confusions, most frequent first (ties in (gold, predicted) order), at most `most`.
std::vector<std::pair<std::pair<std::string, std::string>, int64_t>> top_confusions(
    const Confusions& c, size_t most);

// {"records", "exact_match", "decisions": {kind: {correct, total, accuracy}}, "extract":
// {tp, fp, fn, precision, recall, f1}, "fields": {pointer: {...} (choices also "confusions":
// [{gold, predicted, count}])}, "ece", "calibrated", "bins": [...]}
OrderedJson metrics_to_json(const Metrics& metrics);

// The reliability diagram of `m`'s confidence bins as a standalone SVG: per bin a bar of its
// accuracy at the bin's place, its mean confidence marked, the diagonal of perfect calibration,
// each bin's count, and the ECE in the title line after `title`. Empty bins draw no bar.
std::string reliability_svg(const Metrics& m, const std::string& title);

// A record as compared for exact match: nulls, empty arrays, empty objects and x-generate
// values dropped; multi-select arrays sorted. nullopt when nothing is left.
std::optional<Json> normalize_record(const Field& field, const Json& value);

}  // namespace deg::schema
