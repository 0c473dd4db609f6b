// Scoring fills against labelled records ({"document", "expected"}): what `deg eval` reports —
// decision accuracy per kind, extract precision / recall / F1, exact match, calibration error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deg/engine.h"
#include "deg/json.h"

namespace deg {

class Scorer {
 public:
  // Throws deg::Error (with the JSON pointer) for a schema deg cannot fill.
  explicit Scorer(const OrderedJson& schema);
  ~Scorer();
  Scorer(Scorer&&) noexcept;
  Scorer& operator=(Scorer&&) noexcept;

  // Adds one record: the gold `expected` value and deg's result for its document (a failed
  // result counts as empty). Returns the record's errors (0: every scored field right).
  int64_t add(const Json& expected, const FillResult& result);

  // {"records", "exact_match", "decisions", "extract", "fields", "ece", "calibrated", "bins"}
  OrderedJson to_json() const;
  // The figures as a table, then each field's, then choice fields' most frequent confusions.
  std::string to_text() const;
  // The reliability diagram of the confidences (10 bins) as a standalone SVG, `title` on top.
  std::string reliability_svg(const std::string& title) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// `text` with each span ([start, end) code points) between `open` and `close`, cut after
// `max_code_points` (then " ..." follows).
std::string spans_marked(std::string_view text,
                         const std::vector<std::pair<int64_t, int64_t>>& spans,
                         std::string_view open, std::string_view close, int64_t max_code_points);

}  // namespace deg
