#include "engine/assemble.h"

namespace deg::engine {

using schema::Field;
using schema::FieldKind;

const Answer* Answers::find(const std::string& pointer, const std::string& option) const {
  auto it = by_pointer_.find({pointer, option});
  return it == by_pointer_.end() ? nullptr : &it->second;
}

std::string option_key(const schema::Field& field) {
  return field.selects ? field.selects->dump() : std::string();
}

int64_t Answers::items(const std::string& pointer) const {
  auto it = items_.find(pointer);
  return it == items_.end() ? 0 : it->second;
}

namespace {

bool is_array(const Field& f) {
  return f.kind == FieldKind::anchor || f.kind == FieldKind::count ||
         f.kind == FieldKind::multi_select;
}

// Walks the answered tree: the value of `field` at `indices`, or nullopt when it is left out.
class Builder {
 public:
  Builder(const Answers& answers, bool keep_nulls, double min_confidence, FillResult* result)
      : answers_(answers),
        keep_nulls_(keep_nulls),
        min_confidence_(min_confidence),
        report_(&result->fields),
        missing_(&result->missing) {}

  std::optional<OrderedJson> build(const Field& f, std::vector<int64_t>& indices) {
    const std::string ptr = schema::field_pointer(f, indices);
    switch (f.kind) {
      case FieldKind::object: return build_object(f, indices);
      case FieldKind::anchor:
      case FieldKind::count: {
        const Answer* a = answers_.find(ptr);
        if (a) add_report(ptr, *a, /*leaf=*/false);  // an array's count is never withheld
        OrderedJson arr = OrderedJson::array();
        for (int64_t k = 0; k < answers_.items(ptr); ++k) {
          indices.push_back(k);
          std::optional<OrderedJson> item = build(f.children.at(0), indices);
          indices.pop_back();
          if (item) arr.push_back(std::move(*item));
        }
        return finish_array(f, std::move(arr));
      }
      case FieldKind::multi_select: {
        OrderedJson arr = OrderedJson::array();
        for (const Field& child : f.children) {
          const std::string cptr = schema::field_pointer(child, indices);
          const Answer* a = answers_.find(cptr, option_key(child));
          if (!a) continue;
          const bool keep = add_report(cptr, *a);
          if (keep && a->value == true && child.selects)
            arr.push_back(OrderedJson::parse(child.selects->dump()));
        }
        return finish_array(f, std::move(arr));
      }
      default: {
        const Answer* a = answers_.find(ptr);
        if (!a) return std::nullopt;
        if (!add_report(ptr, *a) || a->value.is_null()) {
          if (keep_nulls_ || (f.required && f.nullable)) return OrderedJson(nullptr);
          return std::nullopt;
        }
        return OrderedJson(a->value);
      }
    }
  }

 private:
  std::optional<OrderedJson> build_object(const Field& f, std::vector<int64_t>& indices) {
    OrderedJson obj = OrderedJson::object();
    const size_t mark = missing_->size();  // required values missing below this object
    for (const Field& child : f.children) {
      std::optional<OrderedJson> v = build(child, indices);
      if (v) {
        obj[child.key()] = std::move(*v);
      } else {
        if (child.required && !child.nullable)
          missing_->push_back(schema::field_pointer(child, indices));
        if (keep_nulls_ && !is_array(child)) obj[child.key()] = nullptr;
      }
    }
    const bool root = f.path.empty();
    // An optional object missing a required value (its own or a required descendant's) is left
    // out whole, so the output stays valid; in a kept one they stay reported.
    if (!root && !f.required && missing_->size() > mark) {
      missing_->resize(mark);
      return std::nullopt;
    }
    return obj;
  }

  std::optional<OrderedJson> finish_array(const Field& f, OrderedJson arr) {
    if (f.unique_items) {
      OrderedJson unique = OrderedJson::array();
      for (auto& v : arr) {
        if (std::find(unique.begin(), unique.end(), v) == unique.end()) unique.push_back(v);
      }
      arr = std::move(unique);
    }
    if (arr.empty() && !f.required && !keep_nulls_) return std::nullopt;
    return arr;
  }

  // Reports an answer; false when a leaf's is withheld (a non-null value below min_confidence).
  bool add_report(const std::string& ptr, const Answer& a, bool leaf = true) {
    const bool withheld = leaf && !a.value.is_null() && a.confidence < min_confidence_;
    report_->push_back({ptr, a.kind, OrderedJson(a.value), a.confidence, a.span, withheld});
    return !withheld;
  }

  const Answers& answers_;
  bool keep_nulls_;
  double min_confidence_;
  std::vector<FieldReport>* report_;
  std::vector<std::string>* missing_;
};

void collect_known(const Field& f, std::vector<int64_t>& indices, const Answers& answers,
                   std::vector<std::pair<std::string, Json>>& out) {
  const std::string ptr = schema::field_pointer(f, indices);
  if (f.kind == FieldKind::anchor || f.kind == FieldKind::count) {
    for (int64_t k = 0; k < answers.items(ptr); ++k) {
      indices.push_back(k);
      collect_known(f.children.at(0), indices, answers, out);
      indices.pop_back();
    }
    return;
  }
  if (f.kind == FieldKind::object) {
    for (const Field& child : f.children) collect_known(child, indices, answers, out);
    return;
  }
  if (f.kind == FieldKind::multi_select) {  // the chosen options, as the output will hold them
    Json chosen = Json::array();
    bool answered = false;
    for (const Field& child : f.children) {
      const Answer* a = answers.find(ptr, option_key(child));
      answered = answered || a;
      if (a && a->value == true && child.selects) chosen.push_back(*child.selects);
    }
    if (answered) out.emplace_back(ptr, std::move(chosen));
    return;
  }
  if (f.kind == FieldKind::generate) return;
  const Answer* a = answers.find(ptr);
  if (a && !a->value.is_null()) out.emplace_back(ptr, a->value);
}

}  // namespace

std::vector<std::pair<std::string, Json>> Answers::known(const schema::Plan& plan) const {
  std::vector<std::pair<std::string, Json>> out;
  std::vector<int64_t> indices;
  collect_known(plan.root, indices, *this, out);
  return out;
}

FillResult assemble(const schema::Plan& plan, const Answers& answers, bool keep_nulls,
                    double min_confidence) {
  FillResult r;
  std::vector<int64_t> indices;
  Builder b(answers, keep_nulls, min_confidence, &r);
  std::optional<OrderedJson> v = b.build(plan.root, indices);
  r.value = v ? std::move(*v) : OrderedJson::object();
  return r;
}

}  // namespace deg::engine
