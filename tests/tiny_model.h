// A tiny random Qwen3.5 snapshot written at test time, for engine tests: the backbone math is
// checked against HF elsewhere (qwen35 golden tests); here only a model of the right shape
// matters. Its tokenizer is byte-level BPE without merges (one token per byte) plus the ChatML
// special tokens, so a few hundred characters stay a few hundred tokens.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace deg::testing {

// Writes config.json, model.safetensors (bf16) and tokenizer.json into `dir`.
void write_tiny_qwen35(const std::filesystem::path& dir, uint64_t seed);

// The same snapshot with `config_patch` (JSON object text) merged over the tiny config (a
// smaller shape, the vocabulary of another tokenizer) and `tokenizer_json` written in place of
// the byte-level one when it is not empty.
void write_tiny_qwen35(const std::filesystem::path& dir, uint64_t seed,
                       const std::string& config_patch, const std::string& tokenizer_json);

// A tiny random LFM2 snapshot (conv, conv, attention, conv, attention; GQA 2; bf16 weights) whose
// tokenizer carries LFM2's specials (<|pad|>, <|startoftext|>, <|endoftext|>, <|im_start|>,
// <|im_end|>): the lfm chat layout's tokens.
void write_tiny_lfm2(const std::filesystem::path& dir, uint64_t seed);

// The tokenizer.json above, alone: one token per byte, then `specials` from id 256 on.
std::string tiny_tokenizer_json(const std::vector<std::string>& specials = {
                                    "<|endoftext|>", "<|im_start|>", "<|im_end|>"});

// A tiny random Gemma 4 snapshot (bf16): 6 layers (sliding, sliding, global) x 2 with window 8,
// global head dim 32 (sliding 16), the last two layers sharing K/V (layer 4 reads layer 3's,
// layer 5 layer 2's), the double-wide MLP on them, per-layer embeddings of width 8, soft-cap 5.
// `multimodal`: the `gemma4` layout (text_config, model.language_model.* weights) with the
// global head dim given as per_layer_config. The tokenizer is the one above plus Gemma's
// <bos>, <pad>, <|turn> and <turn|>.
void write_tiny_gemma4(const std::filesystem::path& dir, uint64_t seed, bool multimodal = false);

// A `deg pretrain` checkpoint of the gpt `tiny` preset (vocab 320, windows 256 / 512 so a query
// sees its whole document; f32) with the init moved by N(0, 0.05) so every path carries signal:
// config.json, model.safetensors and tokenizer.json (the byte-level one, <|endoftext|>) in `dir`.
void write_tiny_gpt(const std::filesystem::path& dir, uint64_t seed);

}  // namespace deg::testing
