// The heads over finished forks (engine/filler.h): choices and scores over their options, the
// two-way noul, span extraction over the document's context, counts; arrays hand on to
// fill_arrays.cc.
#include <algorithm>
#include <exception>

#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/filler.h"

namespace deg::engine {

// Heads over the finished forks, per document; arrays schedule their items' queries.
void Filler::answer(std::vector<Job>& jobs, std::vector<Job>& next) {
  const Heads& heads = model_.heads();
  std::map<size_t, std::vector<size_t>> extract_of, anchor_of;  // doc -> jobs
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = jobs[i];
    Document& doc = docs_[job.doc];
    if (!doc.error.empty()) continue;  // failed in this round: no answers, no item queries
    const std::string ptr = schema::field_pointer(*job.field, job.place.indices);
    switch (job.head) {
      case Head::choice:
      case Head::score: {
        const bool choice = job.head == Head::choice;
        std::vector<float> logits =
            pointer_logits(choice ? heads.choice : heads.score, job.answer_hidden.data(),
                           job.option_hidden.data(), int64_t(job.option_positions.size()));
        engine::Pick p = engine::pick_best(logits.data(), int64_t(logits.size()),
                                           heads.temp(choice ? HeadKind::choice : HeadKind::score));
        if (p.index < 0 || !all_finite(logits.data(), int64_t(logits.size()))) {
          fail(job.doc, non_finite_error("the options of " + job.field->pointer));
          continue;
        }
        doc.answers.set(ptr, {.kind = choice ? "choice" : "score",
                              .value = job.field->options[size_t(p.index)].value,
                              .confidence = p.probability});
        break;
      }
      case Head::noul: {
        float l = noul_logits(heads, job.answer_hidden.data(), 1)[0];
        if (!std::isfinite(l)) {
          fail(job.doc, non_finite_error("the decision of " + job.field->pointer));
          continue;
        }
        float two[2] = {l, 0.0f};
        std::vector<double> p = engine::softmax(two, 2, heads.temp(HeadKind::noul));
        const bool yes = p[0] > p[1];
        doc.answers.set(ptr, {.kind = "bool", .value = yes, .confidence = yes ? p[0] : p[1]},
                        engine::option_key(*job.field));
        break;
      }
      case Head::count: {
        std::vector<float> logits = count_logits(heads, job.answer_hidden.data(), 1);
        std::vector<bool> allowed(logits.size(), false);
        for (int64_t n = job.field->min_items; n <= kMaxCount; ++n) {
          if (!job.field->max_items || n <= *job.field->max_items) allowed[size_t(n)] = true;
        }
        engine::Pick p = engine::pick_best(logits.data(), int64_t(logits.size()),
                                           heads.temp(HeadKind::count), allowed);
        if (p.index < 0 || !all_finite(logits.data(), int64_t(logits.size()))) {
          fail(job.doc, non_finite_error("the item count of " + job.field->pointer));
          continue;
        }
        const int64_t n = p.index;
        doc.answers.set(ptr, {.kind = "count", .value = n, .confidence = p.probability});
        doc.answers.set_items(ptr, n);
        for (int64_t k = 0; k < n; ++k) {
          ItemScope scope{job.place, job.anchor, job.region_lo, job.region_hi};
          scope.place.indices.push_back(k);
          scope.place.item =
              schema::ItemLine{.mode = schema::ItemLine::Mode::index, .index = k, .count = n};
          enqueue(job.doc, job.field->children.at(0), scope, next);
        }
        break;
      }
      case Head::extract: extract_of[job.doc].push_back(i); break;
      case Head::anchor: anchor_of[job.doc].push_back(i); break;
    }
  }
  for (auto& [d, idx] : extract_of)
    if (docs_[d].error.empty()) answer_extracts(jobs, idx, d);
  for (auto& [d, idx] : anchor_of)
    if (docs_[d].error.empty()) answer_anchors(jobs, idx, d, next);
  // A document that failed in this round asks nothing more.
  std::erase_if(next, [&](const Job& j) { return !docs_[j.doc].error.empty(); });
}

std::vector<float> Filler::stack_answers(const std::vector<Job>& jobs,
                                         const std::vector<size_t>& idx) {
  std::vector<float> a;
  for (size_t i : idx)
    a.insert(a.end(), jobs[i].answer_hidden.begin(), jobs[i].answer_hidden.end());
  return a;
}

void Filler::answer_extracts(std::vector<Job>& jobs, const std::vector<size_t>& idx, size_t d) {
  Document& doc = docs_[d];
  const Heads& heads = model_.heads();
  const int64_t T = doc.ctx_hidden.dim(0);
  std::vector<float> a = stack_answers(jobs, idx);
  std::vector<SpanQuery> sq;
  for (size_t i : idx) sq.push_back({.anchor = jobs[i].anchor, .region_end = jobs[i].region_hi});
  span_keys(model_.backbone().family().ops(), model_.heads_on_backend(),
            doc.ctx_hidden.data<float>(), T, doc.keys);
  SpanLogits lg = span_logits(heads, a.data(), int64_t(idx.size()), sq, doc.keys);
  if (overflowed(lg.start) || overflowed(lg.end)) return fail(d, non_finite_error("span logits"));
  // Each query's span search is its own (a pure function of its logits and the text): the
  // host's threads take them in parallel (an exception comes back to this thread).
  std::vector<engine::SpanAnswer> spans(idx.size());
  std::vector<std::exception_ptr> thrown(idx.size());
  parallel_for(int64_t(idx.size()), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const Field& f = *jobs[idx[size_t(j)]].field;
      try {
        spans[size_t(j)] =
            engine::decode_span(lg.start.data() + j * (T + 1), lg.end.data() + j * (T + 1),
                                doc.context, f.value, f.null_masked, heads.temp(HeadKind::extract));
      } catch (...) {
        thrown[size_t(j)] = std::current_exception();
      }
    }
  });
  for (const std::exception_ptr& e : thrown)
    if (e) std::rethrow_exception(e);
  for (size_t j = 0; j < idx.size(); ++j) {
    const Job& job = jobs[idx[j]];
    const engine::SpanAnswer& s = spans[j];
    engine::Answer ans{
        .kind = "extract", .value = s.value ? *s.value : Json(nullptr), .confidence = s.confidence};
    if (s.value) ans.span = {{s.char_start, s.char_end}};
    doc.answers.set(schema::field_pointer(*job.field, job.place.indices), std::move(ans));
  }
}

}  // namespace deg::engine
