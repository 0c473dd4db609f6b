// A compiled plan as data and as text, for `deg plan` (and anyone who wants to show a plan):
// every field's template pointer, kind, flags, options and the query text it would be asked
// with, rendered at an example place (first item of every array, a placeholder item quote).
#pragma once

#include <string>

#include "io/json.h"
#include "schema/plan.h"

namespace deg::schema {

// {"units", "fields": [{"pointer", "kind", "required", "nullable", "type", "title",
// "description", "format", "options", "schema_pointer", "query" | "generate", ...}]}
OrderedJson plan_to_json(const Plan& plan);

// One block per field: "<pointer>  <kind>  <flags>" then its query text, indented.
std::string plan_to_text(const Plan& plan);

}  // namespace deg::schema
