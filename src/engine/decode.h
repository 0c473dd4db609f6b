// From head logits to answers: calibrated probabilities (softmax at the head kind's temperature),
// the best valid span of an extract field, the items of an anchored array. Pure functions of the
// logits and the text; no model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/json.h"
#include "schema/plan.h"
#include "schema/render.h"
#include "schema/spans.h"

namespace deg::engine {

// Code points -> UTF-8.
std::string utf8_of(std::u32string_view text);
// The first `n` code points of valid UTF-8 `text`.
std::string utf8_prefix(std::string_view text, int64_t n);

// softmax(logits / temperature) over entries whose logit is finite (others get 0).
std::vector<double> softmax(const float* logits, int64_t n, double temperature);

struct Pick {
  int64_t index = -1;  // -1: nothing (e.g. every option masked)
  double probability = 0;
};
// argmax of softmax(logits / temperature) among allowed[i] (empty: all allowed).
Pick pick_best(const float* logits, int64_t n, double temperature,
               const std::vector<bool>& allowed = {});

// The document as extract decoding sees it: its code points and its context tokens' ranges.
struct ContextText {
  std::u32string text;                                             // code points of the document
  schema::TokenOffsets offsets{std::vector<schema::CharRange>{}};  // [T] context token ranges
};

struct SpanAnswer {
  std::optional<Json> value;  // nullopt: the null outcome won (or nothing valid was found)
  double confidence = 0;      // p(start) * p(end), or p(null start) * p(null end)
  int64_t char_start = 0, char_end = 0;  // the value's code-point span, when a value
};

struct SpanSearch {
  int64_t max_tokens = 64;   // longest span considered, in tokens
  int64_t candidates = 256;  // best-scoring spans tried for validity before giving up
};

// The best-scoring span (start <= end, at most max_tokens long) whose trimmed text reads as a
// value of `spec`; null when the null outcome scores higher, unless `null_masked` (then null,
// with confidence 0, only when no span of the document reads as a value: a missing field).
// start/end: [T + 1] logits, index T = null.
SpanAnswer decode_span(const float* start, const float* end, const ContextText& context,
                       const schema::ValueSpec& spec, bool null_masked, double temperature,
                       const SpanSearch& search = {});

// Items of an anchored array: tokens whose sigmoid exceeds 0.5 within [lo, hi), at least
// min_items (the most probable tokens are added) and at most max_items (the most probable kept),
// in token order. Each item's region runs to the next anchor (the last to hi).
struct AnchorItem {
  int64_t anchor = 0;
  int64_t region_end = 0;
  double probability = 0;
};
// The ITEM line's text of an anchored item: the context from its anchor token to the end of its
// region (the anchor's own text when the region is empty), at most 4 * kItemQuoteChars code
// points (the renderer quotes and cuts it further).
std::string item_quote(const ContextText& context, int64_t anchor, int64_t region_end);

std::vector<AnchorItem> decode_anchors(const float* logits, int64_t T, int64_t lo, int64_t hi,
                                       int64_t min_items, std::optional<int64_t> max_items);

}  // namespace deg::engine
