// Plan tables: schema -> fields (pointer, kind, TYPE text, flags, options), and schemas that
// must be rejected with the JSON pointer of the part at fault. Each row is one rule of
// docs/schema.md.
#include <gtest/gtest.h>

#include "core/error.h"
#include "schema/plan.h"

namespace deg::schema {
namespace {

// "pointer kind [type] {flags} options" per field, depth-first, the root left out.
std::vector<std::string> summary(const std::string& schema_text, PlanOptions options = {}) {
  const Plan plan = plan_compile(schema_parse(schema_text, "test"), options);
  std::vector<std::string> out;
  plan_visit(plan.root, [&](const Field& f) {
    if (&f == &plan.root) return;
    std::string s = f.pointer + " " + field_kind_name(f.kind) + " [" + f.type + "]";
    if (f.required) s += " req";
    if (f.nullable) s += " null";
    if (f.null_masked) s += " masked";
    if (!f.options.empty()) {
      s += " {";
      for (size_t i = 0; i < f.options.size(); ++i) s += (i ? "|" : "") + f.options[i].text;
      s += "}";
    }
    out.push_back(s);
  });
  return out;
}

struct PlanRow {
  const char* name;
  const char* schema;
  std::vector<std::string> fields;
};

class PlanTable : public ::testing::TestWithParam<PlanRow> {};

TEST_P(PlanTable, Fields) {
  const PlanRow& row = GetParam();
  EXPECT_EQ(summary(row.schema), row.fields) << row.schema;
}

const PlanRow kRows[] = {
    {"enum_is_choice",
     R"({"type":"object","properties":{"k":{"enum":["spam","ham"]}},"required":["k"]})",
     {"/k choice [string] req {spam|ham}"}},
    {"const_is_choice", R"({"properties":{"v":{"const":2}}})", {"/v choice [integer] {2}"}},
    {"anyof_consts_is_choice",
     R"({"properties":{"c":{"anyOf":[{"const":"a","title":"A"},{"const":"b"}]}}})",
     {"/c choice [string] {a|b}"}},
    {"oneof_consts_with_null_is_nullable_choice",
     R"({"properties":{"c":{"oneOf":[{"enum":["x","y"]},{"type":"null"}]}}})",
     {"/c choice [string or null] null {x|y|null}"}},
    {"enum_filtered_by_type",
     R"({"properties":{"c":{"type":"string","enum":["a",1,null]}}})",
     {"/c choice [string] {a}"}},
    {"colliding_option_texts_become_json",
     R"({"properties":{"c":{"enum":["1",1,true]}}})",
     {"/c choice [string or integer or boolean] {\"1\"|1|true}"}},
    {"integer_range_is_score",
     R"({"properties":{"s":{"type":"integer","minimum":1,"maximum":5}}})",
     {"/s score [integer] {1|2|3|4|5}"}},
    {"exclusive_bounds_narrow_the_score",
     R"({"properties":{"s":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":4}}})",
     {"/s score [integer] {1|2|3}"}},
    {"wide_integer_range_is_extract",
     R"({"properties":{"n":{"type":"integer","minimum":0,"maximum":11}}})",
     {"/n extract [integer]"}},
    {"x_levels_labels_on_integer",
     R"({"properties":{"q":{"type":"integer","minimum":1,"x-levels":["poor","ok","great"]}}})",
     {"/q score [integer] {poor|ok|great}"}},
    {"x_levels_values_on_string",
     R"({"properties":{"q":{"type":["string","null"],"x-levels":["low","high"]}}})",
     {"/q score [string or null] null {low|high|null}"}},
    {"boolean_is_noul", R"({"properties":{"b":{"type":"boolean"}}})", {"/b bool [boolean]"}},
    {"nullable_boolean_is_choice",
     R"({"properties":{"b":{"type":["boolean","null"]}}})",
     {"/b choice [boolean or null] null {true|false|null}"}},
    {"required_string_masks_null",
     R"({"properties":{"s":{"type":"string"},"t":{"type":"string"}},"required":["s"]})",
     {"/s extract [string] req masked", "/t extract [string]"}},
    {"nullable_required_string_keeps_null",
     R"({"properties":{"s":{"type":["string","null"]}},"required":["s"]})",
     {"/s extract [string or null] req null"}},
    {"anyof_with_null_is_nullable",
     R"({"properties":{"s":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["s"]})",
     {"/s extract [number or null] req null"}},
    {"required_inside_optional_object_is_not_masked",
     R"({"properties":{"o":{"type":"object","properties":{"e":{"type":"string"}},
        "required":["e"]}}})",
     {"/o object [object]", "/o/e extract [string] req"}},
    {"number_types_union",
     R"({"properties":{"n":{"type":["integer","string"]}}})",
     {"/n extract [integer or string]"}},
    {"scalar_subset_of_mixed_union",
     R"({"properties":{"n":{"type":["object","string"]}}})",
     {"/n extract [string]"}},
    {"untyped_is_string_extract",
     R"({"properties":{"x":{"description":"anything"}}})",
     {"/x extract [string]"}},
    {"x_generate",
     R"({"properties":{"g":{"type":"string","x-generate":true,"maxLength":40}}})",
     {"/g generate [string]"}},
    {"array_of_strings_is_anchor",
     R"({"properties":{"a":{"type":"array","items":{"type":"string"}}}})",
     {"/a anchor [array of string]", "/a/* extract [string] req masked"}},
    {"array_of_objects_without_extract_is_count",
     R"({"properties":{"a":{"type":"array","items":{"type":"object","properties":{
        "ok":{"type":"boolean"}}}}}})",
     {"/a count [array of object]", "/a/* object [object] req", "/a/*/ok bool [boolean]"}},
    {"array_of_objects_with_extract_is_anchor",
     R"({"properties":{"a":{"type":"array","items":{"type":"object","properties":{
        "n":{"type":"string"}},"required":["n"]}}}})",
     {"/a anchor [array of object]", "/a/* object [object] req",
      "/a/*/n extract [string] req masked"}},
    {"array_of_enum_is_multi_select",
     R"({"properties":{"t":{"type":"array","items":{"enum":["red","blue"]}}}})",
     {"/t multi_select [array of string] {red|blue}", "/t bool [array of string] req {red}",
      "/t bool [array of string] req {blue}"}},
    {"ref_and_defs",
     R"({"$defs":{"p":{"type":"object","properties":{"n":{"type":"string"}}}},
        "properties":{"a":{"$ref":"#/$defs/p"},"b":{"$ref":"#/$defs/p"}}})",
     {"/a object [object]", "/a/n extract [string]", "/b object [object]",
      "/b/n extract [string]"}},
    {"definitions_with_percent_escape",
     R"({"definitions":{"a b":{"type":"integer"}},"properties":{"x":{"$ref":"#/definitions/a%20b"}}})",
     {"/x extract [integer]"}},
    {"allof_merges_properties_and_required",
     R"({"allOf":[{"properties":{"a":{"type":"string"}}},{"properties":{"b":{"type":"string"}},
        "required":["b"]}]})",
     {"/a extract [string]", "/b extract [string] req masked"}},
    {"recursive_ref_unrolled_where_optional",
     R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"string"},
        "next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"})",
     {"/v extract [string]", "/next object [object]", "/next/v extract [string]",
      "/next/next object [object]", "/next/next/v extract [string]"}},
    {"benign_keywords_ignored",
     R"({"$schema":"http://json-schema.org/draft-07/schema#","$id":"x","additionalProperties":false,
        "properties":{"a":{"type":"string","default":"d","examples":["e"],"$comment":"c",
        "readOnly":true,"x-other":1}}})",
     {"/a extract [string]"}},
    {"required_undeclared_is_any_value",
     R"({"properties":{},"required":["z"]})",
     {"/z extract [string] req masked"}},
    {"false_schema_optional_dropped",
     R"({"properties":{"a":false,"b":{"type":"string"}}})",
     {"/b extract [string]"}},
    {"json_pointer_escapes",
     R"({"properties":{"a/b":{"type":"string"},"c~d":{"type":"string"}}})",
     {"/a~1b extract [string]", "/c~0d extract [string]"}},
};

