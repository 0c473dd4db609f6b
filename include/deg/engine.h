// The public C++ API of deg: open a model, fill JSON Schemas from documents. The CLI and the
// server use only this header (and model_info.h).
//
//   deg::Engine engine = deg::Engine::open({.model = "ckpt/"});
//   auto results = engine.fill(schema_json, {"Invoice No. 12 ..."});
//   results[0].value   // the filled JSON
//   results[0].fields  // per field: path, kind, value, confidence, span
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deg {

struct EngineOptions {
  std::filesystem::path model;  // a deg checkpoint (or an HF snapshot with heads.safetensors)
  std::filesystem::path base;   // overrides deg.json "base" when the checkpoint's is elsewhere
  int64_t fork_tokens = 16384;  // padded fork tokens per batched pass (memory, not results)
};

struct FillOptions {
  bool keep_nulls = false;  // keep optional fields whose answer is null (as JSON null)
};

// One answered field of the report. `path` is a concrete JSON pointer ("/items/0/price").
struct FieldReport {
  std::string path;
  std::string kind;  // choice, score, bool, extract, generate, anchor, count
  nlohmann::ordered_json value;
  double confidence = 0;                            // calibrated probability of this answer
  std::optional<std::pair<int64_t, int64_t>> span;  // code points of the document, extract only
};

struct FillResult {
  std::string error;  // non-empty: this document failed (the others are unaffected)
  nlohmann::ordered_json value;
  std::vector<FieldReport> fields;  // schema order
  bool ok() const { return error.empty(); }
};

class Engine {
 public:
  // Loads the model (weights are mapped, not copied). Throws deg::Error with what to do.
  static Engine open(const EngineOptions& options);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Fills `schema` from each document. Throws deg::Error for a schema deg cannot fill (before
  // any model work); a bad document (empty, not UTF-8, too long) fails alone in its result.
  std::vector<FillResult> fill(const nlohmann::ordered_json& schema,
                               const std::vector<std::string>& documents,
                               const FillOptions& options = {}) const;

  const std::string& backbone_name() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deg
