// The raw forward pass of a model's LM on one token sequence: the conformance door (`deg forward`)
// that golden tests and users compare against HF transformers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace deg {

struct ForwardOptions {
  std::filesystem::path model;  // HF snapshot directory (config.json + *.safetensors)
  std::vector<int32_t> ids;     // the token sequence, non-empty
  bool hidden = false;          // the final-norm hidden states [T, C] instead of logits [T, V]
  int64_t fork_at = 0;          // > 0: the first K ids are the trunk, the rest one fork over it
  // Media embeddings f32 [n, hidden] (.npy) read as soft tokens where `ids` hold the model's
  // image / audio placeholder ids, in order; empty: none.
  std::filesystem::path soft;
  int64_t read_chunk = 0;  // prefill tokens per pass (a multiple of 64; 0: the device's default)
  bool bf16_gemm = false;  // bf16 dot products over bf16 weights (else f32 activations)
  std::string device = "auto";  // cpu, cuda or auto (as EngineOptions::device)
};

// Runs the forward pass and writes its float32 result to `out` (.npy). Throws deg::Error.
void forward_write(const ForwardOptions& options, const std::filesystem::path& out);

// Token ids from a .npy of int32 / int64 (any shape) or a text of integers separated by spaces,
// commas or newlines. Throws deg::Error naming the file and the word at fault.
std::vector<int32_t> token_ids_read(const std::filesystem::path& path);

}  // namespace deg
