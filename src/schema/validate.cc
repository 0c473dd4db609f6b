// JSON Schema validation with valijson (schema/validate.h).
#include "schema/validate.h"

// valijson's std::string::replace calls trip GCC 12's false -Wrestrict / -Wstringop-overflow at
// -O3 (and -Warray-bounds); CMakeLists.txt turns those three off for this file alone.
#include <algorithm>
#include <set>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>

namespace deg::schema {

namespace {

// valijson's context ("<root>", "[items]", "[0]", ...) as a JSON pointer ("/items/0").
std::string pointer_of(const std::vector<std::string>& context) {
  std::string out;
  for (const std::string& part : context) {
    if (part == "<root>") continue;
    const bool bracketed = part.size() >= 2 && part.front() == '[' && part.back() == ']';
    out = json_pointer_join(out, bracketed ? part.substr(1, part.size() - 2) : part);
  }
  return out;
}

// The property a "Missing required property 'x'." report names, or empty.
std::string missing_property(const std::string& description) {
  const std::string head = "Missing required property '";
  if (description.rfind(head, 0) != 0 || description.size() < head.size() + 2) return {};
  return description.substr(head.size(), description.size() - head.size() - 2);
}

// A report that only says something beneath it failed.
bool wraps(const std::string& description) {
  for (const char* w : {"Failed to validate item #",
                        "Failed to validate against schema associated "
                        "with property name",
                        "Failed to validate against child schema"}) {
    if (description.rfind(w, 0) == 0) return true;
  }
  return false;
}

bool beneath(const std::string& pointer, const std::string& parent) {
  return pointer.size() > parent.size() && pointer.compare(0, parent.size(), parent) == 0 &&
         pointer[parent.size()] == '/';
}

}  // namespace

struct SchemaValidator::Impl {
  valijson::Schema schema;
};

SchemaValidator::SchemaValidator(const Json& schema) : impl_(std::make_unique<Impl>()) {
  Json s = schema;
  if (s.is_object()) s.erase("$schema");
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter adapter(s);
  parser.populateSchema(adapter, impl_->schema);
}

SchemaValidator::SchemaValidator(const OrderedJson& schema)
    : SchemaValidator(Json::parse(schema.dump())) {}

SchemaValidator::~SchemaValidator() = default;
SchemaValidator::SchemaValidator(SchemaValidator&&) noexcept = default;
SchemaValidator& SchemaValidator::operator=(SchemaValidator&&) noexcept = default;

std::vector<std::string> SchemaValidator::violations(
    const Json& value, const std::vector<std::string>& excused) const {
  valijson::Validator validator;
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter adapter(value);
  if (validator.validate(impl_->schema, adapter, &results)) return {};
  struct Report {
    std::string where, what;
  };
  std::vector<Report> reports;
  valijson::ValidationResults::Error e;
  while (results.popError(e)) reports.push_back({pointer_of(e.context), e.description});
  const std::set<std::string> allowed(excused.begin(), excused.end());
  std::vector<Report> kept;
  for (const Report& r : reports) {
    const std::string name = missing_property(r.what);
    if (!name.empty() && allowed.count(r.where + "/" + name)) continue;  // excused
    kept.push_back(r);
  }
  // A wrapper stays only while a report that is not itself a wrapper lies beneath it.
  std::vector<std::string> out;
  for (const Report& r : kept) {
    if (wraps(r.what) && std::none_of(kept.begin(), kept.end(), [&](const Report& x) {
          return !wraps(x.what) && (x.where == r.where || beneath(x.where, r.where));
        }))
      continue;
    out.push_back((r.where.empty() ? "/" : r.where) + ": " + r.what);
  }
  if (out.empty() && kept.size() == reports.size()) out.push_back("/: invalid");
  return out;
}

std::vector<std::string> schema_violations(const Json& schema, const Json& value) {
  return SchemaValidator(schema).violations(value);
}

std::vector<std::string> schema_violations(const OrderedJson& schema, const OrderedJson& value) {
  return schema_violations(Json::parse(schema.dump()), Json::parse(value.dump()));
}

}  // namespace deg::schema
