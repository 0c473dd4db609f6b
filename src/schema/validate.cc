// JSON Schema validation with valijson (schema/validate.h).
#include "schema/validate.h"

// valijson's headers trip GCC 12's -Wrestrict false positive inside std::string::replace.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>
#pragma GCC diagnostic pop

namespace deg::schema {

std::vector<std::string> schema_violations(const Json& schema, const Json& value) {
  Json s = schema;
  if (s.is_object()) s.erase("$schema");
  valijson::Schema parsed;
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter schema_adapter(s);
  parser.populateSchema(schema_adapter, parsed);
  valijson::Validator validator;
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter value_adapter(value);
  std::vector<std::string> out;
  if (validator.validate(parsed, value_adapter, &results)) return out;
  valijson::ValidationResults::Error e;
  while (results.popError(e)) {
    std::string where;
    for (const std::string& part : e.context) where += part == "<root>" ? "" : part;
    out.push_back((where.empty() ? "/" : where) + ": " + e.description);
  }
  if (out.empty()) out.push_back("/: invalid");
  return out;
}

std::vector<std::string> schema_violations(const OrderedJson& schema, const OrderedJson& value) {
  return schema_violations(Json::parse(schema.dump()), Json::parse(value.dump()));
}

}  // namespace deg::schema
