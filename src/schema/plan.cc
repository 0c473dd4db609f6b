// The plan compiler (plan.h): walks a folded schema (fold.h) and decides each field's kind,
// header lines, options and value constraints. docs/schema.md is the prose version of the
// decisions made here.
#include "schema/plan.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "core/error.h"
#include "schema/fold.h"
#include "schema/json_text.h"

namespace deg::schema {

namespace {

struct UnsupportedKeyword {
  std::string_view key;
  std::string_view why;
};

constexpr UnsupportedKeyword kUnsupported[] = {
    {"patternProperties",
     "keys matching a pattern would have to be invented; list the keys "
     "under properties instead"},
    {"not", "a negated schema says what a value is not, so there is nothing to fill"},
    {"if", "conditional schemas (if/then/else) are not supported; split the schema per case"},
    {"dependencies", "property dependencies are not supported; make the properties independent"},
    {"dependentSchemas", "property dependencies are not supported"},
    {"dependentRequired", "property dependencies are not supported"},
    {"prefixItems", "tuples (per-position item schemas) are not supported; use one items schema"},
    {"contains", "arrays constrained by `contains` are not supported"},
    {"propertyNames", "constraints on key names are not supported"},
    {"$dynamicRef", "dynamic references are not supported; use $ref"},
    {"$recursiveRef", "recursive references ($recursiveRef) are not supported; use $ref"},
    {"extends", "draft-3 `extends` is not supported; use allOf"},
    {"disallow", "draft-3 `disallow` is not supported"},
};

constexpr std::string_view kTypeNames[] = {"string", "number", "integer", "boolean",
                                           "object", "array",  "null",    "any"};

// Where a schema sits in the plan being built.
struct Site {
  std::vector<PathToken> path;
  std::string pointer;  // template pointer of the field
  bool required = true;
  bool present = true;  // the enclosing object is always there (required up to root or item)
  bool item = false;    // an array item
  bool item_droppable = false;  // an item that cannot be built leaves the array empty
  int64_t depth = 0;
  std::vector<std::string> open_refs;
};

const OrderedJson kTrueSchema = true;

std::string text_annotation(const Node& node, const char* key) {
  const Located* loc = node.find(key);
  if (loc == nullptr || !loc->value->is_string()) return "";
  return one_line(loc->value->get_ref<const std::string&>());
}

std::optional<double> number_keyword(const Node& node, const char* key) {
  const Located* loc = node.find(key);
  if (loc == nullptr) return std::nullopt;
  if (!loc->value->is_number())
    reject_invalid(loc->pointer, fmt::format("{} must be a number", key));
  return loc->value->get<double>();
}

std::optional<int64_t> count_keyword(const Node& node, const char* key) {
  const std::optional<double> v = number_keyword(node, key);
  if (!v) return std::nullopt;
  if (*v < 0 || *v != std::floor(*v) || *v > 1e15) {
    reject_invalid(node.find(key)->pointer, fmt::format("{} must be a non-negative integer", key));
  }
  return int64_t(*v);
}

std::string join_or(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) {
    if (!out.empty()) out += " or ";
    out += n;
  }
  return out;
}

std::string type_text_of_options(const std::vector<Option>& options) {
  std::vector<std::string> names;
  for (const Option& o : options) {
    const std::string n = json_type_name(o.value);
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  return join_or(names);
}

// Option lines: strings as their text, other values as JSON; when two lines would read the same
// ("1" and 1), every line is written as JSON so they differ.
std::vector<Option> make_options(const std::vector<Json>& values) {
  std::vector<Option> options;
  for (const Json& v : values) {
    options.push_back(
        {v, v.is_string() ? one_line(v.get_ref<const std::string&>()) : json_dumps(v)});
  }
  for (size_t i = 0; i < options.size(); ++i) {
    for (size_t j = i + 1; j < options.size(); ++j) {
      if (options[i].text != options[j].text) continue;
      for (Option& o : options) o.text = json_dumps(o.value);
      return options;
    }
  }
  return options;
}

bool has_extract_leaf(const Field& field) {
  if (field.kind == FieldKind::extract) return true;
  return std::any_of(field.children.begin(), field.children.end(), has_extract_leaf);
}

class Compiler {
 public:
  Compiler(const OrderedJson& root, const PlanOptions& options)
      : options_(options), folder_(root, options), root_(root) {}

  Plan run() {
    Site site;
    std::optional<Field> root = build({{&root_, ""}}, site);
    DEG_CHECK(root.has_value(), "a required root was dropped");
    return Plan{.root = std::move(*root), .units = units_};
  }

 private:
  std::optional<Field> build(const std::vector<Located>& parts, const Site& site);
  void build_choice(const Node& node, Field& f, const std::vector<std::string>& types, bool typed);
  void build_levels(const Node& node, Field& f, const std::vector<std::string>& types,
                    bool nullable);
  bool build_integer_range(const Node& node, Field& f, bool nullable);
  void build_value(const Node& node, Field& f, const std::vector<std::string>& types);
  void build_object(const Node& node, Field& f, const Site& site);
  bool build_array(const Node& node, Field& f, const Site& site);

  void spend(int64_t units, const std::string& at) {
    units_ += units;
    if (units_ > options_.max_units) {
      reject(at, fmt::format("schema expands to more than {} fields and options (the plan "
                             "budget); deg rejects it rather than run that many queries per "
                             "document",
                             options_.max_units));
    }
  }

  const PlanOptions& options_;
  Folder folder_;
  const OrderedJson& root_;
  int64_t units_ = 0;
};

std::optional<Field> Compiler::build(const std::vector<Located>& parts, const Site& site) {
  if (site.depth > options_.max_depth) {
    reject(parts.front().pointer,
           fmt::format("schema nests deeper than {} objects and arrays", options_.max_depth));
  }
  const Node node = folder_.fold(parts, site.open_refs);
  const bool required = site.required || node.required_flag;
  const bool droppable = site.item ? site.item_droppable : !required;
  if (!node.cut_at.empty()) {
    if (droppable) return std::nullopt;
    reject(node.cut_at, fmt::format("recursive $ref deeper than {} levels at a required field: "
                                    "deg unrolls recursion {} levels and leaves out optional parts "
                                    "below; make the recursive property optional",
                                    options_.max_ref_recursion, options_.max_ref_recursion));
  }
  if (node.never) {
    if (droppable) return std::nullopt;
    reject(node.pointer, "schema `false` at a required place: no value satisfies it");
  }
  for (const UnsupportedKeyword& u : kUnsupported) {
    if (const Located* loc = node.find(u.key)) reject(loc->pointer, std::string(u.why));
  }
  spend(1, node.pointer);

  Field f;
  f.path = site.path;
  f.pointer = site.pointer;
  f.schema_pointer = node.pointer;
  f.required = required;
  f.title = text_annotation(node, "title");
  f.description = text_annotation(node, "description");

  // The types the schema admits; "any" or no `type` leaves the list empty (inferred below).
  std::vector<std::string> types;
  bool nullable = node.nullable_union;
  bool typed = false;
  const Located* type_kw = node.find("type");
  if (type_kw != nullptr) {
    std::vector<OrderedJson> names;
    if (type_kw->value->is_array()) {
      names.assign(type_kw->value->begin(), type_kw->value->end());
    } else {
      names.push_back(*type_kw->value);
    }
    for (const OrderedJson& n : names) {
      if (!n.is_string() || std::find(std::begin(kTypeNames), std::end(kTypeNames),
                                      n.get<std::string>()) == std::end(kTypeNames)) {
        reject_invalid(type_kw->pointer,
                       fmt::format("unknown type {}; JSON Schema types are string, number, "
                                   "integer, boolean, object, array and null",
                                   json_dumps(n)));
      }
      const std::string& s = n.get_ref<const std::string&>();
      if (s == "any") {
        types.clear();
        typed = false;
        break;
      }
      typed = true;
      if (s == "null") {
        nullable = true;
      } else if (std::find(types.begin(), types.end(), s) == types.end()) {
        types.push_back(s);
      }
    }
  }
  if (!typed) {
    auto has = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return node.find(k); });
    };
    if (!node.properties.empty() || !node.required.empty() ||
        has({"additionalProperties", "minProperties", "maxProperties"})) {
      types = {"object"};
    } else if (has({"items", "minItems", "maxItems", "uniqueItems"})) {
      types = {"array"};
    } else if (has({"minLength", "maxLength", "pattern", "format", "x-generate"})) {
      types = {"string"};
    } else if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) {
      types = {"number"};
    }
  }
  // A union of scalars with objects, arrays or booleans is filled as its scalars: a subset of
  // what the schema admits, so the output still validates.
  const auto is_scalar = [](const std::string& t) {
    return t == "string" || t == "number" || t == "integer";
  };
  if (types.size() > 1 && std::any_of(types.begin(), types.end(), is_scalar)) {
    std::erase_if(types, [&](const std::string& t) { return !is_scalar(t); });
  }
  if (const Located* gen = node.find("x-generate"); gen && !gen->value->is_boolean()) {
    reject_invalid(gen->pointer, "x-generate must be true or false");
  }
  const Located* generate = node.find("x-generate");
  const bool wants_generate = generate && generate->value->get<bool>();
  const bool scalar = !types.empty() && std::all_of(types.begin(), types.end(), [](auto& t) {
    return t == "string" || t == "number" || t == "integer";
  });
  const bool has_string = types.empty() || std::count(types.begin(), types.end(), "string");
  if (wants_generate && (!has_string || !(types.empty() || scalar) || node.find("enum") ||
                         node.find("const") || node.find("x-levels"))) {
    reject(generate->pointer, "x-generate applies to plain strings (no enum, const or x-levels)");
  }

  if (node.find("x-levels")) {
    build_levels(node, f, types, nullable);
  } else if (node.find("enum") || node.find("const")) {
    if (nullable) types.push_back("null");
    build_choice(node, f, types, typed);
  } else if (typed && types.empty()) {  // "type": "null"
    f.kind = FieldKind::choice;
    f.options = make_options({Json(nullptr)});
    f.nullable = true;
    f.type = "null";
  } else if (types == std::vector<std::string>{"object"}) {
    f.nullable = nullable;
    build_object(node, f, site);
  } else if (types == std::vector<std::string>{"array"}) {
    f.nullable = nullable;
    if (!build_array(node, f, site)) return std::nullopt;
  } else if (types == std::vector<std::string>{"boolean"}) {
    f.type = "boolean";
    if (nullable) {
      f.kind = FieldKind::choice;
      f.options = make_options({Json(true), Json(false), Json(nullptr)});
      f.nullable = true;
      f.type = "boolean or null";
    } else {
      f.kind = FieldKind::boolean;
    }
  } else if (types.empty() || scalar) {
    f.nullable = nullable;
    if (wants_generate) {
      f.kind = FieldKind::generate;
      build_value(node, f, {"string"});
      f.max_tokens = f.value.max_length
                         ? std::clamp<int64_t>(*f.value.max_length, 1, options_.max_generate_tokens)
                         : options_.generate_tokens;
    } else if (!(types == std::vector<std::string>{"integer"} &&
                 build_integer_range(node, f, nullable))) {
      f.kind = FieldKind::extract;
      f.null_masked = site.present && required && !nullable;
      build_value(node, f, types.empty() ? std::vector<std::string>{"string"} : types);
    }
  } else {
    reject(type_kw->pointer,
           fmt::format("type union {}: deg fills one kind of value per field (strings and numbers "
                       "may mix; objects, arrays and booleans may only be combined with null)",
                       json_dumps(*type_kw->value)));
  }
  if (f.kind == FieldKind::choice || f.kind == FieldKind::score) {
    spend(int64_t(f.options.size()), node.pointer);
  }
  return f;
}

