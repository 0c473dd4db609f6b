// Text layouts (render.h). The line formats are fixed here once; changing any of them changes
// what a trained checkpoint reads, so tests pin them.
#include "schema/render.h"

#include "core/error.h"
#include "schema/json_text.h"
#include "schema/spans.h"

namespace deg::schema {

namespace {

std::string item_line(const ItemLine& item) {
  if (item.mode == ItemLine::Mode::index) {
    return fmt::format("ITEM {} of {}\n", item.index + 1, item.count);
  }
  std::string quote = one_line(item.text);
  if (auto cps = utf8_to_code_points(quote); cps && int64_t(cps->size()) > kItemQuoteChars) {
    quote = code_points_to_utf8(std::u32string_view(*cps).substr(0, size_t(kItemQuoteChars)));
  }
  return fmt::format("ITEM: {}\n", json_dumps(Json(quote)));
}

bool is_query_kind(FieldKind kind) {
  return kind != FieldKind::object && kind != FieldKind::multi_select;
}

}  // namespace

std::string field_lines(const Field& field, const QueryPlace& place) {
  std::string out;
  if (!field.type.empty()) out += fmt::format("TYPE: {}\n", field.type);
  if (!field.title.empty()) out += fmt::format("TITLE: {}\n", field.title);
  if (!field.description.empty()) out += fmt::format("DESCRIPTION: {}\n", field.description);
  if (!field.format.empty()) out += fmt::format("FORMAT: {}\n", field.format);
  if (place.item) out += item_line(*place.item);
  if (field.selects) {
    DEG_CHECK(field.options.size() == 1, "{}: a multi-select boolean decides one option",
              field.pointer);
    out += fmt::format("OPTION: {}\n", field.options.front().text);
  }
  return out;
}

RenderedQuery render_query(const Field& field, const QueryPlace& place) {
  DEG_CHECK(is_query_kind(field.kind), "{} ({}) is not asked as a query", field.pointer,
            field_kind_name(field.kind));
  RenderedQuery q;
  q.header = fmt::format("FIELD {}\n", field_pointer(field, place.indices));
  q.header += field_lines(field, place);
  if (field.kind == FieldKind::choice || field.kind == FieldKind::score) {
    for (const Option& o : field.options) q.options.push_back(o.text);
  }
  return q;
}

std::vector<TextPiece> query_pieces(const RenderedQuery& query) {
  std::vector<TextPiece> pieces = {{query.header}};
  if (!query.options.empty()) {
    pieces.push_back({"OPTIONS:\n"});
    for (const std::string& text : query.options) {
      pieces.push_back({fmt::format("- {}", text), true});
      pieces.push_back({"\n"});
    }
  }
  pieces.push_back({"ANSWER:"});
  return pieces;
}

std::string query_text(const RenderedQuery& query) {
  std::string out;
  for (const TextPiece& p : query_pieces(query)) out += p.text;
  return out;
}

std::string known_block(const std::vector<std::pair<std::string, Json>>& known) {
  std::string out = "KNOWN VALUES:\n";
  for (const auto& [pointer, value] : known) {
    out += fmt::format("{} = {}\n", pointer, json_dumps(value));
  }
  return out;
}

std::string generate_header(const Field& field, const QueryPlace& place) {
  DEG_CHECK(field.kind == FieldKind::generate, "{} is not a generate field", field.pointer);
  return fmt::format("WRITE {}\n{}VALUE:\n", field_pointer(field, place.indices),
                     field_lines(field, place));
}

std::vector<TextPiece> trunk_pieces(std::string_view prefix, std::string_view context) {
  return {{std::string(prefix)}, {std::string(context)}, {"\n"}};
}

}  // namespace deg::schema
