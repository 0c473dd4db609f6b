#include "engine/decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

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

// The order spans are tried in: higher score first, then earlier start, then earlier end (a
// total order, so the order never depends on how the spans were gathered).
bool better(const Candidate& a, const Candidate& b) {
  return a.score != b.score ? a.score > b.score : (a.s != b.s ? a.s < b.s : a.e < b.e);
}
bool worse(const Candidate& a, const Candidate& b) {
  return better(b, a);
}

// The largest finite end[e] over each start's window [s, s + max_tokens) (-inf where none is
// finite), by a monotonic queue: O(T).
std::vector<float> window_maxima(const float* end, int64_t T, int64_t max_tokens) {
  std::vector<float> out(size_t(T), -std::numeric_limits<float>::infinity());
  std::vector<int64_t> queue;  // indices of finite ends, their values decreasing
  size_t head = 0;
  for (int64_t s = T - 1; s >= 0; --s) {  // the window of s is [s, s + max_tokens)
    if (std::isfinite(end[s])) {
      while (queue.size() > head && end[queue.back()] <= end[s]) queue.pop_back();
      queue.push_back(s);
    }
    while (queue.size() > head && queue[head] >= s + max_tokens) ++head;
    if (queue.size() > head) out[size_t(s)] = end[queue[head]];
  }
  return out;
}

// The `limit` best spans (at most max_tokens long), best first.
std::vector<Candidate> best_spans(const float* start, const float* end, int64_t T,
                                  int64_t max_tokens, size_t limit) {
  // Spans score start + end logit (the log of p(start) p(end) up to a constant). The best
  // `candidates` spans are kept in a bounded heap (memory independent of the context length),
  // then tried best first until one reads as a value.
  std::vector<Candidate> heap;  // a min-heap under `better`: the worst kept span on top
  // Once the heap is full, a start whose best possible span (its logit plus the largest end
  // logit of its window) does not score above the worst kept span adds nothing: starts come in
  // increasing order, so at an equal score the kept span, with its earlier start, is better.
  std::vector<float> window_max = window_maxima(end, T, max_tokens);
  for (int64_t s = 0; s < T; ++s) {
    if (!std::isfinite(start[s])) continue;
    if (heap.size() == limit && !(start[s] + window_max[size_t(s)] > heap.front().score)) continue;
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

// Every span of the window in `better` order, one at a time: a merge over the start tokens, each
// start offering its best span not yet taken (a start's ends are sorted when its second-best is
// first asked for). A span costs a heap step, so a search that ends at the k-th span costs about
// k log T after one pass over the window, however many spans the document has.
class SpanStream {
 public:
  SpanStream(const float* start, const float* end, int64_t T, int64_t max_tokens)
      : start_(start),
        end_(end),
        T_(T),
        max_tokens_(max_tokens),
        ends_(size_t(T)),
        taken_(size_t(T), 0) {
    for (int64_t s = 0; s < T; ++s) {
      if (!std::isfinite(start[s])) continue;
      std::optional<Candidate> best;
      for (int64_t e = s; e < window_end(s); ++e) {
        if (!std::isfinite(end[e])) continue;
        const Candidate c{start[s] + end[e], s, e};
        if (!best || better(c, *best)) best = c;
      }
      if (best) heap_.push_back(*best);
    }
    std::make_heap(heap_.begin(), heap_.end(), worse);
  }

  std::optional<Candidate> next() {
    if (heap_.empty()) return std::nullopt;
    std::pop_heap(heap_.begin(), heap_.end(), worse);
    const Candidate c = heap_.back();
    heap_.pop_back();
    std::vector<Candidate>& ends = ends_[size_t(c.s)];
    if (ends.empty()) {
      for (int64_t e = c.s; e < window_end(c.s); ++e)
        if (std::isfinite(end_[e])) ends.push_back({start_[c.s] + end_[e], c.s, e});
      std::sort(ends.begin(), ends.end(), better);  // ends[0] is c
    }
    if (size_t k = ++taken_[size_t(c.s)]; k < ends.size()) {
      heap_.push_back(ends[k]);
      std::push_heap(heap_.begin(), heap_.end(), worse);
    }
    return c;
  }

 private:
  int64_t window_end(int64_t s) const { return std::min(T_, s + max_tokens_); }

  const float *start_, *end_;
  int64_t T_, max_tokens_;
  std::vector<Candidate> heap_;               // each start's best span not yet taken
  std::vector<std::vector<Candidate>> ends_;  // a start's spans, best first (once needed)
  std::vector<size_t> taken_;                 // how many of a start's spans were taken
};

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
  // The span's value, when its trimmed text reads as one (a text of a length no value can have
  // is not even built).
  const schema::LengthBounds length = schema::value_length_bounds(spec);
  auto read = [&](const Candidate& c) -> std::optional<SpanAnswer> {
    int64_t cs = off[size_t(c.s)].start, ce = off[size_t(c.e)].end;
    if (ce <= cs) return std::nullopt;
    auto [ts, te] = schema::trim_span(context.text, cs, ce);
    if (te <= ts || te - ts < length.lo || (length.hi >= 0 && te - ts > length.hi))
      return std::nullopt;
    std::string text =
        utf8_of(std::u32string_view(context.text).substr(size_t(ts), size_t(te - ts)));
    std::optional<Json> v = schema::value_read(spec, text);
    if (!v) return std::nullopt;
    return SpanAnswer{std::move(v), ps[size_t(c.s)] * pe[size_t(c.e)], ts, te};
  };
  const size_t limit = size_t(std::max<int64_t>(1, search.candidates));
  const std::vector<Candidate> cands = best_spans(start, end, T, search.max_tokens, limit);
  for (const Candidate& c : cands) {
    if (!null_masked && c.score < null_score) return null_answer;
    if (std::optional<SpanAnswer> a = read(c)) return *a;
  }
  if (!null_masked) return null_answer;
  // A field that must have a value looks further when the best spans do not read as one, so a
  // valid value anywhere in the document is found: the first valid span in score order, which
  // is the best valid one. Where the value's length is bounded (a date: 10 code points) few
  // spans can be one, so all are looked at in any order and the best valid kept; otherwise the
  // spans past the ones tried stream in order until one reads.
  if (cands.size() == limit && length.hi >= 0) {
    std::optional<Candidate> best;
    std::optional<SpanAnswer> answer;
    for (int64_t s = 0; s < T; ++s) {
      if (!std::isfinite(start[s])) continue;
      for (int64_t e = s; e < std::min(T, s + search.max_tokens); ++e) {
        const Candidate c{start[s] + end[e], s, e};
        if (!std::isfinite(end[e]) || (best && !better(c, *best))) continue;
        if (std::optional<SpanAnswer> a = read(c)) {
          best = c;
          answer = std::move(a);
        }
      }
    }
    if (answer) return *answer;
  } else if (cands.size() == limit) {
    SpanStream stream(start, end, T, search.max_tokens);
    for (size_t k = 0; k < cands.size(); ++k) stream.next();
    while (std::optional<Candidate> c = stream.next())
      if (std::optional<SpanAnswer> a = read(*c)) return *a;
  }
  // Masked: no span of the document reads as a value; the field is missing (confidence 0).
  return SpanAnswer{};
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