void Compiler::build_choice(const Node& node, Field& f, const std::vector<std::string>& types,
                            bool typed) {
  const Located* enum_kw = node.find("enum");
  const Located* const_kw = node.find("const");
  std::vector<Json> values;
  if (enum_kw != nullptr) {
    if (!enum_kw->value->is_array() || enum_kw->value->empty()) {
      reject_invalid(enum_kw->pointer, "enum must be a non-empty array");
    }
    for (const OrderedJson& v : *enum_kw->value) values.push_back(Json::parse(v.dump()));
  }
  if (const_kw != nullptr) {
    const Json c = Json::parse(const_kw->value->dump());
    if (enum_kw == nullptr || std::count(values.begin(), values.end(), c)) {
      values = {c};
    } else {
      reject(const_kw->pointer, "const is not one of the enum values: no value satisfies both");
    }
  }
  std::vector<Json> kept;
  for (const Json& v : values) {
    const std::string kind = json_type_name(v);
    const bool fits = !typed || std::any_of(types.begin(), types.end(), [&](const std::string& t) {
      return t == kind || (t == "number" && kind == "integer") ||
             (t == "integer" && kind == "number" && v.get<double>() == std::floor(v.get<double>()));
    });
    if (fits && std::find(kept.begin(), kept.end(), v) == kept.end()) kept.push_back(v);
  }
  const Located* at = enum_kw ? enum_kw : const_kw;
  if (kept.empty()) reject(at->pointer, "no enum value has the schema's type: no value fits");
  f.kind = FieldKind::choice;
  f.options = make_options(kept);
  f.nullable = std::count(kept.begin(), kept.end(), Json(nullptr)) > 0;
  f.type = type_text_of_options(f.options);
}

