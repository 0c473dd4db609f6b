// Metric arithmetic (metrics.h). Values of one field are gathered per record by walking the plan
// and the JSON together, so a field inside array items contributes one value per item.
#include "schema/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deg::schema {

namespace {

using Gathered = std::map<const Field*, std::vector<Json>>;

const char* decision_name(FieldKind kind) {
  switch (kind) {
    case FieldKind::choice: return "choice";
    case FieldKind::score: return "score";
    case FieldKind::boolean: return "bool";
    default: return nullptr;
  }
}

// Every leaf's values in `value` (absent leaves as null; a multi-select array as one boolean per
// option).
void gather(const Field& field, const Json* value, Gathered& out) {
  switch (field.kind) {
    case FieldKind::object:
      for (const Field& child : field.children) {
        const Json* v = nullptr;
        if (value && value->is_object()) {
          auto it = value->find(child.key());
          if (it != value->end()) v = &*it;
        }
        gather(child, v, out);
      }
      break;
    case FieldKind::anchor:
    case FieldKind::count:
      if (value && value->is_array()) {
        for (const Json& item : *value) gather(field.children.front(), &item, out);
      }
      break;
    case FieldKind::multi_select:
      for (const Field& pick : field.children) {
        const bool on = value && value->is_array() &&
                        std::find(value->begin(), value->end(), *pick.selects) != value->end();
        out[&pick].push_back(Json(on));
      }
      break;
    default: out[&field].push_back(value ? *value : Json(nullptr)); break;
  }
}

// Size of the multiset intersection of `a` and `b`.
int64_t matched(const std::vector<Json>& a, std::vector<Json> b) {
  int64_t n = 0;
  for (const Json& x : a) {
    auto it = std::find(b.begin(), b.end(), x);
    if (it != b.end()) {
      ++n;
      b.erase(it);
    }
  }
  return n;
}

std::vector<Json> without_nulls(const std::vector<Json>& values) {
  std::vector<Json> out;
  for (const Json& v : values) {
    if (!v.is_null()) out.push_back(v);
  }
  return out;
}

double ratio(int64_t a, int64_t b) {
  return b ? double(a) / double(b) : 0.0;
}

}  // namespace

double SpanScore::precision() const {
  return ratio(true_positives, true_positives + false_positives);
}
double SpanScore::recall() const {
  return ratio(true_positives, true_positives + false_negatives);
}
double SpanScore::f1() const {
  const double p = precision(), r = recall();
  return p + r > 0 ? 2 * p * r / (p + r) : 0.0;
}

int64_t Metrics::calibrated() const {
  int64_t n = 0;
  for (const CalibrationBin& b : bins) n += b.count;
  return n;
}

std::string reliability_svg(const Metrics& m, const std::string& title) {
  // A 400 x 400 plot area at (60, 50), confidence on x, accuracy on y.
  const double x0 = 60, y0 = 450, side = 400;
  auto X = [&](double v) { return x0 + v * side; };
  auto Y = [&](double v) { return y0 - v * side; };
  std::string escaped;
  for (char c : title) {
    if (c == '<')
      escaped += "&lt;";
    else if (c == '>')
      escaped += "&gt;";
    else if (c == '&')
      escaped += "&amp;";
    else
      escaped += c;
  }
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"500\" height=\"520\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"500\" height=\"520\" fill=\"white\"/>\n"
      "<text x=\"250\" y=\"25\" text-anchor=\"middle\" font-size=\"14\">{} — ECE {:.4f} "
      "({} values)</text>\n",
      escaped, m.ece(), m.calibrated());
  for (int i = 0; i <= 10; ++i) {
    const double v = i / 10.0;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>"
        "<line x1=\"{3:.1f}\" y1=\"{4:.1f}\" x2=\"{5:.1f}\" y2=\"{4:.1f}\" stroke=\"#eee\"/>\n",
        X(v), Y(0), Y(1), X(0), Y(v), X(1));
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.1f}</text>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.1f}</text>\n",
        X(v), y0 + 16, v, x0 - 6, Y(v) + 4, v);
  }
  for (size_t b = 0; b < m.bins.size(); ++b) {
    const CalibrationBin& bin = m.bins[b];
    if (bin.count == 0) continue;
    const double acc = double(bin.correct) / double(bin.count);
    const double conf = bin.confidence_sum / double(bin.count);
    const double lo = double(b) / 10.0;
    svg += fmt::format(
        "<rect class=\"bin\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
        "fill=\"#4878d0\" stroke=\"white\"><title>bin {}: {} values, accuracy {:.4f}, "
        "confidence {:.4f}</title></rect>\n",
        X(lo), Y(acc), side / 10.0, acc * side, b, bin.count, acc, conf);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#d65f5f\" "
        "stroke-width=\"2\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
        "font-size=\"10\">{}</text>\n",
        X(lo), Y(conf), X(lo + 0.1), Y(conf), X(lo + 0.05), Y(acc) - 4, bin.count);
  }
  svg += fmt::format(
      "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\" "
      "stroke-dasharray=\"4 3\"/>\n"
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"black\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">confidence (bars: accuracy, "
      "red: mean confidence, numbers: values)</text>\n"
      "<text x=\"15\" y=\"{:.1f}\" transform=\"rotate(-90 15 {:.1f})\" "
      "text-anchor=\"middle\">accuracy</text>\n</svg>\n",
      X(0), Y(0), X(1), Y(1), x0, Y(1), side, side, X(0.5), y0 + 36, Y(0.5), Y(0.5));
  return svg;
}

