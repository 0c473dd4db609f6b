// Regex matching with Oniguruma, the engine HF tokenizers uses (its `onig` crate wraps the same
// C library), so \p{L}, look-ahead and (?i:...) behave byte for byte as in HF. Compiled once,
// searched concurrently from any number of threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/normalized.h"

namespace deg::text {

class Regex {
 public:
  // Throws deg::Error (format) naming `where` when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Successive non-overlapping matches as [start, end) byte pairs, with the onig crate's
  // find_iter rules for empty matches; `text` must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& out) const;

  // find_all as a match list covering `text` (HF's Pattern::find_matches for a regex).
  std::vector<MatchRange> match_ranges(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* regex_ = nullptr;  // OnigRegex
};

}  // namespace deg::text