void Compiler::build_levels(const Node& node, Field& f, const std::vector<std::string>& types,
                            bool nullable) {
  const Located* levels = node.find("x-levels");
  if (!levels->value->is_array() || levels->value->empty()) {
    reject_invalid(levels->pointer, "x-levels must be a non-empty array of level labels");
  }
  const bool numeric = !types.empty() && std::all_of(types.begin(), types.end(), [](auto& t) {
    return t == "integer" || t == "number";
  });
  const auto n = int64_t(levels->value->size());
  const bool labels = std::all_of(levels->value->begin(), levels->value->end(),
                                  [](const auto& v) { return v.is_string(); });
  f.kind = FieldKind::score;
  if (numeric && labels) {
    // Labels of an integer scale: level i is minimum + i.
    const int64_t base = int64_t(number_keyword(node, "minimum").value_or(0));
    if (const auto max = number_keyword(node, "maximum"); max && int64_t(*max) != base + n - 1) {
      reject_invalid(levels->pointer,
                     fmt::format("x-levels has {} labels but minimum..maximum spans {} values", n,
                                 int64_t(*max) - base + 1));
    }
    for (int64_t i = 0; i < n; ++i) {
      f.options.push_back(
          {Json(base + i), one_line((*levels->value)[size_t(i)].get<std::string>())});
    }
  } else {
    std::vector<Json> values;
    for (const OrderedJson& v : *levels->value) values.push_back(Json::parse(v.dump()));
    f.options = make_options(values);
  }
  if (nullable) f.options.push_back({Json(nullptr), "null"});
  f.nullable = nullable;
  f.type = type_text_of_options(f.options);
}

