// Fuzz target: JSON Schema text through schema_parse and plan_compile (the fill plan), then the
// plan's JSON and text views. Any deg::Error is a correct answer; a crash, a sanitizer report or
// any other exception is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "schema/plan.h"
#include "schema/plan_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const deg::OrderedJson schema = deg::schema::schema_parse(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    const deg::schema::Plan plan = deg::schema::plan_compile(schema);
    (void)deg::schema::plan_to_json(plan);
    (void)deg::schema::plan_to_text(plan);
  } catch (const deg::Error&) {
  }
  return 0;
}
