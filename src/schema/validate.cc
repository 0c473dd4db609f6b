// JSON Schema validation with valijson (schema/validate.h).
#include "schema/validate.h"

// valijson's std::string::replace calls trip GCC 12's false -Wrestrict / -Wstringop-overflow at
// -O3 (and -Warray-bounds); CMakeLists.txt turns those three off for this file alone.
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>

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
