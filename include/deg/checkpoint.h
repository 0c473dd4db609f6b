// Making a deg checkpoint: fresh heads on a base model (`deg init`).
#pragma once

#include <cstdint>
#include <filesystem>

namespace deg {

struct CheckpointInitOptions {
  std::filesystem::path base;  // HF snapshot
  std::filesystem::path out;   // created; must be empty or absent
  uint64_t seed = 0;
};

// Checks the base as fully as `deg fill` will read it — config.json, every tensor with its shape
// and finite values, the tokenizer — then writes the checkpoint (backbone.safetensors,
// heads.safetensors, deg.json, copies of the base's config and tokenizer files), so a base deg
// cannot run never becomes a checkpoint. Throws deg::Error saying what is wrong.
void checkpoint_create(const CheckpointInitOptions& options);

}  // namespace deg
