// The public C++ API of deg: open a model, fill JSON Schemas from documents. The CLI and the
// server use only the headers of include/deg (docs/api.md lists them).
//
//   deg::Engine engine = deg::Engine::open({.model = "ckpt/"});
//   auto results = engine.fill(schema_json, {"Invoice No. 12 ..."});
//   results[0].value   // the filled JSON
//   results[0].fields  // per field: path, kind, value, confidence, span
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deg/error.h"
#include "deg/input.h"

namespace deg {

struct EngineOptions {
  std::filesystem::path model;  // a deg checkpoint (or an HF snapshot with heads.safetensors)
  std::filesystem::path base;   // overrides deg.json "base" when the checkpoint's is elsewhere
  // Padded fork tokens per batched pass (memory, not results), in [1, kMaxForkTokens].
  int64_t fork_tokens = 16384;
  // cpu, cuda, or auto: $DEG_DEVICE when set, else cuda when a GPU is visible, else cpu.
  std::string device = "auto";
  // The backbone's dot products: exact (f32; bf16 weights widened exactly), bf16 (activations
  // rounded to bf16 once, f32 accumulation, as HF runs a bf16 model), or auto: bf16 on a GPU,
  // exact on the CPU. Weights stored in f32 always run exact.
  std::string gemm = "auto";
  InputLimits limits;  // documents over them fail alone, before they are tokenized
};

// The model used when none is named (deg fill without --model): the first of $DEG_MODEL; the
// default model installed beside the executable (<prefix>/share/deg/models/default, for
// <prefix>/bin/deg); the one in the source tree the library was built from (models/default).
// A place counts when it holds a deg checkpoint (deg.json); $DEG_MODEL, when set, is the only
// place looked at. Empty when there is none; `searched` (optional) gets the places looked at.
std::filesystem::path default_model(std::vector<std::filesystem::path>* searched = nullptr);

inline constexpr int64_t kMaxForkTokens = int64_t(1) << 24;  // 16,777,216

// One part of a document given in parts: text, or a media part read as soft tokens — embeddings
// made beforehand by the model's own vision / audio encoder (deg does not run encoders yet),
// placed where the part stands inside the model's media markers. Spans count the code points of
// the text parts only, joined as given (end a part with a space or newline where words must not
// run together): a media part is zero-width, so no span ever addresses it.
struct DocumentPart {
  std::string text;               // a text part (when `media` is empty)
  std::string media;              // "image" or "audio": a media part
  std::vector<float> embeddings;  // media: [rows, hidden size] row-major
  int64_t rows = 0;

  static DocumentPart of_text(std::string text) { return {.text = std::move(text)}; }
  static DocumentPart of_media(std::string kind, std::vector<float> embeddings, int64_t rows) {
    return {.media = std::move(kind), .embeddings = std::move(embeddings), .rows = rows};
  }
};
using DocumentParts = std::vector<DocumentPart>;

struct FillResult;

// Where a fill is, for a progress line: `stage` "read" (the trunk reads document `document`,
// `done` of `total` tokens) or "answer" (`done` of `total` queries of this round answered).
// "read" events come per read chunk for a long document, and once per document for short ones
// read together (shortest first, so not in document order).
struct FillProgress {
  std::string stage;
  size_t document = 0;  // 0-based, "read" only
  size_t documents = 0;
  int64_t done = 0, total = 0;
};

struct FillOptions {
  bool keep_nulls = false;  // keep optional fields whose answer is null (as JSON null)
  // Leaf answers (choices, scores, booleans, extracts, generated text, multi-select picks) whose
  // confidence is below this are withheld: the field reads as the null outcome, so it is left
  // out (null where the schema allows null, or with keep_nulls), and a required one is reported
  // in FillResult::missing. Their report entries say `withheld`. 0 (the default) keeps all.
  double min_confidence = 0;
  // Called on the calling thread as the fill goes (never changes a result); may be empty.
  std::function<void(const FillProgress&)> progress;
  // Called on the calling thread as each document is finished, with its final result (the one
  // the call returns in its place), before the call returns: a document whose fields need fewer
  // rounds (no array items, no generated text) is done before the others. May be empty.
  std::function<void(size_t document, const FillResult& result)> on_result;
};

// One answered field of the report. `path` is a concrete JSON pointer ("/items/0/price").
struct FieldReport {
  std::string path;
  std::string kind;  // choice, score, bool, extract, generate, anchor, count
  nlohmann::ordered_json value;
  double confidence = 0;                            // calibrated probability of this answer
  std::optional<std::pair<int64_t, int64_t>> span;  // code points of the document, extract only
  bool withheld = false;  // below FillOptions::min_confidence: not in the value
};

struct FillResult {
  std::string error;  // non-empty: this document failed (the others are unaffected)
  nlohmann::ordered_json value;
  std::vector<FieldReport> fields;  // schema order
  // Required fields for which the document holds no valid value at all (a required number in a
  // document without one, or x-generate text that is no value of its field: a pattern or format
  // it misses): left out of `value`, which then does not validate. Never silent: the CLI reports
  // them and exits 1 unless --allow-missing.
  std::vector<std::string> missing;
  bool ok() const { return error.empty(); }
};

// One request of Engine::fill_batch: a schema, its documents, its options. The call reads the
// schema and the documents until the request's last document is finished (its last on_result
// has returned), so a caller streaming results may let them go from there.
struct FillRequest {
  const nlohmann::ordered_json* schema = nullptr;
  const std::vector<DocumentParts>* documents = nullptr;
  // Per request: keep_nulls, min_confidence, and `progress`, which hears of its own documents
  // being read and of the answer stage of the whole call (whose rounds hold every request's
  // queries).
  FillOptions options;
};

// What Engine::fill_batch answers one request: its results, one per document in order, or the
// error Engine::fill would have thrown for it alone (then nothing of it was filled).
struct FillResponse {
  std::vector<FillResult> results;
  std::optional<Error> error;
};

class Engine {
 public:
  // Loads the model (weights are mapped, not copied). Throws deg::Error with what to do.
  static Engine open(const EngineOptions& options);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Fills `schema` from each document. Throws deg::Error for a schema deg cannot fill (before
  // any model work); a bad document (empty, not UTF-8, over the limits, or one the model reads
  // into NaN / infinite values) fails alone in its result.
  std::vector<FillResult> fill(const nlohmann::ordered_json& schema,
                               const std::vector<std::string>& documents,
                               const FillOptions& options = {}) const;
  // The same for documents given in parts (text and media); a document of one text part fills
  // exactly as that text does. A media part this model cannot read fails its document alone.
  std::vector<FillResult> fill(const nlohmann::ordered_json& schema,
                               const std::vector<DocumentParts>& documents,
                               const FillOptions& options = {}) const;
  // Fills several requests, with different schemas and options, in one call: the forks of every
  // document of every request share micro-batches, and batch invariance keeps each answer
  // bitwise the one its request gets from fill() alone. A request whose schema or options deg
  // cannot use gets its error; the others are filled.
  std::vector<FillResponse> fill_batch(const std::vector<FillRequest>& requests) const;
  // The media kinds this model reads as soft tokens ("image", "audio"; empty: text only) and
  // the width their embeddings must have.
  std::vector<std::string> media_kinds() const;
  int64_t hidden_size() const;

  const std::string& backbone_name() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deg
