// Scoring fills against labelled records (deg/eval.h), over schema/metrics.
#include <fmt/format.h>

#include "deg/eval.h"
#include "engine/decode.h"
#include "schema/metrics.h"
#include "text/unicode.h"

namespace deg {

struct Scorer::Impl {
  explicit Impl(const OrderedJson& schema) : plan(schema::plan_compile(schema)), acc(plan) {}
  schema::Plan plan;
  schema::MetricsAccumulator acc;  // holds a reference to `plan`
};

Scorer::Scorer(const OrderedJson& schema) : impl_(std::make_unique<Impl>(schema)) {}
Scorer::~Scorer() = default;
Scorer::Scorer(Scorer&&) noexcept = default;
Scorer& Scorer::operator=(Scorer&&) noexcept = default;

int64_t Scorer::add(const Json& expected, const FillResult& result) {
  std::vector<schema::ScoredValue> values;
  for (const FieldReport& f : result.fields) {
    values.push_back({f.path, Json::parse(f.value.dump()), f.confidence});
  }
  return impl_->acc.add(expected, Json::parse(result.value.dump()), values);
}

std::string Scorer::reliability_svg(const std::string& title) const {
  return schema::reliability_svg(impl_->acc.result(), title);
}

OrderedJson Scorer::to_json() const {
  return schema::metrics_to_json(impl_->acc.result());
}

std::string Scorer::to_text() const {
  const schema::Metrics& m = impl_->acc.result();
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "records            {}\n", m.records);
  fmt::format_to(line, "exact match        {:.4f}\n", m.exact_match());
  for (const auto& [kind, s] : m.decisions) {
    fmt::format_to(line, "{:<18} {:.4f}  ({}/{})\n", kind + " accuracy", s.accuracy(), s.correct,
                   s.total);
  }
  fmt::format_to(line, "extract precision  {:.4f}\n", m.extract.precision());
  fmt::format_to(line, "extract recall     {:.4f}\n", m.extract.recall());
  fmt::format_to(line, "extract F1         {:.4f}  (tp {} fp {} fn {})\n", m.extract.f1(),
                 m.extract.true_positives, m.extract.false_positives, m.extract.false_negatives);
  fmt::format_to(line, "calibration ECE    {:.4f}  ({} values, 10 bins)\n", m.ece(),
                 m.calibrated());
  if (!m.decisions_by_field.empty()) {
    fmt::format_to(line, "\n{:<40} {:>9} {:>9}\n", "decision field", "accuracy", "total");
    for (const auto& [field, s] : m.decisions_by_field) {
      fmt::format_to(line, "{:<40} {:>9.4f} {:>9}\n", field, s.accuracy(), s.total);
    }
  }
  if (!m.extract_by_field.empty()) {
    fmt::format_to(line, "\n{:<40} {:>9} {:>9} {:>9}\n", "extract field", "precision", "recall",
                   "F1");
    for (const auto& [field, s] : m.extract_by_field) {
      fmt::format_to(line, "{:<40} {:>9.4f} {:>9.4f} {:>9.4f}\n", field, s.precision(), s.recall(),
                     s.f1());
    }
  }
  for (const auto& [field, c] : m.confusions) {
    fmt::format_to(line, "\nmost confused, {} (gold -> predicted):\n", field);
    for (const auto& [pair, n] : schema::top_confusions(c, 5)) {
      fmt::format_to(line, "  {:>6}  {} -> {}\n", n, pair.first, pair.second);
    }
  }
  return out;
}

std::string spans_marked(std::string_view text_in,
                         const std::vector<std::pair<int64_t, int64_t>>& spans,
                         std::string_view open, std::string_view close, int64_t max_code_points) {
  const std::u32string text = text::utf8_to_u32(text_in);
  const int64_t n = std::min<int64_t>(int64_t(text.size()), max_code_points);
  std::vector<int> opens(size_t(n + 1), 0), closes(size_t(n + 1), 0);
  for (const auto& [s, e] : spans) {
    if (s < 0 || e <= s || s >= n) continue;
    ++opens[size_t(s)];
    ++closes[size_t(std::min(e, n))];
  }
  std::string out;
  for (int64_t i = 0; i <= n; ++i) {
    for (int k = 0; k < closes[size_t(i)]; ++k) out += close;
    for (int k = 0; k < opens[size_t(i)]; ++k) out += open;
    if (i < n) out += engine::utf8_of(std::u32string_view(text).substr(size_t(i), 1));
  }
  if (int64_t(text.size()) > n) out += " ...";
  return out;
}

}  // namespace deg