INSTANTIATE_TEST_SUITE_P(SchemaPlan, PlanTable, ::testing::ValuesIn(kRows),
                         [](const auto& info) { return std::string(info.param.name); });

struct RejectRow {
  const char* name;
  const char* schema;
  ErrorKind kind;
  const char* pointer;
};

class RejectTable : public ::testing::TestWithParam<RejectRow> {};

TEST_P(RejectTable, NamesThePointer) {
  const RejectRow& row = GetParam();
  try {
    plan_compile(schema_parse(row.schema, "test"));
    FAIL() << "planned: " << row.schema;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), row.kind) << e.what();
    EXPECT_EQ(e.context().pointer, row.pointer) << e.what();
    EXPECT_NE(std::string(e.what()).find(row.pointer), std::string::npos) << e.what();
  }
}

const RejectRow kRejects[] = {
    {"pattern_properties", R"({"properties":{"m":{"patternProperties":{"^x":{}}}}})",
     ErrorKind::unsupported, "/properties/m/patternProperties"},
    {"not", R"({"properties":{"a":{"not":{"type":"string"}}}})", ErrorKind::unsupported,
     "/properties/a/not"},
    {"if_then_else", R"({"if":{"properties":{"a":{"const":1}}},"then":{"required":["b"]}})",
     ErrorKind::unsupported, "/if"},
    {"tuple_items", R"({"properties":{"t":{"type":"array","items":[{"type":"string"}]}}})",
     ErrorKind::unsupported, "/properties/t/items"},
    {"prefix_items", R"({"properties":{"t":{"type":"array","prefixItems":[{"type":"string"}]}}})",
     ErrorKind::unsupported, "/properties/t/prefixItems"},
    {"map_with_free_keys",
     R"({"properties":{"m":{"type":"object","additionalProperties":{"type":"string"}}}})",
     ErrorKind::unsupported, "/properties/m/additionalProperties"},
    {"recursive_required", R"({"$defs":{"n":{"type":"object","properties":{"next":
        {"$ref":"#/$defs/n"}},"required":["next"]}},"properties":{"root":{"$ref":"#/$defs/n"}},
        "required":["root"]})",
     ErrorKind::unsupported, "/$defs/n/properties/next/$ref"},
    {"structured_union",
     R"({"properties":{"u":{"oneOf":[{"type":"object","properties":{"a":{"type":"string"}}},
        {"type":"array"}]}}})",
     ErrorKind::unsupported, "/properties/u/oneOf"},
    {"external_ref", R"({"properties":{"a":{"$ref":"other.json#/x"}}})", ErrorKind::unsupported,
     "/properties/a/$ref"},
    {"dangling_ref", R"({"properties":{"a":{"$ref":"#/definitions/none"}}})", ErrorKind::format,
     "/properties/a/$ref"},
    {"bad_pattern", R"({"properties":{"a":{"type":"string","pattern":"(unclosed"}}})",
     ErrorKind::unsupported, "/properties/a/pattern"},
    {"unknown_type", R"({"properties":{"a":{"type":"date"}}})", ErrorKind::format,
     "/properties/a/type"},
    {"enum_without_fitting_value", R"({"properties":{"a":{"type":"integer","enum":["x"]}}})",
     ErrorKind::unsupported, "/properties/a/enum"},
    {"x_generate_on_number", R"({"properties":{"a":{"type":"number","x-generate":true}}})",
     ErrorKind::unsupported, "/properties/a/x-generate"},
    {"allof_conflict", R"({"properties":{"a":{"allOf":[{"pattern":"a"},{"pattern":"b"}]}}})",
     ErrorKind::unsupported, "/properties/a/allOf/1/pattern"},
    {"min_length_above_max",
     R"({"properties":{"a":{"type":"string","minLength":5,"maxLength":2}}})",
     ErrorKind::unsupported, "/properties/a/minLength"},
    {"ref_cycle_without_properties",
     R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},
        "properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]})",
     ErrorKind::unsupported, "/$defs/b/$ref"},
};

