// The fill engine (DESIGN.md §3, the seed's DegModel.answer_many): each document's trunk is
// prefilled once; every query of every document is a fork row over its trunk, run in batches
// under a padded-token budget; heads answer; anchored and counted arrays spawn their items'
// queries round after round; x-generate fields are decoded last from a KNOWN VALUES block;
// answers are assembled in schema order.
//
// Field independence: a query's tokens are rendered from its field and place alone and its fork
// reads only its own trunk, through row-invariant kernels, so its answer is bitwise the same
// whatever else is asked or batched with it.
#include "deg/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "engine/assemble.h"
#include "engine/context.h"
#include "engine/decode.h"
#include "engine/model.h"
#include "kernels/cuda_runtime.h"
#include "schema/render.h"
#include "schema/validate.h"

namespace deg {

using engine::Answers;
using engine::DegModel;
using schema::Field;
using schema::FieldKind;

struct Engine::Impl {
  std::unique_ptr<DegModel> model;
  EngineOptions options;
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

Engine Engine::open(const EngineOptions& options) {
  if (options.fork_tokens < 1 || options.fork_tokens > kMaxForkTokens) {
    throw Error(ErrorKind::invalid_argument, fmt::format("--fork-tokens must be in [1, {}], got {}",
                                                         kMaxForkTokens, options.fork_tokens));
  }
  const InputLimits& l = options.limits;
  if (l.document_bytes < 1 || l.line_bytes < 1 || l.parts < 1 || l.media_bytes < 1) {
    throw Error(ErrorKind::invalid_argument, "input limits must be at least 1");
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  const DeviceChoice device = pick_device(options.device);
  impl->model = DegModel::open(options.model, options.base,
                               {.device = device.device, .cpu_fallback = device.automatic});
  impl->options = options;
  const BackboneSpec& spec = impl->model->backbone().spec();
  log::debug(
      "model {} opened in {:.0f} ms: {} backbone ({} layers, hidden {}, vocab {}) on {}",
      options.model.string(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      impl->model->name(), spec.layers.size(), spec.hidden, spec.vocab,
      impl->model->backbone().options().device == Device::cuda ? "cuda" : "cpu");
  return Engine(std::move(impl));
}

const std::string& Engine::backbone_name() const {
  return impl_->model->name();
}

namespace {

// One document being filled.
struct Document {
  engine::ContextText context;  // code points + context token ranges
  int64_t ctx_start = 0;        // first context token in the trunk ids
  State state;                  // trunk state after reading it
  Tensor ctx_hidden;            // f32 [T, C] final-norm hidden of the context tokens
  Answers answers;
  std::string error;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// Why a document fails when the model's numbers stop being numbers (the weights are checked
// when they load, so this is an activation that overflowed).
std::string non_finite_error(const std::string& where) {
  return fmt::format(
      "the model computed NaN or infinite values ({}); no answer would be valid. The weights "
      "load finite, so an activation overflowed: try --device cpu, or a checkpoint in f32",
      where);
}

// NaN or +inf among logits where masked entries may be -inf.
bool overflowed(const std::vector<float>& logits) {
  return std::any_of(logits.begin(), logits.end(),
                     [](float v) { return std::isnan(v) || v == INFINITY; });
}

enum class Head : uint8_t { choice, score, noul, extract, count, anchor };

// One fork query.
struct Job {
  size_t doc = 0;
  const Field* field = nullptr;
  schema::QueryPlace place;
  Head head = Head::extract;
  int64_t anchor = -1;  // inside an anchored item: its anchor token and region
  int64_t region_lo = 0, region_hi = -1;
  std::vector<int32_t> ids;
  std::vector<int64_t> option_positions;
  std::vector<float> answer_hidden;  // [C]
  std::vector<float> option_hidden;  // [O, C]
};

struct ItemScope {  // where a query sits: enclosing arrays' indices and the innermost item
  schema::QueryPlace place;
  int64_t anchor = -1, region_lo = 0, region_hi = -1;
};

class Filler {
 public:
  Filler(const DegModel& model, const EngineOptions& options, const FillOptions& fill,
         std::vector<Document>& docs)
      : model_(model), options_(options), fill_(fill), docs_(docs) {}

  void run(const schema::Plan& plan) {
    std::vector<Job> jobs;
    for (size_t d = 0; d < docs_.size(); ++d) {
      if (docs_[d].error.empty()) enqueue(d, plan.root, ItemScope{}, jobs);
    }
    for (int round = 0; !jobs.empty(); ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      const size_t queries = jobs.size();
      run_forks(jobs);
      std::vector<Job> next;
      answer(jobs, next);
      log::debug("round {}: {} queries answered in {:.0f} ms; {} item queries next", round, queries,
                 ms_since(t0), next.size());
      jobs = std::move(next);
    }
    for (size_t d = 0; d < docs_.size(); ++d) {
      if (docs_[d].error.empty()) {
        const auto t0 = std::chrono::steady_clock::now();
        generate(plan, d);
        if (generate_fields_.count(d))
          log::debug("document {}: {} x-generate fields written in {:.0f} ms", d,
                     generate_fields_[d].size(), ms_since(t0));
      }
    }
  }

 private:
  // Queries for `field` (and, for objects, its descendants) at `scope`.
  void enqueue(size_t d, const Field& field, const ItemScope& scope, std::vector<Job>& out) {
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

  void add_job(size_t d, const Field& field, const ItemScope& scope, Head head,
               std::vector<Job>& out) {
    Job job{.doc = d,
            .field = &field,
            .place = scope.place,
            .head = head,
            .anchor = scope.anchor,
            .region_lo = scope.region_lo,
            .region_hi = scope.region_hi};
    schema::RenderedQuery q = schema::render_query(field, scope.place);
    for (const schema::TextPiece& piece : schema::query_pieces(q)) {
      std::vector<int32_t> ids = model_.encode(piece.text);
      job.ids.insert(job.ids.end(), ids.begin(), ids.end());
      if (piece.option_end) job.option_positions.push_back(int64_t(job.ids.size()) - 1);
    }
    if (job.ids.empty()) {
      throw Error(ErrorKind::format,
                  fmt::format("the tokenizer encodes the query of {} to no tokens; it cannot "
                              "encode plain text (use the model's own tokenizer.json)",
                              field.pointer),
                  {.path = model_.tokenizer().source()});
    }
    out.push_back(std::move(job));
  }

  // Every job as a fork row over its document's trunk, in batches under the token budget;
  // keeps only the hidden rows the heads read.
  void run_forks(std::vector<Job>& jobs) {
    std::vector<size_t> order(jobs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return jobs[a].ids.size() < jobs[b].ids.size(); });
    const int64_t C = model_.backbone().spec().hidden;
    size_t begin = 0, batches = 0;
    while (begin < order.size()) {
      size_t end = begin + 1;
      while (end < order.size() &&
             int64_t(jobs[order[end]].ids.size()) * int64_t(end - begin + 1) <=
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
        if (added) prefixes.push_back({.state = &docs_[job.doc].state, .row = 0});
        prow.push_back(it->second);
        rows.push_back(job.ids);
      }
      const auto t0 = std::chrono::steady_clock::now();
      TokenBatch batch = TokenBatch::padded(rows, model_.pad_id());
      ForkState fs = model_.backbone().fork(prefixes, prow, batch.tokens);
      Tensor hidden = model_.backbone().fork_forward(batch, fs, /*keep=*/false);  // [B, L, C]
      const float* h = hidden.data<float>();
      for (size_t i = begin; i < end; ++i) {
        Job& job = jobs[order[i]];
        const float* row = h + int64_t(i - begin) * batch.tokens * C;
        const int64_t last = int64_t(job.ids.size()) - 1;
        job.answer_hidden.assign(row + last * C, row + (last + 1) * C);
        for (int64_t p : job.option_positions) {
          job.option_hidden.insert(job.option_hidden.end(), row + p * C, row + (p + 1) * C);
        }
        if (!all_finite(job.answer_hidden.data(), C) ||
            !all_finite(job.option_hidden.data(), int64_t(job.option_hidden.size()))) {
          fail(job.doc, non_finite_error("the query of " + job.field->pointer));
        }
      }
      log::trace("fork batch {}: {} rows x {} tokens in {:.1f} ms", batches++, batch.rows,
                 batch.tokens, ms_since(t0));
      if (fill_.progress) {
        fill_.progress({.stage = "answer", .done = int64_t(end), .total = int64_t(order.size())});
      }
      begin = end;
    }
  }

  void fail(size_t d, const std::string& why) {
    if (docs_[d].error.empty()) docs_[d].error = why;
  }

  // Heads over the finished forks, per document; arrays schedule their items' queries.
  void answer(std::vector<Job>& jobs, std::vector<Job>& next) {
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
          engine::Pick p =
              engine::pick_best(logits.data(), int64_t(logits.size()),
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
          doc.answers.set(ptr, {.kind = "bool", .value = yes, .confidence = yes ? p[0] : p[1]});
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

  std::vector<float> stack_answers(const std::vector<Job>& jobs, const std::vector<size_t>& idx) {
    std::vector<float> a;
    for (size_t i : idx)
      a.insert(a.end(), jobs[i].answer_hidden.begin(), jobs[i].answer_hidden.end());
    return a;
  }

  void answer_extracts(std::vector<Job>& jobs, const std::vector<size_t>& idx, size_t d) {
    Document& doc = docs_[d];
    const Heads& heads = model_.heads();
    const int64_t T = doc.ctx_hidden.dim(0);
    std::vector<float> a = stack_answers(jobs, idx);
    std::vector<SpanQuery> sq;
    for (size_t i : idx) sq.push_back({.anchor = jobs[i].anchor, .region_end = jobs[i].region_hi});
    SpanLogits lg =
        span_logits(heads, a.data(), int64_t(idx.size()), sq, doc.ctx_hidden.data<float>(), T);
    if (overflowed(lg.start) || overflowed(lg.end)) return fail(d, non_finite_error("span logits"));
    for (size_t j = 0; j < idx.size(); ++j) {
      const Job& job = jobs[idx[j]];
      engine::SpanAnswer s = engine::decode_span(
          lg.start.data() + int64_t(j) * (T + 1), lg.end.data() + int64_t(j) * (T + 1), doc.context,
          job.field->value, job.field->null_masked, heads.temp(HeadKind::extract));
      engine::Answer ans{.kind = "extract",
                         .value = s.value ? *s.value : Json(nullptr),
                         .confidence = s.confidence};
      if (s.value) ans.span = {{s.char_start, s.char_end}};
      doc.answers.set(schema::field_pointer(*job.field, job.place.indices), std::move(ans));
    }
  }

  void answer_anchors(std::vector<Job>& jobs, const std::vector<size_t>& idx, size_t d,
                      std::vector<Job>& next) {
    Document& doc = docs_[d];
    const int64_t T = doc.ctx_hidden.dim(0);
    std::vector<float> a = stack_answers(jobs, idx);
    std::vector<Region> regions;
    for (size_t i : idx) regions.push_back({.lo = jobs[i].region_lo, .hi = jobs[i].region_hi});
    std::vector<float> lg = anchor_logits(model_.heads(), a.data(), int64_t(idx.size()), regions,
                                          doc.ctx_hidden.data<float>(), T);
    if (overflowed(lg)) return fail(d, non_finite_error("anchor logits"));
    const auto& off = doc.context.offsets.offsets();
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
        const int64_t c0 = off[size_t(it.anchor)].start;
        const int64_t c1 = it.region_end > it.anchor ? off[size_t(it.region_end - 1)].end : c0;
        std::u32string_view quote =
            std::u32string_view(doc.context.text)
                .substr(size_t(c0),
                        size_t(std::min<int64_t>(c1 - c0, 4 * schema::kItemQuoteChars)));
        scope.place.item = schema::ItemLine{.mode = schema::ItemLine::Mode::anchor,
                                            .text = engine::utf8_of(quote)};
        enqueue(d, job.field->children.at(0), scope, next);
      }
      doc.answers.set(ptr, {.kind = "anchor",
                            .value = int64_t(items.size()),
                            .confidence = items.empty() ? 1.0 : confidence});
    }
  }

  // x-generate fields: the KNOWN VALUES block read once after the trunk, then every generate
  // field of the document as a fork row of one batched greedy decode.
  void generate(const schema::Plan& plan, size_t d) {
    Document& doc = docs_[d];
    auto found = generate_fields_.find(d);
    if (found == generate_fields_.end()) return;
    const auto& fields = found->second;
    const Backbone& bb = model_.backbone();
    State known = doc.state.clone();
    std::vector<int32_t> known_ids = model_.encode(schema::known_block(doc.answers.known(plan)));
    bb.prefill(TokenBatch::single(known_ids), known);
    std::vector<std::vector<int32_t>> rows;
    int64_t budget = 0;
    for (const auto& g : fields) {
      rows.push_back(model_.encode(schema::generate_header(*g.field, g.scope.place)));
      budget = std::max(budget, g.field->max_tokens);
    }
    TokenBatch batch = TokenBatch::padded(rows, model_.pad_id());
    ForkState fs = bb.fork({{.state = &known, .row = 0}}, std::vector<int64_t>(rows.size(), 0),
                           batch.tokens + budget + 1);
    Tensor hidden = bb.fork_forward(batch, fs, /*keep=*/true);
    const int64_t C = bb.spec().hidden, B = int64_t(rows.size());
    std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
    std::vector<bool> done(static_cast<size_t>(B), false);
    std::vector<double> logprob(static_cast<size_t>(B), 0.0);
    Tensor last = Tensor::empty({B, C}, DType::f32);
    for (int64_t b = 0; b < B; ++b) {
      const float* src =
          hidden.data<float>() + (b * batch.tokens + batch.lengths[size_t(b)] - 1) * C;
      std::copy(src, src + C, last.mutable_data<float>() + b * C);
    }
    for (int64_t step = 0;; ++step) {
      Tensor logits = bb.lm_logits(last);  // [B, V]
      const int64_t V = logits.dim(1);
      std::vector<int32_t> step_ids(size_t(B), model_.eos_id());
      bool any = false;
      if (!all_finite(logits.data<float>(), B * V)) return fail(d, non_finite_error("LM logits"));
      for (int64_t b = 0; b < B; ++b) {
        if (done[size_t(b)]) continue;
        const float* l = logits.data<float>() + b * V;
        const int64_t best = std::max_element(l, l + V) - l;
        logprob[size_t(b)] += std::log(engine::softmax(l, V, 1.0)[size_t(best)]);
        if (best == model_.eos_id() ||
            int64_t(out[size_t(b)].size()) >= fields[size_t(b)].field->max_tokens) {
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
      Tensor h = bb.fork_forward(one, fs, /*keep=*/true, /*decode=*/true);
      std::copy(h.data<float>(), h.data<float>() + B * C, last.mutable_data<float>());
    }
    for (size_t b = 0; b < fields.size(); ++b) {
      std::string text = model_.tokenizer().decode(out[b], /*skip_special_tokens=*/true);
      const Field& f = *fields[b].field;
      if (f.value.max_length) text = engine::utf8_prefix(text, *f.value.max_length);
      std::optional<Json> v = schema::value_read(f.value, text);
      doc.answers.set(
          schema::field_pointer(f, fields[b].scope.place.indices),
          {.kind = "generate", .value = v ? *v : Json(text), .confidence = std::exp(logprob[b])});
    }
  }

  struct GenerateField {
    const Field* field;
    ItemScope scope;
  };

  const DegModel& model_;
  const EngineOptions& options_;
  const FillOptions& fill_;
  std::vector<Document>& docs_;
  std::map<size_t, std::vector<GenerateField>> generate_fields_;
};

// Tokens a document may have before its state would not fit in half of the machine's memory.
int64_t max_document_tokens(const Backbone& bb) {
  int64_t per_token = bb.spec().hidden * 4 * 4;  // hidden states kept for the heads + scratch
  for (const LayerSpec& l : bb.spec().layers) {
    // Sliding and K/V-sharing layers keep no per-token K/V.
    if (l.kind == LayerKind::attention && l.window == 0 && l.kv_source < 0)
      per_token += 2 * l.kv_heads * l.head_dim * 4;
  }
  const int64_t memory = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  return std::max<int64_t>(1, memory / 2 / std::max<int64_t>(1, per_token));
}

void prepare(const DegModel& model, const EngineOptions& options, const FillOptions& fill,
             const DocumentParts& parts, size_t index, size_t count, Document& doc) {
  const InputLimits& limits = options.limits;
  if (int64_t(parts.size()) > limits.parts) {
    doc.error =
        fmt::format("the document has {} parts, over the limit of {}", parts.size(), limits.parts);
    return;
  }
  bool blank = true;
  int64_t bytes = 0;
  for (const DocumentPart& p : parts) {
    blank = blank && p.media.empty() && p.text.find_first_not_of(" \t\r\n") == std::string::npos;
    bytes += int64_t(p.text.size());
  }
  if (bytes > limits.document_bytes) {
    doc.error = fmt::format(
        "the document has {} bytes of text, over the limit of {} bytes; split it, or raise "
        "--max-document-bytes",
        bytes, limits.document_bytes);
    return;
  }
  if (blank) {
    doc.error = parts.empty() ? "the document has no parts"
                              : "the document is empty (no text but whitespace)";
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Backbone& bb = model.backbone();
  engine::DocumentContext ctx =
      engine::document_context(model.tokenizer(), bb.spec(), model.name(), parts);
  if (int64_t(ctx.ids.size()) > max_document_tokens(bb)) {
    doc.error = fmt::format(
        "the document has {} tokens, more than this machine's memory holds "
        "for {} ({}); split it",
        ctx.ids.size(), model.name(), max_document_tokens(bb));
    return;
  }
  std::vector<int32_t> ids = model.encode_template(model.layout().bos + model.layout().prefix);
  doc.ctx_start = int64_t(ids.size());
  ids.insert(ids.end(), ctx.ids.begin(), ctx.ids.end());
  std::vector<int32_t> suffix = model.encode("\n");
  ids.insert(ids.end(), suffix.begin(), suffix.end());
  TokenBatch batch = TokenBatch::single(ids);
  if (!ctx.embeddings.empty()) {
    batch.soft.rows.assign(ids.size(), -1);
    std::copy(ctx.soft_rows.begin(), ctx.soft_rows.end(), batch.soft.rows.begin() + doc.ctx_start);
    const int64_t C = bb.spec().hidden;
    batch.soft.embeddings =
        Tensor::from_vector(ctx.embeddings, {int64_t(ctx.embeddings.size()) / C, C});
  }
  const auto T = int64_t(ctx.ids.size());
  doc.context = {std::move(ctx.text), schema::TokenOffsets(std::move(ctx.ranges))};
  doc.state = bb.empty_state(1);
  PrefillProgress progress;
  if (fill.progress) {
    progress = [&](int64_t done, int64_t total) {
      fill.progress(
          {.stage = "read", .document = index, .documents = count, .done = done, .total = total});
    };
  }
  Tensor hidden = bb.prefill(batch, doc.state, progress);  // [1, L, C]
  doc.ctx_hidden = hidden.select(0, 0).slice(0, doc.ctx_start, doc.ctx_start + T).contiguous();
  if (!all_finite(doc.ctx_hidden.data<float>(), doc.ctx_hidden.numel())) {
    doc.error = non_finite_error("reading the document");
  }
  log::debug("document {}: {} bytes, {} tokens read in {:.0f} ms", index, bytes, ids.size(),
             ms_since(t0));
}

}  // namespace

std::vector<FillResult> Engine::fill(const OrderedJson& schema,
                                     const std::vector<std::string>& documents,
                                     const FillOptions& options) const {
  std::vector<DocumentParts> parts;
  parts.reserve(documents.size());
  for (const std::string& d : documents) parts.push_back({DocumentPart::of_text(d)});
  return fill(schema, parts, options);
}

std::vector<std::string> Engine::media_kinds() const {
  std::vector<std::string> kinds;
  for (const auto& m : impl_->model->backbone().spec().media) kinds.push_back(m.kind);
  return kinds;
}

int64_t Engine::hidden_size() const {
  return impl_->model->backbone().spec().hidden;
}

std::vector<FillResult> Engine::fill(const OrderedJson& schema,
                                     const std::vector<DocumentParts>& documents,
                                     const FillOptions& options) const {
  schema::PlanOptions plan_options;
  plan_options.array_mode = impl_->model->array_mode();
  const auto t0 = std::chrono::steady_clock::now();
  const schema::Plan plan = schema::plan_compile(schema, plan_options);
  int64_t fields = 0;
  schema::plan_visit(plan.root, [&](const schema::Field&) { ++fields; });
  log::debug("plan: {} fields, {} of {} plan units, compiled in {:.1f} ms; {} documents", fields,
             plan.units, plan_options.max_units, ms_since(t0), documents.size());
  std::vector<Document> docs(documents.size());
  for (size_t i = 0; i < documents.size(); ++i) {
    try {
      prepare(*impl_->model, impl_->options, options, documents[i], i, documents.size(), docs[i]);
    } catch (const Error& e) {
      docs[i].error = e.what();
    }
    if (!docs[i].error.empty()) log::debug("document {} failed: {}", i, docs[i].error);
  }
  Filler(*impl_->model, impl_->options, options, docs).run(plan);
  // Every value is checked against its schema before it is returned; the one sanctioned gap is a
  // required value the document does not hold (FillResult::missing). With keep_nulls the nulls
  // of absent fields are the user's choice, so the value checked is the one without them. A value
  // that does not validate is a bug in deg: it becomes its document's error instead of output.
  const schema::SchemaValidator validator(schema);
  std::vector<FillResult> results(docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    if (!docs[i].error.empty()) {
      results[i].error = docs[i].error;
      continue;
    }
    results[i] = engine::assemble(plan, docs[i].answers, options.keep_nulls);
    const FillResult& checked =
        options.keep_nulls ? engine::assemble(plan, docs[i].answers, false) : results[i];
    const std::vector<std::string> why =
        validator.violations(Json::parse(checked.value.dump()), checked.missing);
    if (!why.empty()) {
      std::string list;
      for (size_t k = 0; k < why.size() && k < 3; ++k) list += (k ? "; " : "") + why[k];
      log::error("document {}: the filled value does not validate: {}", i, list);
      results[i] = FillResult{.error =
                                  "internal error: the filled value does not validate "
                                  "against the schema (" +
                                  list + "); this is a bug in deg, please report it"};
    }
  }
  return results;
}

}  // namespace deg