bool Compiler::build_integer_range(const Node& node, Field& f, bool nullable) {
  std::optional<double> lo = number_keyword(node, "minimum");
  std::optional<double> hi = number_keyword(node, "maximum");
  const Located* xmin = node.find("exclusiveMinimum");
  const Located* xmax = node.find("exclusiveMaximum");
  // Draft 4 writes exclusive bounds as booleans beside minimum/maximum; later drafts as numbers.
  if (xmin && xmin->value->is_boolean() && xmin->value->get<bool>() && lo) lo = std::floor(*lo) + 1;
  if (xmin && xmin->value->is_number()) {
    const double x = std::floor(xmin->value->get<double>()) + 1;
    lo = lo ? std::max(*lo, x) : x;
  }
  if (xmax && xmax->value->is_boolean() && xmax->value->get<bool>() && hi) hi = std::ceil(*hi) - 1;
  if (xmax && xmax->value->is_number()) {
    const double x = std::ceil(xmax->value->get<double>()) - 1;
    hi = hi ? std::min(*hi, x) : x;
  }
  if (!lo || !hi) return false;
  const double first = std::ceil(*lo), last = std::floor(*hi);
  if (last < first || last - first + 1 > double(options_.score_max_levels)) return false;
  const std::optional<double> step = number_keyword(node, "multipleOf");
  for (auto v = int64_t(first); v <= int64_t(last); ++v) {
    if (step && *step > 0 && std::fmod(double(v), *step) != 0) continue;
    f.options.push_back({Json(v), std::to_string(v)});
  }
  if (f.options.empty()) return false;
  if (nullable) f.options.push_back({Json(nullptr), "null"});
  f.kind = FieldKind::score;
  f.nullable = nullable;
  f.type = nullable ? "integer or null" : "integer";
  return true;
}

