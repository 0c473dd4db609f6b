// Labeled records -> training examples (see tasks.h). The walk mirrors the engine's scheduling
// (engine/fill_schedule.cc, fill_heads.cc, fill_arrays.cc) with the expected answers standing in
// for the heads' decisions.
#include "train/tasks.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "engine/context.h"
#include "schema/spans.h"
#include "train/gpt_params.h"

namespace deg::train {

using schema::Field;
using schema::FieldKind;

const char* query_head_name(QueryHead head) {
  switch (head) {
    case QueryHead::choice: return "choice";
    case QueryHead::score: return "score";
    case QueryHead::noul: return "bool";
    case QueryHead::count: return "count";
    case QueryHead::extract: return "extract";
    case QueryHead::anchor: return "anchor";
  }
  return "?";
}

int64_t TaskExample::tokens() const {
  int64_t n = int64_t(trunk.size());
  for (const TaskQuery& q : queries) n += int64_t(q.ids.size());
  return n;
}

namespace {

struct Scope {  // where a query sits, as the engine's ItemScope
  schema::QueryPlace place;
  int64_t anchor = -1, region_lo = 0, region_hi = -1;
};

struct Located {
  int64_t char_start = 0, char_end = 0;
  int64_t first = 0, last = 0;  // inclusive context tokens
};

class TaskBuilder {
 public:
  TaskBuilder(const engine::DegModel& model, const engine::ContextText& context, TaskExample& ex,
              Rng* shuffle)
      : model_(model),
        ctx_(context),
        ex_(ex),
        T_(int64_t(context.offsets.size())),
        shuffle_(shuffle) {}

  // `gold`: the expected value at this field, or nullptr when the record leaves it out.
  void visit(const Field& f, const Scope& s, const Json* gold) {
    switch (f.kind) {
      case FieldKind::object:
        for (const Field& child : f.children) {
          const Json* g = gold && gold->is_object() && gold->contains(child.key())
                              ? &(*gold)[child.key()]
                              : nullptr;
          visit(child, s, g);
        }
        return;
      case FieldKind::multi_select:
        for (const Field& child : f.children) {
          TaskQuery q{.head = QueryHead::noul};
          q.yes = gold && gold->is_array() &&
                  std::find(gold->begin(), gold->end(), *child.selects) != gold->end();
          add(child, s, std::move(q));
        }
        return;
      case FieldKind::generate: return;
      case FieldKind::choice:
      case FieldKind::score: return choice(f, s, gold);
      case FieldKind::boolean:
        if (!gold) return;
        if (!gold->is_boolean()) mismatch(f, s, *gold, "a boolean");
        return add(f, s, {.head = QueryHead::noul, .yes = gold->get<bool>()});
      case FieldKind::extract: return extract(f, s, gold);
      case FieldKind::count: return count(f, s, gold);
      case FieldKind::anchor: return anchors(f, s, gold);
    }
  }

 private:
  [[noreturn]] void mismatch(const Field& f, const Scope& s, const Json& gold,
                             const std::string& want) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("expected value {} at {} is not {} the schema allows", gold.dump(),
                            schema::field_pointer(f, s.place.indices), want));
  }

  void add(const Field& f, const Scope& s, TaskQuery q) {
    engine::DegModel::Query enc = model_.encode_query(f, s.place);
    q.pointer = schema::field_pointer(f, s.place.indices);
    q.ids = std::move(enc.ids);
    q.option_positions = std::move(enc.option_positions);
    ex_.queries.push_back(std::move(q));
  }

  void choice(const Field& f, const Scope& s, const Json* gold) {
    if (shuffle_ && f.kind == FieldKind::choice && f.options.size() > 1) {
      Field shuffled = f;  // Fisher-Yates from the record's stream
      for (size_t i = shuffled.options.size() - 1; i > 0; --i)
        std::swap(shuffled.options[i], shuffled.options[shuffle_->next_u64() % (i + 1)]);
      return ask_choice(shuffled, s, gold);
    }
    ask_choice(f, s, gold);
  }

  void ask_choice(const Field& f, const Scope& s, const Json* gold) {
    const Json want = gold ? *gold : Json(nullptr);
    for (size_t i = 0; i < f.options.size(); ++i) {
      if (f.options[i].value == want) {
        return add(f, s,
                   {.head = f.kind == FieldKind::choice ? QueryHead::choice : QueryHead::score,
                    .option = int64_t(i)});
      }
    }
    if (gold) mismatch(f, s, *gold, "an option");
  }

  // The region of a scope in tokens: [lo, hi).
  std::pair<int64_t, int64_t> region(const Scope& s) const {
    return {std::max<int64_t>(0, s.region_lo), s.region_hi < 0 ? T_ : std::min(s.region_hi, T_)};
  }

  // The first occurrence of `text` starting at or after code point `from` whose tokens lie in
  // [lo, hi).
  std::optional<Located> locate(const Json& value, int64_t from, int64_t lo, int64_t hi) const {
    const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    std::optional<std::u32string> cps = schema::utf8_to_code_points(text);
    if (!cps || cps->empty()) return std::nullopt;
    for (size_t at = ctx_.text.find(*cps, size_t(std::max<int64_t>(0, from)));
         at != std::u32string::npos; at = ctx_.text.find(*cps, at + 1)) {
      const auto span = schema::token_span(ctx_.offsets, int64_t(at), int64_t(at + cps->size()));
      if (!span || span->first > span->second) continue;
      if (span->first < lo || span->second >= hi) continue;
      return Located{int64_t(at), int64_t(at + cps->size()), span->first, span->second};
    }
    return std::nullopt;
  }

