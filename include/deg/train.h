// Training, part of the public API: `deg shard` (text -> token shards), `deg pretrain` (a gpt
// trunk trained from those shards) and `deg train` (a model fine-tuned on labeled documents).
//
// `deg train` fine-tunes a deg model on labeled documents (shared/data's format, one task per
// schema; several tasks train together). Each record becomes the engine's own queries with
// their heads' targets (train/tasks.h); the losses are the heads' (train/head_loss.h).
//
// A `gpt` trunk trains with its heads: documents and their queries are packed into one stream
// in the fork layout (train/gpt_step.h), the heads' gradients flow into the final hidden states
// and the trunk's backward takes them from there; the trunk steps with the pretraining optimizer
// (NorMuon + Adam) at a fraction of its rates, the heads with AdamW. Other backbones (and a gpt
// with freeze_trunk) keep their trunk frozen: every example's hidden states are computed once by
// the inference engine's prefill and forks and cached, and only the heads train.
//
// The schedule is a linear warmup, constant rates, then a linear decay to zero; gradients are
// clipped by their global norm. Every eval_every steps the dev loss (the same losses on the dev
// records) decides early stopping: the checkpoint in `out` is always the best seen. At the end the
// calibration temperatures (one per head kind) are fit by minimising the NLL on one half of the dev
// records and the expected calibration error (10 bins) is reported before and after on the other
// half.
//
// `out` is a deg checkpoint (deg.json, config.json, tokenizer.json, backbone.safetensors,
// heads.safetensors) plus metrics.jsonl, calibration.json and the state a resume continues
// from (train_state/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace deg::train {

// ---- `deg train` ----------------------------------------------------------------------------

struct TaskFiles {
  std::filesystem::path schema, train, dev;  // dev may be empty
  std::string name;  // for reports: the directory of a schema.json, else the schema file's stem
};
// "SCHEMA.json:TRAIN.jsonl[:DEV.jsonl]"; throws deg::Error (invalid_argument) otherwise.
TaskFiles parse_task(const std::string& spec);

struct FineTuneOptions {
  std::filesystem::path base;  // a deg checkpoint, or a model deg init accepts (fresh heads)
  std::filesystem::path out;
  std::vector<TaskFiles> tasks;
  int64_t steps = 500;
  int64_t batch_tokens = 8192;  // trunk + query tokens per step (at least one record)
  int64_t max_train = 0;        // records per task used for training, evenly spaced (0: all)
  int64_t max_dev = 200;  // dev records per task, evenly spaced, for the dev loss and calibration
  // The share of array queries with no expected item that are kept (an anchor query per absent
  // array dominates schemas with many optional arrays); in (0, 1].
  double empty_array_rate = 1.0;
  // The weight of an item start's term in the anchor loss (starts are a few tokens among many).
  float anchor_pos_weight = 1.0f;
  // Training records list each choice field's options in their own order (drawn from `seed`;
  // dev records and deg fill keep the schema's), so the head learns the options' words rather
  // than their places.
  bool shuffle_options = false;
  float head_lr = 2e-3f, head_wd = 0.01f;
  float trunk_lr = 0.3f;  // multiplies the pretraining optimizer's rates
  int64_t warmup_steps = 20;
  // cpu, cuda or auto (as EngineOptions::device): where a gpt trunk that trains runs (heads and
  // their losses run on the CPU).
  std::string device = "auto";
  // The gpt trunk's matrix products (as PretrainOptions::precision): f32 or bf16.
  std::string precision = "f32";
  double cooldown = 0.3;   // the share of steps at the end over which the rates decay to zero
  float clip = 1.0f;       // global gradient norm (0: none)
  int64_t eval_every = 0;  // 0: only at the end
  int64_t patience = 0;    // stop after this many evaluations without a better dev loss (0: never)
  int64_t stop_at = 0;  // stop after this many steps (evaluated and saved for --resume); 0: steps
  bool freeze_trunk = false;  // gpt: train the heads only
  // > 0: train for about this long (as PretrainOptions::max_seconds; evaluations count).
  double max_seconds = 0;
  bool calibrate = true;
  bool resume = false;
  uint64_t seed = 0;
  // > 0: the device time of every CUDA op of this step (a gpt trunk training on a GPU), written
  // with the step's phases to OUT/profile.txt.
  int64_t profile_step = 0;
};

struct FineTuneProgress {
  std::string stage;  // "prepare", "features", "train", "calibrate"
  int64_t done = 0, total = 0;
  double loss = 0;                 // train: mean loss of the step
  std::optional<double> dev_loss;  // after an evaluation
  // After an evaluation: per head kind, the share of right decisions on the dev queries (the
  // expected items' queries asked, as the loss asks them).
  std::vector<std::pair<std::string, double>> dev_accuracy;
  double tokens_per_s = 0, eta_s = 0;
};

struct KindCalibration {
  std::string kind;
  double temperature = 1;
  int64_t fit_queries = 0, report_queries = 0;
  double ece_before = 0, ece_after = 0;
};

