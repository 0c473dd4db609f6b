// The fill engine's inner loop (engine.cc's Engine::fill_batch), one class over the documents of
// a call — each with its own plan, so documents of different schemas share fork batches — whose
// jobs live in their own files: scheduling queries into fork batches and rounds
// (fill_schedule.cc), the heads over finished forks (fill_heads.cc), arrays whose anchors and
// counts spawn their items' queries (fill_arrays.cc), and x-generate decoding
// (fill_generate.cc). Internal to src/engine.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "deg/engine.h"
#include "engine/assemble.h"
#include "engine/context.h"
#include "engine/decode.h"
#include "engine/model.h"
#include "schema/render.h"

namespace deg::engine {

using schema::Field;
using schema::FieldKind;

// One document being filled.
struct Document {
  const schema::Plan* plan = nullptr;  // its request's schema, compiled
  engine::ContextText context;         // code points + context token ranges
  int64_t ctx_start = 0;               // first context token in the trunk ids
  // Trunk state after reading it: row trunk_row of a state that short documents read together
  // share (kept until the last of them is done).
  std::shared_ptr<State> trunk;
  int64_t trunk_row = 0;
  Tensor ctx_hidden;  // f32 [T, C] final-norm hidden of the context tokens, in the backbone's
                      // memory (the heads' keys are made where it is)
  ContextKeys keys;   // the heads' projections of ctx_hidden, made once for every round
  Answers answers;
  std::string error;
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

inline bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// Why a document fails when the model's numbers stop being numbers (the weights are checked
// when they load, so this is an activation that overflowed).
inline std::string non_finite_error(const std::string& where) {
  return fmt::format(
      "the model computed NaN or infinite values ({}); no answer would be valid. The weights "
      "load finite, so an activation overflowed: try --device cpu, or a checkpoint in f32",
      where);
}

// NaN or +inf among logits where masked entries may be -inf.
inline bool overflowed(const std::vector<float>& logits) {
  return std::any_of(logits.begin(), logits.end(),
                     [](float v) { return std::isnan(v) || v == INFINITY; });
}

// Documents whose x-generate fields decode as one batch at most (each holds a copy of its trunk
// state while they do).
inline constexpr size_t kGenerateDocuments = 16;

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
  using Progress = std::function<void(const FillProgress&)>;
  using Finished = std::function<void(size_t document)>;
  // `progress` (may be empty) hears of the answer stage of the whole call; `finished` of each
  // document once it has all its answers (or failed), after which its trunk is released.
  Filler(const DegModel& model, const EngineOptions& options, Progress progress, Finished finished,
         std::vector<Document>& docs)
      : model_(model),
        options_(options),
        progress_(std::move(progress)),
        finished_(std::move(finished)),
        docs_(docs) {}

  void run();

 private:
  struct GenerateField {
    const Field* field;
    ItemScope scope;
  };

  // ---- scheduling (fill_schedule.cc) ----
  // Queries for `field` (and, for objects, its descendants) at `scope`.
  void enqueue(size_t d, const Field& field, const ItemScope& scope, std::vector<Job>& out);
  void add_job(size_t d, const Field& field, const ItemScope& scope, Head head,
               std::vector<Job>& out);
  // Every job as a fork row over its document's trunk, in batches under the token budget;
  // keeps only the hidden rows the heads read.
  void run_forks(std::vector<Job>& jobs);
  void fail(size_t d, const std::string& why);
  // Documents not yet finished that ask nothing more in the round `upcoming`: their x-generate
  // fields are written, then they are finished.
  void finish_idle(const std::vector<Job>& upcoming, std::vector<bool>& finished);

  // ---- heads (fill_heads.cc) ----
  // Heads over the finished forks, per document; arrays schedule their items' queries.
  void answer(std::vector<Job>& jobs, std::vector<Job>& next);
  std::vector<float> stack_answers(const std::vector<Job>& jobs, const std::vector<size_t>& idx);
  void answer_extracts(std::vector<Job>& jobs, const std::vector<size_t>& idx, size_t d);

  // ---- arrays (fill_arrays.cc) ----
  void answer_anchors(std::vector<Job>& jobs, const std::vector<size_t>& idx, size_t d,
                      std::vector<Job>& next);

  // ---- x-generate (fill_generate.cc) ----
  // x-generate fields of the documents of `group` (each with some, none failed): each one's
  // KNOWN VALUES block read once after its trunk, then every generate field of all of them as a
  // fork row of one batched greedy decode.
  void generate(const std::vector<size_t>& group);

  const DegModel& model_;
  const EngineOptions& options_;
  const Progress progress_;
  const Finished finished_;
  std::vector<Document>& docs_;
  std::map<size_t, std::vector<GenerateField>> generate_fields_;
};

}  // namespace deg::engine