INSTANTIATE_TEST_SUITE_P(SchemaPlan, RejectTable, ::testing::ValuesIn(kRejects),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SchemaPlan, FieldBudgetRejectsExplodingSchemas) {
  // Each level doubles the fields: 2^13 leaves exceed the default budget of 5000 units.
  std::string schema = R"({"type":"string"})";
  for (int i = 0; i < 13; ++i) {
    schema = R"({"type":"object","properties":{"a":)" + schema + R"(,"b":)" + schema + "}}";
  }
  try {
    plan_compile(schema_parse(schema, "test"));
    FAIL() << "an exploding schema planned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(e.message().find("budget"), std::string::npos) << e.what();
    EXPECT_FALSE(e.context().pointer.empty());
  }
}

TEST(SchemaPlan, UnionDagsHitTheFoldBudget) {
  // d_i = anyOf[$ref d_i+1, $ref d_i+1], d_30 a string: no recursion, but folding d_0 visits
  // 2^30 parts. The fold budget rejects it instead of hanging.
  std::string defs;
  for (int i = 0; i < 30; ++i) {
    const std::string next = R"({"$ref":"#/$defs/d)" + std::to_string(i + 1) + "\"}";
    defs += "\"d" + std::to_string(i) + R"(":{"anyOf":[)" + next + "," + next + "]},";
  }
  defs += R"("d30":{"type":"string","minLength":1})";
  const std::string schema =
      R"({"$defs":{)" + defs + R"(},"properties":{"x":{"$ref":"#/$defs/d0"}}})";
  try {
    plan_compile(schema_parse(schema, "test"));
    FAIL() << "planned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
    EXPECT_NE(e.message().find("budget"), std::string::npos) << e.what();
    EXPECT_FALSE(e.context().pointer.empty());
  }
}

