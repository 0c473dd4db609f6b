// deg bench: the command over the benchmark harness (deg/bench.h, src/bench/bench.cc).
#include "deg/bench.h"

#include "cli/commands.h"

namespace deg::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench",
      "CPU throughput of a backbone at a real model's size (Qwen3.5-0.8B, LFM2.5-1.2B, Gemma 4 "
      "E2B; random weights) against this machine's measured peak FLOP/s.");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("--family", o->family,
                  "qwen3_5 (Qwen3.5-0.8B), lfm2 (LFM2.5-1.2B) or gemma4 (Gemma 4 E2B)")
      ->capture_default_str();
  cmd->add_option("--prefill", o->prefill, "Prefill lengths")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--fork-prefix", o->fork_prefix, "Prefix length of the fork pass")
      ->capture_default_str();
  cmd->add_option("--forks", o->forks, "Fork rows")->capture_default_str();
  cmd->add_option("--fork-tokens", o->fork_tokens, "Tokens per fork row")->capture_default_str();
  cmd->add_option("--decode-steps", o->decode_steps, "Decode steps")->capture_default_str();
  cmd->add_option("--layers", o->layers,
                  "Layers, the real model's pattern repeated (gemma4: its first N layers; 0: the "
                  "real model's count)")
      ->capture_default_str();
  cmd->add_option("--gemm", o->gemm, "bf16 (bf16 dot products) or exact")->capture_default_str();
  cmd->add_option("--peak-seconds", o->peak_seconds, "Time spent measuring the peak")
      ->capture_default_str();
  cmd->add_option("--json", o->json, "Also write the figures as JSON here");
  add_device_option(cmd, o->device);
  cmd->add_flag("--profile", o->profile,
                "GPU: time every op of one more run of each figure (CUDA events) and print where "
                "the time goes");
  cmd->add_option("--profile-only", o->profile_only,
                  "With --profile: only these figures (prefill, fork, decode), e.g. so that "
                  "`ncu --profile-from-start off` sees one decode step's kernels alone")
      ->delimiter(',')
      ->check(CLI::IsMember({"prefill", "fork", "decode"}));
  cmd->add_option("--repeats", o->repeats, "GPU: timed runs per figure (the median is reported)")
      ->capture_default_str();
  cmd->callback([o] { bench_run(*o); });
}

}  // namespace deg::cli
