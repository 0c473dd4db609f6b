// Answers -> the filled JSON and the per-field report, in schema order. An optional field whose
// answer is null is left out (kept as null with keep_nulls); an optional object whose required
// field came out null is left out whole; empty optional arrays are left out.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deg/engine.h"
#include "io/json.h"
#include "schema/plan.h"

namespace deg::engine {

struct Answer {
  std::string kind;  // report kind: choice, score, bool, extract, generate, anchor, count
  Json value;        // null: the null outcome
  double confidence = 0;
  std::optional<std::pair<int64_t, int64_t>> span;
};

// A document's answers by concrete JSON pointer, and its arrays' item counts. The options of a
// multi-select share the array's pointer: each option's decision is kept under the pointer and
// the option (option_key), so they never overwrite each other.
class Answers {
 public:
  void set(const std::string& pointer, Answer answer, const std::string& option = {}) {
    by_pointer_[{pointer, option}] = std::move(answer);
  }
  void set_items(const std::string& pointer, int64_t n) { items_[pointer] = n; }
  const Answer* find(const std::string& pointer, const std::string& option = {}) const;
  int64_t items(const std::string& pointer) const;  // 0 when unknown

  // Every decided or extracted non-null value in schema order (the KNOWN VALUES block); a
  // multi-select reads as the array of its chosen options.
  std::vector<std::pair<std::string, Json>> known(const schema::Plan& plan) const;

 private:
  std::map<std::pair<std::string, std::string>, Answer> by_pointer_;
  std::map<std::string, int64_t> items_;
};

// The option a multi-select's boolean child decides, as JSON text ("" for any other field).
std::string option_key(const schema::Field& field);

// min_confidence: FillOptions::min_confidence (leaf answers below it read as null).
FillResult assemble(const schema::Plan& plan, const Answers& answers, bool keep_nulls,
                    double min_confidence = 0);

}  // namespace deg::engine
