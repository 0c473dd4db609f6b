// Type- and format-aware reading of an extracted text: is this span a valid value of its field
// (type, format, pattern, length and numeric bounds), and if so which JSON value. The engine
// picks the best-scoring span whose text reads; null when none beats the null outcome. Pure
// functions; no model, no tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/json.h"

namespace deg::schema {

// The JSON types an extracted text can become, tried in this order (an integer field's text
// "12" is 12, a string-or-number field's text "12" is 12 too).
enum class ValueType : uint8_t { integer, number, string };

const char* value_type_name(ValueType type);

// A JSON Schema `pattern`, compiled once with Oniguruma in Perl syntax with ASCII \d and \w
// (ECMAScript's meaning). Matching is a search (patterns are not anchored, as JSON Schema says)
// with a backtracking limit: a pathological pattern fails to match instead of hanging.
class Pattern {
 public:
  // Throws deg::Error (unsupported) with the engine's message when `source` does not compile.
  static std::shared_ptr<const Pattern> compile(std::string_view source);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  const std::string& source() const { return source_; }
  // True when the pattern matches somewhere in `utf8` (which must be valid UTF-8).
  bool search(std::string_view utf8) const;

 private:
  Pattern(std::string source, void* regex) : source_(std::move(source)), regex_(regex) {}
  std::string source_;
  void* regex_;  // OnigRegex
};

// What a field accepts. Bounds absent from the schema are nullopt.
struct ValueSpec {
  std::vector<ValueType> types;  // non-empty, in reading order
  std::string format;            // "" when none; unknown formats are not checked
  std::shared_ptr<const Pattern> pattern;
  std::optional<int64_t> min_length, max_length;  // code points
  std::optional<double> minimum, maximum;
  std::optional<double> exclusive_minimum, exclusive_maximum;
  std::optional<double> multiple_of;
};

// The JSON value `text` stands for under `spec`, or nullopt when it is not a valid value. The
// text is used as it is (callers trim first): a number reads from JSON number syntax, with
// optional `+` sign and `,` thousands groups ("1,250.5"); an integer must have no fraction.
std::optional<Json> value_read(const ValueSpec& spec, std::string_view text);

// The lengths in code points of every text value_read accepts under `spec`: [lo, hi] (hi < 0:
// unbounded). A caller with many candidate texts (a required field searching a whole document
// for a date) checks a candidate's length before building its text.
struct LengthBounds {
  int64_t lo = 0, hi = -1;
};
LengthBounds value_length_bounds(const ValueSpec& spec);
// The same bounds of the texts format_check accepts (every format with bounds is ASCII).
LengthBounds format_length_bounds(std::string_view format);

// True when `text` satisfies the JSON Schema `format` (date, date-time, time, email, idn-email,
// hostname, ipv4, ipv6, uri, uri-reference, iri, iri-reference, uuid, duration, json-pointer,
// regex). Formats not in this list are annotations: always true.
bool format_check(std::string_view format, std::string_view text);
// The formats format_check knows.
bool format_known(std::string_view format);

}  // namespace deg::schema
