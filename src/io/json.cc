#include "io/json.h"

#include "core/buffer.h"
#include "core/error.h"

namespace deg {

void json_check_depth(std::string_view text, const std::string& what, int64_t max_depth) {
  int64_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        throw Error(ErrorKind::format,
                    fmt::format("JSON nests deeper than {} arrays and objects (at byte {}); deg "
                                "reads no input nested that deep",
                                max_depth, i),
                    {.path = what});
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

namespace {

template <class J>
J parse_checked(std::string_view text, const std::string& what) {
  json_check_depth(text, what);
  try {
    return J::parse(text.begin(), text.end());
  } catch (const typename J::parse_error& e) {
    throw Error(ErrorKind::format, fmt::format("invalid JSON at byte {}: {}", e.byte, e.what()),
                {.path = what});
  } catch (const typename J::out_of_range& e) {
    // A number beyond double's range (1e400): nlohmann reports it as out_of_range, not as a
    // parse error (found by fuzz/hf_config_fuzz).
    throw Error(ErrorKind::format,
                fmt::format("invalid JSON: {}", std::string_view(e.what()).substr(0, 200)),
                {.path = what});
  }
}

}  // namespace

Json json_parse(std::string_view text, const std::string& what) {
  return parse_checked<Json>(text, what);
}

OrderedJson json_parse_ordered(std::string_view text, const std::string& what) {
  return parse_checked<OrderedJson>(text, what);
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