void Compiler::build_value(const Node& node, Field& f, const std::vector<std::string>& types) {
  ValueSpec& spec = f.value;
  for (ValueType t : {ValueType::integer, ValueType::number, ValueType::string}) {
    if (std::count(types.begin(), types.end(), value_type_name(t))) spec.types.push_back(t);
  }
  std::vector<std::string> names;
  for (ValueType t : spec.types) names.push_back(value_type_name(t));
  if (f.nullable) names.push_back("null");
  f.type = join_or(names);
  if (const Located* format = node.find("format")) {
    if (!format->value->is_string()) reject_invalid(format->pointer, "format must be a string");
    f.format = one_line(format->value->get_ref<const std::string&>());
    spec.format = f.format;
  }
  const bool strings = std::count(spec.types.begin(), spec.types.end(), ValueType::string) > 0;
  if (const Located* pattern = node.find("pattern"); pattern && strings) {
    if (!pattern->value->is_string()) reject_invalid(pattern->pointer, "pattern must be a string");
    try {
      spec.pattern = Pattern::compile(pattern->value->get_ref<const std::string&>());
    } catch (const Error& e) {
      throw e.with_pointer(pattern->pointer);
    }
  }
  if (strings) {
    spec.min_length = count_keyword(node, "minLength");
    spec.max_length = count_keyword(node, "maxLength");
    if (spec.min_length && spec.max_length && *spec.min_length > *spec.max_length) {
      reject(node.find("minLength")->pointer, "minLength is above maxLength: no string fits");
    }
  }
  if (spec.types.front() != ValueType::string) {
    spec.minimum = number_keyword(node, "minimum");
    spec.maximum = number_keyword(node, "maximum");
    const Located* xmin = node.find("exclusiveMinimum");
    const Located* xmax = node.find("exclusiveMaximum");
    if (xmin && xmin->value->is_boolean() && xmin->value->get<bool>()) {
      std::swap(spec.exclusive_minimum, spec.minimum);
    } else if (xmin && xmin->value->is_number()) {
      spec.exclusive_minimum = xmin->value->get<double>();
    }
    if (xmax && xmax->value->is_boolean() && xmax->value->get<bool>()) {
      std::swap(spec.exclusive_maximum, spec.maximum);
    } else if (xmax && xmax->value->is_number()) {
      spec.exclusive_maximum = xmax->value->get<double>();
    }
    spec.multiple_of = number_keyword(node, "multipleOf");
    if (spec.multiple_of && *spec.multiple_of <= 0) {
      reject_invalid(node.find("multipleOf")->pointer, "multipleOf must be above 0");
    }
    if (spec.minimum && spec.maximum && *spec.minimum > *spec.maximum) {
      reject(node.find("minimum")->pointer, "minimum is above maximum: no number fits");
    }
  }
}

