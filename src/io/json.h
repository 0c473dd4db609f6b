// JSON (nlohmann::json) with deg's errors: parse failures name the file and the byte position;
// typed access names the JSON pointer of the value that was missing or of the wrong type.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace deg {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Parses `text`; on failure throws deg::Error (format) with `what` (a path or a name) as context.
Json json_parse(std::string_view text, const std::string& what);
// Reads and parses a file.
Json json_load(const std::filesystem::path& path);

// "/a/b/0": a JSON pointer with RFC 6901 escaping of each token.
std::string json_pointer_join(const std::string& base, const std::string& token);

const char* json_type_name(const Json& j);

}  // namespace deg