  void extract(const Field& f, const Scope& s, const Json* gold) {
    TaskQuery q{.head = QueryHead::extract,
                .span_query = {.anchor = s.anchor, .region_end = s.region_hi}};
    if (!gold || gold->is_null()) {
      if (f.null_masked) return;
      return add(f, s, std::move(q));
    }
    const auto [lo, hi] = region(s);
    const int64_t from = lo < T_ ? ctx_.offsets.offsets()[size_t(lo)].start : 0;
    std::optional<Located> at = locate(*gold, from, lo, hi);
    if (!at) {
      ++ex_.unlocated;
      return;
    }
    q.span = {at->first, at->last};
    add(f, s, std::move(q));
  }

  void count(const Field& f, const Scope& s, const Json* gold) {
    const int64_t n = gold && gold->is_array() ? int64_t(gold->size()) : 0;
    const int64_t hi = std::min<int64_t>(kMaxCount, f.max_items ? *f.max_items : kMaxCount);
    if (n < f.min_items || n > hi) {
      ++ex_.unlocated;
      return;
    }
    add(f, s, {.head = QueryHead::count, .count = n, .count_lo = f.min_items, .count_hi = hi});
    for (int64_t k = 0; k < n; ++k) {
      Scope item = s;
      item.place.indices.push_back(k);
      item.place.item =
          schema::ItemLine{.mode = schema::ItemLine::Mode::index, .index = k, .count = n};
      visit(f.children.at(0), item, &(*gold)[size_t(k)]);
    }
  }

  // Where an expected item starts: a string by its text, an object by its earliest string.
  std::optional<Located> locate_item(const Json& item, int64_t from, int64_t lo, int64_t hi) const {
    if (!item.is_object() && !item.is_array()) return locate(item, from, lo, hi);
    std::optional<Located> best;
    auto consider = [&](const Json& v) {
      if (!v.is_string()) return;
      std::optional<Located> at = locate(v, from, lo, hi);
      if (at && (!best || at->first < best->first)) best = at;
    };
    for (const Json& v : item) {
      if (v.is_object() || v.is_array()) {
        for (const Json& w : v) consider(w);
      } else {
        consider(v);
      }
    }
    return best;
  }

  void anchors(const Field& f, const Scope& s, const Json* gold) {
    const auto [lo, hi] = region(s);
    struct Item {
      int64_t anchor;
      const Json* value;
    };
    std::vector<Item> items;
    if (gold && gold->is_array()) {
      int64_t cursor = lo < T_ ? ctx_.offsets.offsets()[size_t(lo)].start : 0;
      const int64_t region_start = cursor;
      for (const Json& v : *gold) {
        std::optional<Located> at = locate_item(v, cursor, lo, hi);
        auto taken = [&](const Located& l) {
          return std::any_of(items.begin(), items.end(),
                             [&](const Item& it) { return it.anchor == l.first; });
        };
        if (!at || taken(*at)) {  // out of order: any occurrence not used yet
          at.reset();
          for (int64_t c = region_start;; c = at->char_start + 1) {
            at = locate_item(v, c, lo, hi);
            if (!at || !taken(*at)) break;
          }
        }
        if (!at) {
          ++ex_.unlocated;
          continue;
        }
        items.push_back({at->first, &v});
        cursor = v.is_string() ? at->char_end : at->char_start + 1;
      }
    }
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.anchor < b.anchor; });
    TaskQuery q{.head = QueryHead::anchor, .region = {s.region_lo, s.region_hi}};
    for (const Item& it : items) q.starts.push_back(it.anchor);
    add(f, s, std::move(q));
    for (size_t k = 0; k < items.size(); ++k) {
      const int64_t end = k + 1 < items.size() ? items[k + 1].anchor : hi;
      Scope item = s;
      item.anchor = items[k].anchor;
      item.region_lo = items[k].anchor;
      item.region_hi = end;
      item.place.indices.push_back(int64_t(k));
      item.place.item = schema::ItemLine{.mode = schema::ItemLine::Mode::anchor,
                                         .text = engine::item_quote(ctx_, items[k].anchor, end)};
      visit(f.children.at(0), item, items[k].value);
    }
  }

  const engine::DegModel& model_;
  const engine::ContextText& ctx_;
  TaskExample& ex_;
  int64_t T_;
  Rng* shuffle_;  // null: options in the schema's order
};

}  // namespace

TaskExample make_example(const engine::DegModel& model, const schema::Plan& plan,
                         const std::string& document, const Json& expected, int task,
                         uint64_t shuffle_options) {
  if (document.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw Error(ErrorKind::invalid_argument, "the document is empty");
  }
  const Backbone& bb = model.backbone();
  engine::DocumentContext dc = engine::document_context(model.tokenizer(), bb.spec(), model.name(),
                                                        {DocumentPart::of_text(document)});
  TaskExample ex;
  ex.task = task;
  ex.trunk = model.trunk_ids(dc.ids, &ex.ctx_start);
  ex.ctx_tokens = int64_t(dc.ids.size());
  const engine::ContextText context{std::move(dc.text), schema::TokenOffsets(std::move(dc.ranges))};
  std::optional<Rng> shuffle;
  if (shuffle_options) shuffle.emplace(shuffle_options);
  TaskBuilder(model, context, ex, shuffle ? &*shuffle : nullptr).visit(plan.root, {}, &expected);
  return ex;
}

}  // namespace deg::train
