// Making a deg checkpoint: fresh heads on a base model (`deg init`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

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

// `deg pack`: a deg checkpoint made small enough to ship (the default model lives in the
// repository, in files of at most 16 MiB): the backbone's larger tensors (at least
// kPackMinValues values) in bf16, the rest — gates, lambdas, norms, rotary frequencies — and the
// heads as they are; the backbone split into parts backbone-00001-of-N.safetensors of at most
// max_file_bytes each (one backbone.safetensors when it fits); the checkpoint's JSON files
// (deg.json, config.json, tokenizer.json, calibration.json, ...) copied; training state left out.
struct CheckpointPackOptions {
  std::filesystem::path model;  // a deg checkpoint
  std::filesystem::path out;    // created; must be empty or absent
  std::string dtype = "bf16";   // bf16, or f32 (tensors as they are: only the split)
  int64_t max_file_bytes = int64_t(16) << 20;
};
inline constexpr int64_t kPackMinValues = 4096;

struct CheckpointPackResult {
  int64_t bytes = 0;      // every file written
  int64_t files = 0;      // backbone parts
  int64_t converted = 0;  // tensors turned into bf16
  int64_t largest_file = 0;
};

// Throws deg::Error: not a deg checkpoint, an existing non-empty --out, a tensor larger than a
// file may be.
CheckpointPackResult checkpoint_pack(const CheckpointPackOptions& options);

}  // namespace deg
