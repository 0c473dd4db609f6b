// JSON values as the text the model reads: Python's `json.dumps(v, ensure_ascii=False)` layout
// (", " and ": " separators, non-ASCII kept, floats as Python's repr), which the seed used for
// KNOWN VALUES lines, and one-line text for header lines and option lines.
#pragma once

#include <string>
#include <string_view>

#include "io/json.h"

namespace deg::schema {

// json.dumps(value, ensure_ascii=False) as Python writes it.
std::string json_dumps(const Json& value);
std::string json_dumps(const OrderedJson& value);

// `text` with every whitespace run (newlines included) replaced by one space, and trimmed: header
// and option lines must stay one line each.
std::string one_line(std::string_view text);

}  // namespace deg::schema
