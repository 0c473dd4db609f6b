// Split/Replace patterns; see pattern.h.
#include "text/pattern.h"

#include "core/error.h"

namespace deg::text {

Pattern::Pattern(const Json& j, const std::string& pointer) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    literal_ = j["String"].get<std::string>();
  } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(j["Regex"].get<std::string>(), pointer + "/Regex");
  } else {
    throw Error(ErrorKind::format, "pattern must be {\"String\": ...} or {\"Regex\": ...}",
                {.pointer = pointer});
  }
}

std::vector<MatchRange> Pattern::find(std::string_view text) const {
  return regex_ ? regex_->match_ranges(text) : match_literal(text, literal_);
}

}  // namespace deg::text
