// The six evaluation schemas of ../shared/data plan, with the field kinds their data needs:
// intents are choices over the schema's enum, slot and entity lists are anchor arrays of string
// extracts, and the e-mail schema mixes extracts, a choice and a uri array. Counts are checked
// against an independent walk of the raw schema JSON. Also `deg plan` end to end.
#include <gtest/gtest.h>

#include <map>

#include "schema/plan.h"
#include "schema/render.h"
#include "test_util.h"

namespace deg::schema {
namespace {

std::filesystem::path data_schema(const std::string& name) {
  return testing::source_path("../shared/data/" + name + "/schema.json");
}

std::map<std::string, int> kind_counts(const Plan& plan) {
  std::map<std::string, int> out;
  plan_visit(plan.root, [&](const Field& f) { ++out[field_kind_name(f.kind)]; });
  return out;
}

// Array-typed properties and enum properties anywhere under `schema`, walking the raw JSON.
void count_raw(const OrderedJson& schema, int& arrays, int& enums) {
  if (!schema.contains("properties")) return;
  for (const auto& [key, sub] : schema["properties"].items()) {
    if (sub.contains("enum")) ++enums;
    if (sub.value("type", "") == "array") ++arrays;
    count_raw(sub, arrays, enums);
  }
}

class RealSchema : public ::testing::TestWithParam<const char*> {};

TEST_P(RealSchema, PlansWithTheKindsItsDataNeeds) {
  const std::string path = data_schema(GetParam()).string();
  const OrderedJson schema = schema_load(path);
  const Plan plan = plan_compile(schema);
  int arrays = 0, enums = 0;
  count_raw(schema, arrays, enums);
  std::map<std::string, int> kinds = kind_counts(plan);
  EXPECT_EQ(kinds["anchor"], arrays) << path;
  EXPECT_EQ(kinds["choice"], enums) << path;
  // Every anchor array holds one string extract item, its null outcome masked.
  plan_visit(plan.root, [&](const Field& f) {
    if (f.kind != FieldKind::anchor) return;
    ASSERT_EQ(f.children.size(), 1u);
    EXPECT_EQ(f.children[0].kind, FieldKind::extract) << f.pointer;
    EXPECT_TRUE(f.children[0].null_masked) << f.pointer;
    EXPECT_EQ(f.children[0].pointer, f.pointer + "/*");
  });
  // In index mode the same arrays are counted instead.
  const Plan indexed = plan_compile(schema, {.array_mode = ArrayMode::index});
  EXPECT_EQ(kind_counts(indexed)["count"], arrays);
  EXPECT_EQ(kind_counts(indexed)["anchor"], 0);
}

INSTANTIATE_TEST_SUITE_P(SchemaReal, RealSchema,
                         ::testing::Values("atis", "conll2003", "emails", "mit_movie",
                                           "mit_restaurant", "snips"));

TEST(SchemaReal, IntentChoicesFollowTheEnum) {
  for (const char* name : {"atis", "snips"}) {
    const OrderedJson schema = schema_load(data_schema(name).string());
    const Plan plan = plan_compile(schema);
    const Field* intent = plan_find(plan, "/intent");
    ASSERT_NE(intent, nullptr);
    EXPECT_EQ(intent->kind, FieldKind::choice);
    ASSERT_EQ(intent->options.size(), schema["properties"]["intent"]["enum"].size());
    for (size_t i = 0; i < intent->options.size(); ++i) {
      EXPECT_EQ(intent->options[i].text,
                schema["properties"]["intent"]["enum"][i].get<std::string>());
    }
  }
}

TEST(SchemaReal, EmailsFieldByField) {
  const Plan plan = plan_compile(schema_load(data_schema("emails").string()));
  std::vector<std::string> fields;
  plan_visit(plan.root,
             [&](const Field& f) { fields.push_back(f.pointer + " " + field_kind_name(f.kind)); });
  const std::vector<std::string> want = {
      " object",          "/sender object", "/sender/name extract", "/sender/email extract",
      "/subject extract", "/sent extract",  "/kind choice",         "/links anchor",
      "/links/* extract"};
  EXPECT_EQ(fields, want);
  EXPECT_EQ(plan_find(plan, "/sender/email")->value.format, "email");
  EXPECT_EQ(plan_find(plan, "/links/0")->value.format, "uri");
  // sender is optional, so its required email may come out null (then sender is left out).
  EXPECT_FALSE(plan_find(plan, "/sender/email")->null_masked);
  EXPECT_TRUE(plan_find(plan, "/kind")->required);
}

TEST(SchemaReal, DegPlanCommand) {
  const auto out = testing::run_deg({"plan", "--schema", data_schema("emails").string()});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_NE(out.out.find("/kind  choice  (required)"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("    OPTIONS:\n    - spam\n    - ham\n    ANSWER:"), std::string::npos);

  const auto json = testing::run_deg({"plan", "--schema", data_schema("snips").string(), "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const Json j = Json::parse(json.out);
  EXPECT_EQ(j["fields"][1]["pointer"], "/intent");
  EXPECT_EQ(j["fields"][1]["kind"], "choice");
  EXPECT_EQ(j["fields"][1]["query"].get<std::string>().substr(0, 15), "FIELD /intent\nT");
}

TEST(SchemaReal, DegPlanRejectsWithPointer) {
  testing::TempDir dir;
  testing::write_text(dir / "s.json", R"({"properties":{"m":{"patternProperties":{"^x":{}}}}})");
  const auto out = testing::run_deg({"plan", "--schema", (dir / "s.json").string()});
  EXPECT_NE(out.exit_code, 0);
  EXPECT_NE(out.err.find("at /properties/m/patternProperties"), std::string::npos) << out.err;
  const auto json = testing::run_deg({"plan", "--schema", (dir / "s.json").string(), "--json"});
  EXPECT_NE(json.exit_code, 0);
  EXPECT_EQ(Json::parse(json.out)["error"]["pointer"], "/properties/m/patternProperties");

  testing::write_text(dir / "bad.json", "{\"a\": ");
  const auto bad = testing::run_deg({"plan", "--schema", (dir / "bad.json").string()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("invalid JSON"), std::string::npos) << bad.err;
  const auto missing = testing::run_deg({"plan", "--schema", (dir / "none.json").string()});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_FALSE(missing.err.empty());
}

}  // namespace
}  // namespace deg::schema
