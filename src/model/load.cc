// Family registry: model_type -> family constructor over the snapshot's text tensors.
#include "model/load.h"

#include <optional>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/weights.h"
#include "model/gpt.h"
#include "model/qwen35.h"

namespace deg {

namespace {

// The family of config.json's model_type over `store`'s tensors; `heads` supplies lm_head.weight
// when `store` lacks it (a checkpoint reads an untied head from its base).
std::unique_ptr<Backbone> open_family(const std::filesystem::path& config_path,
                                      const WeightStore& store, const WeightStore* heads,
                                      const std::string& where, BackboneOptions options) {
  const JsonConfig root = JsonConfig::load(config_path);
  const std::string type = root.model_type();
  const std::string text_type = root.text().model_type();
  const bool gpt = gpt_handles(root.json());
  if (!gpt && !qwen35_handles(type) && !qwen35_handles(text_type)) {
    throw Error(ErrorKind::unsupported,
                "model_type \"" + type +
                    "\" has no deg backbone family (supported: qwen3_5, "
                    "qwen3_5_text, and family gpt)",
                {.path = config_path.string(), .pointer = "/model_type"});
  }
  const std::string& prefix = store.text_prefix();
  if (gpt) {  // deg pretrain writes bare names; a deg checkpoint keeps them under `model.`
    const GptConfig cfg = gpt_config_from_json(root.json(), config_path.string());
    const bool bare = !store.contains(prefix + "embed");
    auto file_name = [&](const std::string& name) { return bare ? name : prefix + name; };
    TensorMap weights;
    for (const auto& [name, shape] : gpt_tensor_table(cfg)) {
      if (store.contains(file_name(name))) weights.emplace(name, store.get(file_name(name)));
    }
    try {
      return std::make_unique<Backbone>(gpt_family(cfg, weights), options);
    } catch (const Error& e) {
      ErrorContext at = e.context();
      at.path = where;
      if (!at.tensor.empty()) at.tensor = file_name(at.tensor);
      throw Error(e.kind(), e.message(), at);
    }
  }
  Qwen35Config cfg = Qwen35Config::from_json(root);
  auto file_name = [&](const std::string& name) {
    return name == "lm_head.weight" ? name : prefix + name;
  };
  TensorMap weights;
  for (const auto& [name, shape] : qwen35_tensor_table(cfg)) {
    if (store.contains(file_name(name))) {
      weights.emplace(name, store.get(file_name(name)));
    } else if (heads && name == "lm_head.weight" && heads->contains(name)) {
      weights.emplace(name, heads->get(name));
    }
  }
  try {
    return std::make_unique<Backbone>(qwen35_family(cfg, weights), options);
  } catch (const Error& e) {  // name the tensor as it appears in the files
    ErrorContext at = e.context();
    at.path = where;
    if (!at.tensor.empty()) at.tensor = file_name(at.tensor);
    throw Error(e.kind(), e.message(), at);
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
  const bool base_weights = std::filesystem::exists(config_dir / "model.safetensors") ||
                            std::filesystem::exists(config_dir / "model.safetensors.index.json");
  if (!store.contains("lm_head.weight") && base_weights) {
    base = WeightStore::open_dir(config_dir);
  }
  return open_family(config_dir / "config.json", store, base ? &*base : nullptr,
                     weight_files.empty() ? config_dir.string() : weight_files[0].string(),
                     options);
}

}  // namespace deg
