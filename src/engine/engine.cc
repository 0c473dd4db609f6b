// The fill engine (DESIGN.md §3, the seed's DegModel.answer_many): each document's trunk is
// prefilled once (short documents together, as many as fill one prefill pass, each a row of a
// shared trunk state); every query of every document is a fork row over its trunk, run in batches
// under a padded-token budget; heads answer; anchored and counted arrays spawn their items'
// queries round after round; x-generate fields are decoded last from a KNOWN VALUES block;
// answers are assembled in schema order.
//
// Field independence: a query's tokens are rendered from its field and place alone and its fork
// reads only its own trunk, through row-invariant kernels, so its answer is bitwise the same
// whatever else is asked or batched with it.
//
// This file opens the engine, compiles each request's schema, reads each document into its trunk
// and checks every assembled value; the per-call loop (engine::Filler, engine/filler.h) lives by
// job in fill_schedule.cc (queries into fork batches and rounds), fill_heads.cc, fill_arrays.cc and
// fill_generate.cc.
#include "deg/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/assemble.h"
#include "engine/context.h"
#include "engine/decode.h"
#include "engine/filler.h"
#include "engine/model.h"
#include "kernels/cuda_runtime.h"
#include "schema/render.h"
#include "schema/validate.h"

namespace deg {

using engine::all_finite;
using engine::DegModel;
using engine::Document;
using engine::Filler;
using engine::ms_since;
using engine::non_finite_error;

struct Engine::Impl {
  std::unique_ptr<DegModel> model;
  EngineOptions options;
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

std::filesystem::path default_model(std::vector<std::filesystem::path>* searched) {
  namespace fs = std::filesystem;
  std::vector<fs::path> places;
  if (!env_config().model.empty()) {
    places.push_back(env_config().model);
  } else {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) places.push_back(exe.parent_path().parent_path() / "share/deg/models/default");
#ifdef DEG_SOURCE_MODELS_DIR
    places.push_back(fs::path(DEG_SOURCE_MODELS_DIR) / "default");
#endif
  }
  if (searched) *searched = places;
  for (const fs::path& p : places) {
    std::error_code ec;
    if (fs::is_regular_file(p / "deg.json", ec)) return p;
  }
  return {};
}

Engine Engine::open(const EngineOptions& options_in) {
  EngineOptions options = options_in;
  if (options.model.empty()) {
    std::vector<std::filesystem::path> searched;
    options.model = default_model(&searched);
    if (options.model.empty()) {
      std::string where;
      for (const auto& p : searched) where += "\n  " + p.string();
      throw Error(ErrorKind::not_found,
                  "no model given and no default model found; looked for a deg checkpoint "
                  "(deg.json) at:" +
                      where +
                      "\npass --model DIR (`deg init` or `deg train` make one), or set DEG_MODEL");
    }
  }
  if (options.fork_tokens < 1 || options.fork_tokens > kMaxForkTokens) {
    throw Error(ErrorKind::invalid_argument, fmt::format("--fork-tokens must be in [1, {}], got {}",
                                                         kMaxForkTokens, options.fork_tokens));
  }
  const InputLimits& l = options.limits;
  if (l.document_bytes < 1 || l.line_bytes < 1 || l.parts < 1 || l.media_bytes < 1) {
    throw Error(ErrorKind::invalid_argument, "input limits must be at least 1");
  }
  BackboneOptions backbone{.precision = GemmPrecision::exact,
                           .cuda_precision = GemmPrecision::bf16};
  if (options.gemm == "exact" || options.gemm == "bf16") {
    backbone.precision = options.gemm == "bf16" ? GemmPrecision::bf16 : GemmPrecision::exact;
    backbone.cuda_precision.reset();
  } else if (options.gemm != "auto") {
    throw Error(ErrorKind::invalid_argument,
                "--gemm must be auto, exact or bf16, got \"" + options.gemm + "\"");
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  backbone.device = pick_device(options.device);
  impl->model = DegModel::open(options.model, options.base, backbone);
  impl->options = options;
  const BackboneSpec& spec = impl->model->backbone().spec();
  log::debug(
      "model {} opened in {:.0f} ms: {} backbone ({} layers, hidden {}, vocab {}) on {}, {} "
      "dot products",
      options.model.string(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      impl->model->name(), spec.layers.size(), spec.hidden, spec.vocab,
      impl->model->backbone().options().device == Device::cuda ? "cuda" : "cpu",
      impl->model->backbone().options().precision == GemmPrecision::bf16 ? "bf16" : "exact");
  return Engine(std::move(impl));
}

const std::string& Engine::backbone_name() const {
  return impl_->model->name();
}

namespace {

// Tokens a document may have before its state would not fit in half of the memory it lives in:
// the machine's, and on a GPU the GPU's too (its K/V and the hidden states the heads read are
// there; the hidden states come through host memory).
int64_t max_document_tokens(const Backbone& bb) {
  int64_t per_token = bb.spec().hidden * 4 * 4;  // hidden states kept for the heads + scratch
  for (const LayerSpec& l : bb.spec().layers) {
    // Sliding and K/V-sharing layers keep no per-token K/V.
    if (l.kind == LayerKind::attention && l.window == 0 && l.kv_source < 0)
      per_token += 2 * l.kv_heads * l.head_dim * 4;
  }
  int64_t memory = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  if (bb.options().device == Device::cuda) {
    static const int64_t gpu_memory = [] {  // the first visible GPU's: the backend's
      const std::vector<CudaDeviceInfo> gpus = cuda_devices();
      return gpus.empty() ? int64_t(0) : int64_t(gpus[0].memory_bytes);
    }();
    if (gpu_memory > 0) memory = std::min(memory, gpu_memory);
  }
  return std::max<int64_t>(1, memory / 2 / std::max<int64_t>(1, per_token));
}

// A document whose context is built, waiting to be read.
struct Reading {
  size_t doc = 0;               // in the call's documents
  size_t index = 0, count = 0;  // in its request (progress)
  const FillOptions* fill = nullptr;
  TokenBatch batch;    // its trunk ids (one row), with its media as soft tokens
  int64_t tokens = 0;  // context tokens
  int64_t bytes = 0;
};

// Checks a document and builds its context; nullopt (doc.error set) when it cannot be read.
std::optional<Reading> prepare(const DegModel& model, const EngineOptions& options,
                               const FillOptions& fill, const DocumentParts& parts, size_t index,
                               size_t count, Document& doc) {
  const InputLimits& limits = options.limits;
  if (int64_t(parts.size()) > limits.parts) {
    doc.error =
        fmt::format("the document has {} parts, over the limit of {}", parts.size(), limits.parts);
    return std::nullopt;
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
    return std::nullopt;
  }
  if (blank) {
    doc.error = parts.empty() ? "the document has no parts"
                              : "the document is empty (no text but whitespace)";
    return std::nullopt;
  }
  const Backbone& bb = model.backbone();
  engine::DocumentContext ctx =
      engine::document_context(model.tokenizer(), bb.spec(), model.name(), parts);
  if (int64_t(ctx.ids.size()) > max_document_tokens(bb)) {
    doc.error = fmt::format(
        "the document has {} tokens, more than this machine's memory holds "
        "for {} ({}); split it",
        ctx.ids.size(), model.name(), max_document_tokens(bb));
    return std::nullopt;
  }
  Reading r{.index = index, .count = count, .fill = &fill, .bytes = bytes};
  r.batch = TokenBatch::single(model.trunk_ids(ctx.ids, &doc.ctx_start));
  if (!ctx.embeddings.empty()) {
    TokenBatch& batch = r.batch;
    batch.soft.rows.assign(size_t(batch.tokens), -1);
    std::copy(ctx.soft_rows.begin(), ctx.soft_rows.end(), batch.soft.rows.begin() + doc.ctx_start);
    const int64_t C = bb.spec().hidden;
    batch.soft.embeddings =
        Tensor::from_vector(ctx.embeddings, {int64_t(ctx.embeddings.size()) / C, C});
  }
  r.tokens = int64_t(ctx.ids.size());
  doc.context = {std::move(ctx.text), schema::TokenOffsets(std::move(ctx.ranges))};
  return r;
}

// Reads the documents of `group` into one trunk state, a row each: one prefill.
// Every kernel is row-invariant, so a document's state and hidden states are bitwise those it
// gets read alone.
void read_together(const Backbone& bb, std::vector<Document>& docs,
                   const std::vector<const Reading*>& group) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = int64_t(group.size());
  TokenBatch batch;
  if (n == 1) {
    batch = group[0]->batch;
  } else {
    std::vector<std::vector<int32_t>> rows;
    for (const Reading* r : group) rows.push_back(r->batch.ids);
    batch = TokenBatch::padded(rows);  // padded positions are never read
  }
  auto trunk = std::make_shared<State>(bb.empty_state(n));
  PrefillProgress progress;  // by chunk for a document read alone (a long one)
  const Reading& only = *group[0];
  if (n == 1 && only.fill->progress) {
    progress = [&](int64_t done, int64_t total) {
      only.fill->progress({.stage = "read",
                           .document = only.index,
                           .documents = only.count,
                           .done = done,
                           .total = total});
    };
  }
  // [n, L, C] where the backbone computes: the heads' keys are made there too.
  const Tensor hidden = bb.prefill(batch, *trunk, progress, /*on_backend=*/true);
  const Ops& ops = bb.family().ops();
  for (int64_t k = 0; k < n; ++k) {
    const Reading& r = *group[size_t(k)];
    Document& doc = docs[r.doc];
    doc.trunk = trunk;
    doc.trunk_row = k;
    const Tensor ctx = hidden.select(0, k).slice(0, doc.ctx_start, doc.ctx_start + r.tokens);
    // On a GPU the check is a sum of squares there (not finite exactly when a value is not).
    const bool finite = ops.device() == Device::cpu
                            ? all_finite(ctx.data<float>(), ctx.numel())
                            : std::isfinite(ops.sum_squares(ctx.data<float>(), ctx.numel()));
    if (!finite) doc.error = non_finite_error("reading the document");
    doc.ctx_hidden = ctx;
    if (n > 1 && r.fill->progress) {
      r.fill->progress({.stage = "read",
                        .document = r.index,
                        .documents = r.count,
                        .done = r.batch.tokens,
                        .total = r.batch.tokens});
    }
    log::debug("document {}: {} bytes, {} tokens read in {:.0f} ms ({})", r.index, r.bytes,
               r.batch.tokens, ms_since(t0),
               n == 1 ? std::string("alone") : fmt::format("{} read together", n));
  }
}

// Reads every prepared document. Short text documents are read together, as many at a time as
// fill one prefill pass (rows x padded length <= the backbone's read chunk), shortest first so
// that a group pads little; long ones and ones with media alone.
void read_documents(const Backbone& bb, std::vector<Document>& docs,
                    const std::vector<Reading>& readings) {
  std::vector<const Reading*> order;
  for (const Reading& r : readings) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), [](const Reading* a, const Reading* b) {
    return a->batch.tokens < b->batch.tokens;
  });
  const int64_t pass = bb.read_chunk();
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    if (order[i]->batch.soft.empty()) {
      while (j < order.size() && order[j]->batch.soft.empty() &&
             int64_t(j - i + 1) * order[j]->batch.tokens <= pass)
        ++j;
    }
    const std::vector<const Reading*> group(order.begin() + ptrdiff_t(i),
                                            order.begin() + ptrdiff_t(j));
    try {
      read_together(bb, docs, group);
    } catch (const Error& e) {
      // One document's failure must not take its group with it: each is read alone again.
      for (const Reading* r : group) {
        try {
          if (group.size() > 1) {
            docs[r->doc].error.clear();
            read_together(bb, docs, {r});
          } else {
            docs[r->doc].error = e.what();
          }
        } catch (const Error& alone) {
          docs[r->doc].error = alone.what();
        }
      }
    }
    i = j;
  }
}

