// JSON for users of the public API: the nlohmann types deg's values come in, and the parser deg
// reads outside JSON with (nesting depth checked before parsing, errors as deg::Error naming the
// source and the byte).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deg {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Arrays and objects may nest this deep in any JSON text deg reads (docs/hardening.md).
inline constexpr int64_t kMaxJsonDepth = 256;

// Parses `text`; on failure throws deg::Error (format) with `what` (a path or a name) as context.
Json json_parse(std::string_view text, const std::string& what);
// The same, keeping the order of object keys (schemas).
OrderedJson json_parse_ordered(std::string_view text, const std::string& what);

}  // namespace deg
