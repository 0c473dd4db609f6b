// schema::SchemaValidator: what every filled value is checked with inside the engine (valijson),
// and the one excuse it grants: required properties a document does not hold
// (FillResult::missing), with the reports that only wrap them.
#include <gtest/gtest.h>

#include "schema/validate.h"

namespace deg::schema {
namespace {

const Json kSchema = Json::parse(R"({
  "type": "object",
  "required": ["total", "items"],
  "properties": {
    "total": {"type": "number"},
    "items": {"type": "array", "items": {
      "type": "object", "required": ["price", "name"],
      "properties": {"price": {"type": "number"}, "name": {"type": "string"}}}}
  }
})");

bool mentions(const std::vector<std::string>& why, const std::string& text) {
  for (const std::string& w : why)
    if (w.find(text) != std::string::npos) return true;
  return false;
}

TEST(SchemaValidator, ValidValuesHaveNoViolations) {
  const SchemaValidator v(kSchema);
  EXPECT_TRUE(
      v.violations(Json::parse(R"({"total": 3, "items": [{"price": 1, "name": "a"}]})")).empty());
}

TEST(SchemaValidator, ViolationsNameWhereAndWhat) {
  const SchemaValidator v(kSchema);
  const auto why = v.violations(Json::parse(R"({"total": "x", "items": [{"price": 1}]})"));
  ASSERT_FALSE(why.empty());
  EXPECT_TRUE(mentions(why, "/items/0: Missing required property 'name'")) << why[0];
  EXPECT_TRUE(mentions(why, "/total")) << why[0];
}

TEST(SchemaValidator, ExcusedMissingPropertiesValidate) {
  const SchemaValidator v(kSchema);
  const Json value = Json::parse(R"({"items": [{"price": 1, "name": "a"}, {"name": "b"}]})");
  EXPECT_FALSE(v.violations(value).empty());
  EXPECT_TRUE(v.violations(value, {"/total", "/items/1/price"}).empty());
  // Only the named ones: the same value with one excuse left out still fails, on that one.
  const auto why = v.violations(value, {"/total"});
  EXPECT_TRUE(mentions(why, "/items/1: Missing required property 'price'"));
  EXPECT_FALSE(mentions(why, "'total'"));
  // An excuse for another item does not cover this one.
  EXPECT_FALSE(v.violations(value, {"/total", "/items/0/price"}).empty());
}

TEST(SchemaValidator, AnExcuseDoesNotHideOtherViolations) {
  const SchemaValidator v(kSchema);
  const Json value = Json::parse(R"({"items": [{"price": "not a number", "name": "a"}]})");
  const auto why = v.violations(value, {"/total"});
  EXPECT_TRUE(mentions(why, "/items/0/price")) << (why.empty() ? "" : why[0]);
}

TEST(SchemaValidator, RefsAndSchemaKeywordAreRead) {
  const SchemaValidator v(Json::parse(R"({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "definitions": {"n": {"type": "integer"}},
    "type": "object", "properties": {"n": {"$ref": "#/definitions/n"}}})"));
  EXPECT_TRUE(v.violations(Json::parse(R"({"n": 2})")).empty());
  EXPECT_FALSE(v.violations(Json::parse(R"({"n": 2.5})")).empty());
}

}  // namespace
}  // namespace deg::schema
