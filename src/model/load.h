// Opening an HF snapshot directory as a Backbone: config.json picks the family by model_type
// (text or multimodal layout), the weights are mapped (WeightStore), never copied.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "model/backbone.h"

namespace deg {

std::unique_ptr<Backbone> backbone_open(const std::filesystem::path& dir,
                                        BackboneOptions options = {});

// A deg checkpoint's backbone: the architecture from `config_dir`/config.json, the weights from
// `weight_files` (backbone.safetensors: text tensors under `model.`), and an untied LM head
// from the base snapshot in `config_dir` when the checkpoint does not carry one.
std::unique_ptr<Backbone> backbone_open_checkpoint(
    const std::filesystem::path& config_dir, const std::vector<std::filesystem::path>& weight_files,
    BackboneOptions options = {});

}  // namespace deg
