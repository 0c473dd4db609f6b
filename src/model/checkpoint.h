// deg checkpoints (the seed's `DegModel.save` / `_load_model` format): a directory with
//   deg.json               meta: base snapshot path, backbone name, kinds, max_count, array_mode,
//                          lora / moe (null unless adapters are present)
//   backbone.safetensors   the text model's weights in bf16 under `model.` (no lm_head: the head
//                          is tied, or read from the base; no LoRA / MoE / PLE table); a gpt
//                          trunk of `deg pretrain` keeps all its tensors, in f32
//   heads.safetensors      fp32 heads (model/heads.h key names)
//   adapters.safetensors, moe.safetensors   optional; refused with a clear error until supported
// deg also copies the base's config.json and tokenizer files in, so a checkpoint is usable where
// its base path does not exist.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "deg/checkpoint.h"  // CheckpointInitOptions
#include "io/json.h"

namespace deg {

struct CheckpointMeta {
  std::string base;      // the base HF snapshot (absolute path), or "custom"
  std::string backbone;  // family / size name, e.g. "qwen3_5"
  std::string array_mode = "anchor";
  Json raw;  // everything in deg.json, unknown keys included
};

CheckpointMeta checkpoint_meta_load(const std::filesystem::path& dir);
// The meta from deg.json text; `path` names it in errors. Throws deg::Error (format,
// unsupported) for a value this build cannot run; checks no files (checkpoint_meta_load does).
CheckpointMeta checkpoint_meta_parse(std::string_view text, const std::string& path);

// `deg init`: fresh heads on a base model. Reads the base's config to size the heads, writes the
// base's text weights as bf16, and the meta. Throws deg::Error on a base it cannot read.
void checkpoint_init(const CheckpointInitOptions& options);

// Where the config.json / tokenizer.json of a model directory live: the directory itself for
// an HF snapshot; for a checkpoint its own copies, else deg.json "base", else `base_override`.
std::filesystem::path model_config_dir(const std::filesystem::path& dir,
                                       const std::filesystem::path& base_override = {});

}  // namespace deg
