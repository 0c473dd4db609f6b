#include "engine/decode.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace deg::engine {

std::vector<double> softmax(const float* logits, int64_t n, double temperature) {
  std::vector<double> p(static_cast<size_t>(n), 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(logits[i])) mx = std::max(mx, double(logits[i]) / temperature);
  }
  if (!std::isfinite(mx)) return p;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(logits[i])) continue;
    p[size_t(i)] = std::exp(double(logits[i]) / temperature - mx);
    sum += p[size_t(i)];
  }
  for (double& x : p) x /= sum;
  return p;
}

Pick pick_best(const float* logits, int64_t n, double temperature,
               const std::vector<bool>& allowed) {
  std::vector<float> masked(logits, logits + n);
  for (int64_t i = 0; i < n; ++i) {
    if (!allowed.empty() && !allowed[size_t(i)]) masked[size_t(i)] = -INFINITY;
  }
  std::vector<double> p = softmax(masked.data(), n, temperature);
  Pick best;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(masked[size_t(i)]) && (best.index < 0 || p[size_t(i)] > best.probability)) {
      best = {i, p[size_t(i)]};
    }
  }
  return best;
}

std::string utf8_of(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xc0 | (c >> 6));
      out += char(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += char(0xe0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3f));
      out += char(0x80 | (c & 0x3f));
    } else {
      out += char(0xf0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3f));
      out += char(0x80 | ((c >> 6) & 0x3f));
      out += char(0x80 | (c & 0x3f));
    }
  }
  return out;
}

std::string utf8_prefix(std::string_view text, int64_t n) {
  size_t i = 0;
  for (int64_t k = 0; k < n && i < text.size(); ++k) {
    ++i;
    while (i < text.size() && (uint8_t(text[i]) & 0xc0) == 0x80) ++i;
  }
  return std::string(text.substr(0, i));
}

namespace {

struct Candidate {
  float score;
  int64_t s, e;
};

}  // namespace

namespace {

// The `limit` best spans (at most max_tokens long), best first.
std::vector<Candidate> best_spans(const float* start, const float* end, int64_t T,
                                  int64_t max_tokens, size_t limit) {
  // Spans score start + end logit (the log of p(start) p(end) up to a constant). The best
  // `candidates` spans are kept in a bounded heap (memory independent of the context length),
  // then tried best first until one reads as a value.
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score > b.score : (a.s != b.s ? a.s < b.s : a.e < b.e);
  };
  std::vector<Candidate> heap;  // a min-heap under `better`: the worst kept span on top
  for (int64_t s = 0; s < T; ++s) {
    if (!std::isfinite(start[s])) continue;
    for (int64_t e = s; e < std::min(T, s + max_tokens); ++e) {
      if (!std::isfinite(end[e])) continue;
      Candidate c{start[s] + end[e], s, e};
      if (heap.size() < limit) {
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(c, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  return heap;
}

}  // namespace

SpanAnswer decode_span(const float* start, const float* end, const ContextText& context,
                       const schema::ValueSpec& spec, bool null_masked, double temperature,
                       const SpanSearch& search) {
  const int64_t T = context.offsets.size();
  std::vector<double> ps = softmax(start, T + 1, temperature);
  std::vector<double> pe = softmax(end, T + 1, temperature);
  const float null_score = start[T] + end[T];
  SpanAnswer null_answer{std::nullopt, ps[size_t(T)] * pe[size_t(T)], 0, 0};
  const auto& off = context.offsets.offsets();
  // A field that must have a value looks further when the best spans do not read as one: every
  // span of the window, best first, so a valid value anywhere in the document is found. The
  // spans are taken in growing lots (8 times more each time) rather than all sorted at once: the
  // same order, but a value among the first few thousand spans of a 4096-token document costs
  // a bounded heap, not a sort of its 262,144 spans.
  size_t tried = 0;
  size_t limit = size_t(std::max<int64_t>(1, search.candidates));
  for (int pass = 0;; ++pass, limit = limit > SIZE_MAX / 8 ? SIZE_MAX : limit * 8) {
    if (pass == 1 && !null_masked) break;
    std::vector<Candidate> cands = best_spans(start, end, T, search.max_tokens, limit);
    for (size_t i = tried; i < cands.size(); ++i) {
      const Candidate& c = cands[i];
      if (!null_masked && c.score < null_score) return null_answer;
      int64_t cs = off[size_t(c.s)].start, ce = off[size_t(c.e)].end;
      if (ce <= cs) continue;
      auto [ts, te] = schema::trim_span(context.text, cs, ce);
      if (te <= ts) continue;
      std::string text =
          utf8_of(std::u32string_view(context.text).substr(size_t(ts), size_t(te - ts)));
      std::optional<Json> v = schema::value_read(spec, text);
      if (!v) continue;
      return {std::move(v), ps[size_t(c.s)] * pe[size_t(c.e)], ts, te};
    }
    if (cands.size() < limit) break;  // every span was tried
    tried = cands.size();
  }
  // Masked: no span of the document reads as a value; the field is missing (confidence 0).
  return null_masked ? SpanAnswer{} : null_answer;
}

std::vector<AnchorItem> decode_anchors(const float* logits, int64_t T, int64_t lo, int64_t hi,
                                       int64_t min_items, std::optional<int64_t> max_items) {
  lo = std::max<int64_t>(0, lo);
  hi = hi < 0 ? T : std::min(hi, T);
  auto prob = [&](int64_t t) { return 1.0 / (1.0 + std::exp(-double(logits[t]))); };
  std::vector<int64_t> picked, rest;
  for (int64_t t = lo; t < hi; ++t) (logits[t] > 0 ? picked : rest).push_back(t);
  auto by_prob = [&](int64_t a, int64_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  if (int64_t(picked.size()) < min_items) {
    std::sort(rest.begin(), rest.end(), by_prob);
    for (int64_t t : rest) {
      if (int64_t(picked.size()) >= min_items) break;
      picked.push_back(t);
    }
  }
  if (max_items && int64_t(picked.size()) > *max_items) {
    std::sort(picked.begin(), picked.end(), by_prob);
    picked.resize(size_t(*max_items));
  }
  std::sort(picked.begin(), picked.end());
  std::vector<AnchorItem> items;
  for (size_t i = 0; i < picked.size(); ++i) {
    int64_t next = i + 1 < picked.size() ? picked[i + 1] : hi;
    items.push_back({picked[i], next, prob(picked[i])});
  }
  return items;
}

std::string item_quote(const ContextText& context, int64_t anchor, int64_t region_end) {
  const auto& off = context.offsets.offsets();
  const int64_t c0 = off[size_t(anchor)].start;
  const int64_t c1 = region_end > anchor ? off[size_t(region_end - 1)].end : c0;
  return utf8_of(
      std::u32string_view(context.text)
          .substr(size_t(c0), size_t(std::min<int64_t>(c1 - c0, 4 * schema::kItemQuoteChars))));
}

}  // namespace deg::engine
