// model_info: `deg inspect` without the CLI. Counts parameters as PyTorch would on the loaded
// model: a tied LM head shares the embedding's storage and is counted once.
#include "deg/model_info.h"

#include <set>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/weights.h"

namespace deg {

namespace fs = std::filesystem;

ModelInfo model_info(const fs::path& dir) {
  if (!fs::is_directory(dir)) {
    throw Error(ErrorKind::not_found,
                "not a directory; pass an HF snapshot (config.json + *.safetensors) or a deg "
                "checkpoint (deg.json + backbone.safetensors + heads.safetensors)",
                {.path = dir.string()});
  }
  ModelInfo info;
  info.path = dir.string();
  WeightStore store;
  if (fs::exists(dir / "deg.json")) {
    info.format = "deg-checkpoint";
    JsonConfig meta = JsonConfig::load(dir / "deg.json");
    info.model_type = meta.get_or<std::string>("backbone", "");
    info.text_model_type = info.model_type;
    std::vector<fs::path> files = checkpoint_backbone_files(dir);
    if (!fs::exists(dir / "heads.safetensors")) {
      throw Error(ErrorKind::not_found, "heads.safetensors is missing from this deg checkpoint",
                  {.path = dir.string()});
    }
    for (const char* name : {"heads.safetensors", "adapters.safetensors", "moe.safetensors"}) {
      if (fs::exists(dir / name)) files.push_back(dir / name);
    }
    store = WeightStore::open_files(files);
  } else if (fs::exists(dir / "config.json")) {
    info.format = "hf-snapshot";
    JsonConfig config = JsonConfig::load(dir / "config.json");
    info.model_type = config.model_type();
    if (info.model_type.empty()) info.model_type = config.get_or<std::string>("family", "");
    info.text_model_type = config.text().model_type();
    info.tied_embeddings = config.text().get_or<bool>(
        "tie_word_embeddings", config.get_or<bool>("tie_word_embeddings", false));
    store = WeightStore::open_dir(dir);
  } else {
    throw Error(ErrorKind::not_found,
                "neither config.json (an HF snapshot) nor deg.json (a deg checkpoint) is here",
                {.path = dir.string()});
  }
  info.text_prefix = store.text_prefix();

  // Storage already counted: (file, begin, end) of each tensor, so aliases count once.
  std::set<std::tuple<std::string, uint64_t, uint64_t>> seen;
  const std::string embed = store.text_prefix() + "embed_tokens.weight";
  for (const std::string& name : store.names()) {
    const TensorInfo& t = store.info(name);
    TensorSummary s{name, std::string(dtype_name(t.dtype)), t.shape, shape_numel(t.shape),
                    fs::path(store.file_of(name)).filename().string()};
    bool counted = seen.insert({store.file_of(name), t.begin, t.end}).second || t.begin == t.end;
    if (name == "lm_head.weight" && info.tied_embeddings && store.contains(embed)) counted = false;
    if (counted) {
      info.parameters += s.numel;
      info.parameters_by_dtype[s.dtype] += s.numel;
    }
    info.tensors.push_back(std::move(s));
  }
  return info;
}

}  // namespace deg