struct FineTuneResult {
  int rank = 0;  // this process's rank in a data-parallel run: rank 0 alone evaluates and reports
  int64_t steps_run = 0;
  int64_t train_examples = 0, dev_examples = 0, unlocated = 0;
  double first_dev_loss = 0, best_dev_loss = 0;
  int64_t best_step = 0;
  bool stopped_early = false;
  std::vector<KindCalibration> calibration;
};

FineTuneResult fine_tune(const FineTuneOptions& options,
                         const std::function<void(const FineTuneProgress&)>& on_progress = {});

// ---- `deg shard` ----------------------------------------------------------------------------

// Tokenizes text files into token shards in the modded-nanogpt format (train_000000.bin ...,
// val_000000.bin) plus data.json and a copy of the tokenizer.json, for `deg pretrain`. A file
// holds one document, or several separated by the end-of-text token's text (e.g.
// "<|endoftext|>"); every document is written after that token's id (the document start the
// loader looks for).
struct ShardTextOptions {
  std::filesystem::path tokenizer;  // tokenizer.json or a directory holding one
  std::filesystem::path out_dir;
  std::vector<std::filesystem::path> train_files;
  std::vector<std::filesystem::path> val_files;
  std::string separator;  // the end-of-text token; empty: the first known one found
  int64_t shard_tokens = 100'000'000;
};

struct ShardTextResult {
  int64_t train_tokens = 0, val_tokens = 0, documents = 0;
  int32_t bos_id = 0;
  std::string separator;
};

// Throws deg::Error naming the file: an unreadable tokenizer or text, a vocabulary too large for
// 16-bit ids, no end-of-text token.
ShardTextResult shard_text_files(const ShardTextOptions& options);

// ---- `deg pretrain` -------------------------------------------------------------------------

// Trains a gpt trunk from token shards on the CPU with NorMuon + Adam and the speedrun's
// schedules; validates every val_every steps, logs out_dir/metrics.jsonl, writes a checkpoint
// (config.json with family "gpt", model.safetensors, tokenizer.json when the data directory has
// one, optimizer and trainer state) and resumes from it.
struct PretrainOptions {
  // A preset (speedrun-124m, speedrun-124m-1gpu, small, compact, tiny), whose vocab_size becomes
  // the data's (data.json) rounded up to a multiple of 128; or the path of a config JSON (a
  // config.json or a bare config), whose vocab_size must hold the data's.
  std::string config;
  std::filesystem::path data_dir;  // train_*.bin, val_*.bin, data.json [, tokenizer.json]
  std::filesystem::path out_dir;
  int64_t steps = 0;
  uint64_t seed = 0;
  int64_t batch_tokens = 1024;  // tokens per step (one packed stream)
  // A step's batch read as this many micro-batches of batch_tokens / micro_batches tokens each,
  // their gradients summed and averaged (gradient accumulation: the memory of one micro-batch);
  // under a multi-process launch the ranks share them out (a multiple of the world size).
  int64_t micro_batches = 1;
  int64_t max_seq_len = 256;  // documents are cut to this many tokens
  int64_t val_every = 0;      // 0: only at the end
  int64_t val_tokens = 4096;
  int64_t save_every = 0;  // 0: only at the end
  int64_t warmup_steps = 0;
  int64_t stop_at = 0;  // stop (and checkpoint) after this many steps; 0: steps
  bool resume = false;  // continue from out_dir's checkpoint
  // > 0: train for about this long: after 10, 40 and 160 steps the run's length becomes the
  // steps that fit at the pace so far (at most `steps`); the schedules follow it. Not with
  // resume or stop_at.
  double max_seconds = 0;
  // cpu, cuda or auto (as EngineOptions::device): where each step's forward and backward run;
  // auto takes a GPU when one is visible (on an H200 a step runs 6-12x faster than on 16 CPU
  // cores: docs/training.md, "The trainer on the GPU").
  std::string device = "auto";
  // f32: every product in f32 (what the PyTorch gradient fixture checks). bf16: the layers' and
  // the loss's matrix products, forward and backward, and Polar Express's round their operands
  // to bf16 and sum in f32 (tensor cores on a GPU), and on a GPU the attention runs on tensor
  // cores in bf16 too; parameters, gradients and optimizer state stay f32 (docs/training.md,
  // "The bf16 path" and "The bf16 attention on tensor cores").
  std::string precision = "f32";
};

struct PretrainProgress {
  int64_t step = 0, steps = 0;
  double train_loss = 0;
  std::optional<double> val_loss;
  double tokens_per_s = 0;
  // Model FLOPs per second over the GPUs' dense bf16 peak, from the run's start (docs/training.md
  // "MFU"); none on the CPU or a GPU whose peak deg does not know.
  std::optional<double> mfu;
  double eta_s = 0;
};

struct PretrainResult {
  // This process's rank in a data-parallel run (docs/training.md): rank 0 alone validates,
  // writes and reports, so the losses below are 0 on the others.
  int rank = 0;
  double first_val_loss = 0, last_val_loss = 0;
  double unigram_entropy = 0;  // of the validation tokens, nats
  int64_t steps_run = 0;
};

// Throws deg::Error: an unknown preset or unreadable config, invalid options, data that is
// missing or does not fit the config.
PretrainResult pretrain(const PretrainOptions& options,
                        const std::function<void(const PretrainProgress&)>& on_progress = {});

}  // namespace deg::train
