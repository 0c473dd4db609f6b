// JSON Schema -> Plan: the tree of fields deg fills (DESIGN.md §3). Every leaf is one query kind
// (choice, score, boolean, extract, generate); arrays are anchor or count fields with one item
// sub-field; multi-select arrays hold one boolean field per option. The compiler resolves $ref,
// folds allOf and unions of constants, and rejects what deg cannot fill with a deg::Error whose
// context.pointer names the offending part of the schema, before any model work. docs/schema.md
// lists every decision.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deg/plan.h"
#include "io/json.h"
#include "schema/value.h"

namespace deg::schema {

enum class FieldKind : uint8_t {
  object,        // no query: its children are the properties, in schema order
  choice,        // pointer head over option lines (enum, const, unions of consts, bool or null)
  score,         // pointer head over level lines (small integer ranges, x-levels)
  boolean,       // noul head: logits [l, 0] = [true, false]
  extract,       // span head over the context, plus the null outcome unless masked
  generate,      // LM head, greedy, after every other value is known (x-generate strings)
  anchor,        // array: "an item starts here" per context token; one child, the item field
  count,         // array: count head 0..64, then one query set per item; one child, the item
  multi_select,  // array of enum: one boolean child per option ("is this option in the array")
};

const char* field_kind_name(FieldKind kind);

// How arrays are addressed (deg/plan.h). In anchor mode an array whose items hold no extract
// leaf is still a count array: anchors need something to point at.
using deg::ArrayMode;

// One step of a field's path: an object key, or an array item (an index known only at run time).
struct PathToken {
  std::string key;  // empty for items
  bool item = false;
};

// One option line of a choice or score field, or one option of a multi-select array.
struct Option {
  Json value;        // the JSON value this option stands for
  std::string text;  // the text of its line (`- text`), one line, no newline
};

struct Field {
  FieldKind kind = FieldKind::object;
  std::vector<PathToken> path;
  std::string pointer;         // JSON pointer template: "/items/*/price" (`*` for each item)
  std::string schema_pointer;  // where its schema lives ("#/definitions/x" after a $ref)

  // Header lines (empty = line omitted); single-line text, whitespace runs collapsed.
  std::string type;  // TYPE: "string", "integer or null", "array of object", ...
  std::string title;
  std::string description;
  std::string format;

  std::vector<Option> options;  // choice and score: the lines; multi_select: one per child

  bool required = false;  // listed in the parent's `required` (root and items: true)
  bool nullable = false;  // the schema admits null
  // Extract: the null outcome is masked: required, not nullable, and every enclosing object up
  // to the root or the array item is required too (an optional object whose required field
  // comes out null is left out whole by the assembler instead).
  bool null_masked = false;
  ValueSpec value;         // extract and generate: what a text must be to count as a value
  int64_t max_tokens = 0;  // generate: decode budget

  int64_t min_items = 0;             // arrays
  std::optional<int64_t> max_items;  // arrays
  bool unique_items = false;         // arrays: the engine drops repeated values
  std::optional<Json> selects;       // boolean child of multi_select: the option it decides

  std::vector<Field> children;  // object: properties; anchor/count: {item}; multi_select: bools

  // The key of an object property (the last path token), "" for the root and items.
  const std::string& key() const;
  // Choice/score/boolean/extract/generate (fields that are one query each).
  bool is_leaf() const;
};

struct PlanOptions {
  ArrayMode array_mode = ArrayMode::anchor;
  int64_t max_units = 5000;       // budget: fields + option lines, beyond it the schema is rejected
  int64_t max_ref_recursion = 3;  // a $ref may be open this many times on one path
  int64_t max_depth = 48;         // nesting of objects and arrays
  int64_t generate_tokens = 256;  // x-generate strings without maxLength
  int64_t max_generate_tokens = 4096;
  int64_t score_max_levels = 11;  // integer ranges up to this many values are scores
};

struct Plan {
  Field root;
  int64_t units = 0;  // fields + option lines spent of PlanOptions::max_units
};

// Compiles a schema. Throws deg::Error: `unsupported` for constructs deg cannot fill, `format`
// for schemas that are not valid JSON Schema; context.pointer is the JSON pointer of the part at
// fault, within `schema`.
Plan plan_compile(const OrderedJson& schema, const PlanOptions& options = {});

using deg::kMaxSchemaBytes;
using deg::schema_load;  // a schema file (deg/plan.h)

// Parses schema text keeping key order (fields follow the schema's order). Throws deg::Error
// (format) naming `what` and the byte offset, or where it nests deeper than kMaxJsonDepth.
OrderedJson schema_parse(std::string_view text, const std::string& what);

// The field a concrete pointer ("/items/3/price") addresses, or nullptr.
const Field* plan_find(const Plan& plan, std::string_view pointer);

// Visits every field depth-first in schema order (parents before children).
template <typename F>
void plan_visit(const Field& field, F&& f) {
  f(field);
  for (const Field& child : field.children) plan_visit(child, f);
}

// The concrete pointer of `field` for the item indices of its enclosing arrays (outermost
// first); `indices.size()` must equal the number of item tokens in its path.
std::string field_pointer(const Field& field, const std::vector<int64_t>& indices);

}  // namespace deg::schema
