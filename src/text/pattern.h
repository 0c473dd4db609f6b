// The "pattern" of Split pre-tokenizers and Replace normalizers/decoders: {"String": s} (a
// literal) or {"Regex": r} (Oniguruma), found as HF's Pattern::find_matches does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/json.h"
#include "text/normalized.h"
#include "text/regex.h"

namespace deg::text {

class Pattern {
 public:
  // Parses {"String": ...} or {"Regex": ...}; throws deg::Error naming `pointer`.
  Pattern(const Json& j, const std::string& pointer);
  std::vector<MatchRange> find(std::string_view text) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;  // set for {"Regex": ...}
};

}  // namespace deg::text