double Metrics::ece() const {
  const int64_t n = calibrated();
  if (n == 0) return 0.0;
  double sum = 0;
  for (const CalibrationBin& b : bins) {
    if (b.count == 0) continue;
    const double accuracy = double(b.correct) / double(b.count);
    const double confidence = b.confidence_sum / double(b.count);
    sum += double(b.count) / double(n) * std::abs(accuracy - confidence);
  }
  return sum;
}

std::optional<Json> normalize_record(const Field& field, const Json& value) {
  if (value.is_null() || field.kind == FieldKind::generate) return std::nullopt;
  if (field.kind == FieldKind::object && value.is_object()) {
    Json out = Json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      auto child = std::find_if(field.children.begin(), field.children.end(),
                                [&](const Field& c) { return c.key() == it.key(); });
      std::optional<Json> v = child == field.children.end()
                                  ? (it->is_null() ? std::nullopt : std::optional<Json>(*it))
                                  : normalize_record(*child, *it);
      if (v) out[it.key()] = std::move(*v);
    }
    if (out.empty()) return std::nullopt;
    return out;
  }
  if ((field.kind == FieldKind::anchor || field.kind == FieldKind::count) && value.is_array()) {
    Json out = Json::array();
    for (const Json& item : value) {
      out.push_back(normalize_record(field.children.front(), item).value_or(Json(nullptr)));
    }
    if (out.empty()) return std::nullopt;
    return out;
  }
  if (field.kind == FieldKind::multi_select && value.is_array()) {
    if (value.empty()) return std::nullopt;
    std::vector<Json> sorted(value.begin(), value.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const Json& a, const Json& b) { return a.dump() < b.dump(); });
    return Json(sorted);
  }
  return value;
}

int64_t MetricsAccumulator::add(const Json& expected, const Json& predicted,
                                const std::vector<ScoredValue>& scored) {
  int64_t errors = 0;
  Gathered gold, guess;
  gather(plan_.root, &expected, gold);
  gather(plan_.root, &predicted, guess);
  plan_visit(plan_.root, [&](const Field& field) {
    if (!field.is_leaf() || field.kind == FieldKind::generate) return;
    const std::vector<Json>& g = gold[&field];
    const std::vector<Json>& p = guess[&field];
    if (const char* kind = decision_name(field.kind)) {
      const int64_t correct = matched(p, g);
      const auto total = int64_t(std::max(g.size(), p.size()));
      errors += total - correct;
      for (DecisionScore* s :
           {&metrics_.decisions[kind], &metrics_.decisions_by_field[field.pointer]}) {
        s->correct += correct;
        s->total += total;
      }
      // A single-valued choice answered wrong (or not at all): what it was taken for.
      if (field.kind == FieldKind::choice && g.size() == 1 && p.size() <= 1 && correct == 0) {
        const std::string guess = p.empty() ? "null" : p[0].dump();
        ++metrics_.confusions[field.pointer][{g[0].dump(), guess}];
      }
    } else {
      const std::vector<Json> gv = without_nulls(g), pv = without_nulls(p);
      const int64_t tp = matched(pv, gv);
      errors += int64_t(pv.size()) + int64_t(gv.size()) - 2 * tp;
      for (SpanScore* s : {&metrics_.extract, &metrics_.extract_by_field[field.pointer]}) {
        s->true_positives += tp;
        s->false_positives += int64_t(pv.size()) - tp;
        s->false_negatives += int64_t(gv.size()) - tp;
      }
    }
  });
  ++metrics_.records;
  const std::optional<Json> a = normalize_record(plan_.root, expected);
  const std::optional<Json> b = normalize_record(plan_.root, predicted);
  if (a == b) ++metrics_.exact;
  add_calibration(expected, scored);
  return errors;
}

