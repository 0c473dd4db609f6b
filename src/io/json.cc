#include "io/json.h"

#include "core/buffer.h"
#include "core/error.h"

namespace deg {

Json json_parse(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw Error(ErrorKind::format, fmt::format("invalid JSON at byte {}: {}", e.byte, e.what()),
                {.path = what});
  }
}

Json json_load(const std::filesystem::path& path) {
  return json_parse(read_file(path), path.string());
}

std::string json_pointer_join(const std::string& base, const std::string& token) {
  std::string out = base + "/";
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

const char* json_type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    default: return "value";
  }
}

}  // namespace deg
