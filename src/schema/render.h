// The text layouts the model reads (DESIGN.md §3, the seed's `Renderer`), as text: the trunk,
// one query per field, the KNOWN VALUES block and the generate header. Tokenizing is the
// engine's job; because the seed encodes some pieces separately (each option line, so its last
// token marks the option), the layouts come as ordered pieces to encode one by one.
//
//   trunk:    <bos + PREFIX> | <context> | "\n"
//   query:    "FIELD /items/0/price\nTYPE: number\nTITLE: ...\nDESCRIPTION: ...\nFORMAT: ...\n"
//             "ITEM: \"start of the item\"\n" | "OPTIONS:\n" | "- a" | "\n" | "- b" | "\n" |
//             "ANSWER:"
//   generate: "KNOWN VALUES:\n/a = \"x\"\n/b = 3\n" | "WRITE /summary\nTYPE: string\n...VALUE:\n"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/json.h"
#include "schema/plan.h"

namespace deg::schema {

// The item quote of an ITEM line holds at most this many code points of the item's text.
inline constexpr int64_t kItemQuoteChars = 64;

// The ITEM line of a query inside an array item (its innermost enclosing array).
struct ItemLine {
  enum class Mode : uint8_t { anchor, index };
  Mode mode = Mode::anchor;
  std::string text;   // anchor: the item's text from its anchor on (UTF-8; quoted, then cut)
  int64_t index = 0;  // index: 0-based item index
  int64_t count = 0;  // index: number of items
};

// Where a query is asked: the item indices of its enclosing arrays (outermost first) and, inside
// an item, that item's line.
struct QueryPlace {
  std::vector<int64_t> indices;
  std::optional<ItemLine> item;
};

struct RenderedQuery {
  std::string header;                // "FIELD /ptr\n" and the field's lines (the seed's header)
  std::vector<std::string> options;  // option texts, choice and score only
};

// One piece of a layout, encoded on its own; `option_end`: its last token is an option position.
struct TextPiece {
  std::string text;
  bool option_end = false;
};

// The query of a leaf, anchor, count or multi-select boolean field. Rendered from the field and
// its place alone, never from other fields' answers.
RenderedQuery render_query(const Field& field, const QueryPlace& place);
// header | "OPTIONS:\n" | "- a" | "\n" | ... | "ANSWER:" (no options: header | "ANSWER:").
std::vector<TextPiece> query_pieces(const RenderedQuery& query);
// The pieces joined: what the model reads.
std::string query_text(const RenderedQuery& query);

// "KNOWN VALUES:\n" then "/ptr = <json>\n" per value (Python json.dumps layout), schema order.
std::string known_block(const std::vector<std::pair<std::string, Json>>& known);
// "WRITE /ptr\n" + the field's lines + "VALUE:\n": one generate fork after the known block.
std::string generate_header(const Field& field, const QueryPlace& place);

// The trunk: `prefix` (bos + the backbone's PREFIX, one piece), the context, then "\n".
std::vector<TextPiece> trunk_pieces(std::string_view prefix, std::string_view context);

// The field's own lines (TYPE, TITLE, DESCRIPTION, FORMAT, ITEM, OPTION), each ending in "\n".
std::string field_lines(const Field& field, const QueryPlace& place);

}  // namespace deg::schema
