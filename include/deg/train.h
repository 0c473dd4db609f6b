// `deg train` (public API): fine-tunes a deg model on labeled documents (shared/data's format, one
// task per schema; several tasks train together). Each record becomes the engine's own queries with
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
  float head_lr = 2e-3f, head_wd = 0.01f;
  float trunk_lr = 0.3f;  // multiplies the pretraining optimizer's rates
  int64_t warmup_steps = 20;
  double cooldown = 0.3;   // the share of steps at the end over which the rates decay to zero
  float clip = 1.0f;       // global gradient norm (0: none)
  int64_t eval_every = 0;  // 0: only at the end
  int64_t patience = 0;    // stop after this many evaluations without a better dev loss (0: never)
  int64_t stop_at = 0;  // stop after this many steps (evaluated and saved for --resume); 0: steps
  bool freeze_trunk = false;  // gpt: train the heads only
  bool calibrate = true;
  bool resume = false;
  uint64_t seed = 0;
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
  int64_t steps_run = 0;
  int64_t train_examples = 0, dev_examples = 0, unlocated = 0;
  double first_dev_loss = 0, best_dev_loss = 0;
  int64_t best_step = 0;
  bool stopped_early = false;
  std::vector<KindCalibration> calibration;
};

FineTuneResult fine_tune(const FineTuneOptions& options,
                         const std::function<void(const FineTuneProgress&)>& on_progress = {});

}  // namespace deg::train
