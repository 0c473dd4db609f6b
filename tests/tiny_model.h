// A tiny random Qwen3.5 snapshot written at test time, for engine tests: the backbone math is
// checked against HF elsewhere (qwen35 golden tests); here only a model of the right shape
// matters. Its tokenizer is byte-level BPE without merges (one token per byte) plus the ChatML
// special tokens, so a few hundred characters stay a few hundred tokens.
#pragma once

#include <filesystem>

namespace deg::testing {

// Writes config.json, model.safetensors (bf16) and tokenizer.json into `dir`.
void write_tiny_qwen35(const std::filesystem::path& dir, uint64_t seed);

// The tokenizer.json above, alone.
std::string tiny_tokenizer_json();

}  // namespace deg::testing
