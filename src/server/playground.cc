// The playground page (playground.h): examples/NAME.schema.json with examples/NAME.txt become
// {"name", "schema", "document"} entries of a JSON array inlined in the page (an example without
// its document offers the schema alone).
#include "server/playground.h"

#include <string_view>

#include "deg/error.h"
#include "deg/json.h"
#include "server/embedded.h"

namespace deg::server {

namespace {

// The embedded file `name`, or an empty view when there is none.
std::string_view embedded(std::string_view name) {
  for (const EmbeddedFile& f : kEmbeddedFiles) {
    if (f.name == name) return f.data;
  }
  return {};
}

}  // namespace

std::string playground_page() {
  constexpr std::string_view kPrefix = "examples/", kSchema = ".schema.json";
  OrderedJson examples = OrderedJson::array();
  for (const EmbeddedFile& f : kEmbeddedFiles) {
    if (!f.name.starts_with(kPrefix) || !f.name.ends_with(kSchema)) continue;
    const std::string_view name =
        f.name.substr(kPrefix.size(), f.name.size() - kPrefix.size() - kSchema.size());
    examples.push_back({{"name", name},
                        {"schema", OrderedJson::parse(f.data)},
                        {"document", embedded(std::string(kPrefix) + std::string(name) + ".txt")}});
  }
  // Inside <script>, "</script>" or "<!--" in a string would end or bend the element: JSON may
  // write every '<' as \u003c, and '<' only ever stands inside strings.
  std::string json;
  for (const char c : examples.dump()) {
    if (c == '<') {
      json += "\\u003c";
    } else {
      json += c;
    }
  }
  std::string page(embedded("src/server/playground.html"));
  constexpr std::string_view kMarker = ">EXAMPLES<";
  const size_t at = page.find(kMarker);
  if (at == std::string::npos) {
    throw Error(
        ErrorKind::internal,
        "the playground page is not embedded, or has no EXAMPLES marker (cmake/embed.cmake)");
  }
  page.replace(at + 1, kMarker.size() - 2, json);
  return page;
}

}  // namespace deg::server
