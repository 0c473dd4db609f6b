// Oniguruma wrapper; see regex.h.
#include "text/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "core/error.h"

namespace deg::text {

namespace {

void onig_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// One match region per thread, reused across searches.
struct ThreadRegion {
  OnigRegion* region = onig_region_new();
  ~ThreadRegion() { onig_region_free(region, 1); }
};

OnigRegion* thread_region() {
  thread_local ThreadRegion r;
  return r.region;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
  onig_init_once();
  OnigRegex reg = nullptr;
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  int rc = onig_new(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                    ONIG_SYNTAX_DEFAULT, &einfo);
  if (rc != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, rc, &einfo);
    throw Error(
        ErrorKind::format,
        fmt::format("regex {:?} does not compile: {}", pattern, reinterpret_cast<const char*>(msg)),
        {.pointer = where});
  }
  regex_ = reg;
}

Regex::~Regex() {
  if (regex_) onig_free(static_cast<OnigRegex>(regex_));
}

void Regex::find_all(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  out.clear();
  auto reg = static_cast<OnigRegex>(regex_);
  OnigRegion* region = thread_region();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t last_end = 0;
  bool skip_next_empty = false;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    int r = onig_search(reg, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (r < 0) break;  // ONIG_MISMATCH, or a matcher error (treated as no more matches)
    const auto s = static_cast<size_t>(region->beg[0]);
    const auto e = static_cast<size_t>(region->end[0]);
    last_end = e;
    if (s == e) {
      last_end += e < text.size() ? utf8_seq_len(static_cast<unsigned char>(text[e])) : 1;
      if (skip_next_empty) {
        skip_next_empty = false;
        continue;
      }
    } else {
      skip_next_empty = true;
    }
    out.emplace_back(static_cast<uint32_t>(s), static_cast<uint32_t>(e));
  }
}

std::vector<MatchRange> Regex::match_ranges(std::string_view text) const {
  std::vector<MatchRange> out;
  if (text.empty()) {
    out.push_back({0, 0, false});
    return out;
  }
  std::vector<std::pair<uint32_t, uint32_t>> found;
  find_all(text, found);
  out.reserve(found.size() * 2 + 1);
  uint32_t prev = 0;
  for (auto [s, e] : found) {
    if (prev != s) out.push_back({prev, s, false});
    out.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, static_cast<uint32_t>(text.size()), false});
  return out;
}

}  // namespace deg::text
