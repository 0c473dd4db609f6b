// JSON (nlohmann::json) with deg's errors: parse failures name the file and the byte position;
// typed access names the JSON pointer of the value that was missing or of the wrong type.
// Every JSON text deg reads from outside (schemas, JSON Lines, config.json, deg.json,
// tokenizer.json, safetensors headers) has its nesting depth checked before it is parsed, so
// code that walks a parsed value recursively (copies, dumps, the schema compiler) stays within
// the stack.
#pragma once

#include <filesystem>
#include <string>

#include "deg/json.h"  // Json, OrderedJson, kMaxJsonDepth, json_parse, json_parse_ordered

namespace deg {

// Throws deg::Error (format) naming `what` and the byte where `text` nests deeper than
// `max_depth` arrays and objects. A linear scan that allocates nothing.
void json_check_depth(std::string_view text, const std::string& what,
                      int64_t max_depth = kMaxJsonDepth);

// Reads and parses a file.
Json json_load(const std::filesystem::path& path);

// "/a/b/0": a JSON pointer with RFC 6901 escaping of each token.
std::string json_pointer_join(const std::string& base, const std::string& token);

const char* json_type_name(const Json& j);

}  // namespace deg
