// deg pretrain --config PRESET|FILE --data DIR --steps N --out DIR [--seed S]: train a gpt trunk
// on the CPU from token shards (see include/deg/train.h); a progress bar with the loss,
// tokens/s and the ETA goes to stderr.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "deg/error.h"
#include "deg/train.h"

namespace deg::cli {
void add_pretrain_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "pretrain",
      "Train a `gpt` trunk (seed 003's speedrun GPT) from token shards made by `deg shard`, on "
      "the CPU or a GPU (the parameters, gradients and optimizer state stay on the device for the "
      "whole run; checkpoints copy them out). Writes "
      "DIR/metrics.jsonl and a checkpoint (config.json, model.safetensors, tokenizer.json) that "
      "--resume continues.");
  auto o = std::make_shared<train::PretrainOptions>();
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option(
         "--config", o->config,
         "Preset (speedrun-124m, speedrun-124m-1gpu, small, compact, tiny; its vocab_size becomes "
         "the data's, rounded up to a multiple of 128) or a config JSON")
      ->required();
  cmd->add_option("--data", o->data_dir, "Directory of train_*.bin / val_*.bin and data.json")
      ->required();
  cmd->add_option("--steps", o->steps, "Optimizer steps")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--out", o->out_dir, "Checkpoint directory")->required();
  cmd->add_option("--seed", o->seed, "Initialisation seed")->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu, cuda or auto (a GPU when one is visible). The parameters, gradients "
                  "and optimizer state stay on the device for the whole run")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "f32 (every product in f32), or bf16: the layers', the loss's and the "
                  "optimizer's matrix products round their operands to bf16 and sum in f32, and "
                  "on a GPU the attention runs in bf16 too (tensor cores: compact's step 2.5x "
                  "faster on an H200); "
                  "weights, gradients and optimizer state stay f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--batch-tokens", o->batch_tokens, "Tokens per step")->capture_default_str();
  cmd->add_option("--micro-batches", o->micro_batches,
                  "Read each step's batch as this many micro-batches and average their "
                  "gradients (gradient accumulation: the memory of one micro-batch). Started as "
                  "several CPU processes by torchrun, mpirun or srun (RANK, WORLD_SIZE, "
                  "MASTER_ADDR, MASTER_PORT), the processes share them out (a multiple of their "
                  "number) and train data-parallel")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-seq-len", o->max_seq_len, "Documents are cut to this many tokens")
      ->capture_default_str();
  cmd->add_option("--val-every", o->val_every, "Validate every N steps (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--val-tokens", o->val_tokens, "Validation tokens")->capture_default_str();
  cmd->add_option("--save-every", o->save_every, "Checkpoint every N steps (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", o->warmup_steps, "Linear lr warmup")->capture_default_str();
  cmd->add_option("--max-seconds", o->max_seconds,
                  "Train for about this long: after 10, 40 and 160 steps the run becomes the steps "
                  "that fit at the pace so far (at most --steps); the schedules follow")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--stop-at", o->stop_at, "Stop and checkpoint after N steps (even)")
      ->capture_default_str();
  cmd->add_flag("--resume", o->resume, "Continue from the checkpoint in --out");
  cmd->add_flag("--quiet", *quiet, "No progress bar");
  cmd->callback([o, quiet] {
    const auto result = train::pretrain(*o, [&](const train::PretrainProgress& p) {
      if (*quiet) return;
      std::string val = p.val_loss ? fmt::format(" val {:.4f}", *p.val_loss) : "";
      std::string mfu = p.mfu ? fmt::format(" MFU {:.1f}%", 100 * *p.mfu) : "";
      std::fprintf(stderr, "\r%s %lld/%lld loss %.4f%s %.0f tok/s%s ETA %s   ",
                   progress_bar(p.step, p.steps).c_str(), (long long)p.step, (long long)p.steps,
                   p.train_loss, val.c_str(), p.tokens_per_s, mfu.c_str(),
                   progress_clock(p.eta_s).c_str());
      if (p.val_loss) std::fprintf(stderr, "\n");
    });
    if (result.rank != 0) return;  // rank 0 reports for a data-parallel run
    fmt::print(
        "{{\"steps\": {}, \"first_val_loss\": {:.6f}, \"val_loss\": {:.6f}, "
        "\"unigram_entropy\": {:.6f}}}\n",
        result.steps_run, result.first_val_loss, result.last_val_loss, result.unigram_entropy);
  });
}

}  // namespace deg::cli
