// Scheduling (engine/filler.h): every field's query of every document (whatever its schema), run
// as fork rows over their trunks in batches under the padded-token budget, round after round
// until no array item asks for more.
#include <algorithm>

#include "core/log.h"
#include "engine/filler.h"

namespace deg::engine {

void Filler::run() {
  std::vector<Job> jobs;
  for (size_t d = 0; d < docs_.size(); ++d) {
    if (docs_[d].error.empty()) enqueue(d, docs_[d].plan->root, ItemScope{}, jobs);
  }
  std::vector<bool> finished(docs_.size(), false);
  finish_idle(jobs, finished);  // documents that could not be read, or ask nothing
  for (int round = 0; !jobs.empty(); ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t queries = jobs.size();
    run_forks(jobs);
    const double fork_ms = ms_since(t0);
    std::vector<Job> next;
    answer(jobs, next);
    log::debug(
        "round {}: {} queries answered in {:.0f} ms (forks {:.0f}, heads {:.0f}); {} item "
        "queries next",
        round, queries, ms_since(t0), fork_ms, ms_since(t0) - fork_ms, next.size());
    jobs = std::move(next);
    finish_idle(jobs, finished);
  }
}

void Filler::finish_idle(const std::vector<Job>& upcoming, std::vector<bool>& finished) {
  std::vector<bool> asking(docs_.size(), false);
  for (const Job& job : upcoming) asking[job.doc] = true;
  // The idle documents' x-generate fields decode together, kGenerateDocuments documents at a
  // time (each holds a copy of its trunk state with its KNOWN VALUES block read).
  std::vector<size_t> group;
  auto write = [&] {
    if (group.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    generate(group);
    log::debug("{} documents' x-generate fields written in {:.0f} ms", group.size(), ms_since(t0));
    group.clear();
  };
  for (size_t d = 0; d < docs_.size(); ++d) {
    if (finished[d] || asking[d] || !docs_[d].error.empty() || !generate_fields_.count(d)) continue;
    group.push_back(d);
    if (group.size() == kGenerateDocuments) write();
  }
  write();
  for (size_t d = 0; d < docs_.size(); ++d) {
    if (finished[d] || asking[d]) continue;
    finished[d] = true;
    if (finished_) finished_(d);
    docs_[d].trunk.reset();
    docs_[d].ctx_hidden = Tensor{};
    docs_[d].keys = ContextKeys{};
  }
}

// Queries for `field` (and, for objects, its descendants) at `scope`.
void Filler::enqueue(size_t d, const Field& field, const ItemScope& scope, std::vector<Job>& out) {
  switch (field.kind) {
    case FieldKind::object:
      for (const Field& child : field.children) enqueue(d, child, scope, out);
      return;
    case FieldKind::multi_select:
      for (const Field& child : field.children) add_job(d, child, scope, Head::noul, out);
      return;
    case FieldKind::generate: generate_fields_[d].push_back({&field, scope}); return;
    case FieldKind::choice: return add_job(d, field, scope, Head::choice, out);
    case FieldKind::score: return add_job(d, field, scope, Head::score, out);
    case FieldKind::boolean: return add_job(d, field, scope, Head::noul, out);
    case FieldKind::extract: return add_job(d, field, scope, Head::extract, out);
    case FieldKind::count: return add_job(d, field, scope, Head::count, out);
    case FieldKind::anchor: return add_job(d, field, scope, Head::anchor, out);
  }
}

void Filler::add_job(size_t d, const Field& field, const ItemScope& scope, Head head,
                     std::vector<Job>& out) {
  Job job{.doc = d,
          .field = &field,
          .place = scope.place,
          .head = head,
          .anchor = scope.anchor,
          .region_lo = scope.region_lo,
          .region_hi = scope.region_hi};
  DegModel::Query q = model_.encode_query(field, scope.place);
  job.ids = std::move(q.ids);
  job.option_positions = std::move(q.option_positions);
  out.push_back(std::move(job));
}

// Every job as a fork row over its document's trunk, in batches under the token budget;
// keeps only the hidden rows the heads read.
void Filler::run_forks(std::vector<Job>& jobs) {
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].ids.size() < jobs[b].ids.size(); });
  const int64_t C = model_.backbone().spec().hidden;
  size_t begin = 0, batches = 0;
  while (begin < order.size()) {
    size_t end = begin + 1;
    while (end < order.size() && int64_t(jobs[order[end]].ids.size()) * int64_t(end - begin + 1) <=
                                     options_.fork_tokens) {
      ++end;
    }
    std::vector<PrefixRef> prefixes;
    std::map<size_t, int64_t> prefix_of;
    std::vector<int64_t> prow;
    std::vector<std::vector<int32_t>> rows;
    for (size_t i = begin; i < end; ++i) {
      const Job& job = jobs[order[i]];
      auto [it, added] = prefix_of.emplace(job.doc, int64_t(prefixes.size()));
      if (added)
        prefixes.push_back({.state = docs_[job.doc].trunk.get(), .row = docs_[job.doc].trunk_row});
      prow.push_back(it->second);
      rows.push_back(job.ids);
    }
    const auto t0 = std::chrono::steady_clock::now();
    TokenBatch batch = TokenBatch::padded(rows, model_.pad_id());
    ForkState fs = model_.backbone().fork(prefixes, prow, batch.tokens);
    // Each row's last token and its options' positions: the only hidden states the heads read.
    std::vector<int64_t> picks;
    for (size_t i = begin; i < end; ++i) {
      const Job& job = jobs[order[i]];
      const int64_t row = int64_t(i - begin) * batch.tokens;
      picks.push_back(row + int64_t(job.ids.size()) - 1);
      for (int64_t p : job.option_positions) picks.push_back(row + p);
    }
    Tensor hidden = model_.backbone().fork_forward(batch, fs, /*keep=*/false, false, picks);
    const float* h = hidden.data<float>();  // [picks, C]
    for (size_t i = begin; i < end; ++i) {
      Job& job = jobs[order[i]];
      job.answer_hidden.assign(h, h + C);
      h += C;
      const int64_t options = int64_t(job.option_positions.size());
      job.option_hidden.assign(h, h + options * C);
      h += options * C;
      if (!all_finite(job.answer_hidden.data(), C) ||
          !all_finite(job.option_hidden.data(), int64_t(job.option_hidden.size()))) {
        fail(job.doc, non_finite_error("the query of " + job.field->pointer));
      }
    }
    log::trace("fork batch {}: {} rows x {} tokens in {:.1f} ms", batches++, batch.rows,
               batch.tokens, ms_since(t0));
    if (progress_) {
      progress_({.stage = "answer", .done = int64_t(end), .total = int64_t(order.size())});
    }
    begin = end;
  }
}

void Filler::fail(size_t d, const std::string& why) {
  if (docs_[d].error.empty()) docs_[d].error = why;
}

}  // namespace deg::engine