void MetricsAccumulator::add_calibration(const Json& expected,
                                         const std::vector<ScoredValue>& scored) {
  // A non-null value is correct when it claims an equal, unclaimed gold value of its field (most
  // confident first); a null is correct when the gold record has nothing at its pointer.
  Gathered gold;
  gather(plan_.root, &expected, gold);
  std::vector<const ScoredValue*> order;
  for (const ScoredValue& s : scored) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const ScoredValue* a, const ScoredValue* b) {
    return a->confidence > b->confidence;
  });
  for (const ScoredValue* s : order) {
    const Field* field = plan_find(plan_, s->pointer);
    if (field == nullptr || !field->is_leaf() || field->kind == FieldKind::generate) continue;
    bool correct = false;
    if (s->value.is_null()) {
      const Json* at = nullptr;
      try {
        at = &expected.at(Json::json_pointer(s->pointer));
      } catch (const std::exception&) {
      }
      correct = at == nullptr || at->is_null();
    } else {
      std::vector<Json>& pool = gold[field];
      auto it = std::find(pool.begin(), pool.end(), s->value);
      correct = it != pool.end();
      if (correct) pool.erase(it);
    }
    const double c = std::clamp(s->confidence, 0.0, 1.0);
    CalibrationBin& bin = metrics_.bins[size_t(std::min(int(c * 10), 9))];
    ++bin.count;
    bin.confidence_sum += c;
    bin.correct += correct ? 1 : 0;
  }
}

std::vector<std::pair<std::pair<std::string, std::string>, int64_t>> top_confusions(
    const Confusions& c, size_t most) {
  std::vector<std::pair<std::pair<std::string, std::string>, int64_t>> out(c.begin(), c.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out.size() > most) out.resize(most);
  return out;
}

OrderedJson metrics_to_json(const Metrics& m) {
  const auto decision = [](const DecisionScore& s) {
    return OrderedJson{{"correct", s.correct}, {"total", s.total}, {"accuracy", s.accuracy()}};
  };
  const auto span = [](const SpanScore& s) {
    return OrderedJson{{"tp", s.true_positives},  {"fp", s.false_positives},
                       {"fn", s.false_negatives}, {"precision", s.precision()},
                       {"recall", s.recall()},    {"f1", s.f1()}};
  };
  OrderedJson out;
  out["records"] = m.records;
  out["exact_match"] = m.exact_match();
  out["decisions"] = OrderedJson::object();
  for (const auto& [kind, s] : m.decisions) out["decisions"][kind] = decision(s);
  out["extract"] = span(m.extract);
  out["fields"] = OrderedJson::object();
  for (const auto& [ptr, s] : m.decisions_by_field) out["fields"][ptr] = decision(s);
  for (const auto& [ptr, c] : m.confusions) {
    OrderedJson list = OrderedJson::array();
    for (const auto& [pair, n] : top_confusions(c, c.size()))
      list.push_back({{"gold", pair.first}, {"predicted", pair.second}, {"count", n}});
    out["fields"][ptr]["confusions"] = list;
  }
  for (const auto& [ptr, s] : m.extract_by_field) out["fields"][ptr] = span(s);
  out["ece"] = m.ece();
  out["calibrated"] = m.calibrated();
  out["bins"] = OrderedJson::array();
  for (const CalibrationBin& b : m.bins) {
    out["bins"].push_back({{"count", b.count},
                           {"confidence", b.count ? b.confidence_sum / double(b.count) : 0.0},
                           {"accuracy", b.count ? double(b.correct) / double(b.count) : 0.0}});
  }
  return out;
}

}  // namespace deg::schema
