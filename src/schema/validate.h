// JSON Schema validation of values (valijson, draft 7 keywords): the check every filled output
// must pass. One translation unit instantiates valijson, so callers pay nothing for its headers.
#pragma once

#include <string>
#include <vector>

#include "io/json.h"

namespace deg::schema {

// What makes `value` invalid against `schema`: one "where: reason" line per violation (where:
// valijson's path, e.g. ["items"][0]), empty when it validates. A "$schema" keyword is ignored
// (valijson reads the keywords, not the dialect URI).
std::vector<std::string> schema_violations(const Json& schema, const Json& value);
std::vector<std::string> schema_violations(const OrderedJson& schema, const OrderedJson& value);

}  // namespace deg::schema
