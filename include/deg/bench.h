// The benchmark harness behind `deg bench`: throughput of a backbone family at a real model's
// dimensions (Qwen3.5-0.8B, LFM2.5-1.2B, Gemma 4 E2B) with random bf16 weights — trunk prefill at
// several lengths, a fork pass, decode steps — next to this machine's peak dot-product FLOP/s
// measured in the same run, so figures read as ratios. Not a test: nothing asserts on time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deg {

struct BenchOptions {
  std::string family = "qwen3_5";  // qwen3_5, lfm2 or gemma4
  std::vector<int64_t> prefill{512, 2048, 8192};
  int64_t fork_prefix = 2048, forks = 64, fork_tokens = 24, decode_steps = 32;
  int64_t layers = 0;                                // 0: the real model's
  std::string gemm = "bf16", json, device = "auto";  // json: also write the figures here
  double peak_seconds = 1.0;
  int64_t repeats = 5;   // GPU: timed runs of each figure (the median is reported)
  bool profile = false;  // GPU: one more run of each figure with every op timed
  // With profile: the figures to profile (prefill, fork, decode); empty: all of them.
  std::vector<std::string> profile_only;
};

// Runs the benchmark and prints its figures on stdout. Throws deg::Error for an option it does
// not know.
void bench_run(const BenchOptions& options);

}  // namespace deg