// The result of a filled document. Every value is checked against its schema before it is
// returned; the one sanctioned gap is a required value the document does not hold
// (FillResult::missing). With keep_nulls the nulls of absent fields are the user's choice, so the
// value checked is the one without them. A value that does not validate is a bug in deg: it
// becomes its document's error instead of output.
FillResult result_of(const Document& doc, const schema::SchemaValidator& validator,
                     const FillOptions& options, size_t index) {
  if (!doc.error.empty()) return {.error = doc.error};
  FillResult result =
      engine::assemble(*doc.plan, doc.answers, options.keep_nulls, options.min_confidence);
  std::optional<FillResult> without_nulls;
  if (options.keep_nulls)
    without_nulls = engine::assemble(*doc.plan, doc.answers, false, options.min_confidence);
  const FillResult& checked = without_nulls ? *without_nulls : result;
  const std::vector<std::string> why =
      validator.violations(Json::parse(checked.value.dump()), checked.missing);
  if (why.empty()) return result;
  std::string list;
  for (size_t k = 0; k < why.size() && k < 3; ++k) list += (k ? "; " : "") + why[k];
  log::error("document {}: the filled value does not validate: {}", index, list);
  return {.error = "internal error: the filled value does not validate against the schema (" +
                   list + "); this is a bug in deg, please report it"};
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
  std::vector<FillResponse> answer =
      fill_batch({{.schema = &schema, .documents = &documents, .options = options}});
  if (answer[0].error) throw *answer[0].error;
  return std::move(answer[0].results);
}