void Compiler::build_object(const Node& node, Field& f, const Site& site) {
  f.kind = FieldKind::object;
  f.type = "object";
  const Located* extra = node.find("additionalProperties");
  if (node.properties.empty() && extra && extra->value->is_object() && !extra->value->empty()) {
    reject(extra->pointer,
           "an object whose content lives in free keys (a map): deg fills only "
           "declared properties and never invents keys; list them under "
           "properties");
  }
  const auto declared = int64_t(node.properties.size());
  if (const auto min = count_keyword(node, "minProperties"); min && *min > declared) {
    reject(node.find("minProperties")->pointer,
           fmt::format("minProperties {} exceeds the {} declared properties; deg never invents "
                       "keys",
                       *min, declared));
  }
  if (const auto max = count_keyword(node, "maxProperties"); max && *max < declared) {
    reject(node.find("maxProperties")->pointer,
           fmt::format("maxProperties {} is below the {} declared properties deg may fill", *max,
                       declared));
  }
  // A required name missing from properties still has to appear: its schema is
  // additionalProperties (absent = any value), unless that is false.
  std::vector<std::pair<std::string, std::vector<Located>>> properties = node.properties;
  for (const std::string& name : node.required) {
    const bool declared = std::any_of(properties.begin(), properties.end(),
                                      [&](const auto& p) { return p.first == name; });
    if (declared) continue;
    if (extra && extra->value->is_boolean() && !extra->value->get<bool>()) {
      reject(node.required_at, fmt::format("required property \"{}\" is not under properties "
                                           "and additionalProperties is false: no object fits",
                                           name));
    }
    properties.push_back({name, {extra ? *extra : Located{&kTrueSchema, node.required_at}}});
  }
  for (const auto& [name, parts] : properties) {
    Site child = {.path = site.path,
                  .pointer = json_pointer_join(site.pointer, name),
                  .required = std::count(node.required.begin(), node.required.end(), name) > 0,
                  .present = site.present && f.required,
                  .depth = site.depth + 1,
                  .open_refs = site.open_refs};
    child.path.push_back({.key = name});
    child.open_refs.insert(child.open_refs.end(), node.refs.begin(), node.refs.end());
    if (std::optional<Field> field = build(parts, child)) f.children.push_back(std::move(*field));
  }
}

bool Compiler::build_array(const Node& node, Field& f, const Site& site) {
  const Located* items = node.find("items");
  if (items && items->value->is_array()) {
    reject(items->pointer,
           "tuples (items as an array of per-position schemas) are not "
           "supported; use one items schema");
  }
  f.min_items = count_keyword(node, "minItems").value_or(0);
  f.max_items = count_keyword(node, "maxItems");
  if (f.max_items && *f.max_items < f.min_items) {
    reject(node.find("minItems")->pointer, "minItems is above maxItems: no array fits");
  }
  if (const Located* unique = node.find("uniqueItems")) {
    f.unique_items = unique->value->is_boolean() && unique->value->get<bool>();
  }
  Site item_site = {.path = site.path,
                    .pointer = site.pointer + "/*",
                    .required = true,
                    .present = true,
                    .item = true,
                    .item_droppable = f.min_items == 0,
                    .depth = site.depth + 1,
                    .open_refs = site.open_refs};
  item_site.path.push_back({.item = true});
  item_site.open_refs.insert(item_site.open_refs.end(), node.refs.begin(), node.refs.end());
  const Located items_at =
      items ? *items : Located{&kTrueSchema, json_pointer_join(node.pointer, "items")};
  std::optional<Field> item = build({items_at}, item_site);
  if (!item) {  // items admit nothing (false, or the recursion limit): only [] would fit
    if (!f.required) return false;
    reject(items_at.pointer,
           "the items of this required array admit no value (items: false, or "
           "recursion beyond the $ref limit); make the array optional");
  }
  if (item->is_leaf() && item->title.empty() && item->description.empty()) {
    item->title = f.title;
    item->description = f.description;
  }
  if (item->kind == FieldKind::choice) {
    f.kind = FieldKind::multi_select;
    f.type = fmt::format("array of {}", type_text_of_options(item->options));
    for (const Option& o : item->options) {
      if (o.value.is_null()) continue;
      f.options.push_back(o);
      Field pick;
      pick.kind = FieldKind::boolean;
      pick.path = f.path;
      pick.pointer = f.pointer;
      pick.schema_pointer = item->schema_pointer;
      pick.type = f.type;
      pick.title = item->title;
      pick.description = item->description;
      pick.required = true;
      pick.options = {o};
      pick.selects = o.value;
      f.children.push_back(std::move(pick));
    }
    spend(int64_t(f.children.size()), node.pointer);
    return true;
  }
  const bool anchored = options_.array_mode == ArrayMode::anchor && has_extract_leaf(*item);
  f.kind = anchored ? FieldKind::anchor : FieldKind::count;
  f.type = fmt::format("array of {}", item->type);
  f.children.push_back(std::move(*item));
  return true;
}

}  // namespace

