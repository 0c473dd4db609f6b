// JSON Schema validation of values (valijson, draft 7 keywords): the check every filled output
// must pass. One translation unit instantiates valijson, so callers pay nothing for its headers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/json.h"

namespace deg::schema {

// A schema parsed once for many values. A "$schema" keyword is ignored (valijson reads the
// keywords, not the dialect URI).
class SchemaValidator {
 public:
  explicit SchemaValidator(const Json& schema);
  explicit SchemaValidator(const OrderedJson& schema);
  ~SchemaValidator();
  SchemaValidator(SchemaValidator&&) noexcept;
  SchemaValidator& operator=(SchemaValidator&&) noexcept;

  // What makes `value` invalid: one "where: reason" line per violation (where: a JSON pointer
  // into the value, "/" for its root), empty when it validates. `excused`: pointers of required
  // properties that may be absent (FillResult::missing: a required value the document does not
  // hold); their "missing required property" reports, and the enclosing "failed to validate
  // item / property / child schema" reports left with nothing else beneath them, are dropped.
  std::vector<std::string> violations(const Json& value,
                                      const std::vector<std::string>& excused = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The same for one value.
std::vector<std::string> schema_violations(const Json& schema, const Json& value);
std::vector<std::string> schema_violations(const OrderedJson& schema, const OrderedJson& value);

}  // namespace deg::schema
