// Arrays (engine/filler.h): an anchored array's item anchors from its per-token scores, each item
// then asked its own fields as nested queries within its region.
#include <algorithm>

#include "core/log.h"
#include "engine/filler.h"

namespace deg::engine {

void Filler::answer_anchors(std::vector<Job>& jobs, const std::vector<size_t>& idx, size_t d,
                            std::vector<Job>& next) {
  Document& doc = docs_[d];
  const int64_t T = doc.ctx_hidden.dim(0);
  std::vector<float> a = stack_answers(jobs, idx);
  std::vector<Region> regions;
  for (size_t i : idx) regions.push_back({.lo = jobs[i].region_lo, .hi = jobs[i].region_hi});
  anchor_keys(model_.backbone().family().ops(), model_.heads_on_backend(),
              doc.ctx_hidden.data<float>(), T, doc.keys);
  std::vector<float> lg =
      anchor_logits(model_.heads(), a.data(), int64_t(idx.size()), regions, doc.keys);
  if (overflowed(lg)) return fail(d, non_finite_error("anchor logits"));
  for (size_t j = 0; j < idx.size(); ++j) {
    const Job& job = jobs[idx[j]];
    const std::string ptr = schema::field_pointer(*job.field, job.place.indices);
    std::vector<engine::AnchorItem> items =
        engine::decode_anchors(lg.data() + int64_t(j) * T, T, job.region_lo, job.region_hi,
                               job.field->min_items, job.field->max_items);
    doc.answers.set_items(ptr, int64_t(items.size()));
    double confidence = 1;
    for (size_t k = 0; k < items.size(); ++k) {
      const engine::AnchorItem& it = items[k];
      confidence *= it.probability;
      ItemScope scope{job.place, it.anchor, it.anchor, it.region_end};
      scope.place.indices.push_back(int64_t(k));
      scope.place.item =
          schema::ItemLine{.mode = schema::ItemLine::Mode::anchor,
                           .text = engine::item_quote(doc.context, it.anchor, it.region_end)};
      enqueue(d, job.field->children.at(0), scope, next);
    }
    doc.answers.set(ptr, {.kind = "anchor",
                          .value = int64_t(items.size()),
                          .confidence = items.empty() ? 1.0 : confidence});
  }
}

}  // namespace deg::engine