std::vector<FillResponse> Engine::fill_batch(const std::vector<FillRequest>& requests) const {
  std::vector<FillResponse> out(requests.size());
  // Each request's plan, or its error: a bad schema or option fails its request alone.
  std::vector<std::optional<schema::Plan>> plans(requests.size());
  schema::PlanOptions plan_options;
  plan_options.array_mode = impl_->model->array_mode();
  for (size_t r = 0; r < requests.size(); ++r) {
    const FillOptions& options = requests[r].options;
    try {
      if (!(options.min_confidence >= 0 && options.min_confidence <= 1)) {
        throw Error(
            ErrorKind::invalid_argument,
            fmt::format("min_confidence must be in [0, 1], got {}", options.min_confidence));
      }
      const auto t0 = std::chrono::steady_clock::now();
      plans[r] = schema::plan_compile(*requests[r].schema, plan_options);
      int64_t fields = 0;
      schema::plan_visit(plans[r]->root, [&](const schema::Field&) { ++fields; });
      log::debug("plan: {} fields, {} of {} plan units, compiled in {:.1f} ms; {} documents",
                 fields, plans[r]->units, plan_options.max_units, ms_since(t0),
                 requests[r].documents->size());
    } catch (const Error& e) {
      out[r].error = e;
    }
  }
  // The documents of every request that compiled, in request order, and where each belongs.
  std::vector<Document> docs;
  std::vector<Reading> readings;
  std::vector<std::pair<size_t, size_t>> place;  // document -> (request, index in it)
  std::vector<std::optional<schema::SchemaValidator>> validators(requests.size());
  size_t total = 0;
  for (size_t r = 0; r < requests.size(); ++r)
    total += plans[r] ? requests[r].documents->size() : 0;
  docs.reserve(total);
  for (size_t r = 0; r < requests.size(); ++r) {
    if (!plans[r]) continue;
    validators[r].emplace(*requests[r].schema);
    const std::vector<DocumentParts>& documents = *requests[r].documents;
    out[r].results.resize(documents.size());
    for (size_t i = 0; i < documents.size(); ++i) {
      Document& doc = docs.emplace_back();
      place.emplace_back(r, i);
      doc.plan = &*plans[r];
      try {
        std::optional<Reading> reading = prepare(*impl_->model, impl_->options, requests[r].options,
                                                 documents[i], i, documents.size(), doc);
        if (reading) {
          reading->doc = docs.size() - 1;
          readings.push_back(std::move(*reading));
        }
      } catch (const Error& e) {
        doc.error = e.what();
      }
    }
  }
  read_documents(impl_->model->backbone(), docs, readings);
  readings = {};  // the documents' ids and media are in their trunks now
  for (size_t d = 0; d < docs.size(); ++d)
    if (!docs[d].error.empty())
      log::debug("document {} failed: {}", place[d].second, docs[d].error);
  Filler::Progress progress;
  if (std::any_of(requests.begin(), requests.end(),
                  [](const FillRequest& r) { return bool(r.options.progress); })) {
    progress = [&requests](const FillProgress& p) {
      for (const FillRequest& r : requests) {
        if (r.options.progress) r.options.progress(p);
      }
    };
  }
  // Each document's result as soon as it is finished; its request hears of it at once.
  const auto finished = [&](size_t d) {
    const auto [r, i] = place[d];
    FillResult& result = out[r].results[i];
    result = result_of(docs[d], *validators[r], requests[r].options, i);
    if (requests[r].options.on_result) requests[r].options.on_result(i, result);
  };
  Filler(*impl_->model, impl_->options, progress, finished, docs).run();
  return out;
}

}  // namespace deg
