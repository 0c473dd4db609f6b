// Family registry: model_type -> family constructor over the snapshot's text tensors.
#include "model/load.h"

#include <functional>
#include <optional>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/weights.h"
#include "kernels/ops.h"
#include "model/checkpoint.h"
#include "model/gemma4.h"
#include "model/gpt.h"
#include "model/lfm2.h"
#include "model/qwen35.h"

namespace deg {

namespace {

// The family of config.json's model_type over `store`'s tensors; `heads` (the base snapshot)
// supplies what a checkpoint leaves out when `store` lacks it: an untied lm_head.weight, the
// per-layer embedding table.
std::unique_ptr<Backbone> open_family(const std::filesystem::path& config_path,
                                      const WeightStore& store, const WeightStore* heads,
                                      const std::string& where, BackboneOptions options) {
  const JsonConfig root = JsonConfig::load(config_path);
  const std::string type = root.model_type();
  const std::string text_type = root.text().model_type();
  const Ops* ops = &ops_for(options.device);
  if (gpt_handles(root.json())) {
    // deg pretrain writes bare names; a deg checkpoint keeps them under `model.`
    const GptConfig cfg = gpt_config_from_json(root.json(), config_path.string());
    const bool bare = !store.contains(store.text_prefix() + "embed");
    auto file_name = [&](const std::string& name) {
      return bare ? name : store.text_prefix() + name;
    };
    TensorMap weights;
    for (const auto& [name, shape] : gpt_tensor_table(cfg)) {
      if (store.contains(file_name(name))) weights.emplace(name, store.get(file_name(name)));
    }
    try {
      return std::make_unique<Backbone>(gpt_family(cfg, weights, *ops), options);
    } catch (const Error& e) {
      ErrorContext at = e.context();
      at.path = where;
      if (!at.tensor.empty()) at.tensor = file_name(at.tensor);
      throw Error(e.kind(), e.message(), at);
    }
  }
  auto is = [&](bool (*handles)(const std::string&)) {
    return handles(type) || handles(text_type);
  };
  std::vector<std::pair<std::string, Shape>> table;
  std::function<std::unique_ptr<Family>(const TensorMap&)> make;
  if (is(qwen35_handles)) {
    Qwen35Config cfg = Qwen35Config::from_json(root);
    table = qwen35_tensor_table(cfg);
    make = [cfg, ops](const TensorMap& w) { return qwen35_family(cfg, w, *ops); };
  } else if (is(lfm2_handles)) {
    Lfm2Config cfg = Lfm2Config::from_json(root);
    table = lfm2_tensor_table(cfg);
    make = [cfg, ops](const TensorMap& w) { return lfm2_family(cfg, w, *ops); };
  } else if (is(gemma4_handles)) {
    Gemma4Config cfg = Gemma4Config::from_json(root);
    table = gemma4_tensor_table(cfg);
    make = [cfg, ops](const TensorMap& w) { return gemma4_family(cfg, w, *ops); };
  } else {
    throw Error(ErrorKind::unsupported,
                "model_type \"" + type +
                    "\" has no deg backbone family (supported: qwen3_5, qwen3_5_text, lfm2, "
                    "lfm2_vl, gemma4, gemma4_text, and family gpt)",
                {.path = config_path.string(), .pointer = "/model_type"});
  }
  const std::string& prefix = store.text_prefix();
  auto file_name = [&](const std::string& name) {
    return name == "lm_head.weight" ? name : prefix + name;
  };
  TensorMap weights;
  for (const auto& [name, shape] : table) {
    const std::string base_name =
        heads && name != "lm_head.weight" ? heads->text_prefix() + name : name;
    if (store.contains(file_name(name))) {
      weights.emplace(name, store.get(file_name(name)));
    } else if (heads && (name == "lm_head.weight" || name == "embed_tokens_per_layer.weight") &&
               heads->contains(base_name)) {
      weights.emplace(name, heads->get(base_name));
    }
  }
  try {
    return std::make_unique<Backbone>(make(weights), options);
  } catch (const Error& e) {  // name the tensor as it appears in the files
    ErrorContext at = e.context();
    at.path = where;
    std::string message = e.message();
    if (at.tensor == "embed_tokens_per_layer.weight" && e.kind() == ErrorKind::not_found) {
      message +=
          "; a deg checkpoint reads this table from its base snapshot (deg.json \"base\"): "
          "make sure that snapshot is there";
    }
    if (!at.tensor.empty()) at.tensor = file_name(at.tensor);
    throw Error(e.kind(), message, at);
  }
}

}  // namespace

std::unique_ptr<Backbone> backbone_open(const std::filesystem::path& dir, BackboneOptions options) {
  const std::filesystem::path config_path = dir / "config.json";
  if (!std::filesystem::exists(config_path)) {
    throw Error(ErrorKind::not_found,
                "config.json not found; pass --model pointing at an HF snapshot directory",
                {.path = dir.string()});
  }
  return open_family(config_path, WeightStore::open_dir(dir), nullptr, dir.string(), options);
}

std::unique_ptr<Backbone> backbone_open_checkpoint(
    const std::filesystem::path& config_dir, const std::vector<std::filesystem::path>& weight_files,
    BackboneOptions options) {
  WeightStore store = WeightStore::open_files(weight_files);
  std::optional<WeightStore> base;
  auto has_weights = [](const std::filesystem::path& dir) {
    return std::filesystem::exists(dir / "model.safetensors") ||
           std::filesystem::exists(dir / "model.safetensors.index.json");
  };
  // The base's weights: beside the config, else at the checkpoint's deg.json "base".
  std::filesystem::path base_dir = config_dir;
  if (!has_weights(base_dir) && std::filesystem::exists(config_dir / "deg.json")) {
    const CheckpointMeta meta = checkpoint_meta_load(config_dir);
    if (meta.base != "custom") base_dir = meta.base;
  }
  if (!store.contains("lm_head.weight") && has_weights(base_dir)) {
    base = WeightStore::open_dir(base_dir);
  }
  return open_family(config_dir / "config.json", store, base ? &*base : nullptr,
                     weight_files.empty() ? config_dir.string() : weight_files[0].string(),
                     options);
}

}  // namespace deg
