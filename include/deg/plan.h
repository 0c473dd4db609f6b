// A JSON Schema compiled into deg's field plan, without a model: what `deg plan` prints and
// `POST /v1/plan` answers (Engine::fill compiles the same plan itself). docs/schema.md lists how
// each construct maps to a field kind.
#pragma once

#include <cstdint>
#include <string>

#include "deg/json.h"

namespace deg {

// How arrays are addressed by the checkpoint (the seed's `array_mode`): anchor checkpoints find
// items by position anchors; index checkpoints count, then ask "ITEM i of n".
enum class ArrayMode : uint8_t { anchor, index };

// Schema files and schema texts are at most this big (docs/hardening.md); a bigger one is
// refused unread.
inline constexpr int64_t kMaxSchemaBytes = int64_t(8) << 20;  // 8 MiB

// A schema file, parsed keeping key order (fields follow the schema's order). Throws deg::Error
// naming the path (and the byte, for broken JSON).
OrderedJson schema_load(const std::string& path);

struct PlanSummary {
  // {"units", "fields": [{"pointer", "kind", "required", "nullable", "type", "title",
  // "description", "format", "options", "schema_pointer", "query" | "generate", ...}]}
  OrderedJson json;
  std::string text;       // one block per field: "<pointer>  <kind>  <flags>", its query text
  int64_t fields = 0;     // every field, objects included
  int64_t queries = 0;    // queries per document before array items
  int64_t units = 0;      // budget units spent (fields + option lines) ...
  int64_t max_units = 0;  // ... of this many
};

// Compiles `schema`. Throws deg::Error (unsupported / format) whose context().pointer names the
// part of the schema at fault.
PlanSummary plan_describe(const OrderedJson& schema, ArrayMode array_mode = ArrayMode::anchor);

}  // namespace deg