const char* field_kind_name(FieldKind kind) {
  switch (kind) {
    case FieldKind::object: return "object";
    case FieldKind::choice: return "choice";
    case FieldKind::score: return "score";
    case FieldKind::boolean: return "bool";
    case FieldKind::extract: return "extract";
    case FieldKind::generate: return "generate";
    case FieldKind::anchor: return "anchor";
    case FieldKind::count: return "count";
    case FieldKind::multi_select: return "multi_select";
  }
  return "?";
}

const std::string& Field::key() const {
  static const std::string kNone;
  return path.empty() || path.back().item ? kNone : path.back().key;
}

bool Field::is_leaf() const {
  return kind == FieldKind::choice || kind == FieldKind::score || kind == FieldKind::boolean ||
         kind == FieldKind::extract || kind == FieldKind::generate;
}

Plan plan_compile(const OrderedJson& schema, const PlanOptions& options) {
  return Compiler(schema, options).run();
}

OrderedJson schema_parse(std::string_view text, const std::string& what) {
  return json_parse_ordered(text, what);
}

const Field* plan_find(const Plan& plan, std::string_view pointer) {
  const Field* at = &plan.root;
  size_t i = 0;
  while (i < pointer.size()) {
    if (pointer[i] != '/') return nullptr;
    const size_t next = std::min(pointer.find('/', i + 1), pointer.size());
    std::string token;
    for (size_t k = i + 1; k < next; ++k) {
      if (pointer[k] == '~' && k + 1 < next && (pointer[k + 1] == '0' || pointer[k + 1] == '1')) {
        token += pointer[++k] == '0' ? '~' : '/';
      } else {
        token += pointer[k];
      }
    }
    i = next;
    if (at->kind == FieldKind::object) {
      auto child = std::find_if(at->children.begin(), at->children.end(),
                                [&](const Field& c) { return c.key() == token; });
      if (child == at->children.end()) return nullptr;
      at = &*child;
    } else if (at->kind == FieldKind::anchor || at->kind == FieldKind::count ||
               at->kind == FieldKind::multi_select) {
      if (token.empty() || !std::all_of(token.begin(), token.end(), ::isdigit)) return nullptr;
      if (at->kind == FieldKind::multi_select) return i == pointer.size() ? at : nullptr;
      at = &at->children.front();
    } else {
      return nullptr;
    }
  }
  return at;
}

std::string field_pointer(const Field& field, const std::vector<int64_t>& indices) {
  std::string out;
  size_t k = 0;
  for (const PathToken& t : field.path) {
    if (t.item) {
      DEG_CHECK(k < indices.size(), "{} needs more item indices than {}", field.pointer,
                indices.size());
      out += fmt::format("/{}", indices[k++]);
    } else {
      out = json_pointer_join(out, t.key);
    }
  }
  DEG_CHECK(k == indices.size(), "{} takes {} item indices, got {}", field.pointer, k,
            indices.size());
  return out;
}

}  // namespace deg::schema

namespace deg {

OrderedJson schema_load(const std::string& path) {
  return schema::schema_parse(read_file(path, kMaxSchemaBytes, "schema"), path);
}

}  // namespace deg
