// The text layouts (DESIGN.md §3, the seed's Renderer) pinned byte for byte, and the
// Python-compatible JSON text of KNOWN VALUES checked against Python's json module
// (fixtures/schema/python_json_cases.json, written by python_json.py).
#include <gtest/gtest.h>

#include "schema/json_text.h"
#include "schema/render.h"
#include "test_util.h"

namespace deg::schema {
namespace {

Plan plan_of(const std::string& text) {
  return plan_compile(schema_parse(text, "test"));
}

TEST(SchemaRender, ChoiceQueryLayout) {
  const Plan plan = plan_of(R"({"properties":{"kind":{"title":"Kind","enum":["spam","ham"],
      "description":"spam is unsolicited\n bulk mail"}}})");
  const RenderedQuery q = render_query(plan.root.children[0], {});
  EXPECT_EQ(q.header,
            "FIELD /kind\nTYPE: string\nTITLE: Kind\nDESCRIPTION: spam is unsolicited "
            "bulk mail\n");
  EXPECT_EQ(query_text(q), q.header + "OPTIONS:\n- spam\n- ham\nANSWER:");
  const std::vector<TextPiece> pieces = query_pieces(q);
  ASSERT_EQ(pieces.size(), 7u);
  EXPECT_EQ(pieces[1].text, "OPTIONS:\n");
  EXPECT_EQ(pieces[2].text, "- spam");
  EXPECT_TRUE(pieces[2].option_end);
  EXPECT_EQ(pieces[3].text, "\n");
  EXPECT_FALSE(pieces[3].option_end);
  EXPECT_EQ(pieces[4].text, "- ham");
  EXPECT_TRUE(pieces[4].option_end);
  EXPECT_EQ(pieces[6].text, "ANSWER:");
}

TEST(SchemaRender, ExtractInsideAnchoredItem) {
  const Plan plan = plan_of(R"({"properties":{"items":{"type":"array","items":{"type":"object",
      "properties":{"price":{"type":"number","format":"decimal"}}}}}})");
  const Field& price = plan.root.children[0].children[0].children[0];
  const std::string long_text =
      "Widget  A,\n12 pcs at 4.99 each; then a very long tail that goes on "
      "and on";
  const RenderedQuery q = render_query(
      price, {.indices = {2}, .item = ItemLine{.mode = ItemLine::Mode::anchor, .text = long_text}});
  // Whitespace runs collapse, then the quote keeps the first 64 code points.
  EXPECT_EQ(query_text(q),
            "FIELD /items/2/price\nTYPE: number\nFORMAT: decimal\nITEM: \"Widget A, 12 pcs at 4.99 "
            "each; then a very long tail that goes o\"\nANSWER:");
}

TEST(SchemaRender, IndexModeItemLine) {
  const Plan plan = plan_of(R"({"properties":{"a":{"type":"array","items":{"type":"string"}}}})");
  const Field& item = plan.root.children[0].children[0];
  const RenderedQuery q = render_query(
      item,
      {.indices = {1}, .item = ItemLine{.mode = ItemLine::Mode::index, .index = 1, .count = 3}});
  EXPECT_EQ(query_text(q), "FIELD /a/1\nTYPE: string\nITEM 2 of 3\nANSWER:");
  // The array's own query (anchor or count) has no item line at the top level.
  EXPECT_EQ(query_text(render_query(plan.root.children[0], {})),
            "FIELD /a\nTYPE: array of string\nANSWER:");
}

TEST(SchemaRender, MultiSelectOptionQuery) {
  const Plan plan = plan_of(R"({"properties":{"t":{"type":"array","description":"colors",
      "items":{"enum":["red","blue"]}}}})");
  const Field& blue = plan.root.children[0].children[1];
  EXPECT_EQ(query_text(render_query(blue, {})),
            "FIELD /t\nTYPE: array of string\nDESCRIPTION: colors\nOPTION: blue\nANSWER:");
}

TEST(SchemaRender, GenerateLayout) {
  const Plan plan = plan_of(R"({"properties":{"a":{"type":"integer"},"s":{"type":"string",
      "x-generate":true,"description":"one line summary"}}})");
  const std::string known =
      known_block({{"/a", Json(3)}, {"/b", Json::parse(R"({"x":[1,2.5]})")}, {"/c", Json("é\n")}});
  EXPECT_EQ(known, "KNOWN VALUES:\n/a = 3\n/b = {\"x\": [1, 2.5]}\n/c = \"é\\n\"\n");
  EXPECT_EQ(known_block({}), "KNOWN VALUES:\n");
  EXPECT_EQ(generate_header(plan.root.children[1], {}),
            "WRITE /s\nTYPE: string\nDESCRIPTION: one line summary\nVALUE:\n");
}

TEST(SchemaRender, TrunkPieces) {
  const auto pieces = trunk_pieces("<bos>CONTEXT:\n", "the document");
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "<bos>CONTEXT:\n");
  EXPECT_EQ(pieces[1].text, "the document");
  EXPECT_EQ(pieces[2].text, "\n");
}

TEST(SchemaRender, JsonDumpsMatchesPython) {
  const Json cases = json_load(testing::fixture_path("schema/python_json_cases.json"));
  ASSERT_GT(cases.size(), 250u);
  for (const Json& c : cases) {
    const Json value = Json::parse(c[0].get<std::string>());
    // Objects: nlohmann::json sorts keys; the fixture's objects are written in sorted order.
    EXPECT_EQ(json_dumps(value), c[1].get<std::string>()) << c[0];
  }
}

TEST(SchemaRender, OneLine) {
  EXPECT_EQ(one_line("  a\n\tb  \u00a0c \n"), "a b c");
  EXPECT_EQ(one_line(""), "");
}

}  // namespace
}  // namespace deg::schema
