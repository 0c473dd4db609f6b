// `deg pretrain`: trains a gpt trunk from token shards on the CPU with the training core
// (gpt_step), NorMuon + Adam and the speedrun's schedules; validates every k steps, logs
// DIR/metrics.jsonl, writes a checkpoint (config.json with family "gpt", model.safetensors,
// tokenizer.json when the data directory has one, optimizer and trainer state) and resumes from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>

#include "model/gpt_config.h"

namespace deg::train {

// Preset vocabularies are padded to a multiple of this (GPT-2's 50257 -> 50304).
inline constexpr int64_t kVocabMultiple = 128;

struct PretrainOptions {
  GptConfig config;
  // `config` is a preset: its vocab_size becomes the data's (data.json), rounded up to a
  // multiple of kVocabMultiple. Otherwise a vocabulary smaller than the data's is an error.
  bool vocab_from_data = false;
  std::filesystem::path data_dir;  // train_*.bin, val_*.bin, data.json [, tokenizer.json]
  std::filesystem::path out_dir;
  int64_t steps = 0;
  uint64_t seed = 0;
  int64_t batch_tokens = 1024;  // tokens per step (one packed stream)
  int64_t max_seq_len = 256;    // documents are cut to this many tokens
  int64_t val_every = 0;        // 0: only at the end
  int64_t val_tokens = 4096;
  int64_t save_every = 0;  // 0: only at the end
  int64_t warmup_steps = 0;
  int64_t stop_at = 0;  // stop (and checkpoint) after this many steps; 0: steps
  bool resume = false;  // continue from out_dir's checkpoint
};

struct PretrainProgress {
  int64_t step = 0, steps = 0;
  double train_loss = 0;
  std::optional<double> val_loss;
  double tokens_per_s = 0;
  double eta_s = 0;
};

struct PretrainResult {
  double first_val_loss = 0, last_val_loss = 0;
  double unigram_entropy = 0;  // of the validation tokens, nats
  int64_t steps_run = 0;
};

PretrainResult pretrain(const PretrainOptions& options,
                        const std::function<void(const PretrainProgress&)>& on_progress = {});

}  // namespace deg::train