TEST(SchemaPlan, IndexModeMakesEveryArrayCount) {
  const auto fields = summary(R"({"properties":{"a":{"type":"array","items":{"type":"string"}}}})",
                              {.array_mode = ArrayMode::index});
  EXPECT_EQ(fields.front(), "/a count [array of string]");
}

TEST(SchemaPlan, GenerateTokensFromMaxLength) {
  const Plan plan = plan_compile(schema_parse(
      R"({"properties":{"g":{"type":"string","x-generate":true,"maxLength":40},
          "h":{"type":"string","x-generate":true}}})",
      "test"));
  EXPECT_EQ(plan.root.children[0].max_tokens, 40);
  EXPECT_EQ(plan.root.children[1].max_tokens, PlanOptions{}.generate_tokens);
}

TEST(SchemaPlan, ExtractKeepsValueConstraints) {
  const Plan plan = plan_compile(schema_parse(
      R"({"properties":{"d":{"type":"string","format":"date","pattern":"^2","minLength":10,
          "maxLength":10},"n":{"type":"number","minimum":0,"exclusiveMaximum":100}}})",
      "test"));
  const Field& d = plan.root.children[0];
  EXPECT_EQ(d.format, "date");
  ASSERT_TRUE(d.value.pattern);
  EXPECT_EQ(d.value.pattern->source(), "^2");
  EXPECT_EQ(d.value.min_length, 10);
  EXPECT_EQ(d.value.max_length, 10);
  const Field& n = plan.root.children[1];
  EXPECT_EQ(n.value.minimum, 0.0);
  EXPECT_EQ(n.value.exclusive_maximum, 100.0);
  EXPECT_FALSE(n.value.maximum.has_value());
}

TEST(SchemaPlan, FindAndConcretePointers) {
  const Plan plan = plan_compile(schema_parse(
      R"({"properties":{"items":{"type":"array","items":{"type":"object","properties":{
          "price":{"type":"number"}}}},"a/b":{"type":"string"}}})",
      "test"));
  const Field* price = plan_find(plan, "/items/3/price");
  ASSERT_NE(price, nullptr);
  EXPECT_EQ(price->pointer, "/items/*/price");
  EXPECT_EQ(field_pointer(*price, {3}), "/items/3/price");
  EXPECT_EQ(plan_find(plan, "/a~1b")->pointer, "/a~1b");
  EXPECT_EQ(plan_find(plan, "/items/x/price"), nullptr);
  EXPECT_EQ(plan_find(plan, "/missing"), nullptr);
  EXPECT_EQ(plan_find(plan, ""), &plan.root);
}

TEST(SchemaPlan, SchemaOrderIsKept) {
  const Plan plan = plan_compile(
      schema_parse(R"({"properties":{"z":{"type":"string"},"a":{"type":"string"}}})", "test"));
  ASSERT_EQ(plan.root.children.size(), 2u);
  EXPECT_EQ(plan.root.children[0].key(), "z");
  EXPECT_EQ(plan.root.children[1].key(), "a");
}

TEST(SchemaPlan, InvalidJsonNamesTheFile) {
  try {
    schema_parse("{\"a\": ", "s.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::format);
    EXPECT_EQ(e.context().path, "s.json");
  }
}

}  // namespace
}  // namespace deg::schema
