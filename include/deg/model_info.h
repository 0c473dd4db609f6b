// What a model directory holds, without loading a model: the data behind `deg inspect`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace deg {

struct TensorSummary {
  std::string name;
  std::string dtype;  // "bf16", "f32", ...
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::string file;  // file name inside the directory
};

struct ModelInfo {
  std::string path;
  std::string format;           // "hf-snapshot" or "deg-checkpoint"
  std::string model_type;       // config.json "model_type" (deg.json "backbone" for checkpoints)
  std::string text_model_type;  // text_config's model_type in multimodal snapshots, else same
  std::string text_prefix;      // "model." or "model.language_model."
  bool tied_embeddings = false;
  int64_t parameters = 0;  // every tensor once; a tied LM head counted with the embedding
  std::map<std::string, int64_t> parameters_by_dtype;
  std::vector<TensorSummary> tensors;  // sorted by name
};

// Reads config.json / deg.json and the safetensors headers of `dir`. Throws deg::Error with a
// message that says what is missing.
ModelInfo model_info(const std::filesystem::path& dir);

}  // namespace deg
