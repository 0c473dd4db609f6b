// Plan display (plan_json.h). The example place gives array items the index 0 and, inside
// anchored items, the quote "<item text>"; count items read "ITEM 1 of n" with n = 1.
#include "schema/plan_json.h"

#include <fmt/format.h>

#include "schema/render.h"

namespace deg::schema {

namespace {

struct Shown {
  const Field* field;
  QueryPlace place;
};

void collect(const Field& field, QueryPlace place, std::vector<Shown>& out) {
  out.push_back({&field, place});
  if (field.kind == FieldKind::anchor || field.kind == FieldKind::count) {
    QueryPlace inner = place;
    inner.indices.push_back(0);
    inner.item = field.kind == FieldKind::anchor
                     ? ItemLine{.mode = ItemLine::Mode::anchor, .text = "<item text>"}
                     : ItemLine{.mode = ItemLine::Mode::index, .index = 0, .count = 1};
    collect(field.children.front(), inner, out);
    return;
  }
  for (const Field& child : field.children) collect(child, place, out);
}

std::vector<Shown> shown_fields(const Plan& plan) {
  std::vector<Shown> out;
  collect(plan.root, {}, out);
  return out;
}

std::string query_of(const Field& f, const QueryPlace& place) {
  if (f.kind == FieldKind::object || f.kind == FieldKind::multi_select) return "";
  if (f.kind == FieldKind::generate) return generate_header(f, place);
  return query_text(render_query(f, place));
}

std::string flags_of(const Field& f) {
  std::string out = f.required ? "required" : "optional";
  if (f.nullable) out += ", nullable";
  if (f.kind == FieldKind::extract && f.null_masked) out += ", null masked";
  if (f.kind == FieldKind::generate) out += fmt::format(", max {} tokens", f.max_tokens);
  if (f.min_items > 0) out += fmt::format(", minItems {}", f.min_items);
  if (f.max_items) out += fmt::format(", maxItems {}", *f.max_items);
  if (f.unique_items) out += ", unique";
  if (f.value.pattern) out += fmt::format(", pattern {}", Json(f.value.pattern->source()).dump());
  return out;
}

}  // namespace

OrderedJson plan_to_json(const Plan& plan) {
  OrderedJson fields = OrderedJson::array();
  for (const Shown& s : shown_fields(plan)) {
    const Field& f = *s.field;
    OrderedJson j;
    j["pointer"] = f.pointer;
    j["kind"] = field_kind_name(f.kind);
    j["required"] = f.required;
    j["nullable"] = f.nullable;
    j["type"] = f.type;
    if (!f.title.empty()) j["title"] = f.title;
    if (!f.description.empty()) j["description"] = f.description;
    if (!f.format.empty()) j["format"] = f.format;
    if (!f.options.empty()) {
      j["options"] = OrderedJson::array();
      for (const Option& o : f.options) j["options"].push_back(o.text);
    }
    if (f.selects) j["selects"] = OrderedJson::parse(f.selects->dump());
    if (f.kind == FieldKind::extract) j["null_masked"] = f.null_masked;
    if (f.kind == FieldKind::extract || f.kind == FieldKind::generate) {
      j["value_types"] = OrderedJson::array();
      for (ValueType t : f.value.types) j["value_types"].push_back(value_type_name(t));
      if (f.value.pattern) j["pattern"] = f.value.pattern->source();
      if (f.value.min_length) j["min_length"] = *f.value.min_length;
      if (f.value.max_length) j["max_length"] = *f.value.max_length;
    }
    if (f.kind == FieldKind::generate) j["max_tokens"] = f.max_tokens;
    if (f.kind == FieldKind::anchor || f.kind == FieldKind::count ||
        f.kind == FieldKind::multi_select) {
      j["min_items"] = f.min_items;
      if (f.max_items) j["max_items"] = *f.max_items;
      j["unique_items"] = f.unique_items;
    }
    j["schema_pointer"] = f.schema_pointer;
    if (const std::string q = query_of(f, s.place); !q.empty()) j["query"] = q;
    fields.push_back(std::move(j));
  }
  return {{"units", plan.units}, {"fields", std::move(fields)}};
}

std::string plan_to_text(const Plan& plan) {
  std::string out;
  for (const Shown& s : shown_fields(plan)) {
    const Field& f = *s.field;
    out += fmt::format("{}  {}  ({})\n", f.pointer.empty() ? "(root)" : f.pointer,
                       field_kind_name(f.kind), flags_of(f));
    std::string q = query_of(f, s.place);
    if (f.kind == FieldKind::multi_select) {
      q = fmt::format("(one bool query per option: {})\n", f.options.size());
    }
    size_t start = 0;
    while (start < q.size()) {
      const size_t end = std::min(q.find('\n', start), q.size());
      out += fmt::format("    {}\n", q.substr(start, end - start));
      start = end + 1;
    }
  }
  return out;
}

}  // namespace deg::schema

namespace deg {

PlanSummary plan_describe(const OrderedJson& schema, ArrayMode array_mode) {
  const schema::PlanOptions options = {.array_mode = array_mode};
  const schema::Plan plan = schema::plan_compile(schema, options);
  PlanSummary out{.json = schema::plan_to_json(plan),
                  .text = schema::plan_to_text(plan),
                  .units = plan.units,
                  .max_units = options.max_units};
  schema::plan_visit(plan.root, [&](const schema::Field& f) {
    ++out.fields;
    if (f.kind != schema::FieldKind::object && f.kind != schema::FieldKind::multi_select) {
      ++out.queries;
    }
  });
  return out;
}

}  // namespace deg
