// Schema folding (fold.h): $ref resolution inside the document, allOf merging with per-keyword
// provenance, and unions (anyOf/oneOf) reduced to an enum, a nullable schema, or a type union.
#include "schema/fold.h"

#include <algorithm>

#include "core/error.h"
#include "schema/json_text.h"

namespace deg::schema {

namespace {

// Folding steps (parts merged) one node may take: a cycle of allOf/$ref without properties in
// between would otherwise never end.
constexpr int kMaxFoldSteps = 256;
// Parts merged over a whole compile: unions whose branches refer to each other multiply the
// folding work without creating fields, so the field budget alone would not stop them.
constexpr int64_t kMaxTotalSteps = 200'000;

bool is_annotation(std::string_view key) {
  static constexpr std::string_view kAnnotations[] = {
      "title",       "description", "default",          "examples",       "example",   "$comment",
      "$id",         "id",          "$schema",          "readOnly",       "writeOnly", "deprecated",
      "definitions", "$defs",       "contentMediaType", "contentEncoding"};
  if (key.starts_with("x-")) return key != "x-generate" && key != "x-levels";
  return std::find(std::begin(kAnnotations), std::end(kAnnotations), key) != std::end(kAnnotations);
}

// Keywords whose conflicting values across allOf branches deg cannot reconcile.
bool must_agree(std::string_view key) {
  static constexpr std::string_view kKeys[] = {
      "const", "items",      "format",   "pattern",    "anyOf",
      "oneOf", "x-generate", "x-levels", "multipleOf", "additionalItems"};
  return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

bool is_lower_bound(std::string_view key) {
  return key == "minimum" || key == "minLength" || key == "minItems" || key == "minProperties";
}
bool is_upper_bound(std::string_view key) {
  return key == "maximum" || key == "maxLength" || key == "maxItems" || key == "maxProperties";
}

std::vector<std::string> type_names(const OrderedJson& type) {
  std::vector<std::string> out;
  if (type.is_string()) out.push_back(type.get<std::string>());
  if (type.is_array()) {
    for (const auto& t : type) {
      if (t.is_string()) out.push_back(t.get<std::string>());
    }
  }
  return out;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A union branch that only admits null.
bool is_null_only(const Node& b) {
  if (const Located* c = b.find("const")) return c->value->is_null();
  if (const Located* e = b.find("enum")) {
    return e->value->is_array() && !e->value->empty() &&
           std::all_of(e->value->begin(), e->value->end(),
                       [](const auto& v) { return v.is_null(); });
  }
  const Located* t = b.find("type");
  return t && type_names(*t->value) == std::vector<std::string>{"null"} && b.properties.empty();
}

// True when every keyword of `b` is an annotation or one of `allowed`.
bool only_keywords(const Node& b, std::initializer_list<std::string_view> allowed) {
  if (!b.properties.empty() || !b.required.empty()) return false;
  for (const auto& [key, loc] : b.keywords) {
    if (is_annotation(key)) continue;
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) return false;
  }
  return true;
}

bool json_type_matches(const OrderedJson& v, const std::vector<std::string>& types) {
  for (const std::string& t : types) {
    if ((t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
        (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
        (t == "array" && v.is_array()) || (t == "number" && v.is_number()) ||
        (t == "integer" &&
         (v.is_number_integer() ||
          (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))))) {
      return true;
    }
  }
  return false;
}

// A branch whose declared types are all scalars a span can hold (string, number, integer, null).
bool scalar_types(const Node& b) {
  const Located* t = b.find("type");
  if (t == nullptr || !b.properties.empty()) return false;
  const auto names = type_names(*t->value);
  return !names.empty() && std::all_of(names.begin(), names.end(), [](const std::string& n) {
    return n == "string" || n == "number" || n == "integer" || n == "null";
  });
}

std::string json_type_of(const OrderedJson& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  return v.is_array() ? "array" : "object";
}

// True when every branch of `others` except `self` declares types, none of which overlaps
// `kinds` (integer and number overlap).
bool disjoint_from_all(const std::vector<std::string>& kinds, const std::vector<Node>& others,
                       const Node* self) {
  const auto numeric = [](const std::string& t) { return t == "integer" || t == "number"; };
  for (const Node& b : others) {
    if (&b == self) continue;
    const Located* t = b.find("type");
    if (t == nullptr) return false;
    for (const std::string& theirs : type_names(*t->value)) {
      for (const std::string& mine : kinds) {
        if (theirs == mine || (numeric(theirs) && numeric(mine))) return false;
      }
    }
  }
  return true;
}

}  // namespace

void reject(const std::string& pointer, const std::string& message) {
  throw Error(ErrorKind::unsupported, message, {.pointer = pointer});
}

void reject_invalid(const std::string& pointer, const std::string& message) {
  throw Error(ErrorKind::format, message, {.pointer = pointer});
}

const Located* Node::find(std::string_view key) const {
  for (const auto& [k, v] : keywords) {
    if (k == key) return &v;
  }
  return nullptr;
}

const OrderedJson* Folder::own(OrderedJson value) {
  owned_.push_back(std::move(value));
  return &owned_.back();
}

Node Folder::fold(const std::vector<Located>& parts, const std::vector<std::string>& open_refs) {
  DEG_CHECK(!parts.empty(), "folding no schema");
  Node node;
  node.pointer = parts.front().pointer;
  int steps = 0;
  for (const Located& part : parts) merge_part(node, part, open_refs, steps);
  if (!node.cut_at.empty()) return node;
  for (const char* key : {"anyOf", "oneOf"}) {
    if (node.find(key) == nullptr) continue;
    std::vector<std::string> refs = open_refs;
    refs.insert(refs.end(), node.refs.begin(), node.refs.end());
    fold_union(node, key, refs);
    if (!node.cut_at.empty()) return node;
  }
  return node;
}

void Folder::merge_part(Node& node, const Located& part, const std::vector<std::string>& open_refs,
                        int& steps) {
  if (++steps > kMaxFoldSteps) {
    reject(part.pointer, fmt::format("schema folds more than {} allOf/$ref parts into one field; "
                                     "simplify the allOf/$ref chain",
                                     kMaxFoldSteps));
  }
  if (++total_steps_ > kMaxTotalSteps) {
    reject(part.pointer, fmt::format("schema takes more than {} $ref/allOf/anyOf expansions to "
                                     "fold (the plan budget); simplify its references",
                                     kMaxTotalSteps));
  }
  const OrderedJson& v = *part.value;
  if (v.is_boolean()) {
    if (!v.get<bool>()) node.never = true;
    return;
  }
  if (!v.is_object()) {
    reject_invalid(part.pointer, fmt::format("a schema must be an object or a boolean, not {}",
                                             json_dumps(v).substr(0, 60)));
  }
  const OrderedJson* ref = nullptr;
  const OrderedJson* all_of = nullptr;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    const std::string at = json_pointer_join(part.pointer, key);
    const OrderedJson& value = it.value();
    if (key == "$ref") {
      ref = &value;
    } else if (key == "allOf") {
      all_of = &value;
    } else if (key == "properties") {
      if (!value.is_object()) reject_invalid(at, "properties must be an object of schemas");
      for (auto p = value.begin(); p != value.end(); ++p) {
        auto slot = std::find_if(node.properties.begin(), node.properties.end(),
                                 [&](const auto& e) { return e.first == p.key(); });
        if (slot == node.properties.end()) {
          node.properties.push_back({p.key(), {}});
          slot = node.properties.end() - 1;
        }
        slot->second.push_back({&p.value(), json_pointer_join(at, p.key())});
      }
    } else if (key == "required") {
      if (value.is_boolean()) {
        node.required_flag = node.required_flag || value.get<bool>();
        continue;
      }
      if (!value.is_array()) reject_invalid(at, "required must be an array of property names");
      if (node.required_at.empty()) node.required_at = at;
      for (const auto& name : value) {
        if (!name.is_string()) reject_invalid(at, "required must list property names (strings)");
        const auto& s = name.get_ref<const std::string&>();
        if (std::find(node.required.begin(), node.required.end(), s) == node.required.end()) {
          node.required.push_back(s);
        }
      }
    } else if (key != "definitions" && key != "$defs") {
      add_keyword(node, key, {&value, at});
    }
  }
  if (all_of != nullptr) {
    const std::string at = json_pointer_join(part.pointer, "allOf");
    if (!all_of->is_array()) reject_invalid(at, "allOf must be an array of schemas");
    for (size_t i = 0; i < all_of->size(); ++i) {
      merge_part(node, {&(*all_of)[i], json_pointer_join(at, std::to_string(i))}, open_refs, steps);
    }
  }
  if (ref != nullptr)
    merge_ref(node, {ref, json_pointer_join(part.pointer, "$ref")}, open_refs, steps);
}

void Folder::merge_ref(Node& node, const Located& ref, const std::vector<std::string>& open_refs,
                       int& steps) {
  if (!ref.value->is_string()) reject_invalid(ref.pointer, "$ref must be a string");
  const std::string& target = ref.value->get_ref<const std::string&>();
  if (target.empty() || target[0] != '#') {
    reject(ref.pointer, fmt::format("external $ref {}: deg resolves only references inside the "
                                    "schema (\"#/...\"); inline the referenced schema",
                                    json_dumps(OrderedJson(target))));
  }
  const std::string fragment = percent_decode(std::string_view(target).substr(1));
  if (!fragment.empty() && fragment[0] != '/') {
    reject(ref.pointer, fmt::format("$ref {} names an anchor; use a JSON pointer (\"#/$defs/x\")",
                                    json_dumps(OrderedJson(target))));
  }
  const auto open = std::count(open_refs.begin(), open_refs.end(), fragment) +
                    std::count(node.refs.begin(), node.refs.end(), fragment);
  if (open >= options_.max_ref_recursion) {
    node.cut_at = ref.pointer;
    return;
  }
  const OrderedJson* resolved = nullptr;
  try {
    resolved = &root_.at(OrderedJson::json_pointer(fragment));
  } catch (const std::exception&) {
    reject_invalid(ref.pointer, fmt::format("$ref {} points at nothing in this schema",
                                            json_dumps(OrderedJson(target))));
  }
  node.refs.push_back(fragment);
  merge_part(node, {resolved, fragment}, open_refs, steps);
}

void Folder::add_keyword(Node& node, const std::string& key, const Located& value) {
  auto existing = std::find_if(node.keywords.begin(), node.keywords.end(),
                               [&](const auto& e) { return e.first == key; });
  if (existing == node.keywords.end()) {
    node.keywords.push_back({key, value});
    return;
  }
  const OrderedJson& old = *existing->second.value;
  const OrderedJson& now = *value.value;
  if (old == now || is_annotation(key)) return;
  if (key == "type") {
    std::vector<std::string> a = type_names(old), b = type_names(now), both;
    for (const std::string& t : a) {
      const bool in_b = std::find(b.begin(), b.end(), t) != b.end() ||
                        (t == "integer" && std::find(b.begin(), b.end(), "number") != b.end());
      if (in_b) both.push_back(t);
    }
    for (const std::string& t : b) {
      if (t == "integer" && std::find(a.begin(), a.end(), "number") != a.end() &&
          std::find(both.begin(), both.end(), t) == both.end()) {
        both.push_back(t);
      }
    }
    if (both.empty()) reject(value.pointer, "allOf branches share no type: no value fits them all");
    existing->second = {own(OrderedJson(both)), value.pointer};
  } else if (key == "enum") {
    if (!old.is_array() || !now.is_array()) reject_invalid(value.pointer, "enum must be an array");
    OrderedJson both = OrderedJson::array();
    for (const auto& v : old) {
      if (std::find(now.begin(), now.end(), v) != now.end()) both.push_back(v);
    }
    if (both.empty()) reject(value.pointer, "allOf branches share no enum value");
    existing->second = {own(std::move(both)), value.pointer};
  } else if (is_lower_bound(key) || is_upper_bound(key)) {
    if (!old.is_number() || !now.is_number()) {
      reject_invalid(value.pointer, fmt::format("{} must be a number", key));
    }
    const bool stricter = is_lower_bound(key) ? now.get<double>() > old.get<double>()
                                              : now.get<double>() < old.get<double>();
    if (stricter) existing->second = value;
  } else if (key == "uniqueItems" || key == "additionalProperties") {
    // The stricter one: uniqueItems true, additionalProperties false.
    if ((key == "uniqueItems" && now == true) || (key == "additionalProperties" && now == false)) {
      existing->second = value;
    }
  } else if (must_agree(key)) {
    reject(value.pointer,
           fmt::format("allOf branches disagree on '{}' ({} vs {}); deg merges allOf branches "
                       "keyword by keyword, so give '{}' one value",
                       key, json_dumps(old).substr(0, 60), json_dumps(now).substr(0, 60), key));
  }
  // Any other keyword: the first value stands (plan.cc rejects the unsupported ones anyway).
}

void Folder::merge_node(Node& node, const Node& other) {
  for (const auto& [key, loc] : other.keywords) add_keyword(node, key, loc);
  for (const auto& [name, parts] : other.properties) {
    auto slot = std::find_if(node.properties.begin(), node.properties.end(),
                             [&name = name](const auto& e) { return e.first == name; });
    if (slot == node.properties.end()) {
      node.properties.push_back({name, parts});
    } else {
      slot->second.insert(slot->second.end(), parts.begin(), parts.end());
    }
  }
  for (const std::string& name : other.required) {
    if (std::find(node.required.begin(), node.required.end(), name) == node.required.end()) {
      node.required.push_back(name);
    }
  }
  if (node.required_at.empty()) node.required_at = other.required_at;
  node.refs.insert(node.refs.end(), other.refs.begin(), other.refs.end());
  node.nullable_union = node.nullable_union || other.nullable_union;
  node.never = node.never || other.never;
  if (node.cut_at.empty()) node.cut_at = other.cut_at;
}

void Folder::fold_union(Node& node, const std::string& key,
                        const std::vector<std::string>& open_refs) {
  auto it = std::find_if(node.keywords.begin(), node.keywords.end(),
                         [&](const auto& e) { return e.first == key; });
  const Located union_at = it->second;
  node.keywords.erase(it);
  const OrderedJson& branches = *union_at.value;
  if (!branches.is_array() || branches.empty()) {
    reject_invalid(union_at.pointer, fmt::format("{} must be a non-empty array of schemas", key));
  }
  OrderedJson values = OrderedJson::array();
  bool null_branch = false;
  std::vector<Node> others;
  for (size_t i = 0; i < branches.size(); ++i) {
    Node b =
        fold({{&branches[i], json_pointer_join(union_at.pointer, std::to_string(i))}}, open_refs);
    if (!b.cut_at.empty()) {
      node.cut_at = b.cut_at;
      return;
    }
    if (b.never) continue;
    if (is_null_only(b)) {
      null_branch = true;
    } else if ((b.find("const") || b.find("enum")) && only_keywords(b, {"const", "enum", "type"})) {
      const Located* c = b.find("const");
      const Located* e = b.find("enum");
      const Located* t = b.find("type");
      std::vector<const OrderedJson*> candidates;
      if (c) candidates.push_back(c->value);
      if (e && e->value->is_array()) {
        for (const auto& v : *e->value) candidates.push_back(&v);
      }
      for (const OrderedJson* v : candidates) {
        if (t && !json_type_matches(*v, type_names(*t->value))) continue;
        if (c && e && !std::count(e->value->begin(), e->value->end(), *c->value)) continue;
        if (std::find(values.begin(), values.end(), *v) == values.end()) values.push_back(*v);
      }
    } else {
      others.push_back(std::move(b));
    }
  }
  if (others.empty()) {
    if (null_branch) values.push_back(nullptr);
    if (values.empty())
      reject(union_at.pointer, fmt::format("no branch of {} admits a value", key));
    add_keyword(node, "enum", {own(std::move(values)), union_at.pointer});
    return;
  }
  node.nullable_union = node.nullable_union || null_branch;
  if (others.size() == 1 && values.empty()) {
    merge_node(node, others.front());
    return;
  }
  if (values.empty() && std::all_of(others.begin(), others.end(), [](const Node& b) {
        return scalar_types(b) && only_keywords(b, {"type"});
      })) {
    OrderedJson types = OrderedJson::array();
    for (const Node& b : others) {
      for (const std::string& t : type_names(*b.find("type")->value)) {
        if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
      }
    }
    add_keyword(node, "type", {own(std::move(types)), union_at.pointer});
    return;
  }
  // Structured alternatives: fill the constants, or else the first scalar alternative — a subset
  // of what the union admits, so the output still validates. For oneOf the chosen alternative
  // must not overlap the others (their declared types are disjoint from its own), or a value
  // could match two branches.
  const bool exclusive = key == "oneOf";
  if (!values.empty()) {
    std::vector<std::string> kinds;
    for (const auto& v : values) kinds.push_back(json_type_of(v));
    if (!exclusive || disjoint_from_all(kinds, others, nullptr)) {
      if (null_branch) values.push_back(nullptr);
      add_keyword(node, "enum", {own(std::move(values)), union_at.pointer});
      return;
    }
  }
  for (const Node& b : others) {
    if (!values.empty() || !scalar_types(b)) continue;
    if (exclusive && !disjoint_from_all(type_names(*b.find("type")->value), others, &b)) continue;
    merge_node(node, b);
    return;
  }
  reject(union_at.pointer,
         fmt::format("{} with {} structured alternatives: deg fills one schema per field and "
                     "cannot choose between objects, arrays or overlapping alternatives; make them "
                     "constants (a choice), or keep one alternative",
                     key, others.size() + (values.empty() ? 0 : 1)));
}

}  // namespace deg::schema
