// x-generate fields (engine/filler.h): each document's KNOWN VALUES block read once after its
// trunk, then every generate field of the documents finished together as a fork row of one
// batched greedy decode.
#include <algorithm>

#include "core/log.h"
#include "engine/filler.h"
#include "schema/spans.h"

namespace deg::engine {

// x-generate fields of several documents: each document's KNOWN VALUES block read once after its
// trunk, then every generate field of every document as a fork row of one batched greedy
// decode (rows over different prefixes: each row's tokens are what it gets alone).
void Filler::generate(const std::vector<size_t>& group) {
  const Backbone& bb = model_.backbone();
  std::vector<std::unique_ptr<State>> known;  // one per document of the group
  std::vector<PrefixRef> prefixes;
  std::vector<size_t> doc_of;  // per row: its document
  std::vector<const GenerateField*> fields;
  std::vector<int64_t> prow;
  std::vector<std::vector<int32_t>> rows;
  int64_t budget = 0, known_tokens = 0;
  const auto t_read = std::chrono::steady_clock::now();
  for (size_t d : group) {
    Document& doc = docs_[d];
    known.push_back(std::make_unique<State>(doc.trunk->row(doc.trunk_row)));
    const std::vector<int32_t> known_ids =
        model_.encode(schema::known_block(doc.answers.known(*doc.plan)));
    bb.prefill(TokenBatch::single(known_ids), *known.back());
    known_tokens += int64_t(known_ids.size());
    prefixes.push_back({.state = known.back().get(), .row = 0});
    for (const GenerateField& g : generate_fields_.at(d)) {
      rows.push_back(model_.encode(schema::generate_header(*g.field, g.scope.place)));
      budget = std::max(budget, g.field->max_tokens);
      doc_of.push_back(d);
      fields.push_back(&g);
      prow.push_back(int64_t(prefixes.size()) - 1);
    }
  }
  if (rows.empty()) return;
  TokenBatch batch = TokenBatch::padded(rows, model_.pad_id());
  ForkState fs = bb.fork(prefixes, prow, batch.tokens + budget + 1);
  const int64_t C = bb.spec().hidden, B = int64_t(rows.size());
  std::vector<int64_t> header_ends;  // each row's last header token
  for (int64_t b = 0; b < B; ++b)
    header_ends.push_back(b * batch.tokens + batch.lengths[size_t(b)] - 1);
  Tensor last = bb.fork_forward(batch, fs, /*keep=*/true, false, header_ends);  // [B, C]
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  std::vector<double> logprob(static_cast<size_t>(B), 0.0);
  const double read_ms = ms_since(t_read);  // the KNOWN VALUES blocks and the headers
  const auto t0 = std::chrono::steady_clock::now();
  int64_t steps = 0;
  double head_ms = 0, step_ms = 0;  // LM head and its picks, decode steps; the rest: the host's
  const int64_t id_limit = model_.tokenizer().id_limit();
  for (int64_t step = 0;; ++step, ++steps) {
    auto t1 = std::chrono::steady_clock::now();
    // The greedy picks where the logits are (only they come back from a GPU), among the ids the
    // tokenizer can write (random or padded rows past them decode to nothing).
    const std::vector<Backbone::LogitPick> picks = bb.lm_picks(last, id_limit);
    head_ms += ms_since(t1);
    std::vector<int32_t> step_ids(size_t(B), model_.eos_id());
    bool any = false;
    // A document whose logits overflow fails alone: its rows stop.
    for (int64_t b = 0; b < B; ++b)
      if (picks[size_t(b)].bad || picks[size_t(b)].best < 0)
        fail(doc_of[size_t(b)], non_finite_error("LM logits"));
    for (int64_t b = 0; b < B; ++b) {
      if (!docs_[doc_of[size_t(b)]].error.empty()) done[size_t(b)] = true;
      if (done[size_t(b)]) continue;
      const Backbone::LogitPick& p = picks[size_t(b)];
      int64_t best = p.best;
      float logit = p.best_logit;
      // A minLength: the end of the text is passed over (the next most likely token taken)
      // until the text is that long, so the value validates.
      const std::optional<int64_t>& min_length = fields[size_t(b)]->field->value.min_length;
      if (best == model_.eos_id() && min_length &&
          int64_t(schema::utf8_to_code_points(model_.tokenizer().decode(out[size_t(b)], true))
                      .value_or(std::u32string())
                      .size()) < *min_length) {
        if (p.second >= 0) {
          best = p.second;
          logit = p.second_logit;
        }
      }
      logprob[size_t(b)] += p.log_prob(logit);
      if (best == model_.eos_id() ||
          int64_t(out[size_t(b)].size()) >= fields[size_t(b)]->field->max_tokens) {
        done[size_t(b)] = true;
        continue;
      }
      out[size_t(b)].push_back(int32_t(best));
      step_ids[size_t(b)] = int32_t(best);
      any = true;
    }
    if (!any || step >= budget) break;
    TokenBatch one{
        .ids = step_ids, .rows = B, .tokens = 1, .lengths = std::vector<int64_t>(size_t(B), 1)};
    t1 = std::chrono::steady_clock::now();
    Tensor h = bb.fork_forward(one, fs, /*keep=*/true, /*decode=*/true);
    step_ms += ms_since(t1);
    std::copy(h.data<float>(), h.data<float>() + B * C, last.mutable_data<float>());
  }
  log::debug(
      "{} documents: KNOWN VALUES blocks ({} tokens) and headers read in {:.1f} ms; {} x-generate "
      "rows decoded in {} steps, {:.1f} ms ({:.2f} ms a step: LM head and picks {:.2f}, backbone "
      "{:.2f}, host {:.2f})",
      group.size(), known_tokens, read_ms, B, steps, ms_since(t0),
      ms_since(t0) / double(std::max<int64_t>(steps, 1)),
      head_ms / double(std::max<int64_t>(steps, 1)), step_ms / double(std::max<int64_t>(steps, 1)),
      (ms_since(t0) - head_ms - step_ms) / double(std::max<int64_t>(steps, 1)));
  for (size_t b = 0; b < fields.size(); ++b) {
    Document& doc = docs_[doc_of[b]];
    if (!doc.error.empty()) continue;
    std::string text = model_.tokenizer().decode(out[b], /*skip_special_tokens=*/true);
    const Field& f = *fields[b]->field;
    if (f.value.max_length) text = engine::utf8_prefix(text, *f.value.max_length);
    const std::string pointer = schema::field_pointer(f, fields[b]->scope.place.indices);
    std::optional<Json> v = schema::value_read(f.value, text);
    if (!v) {
      // Text that is no value of the field (a pattern or format it misses, or shorter than its
      // minLength when the decode budget ran out) is not output: the field reads as null, and a
      // required one is reported missing, as a value the document does not hold.
      log::debug("document {}: x-generate {}: {:?} is not a valid value; left out", doc_of[b],
                 pointer, text);
      doc.answers.set(pointer, {.kind = "generate", .value = Json(nullptr), .confidence = 0});
      continue;
    }
    doc.answers.set(pointer, {.kind = "generate", .value = *v, .confidence = std::exp(logprob[b])});
  }
}

}  // namespace deg::engine
