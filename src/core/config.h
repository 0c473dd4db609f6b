// Process-wide settings read from the environment. This is the only place in src/ that reads
// environment variables (DESIGN.md §2); everything else takes settings as arguments. Each value
// is checked where it is read: a bad one throws deg::Error naming the variable.
#pragma once

#include <string>

#include "deg/runtime.h"

namespace deg {

struct EnvConfig {
  int threads = 0;        // DEG_THREADS: worker threads in [0, kMaxThreads]; 0 = one per core
  std::string log_level;  // DEG_LOG_LEVEL: trace, debug, info, warn, error, off (default warn)
  std::string device;     // DEG_DEVICE: cpu or cuda, what --device auto picks; empty: unset
  std::string hf_hub;     // DEG_HF_HUB, else HF_HUB_CACHE, else ~/.cache/huggingface/hub
  std::string model;      // DEG_MODEL: the model used without --model; empty: unset
};

// Read and checked on first use (throws deg::Error on a bad value, again on each later call).
const EnvConfig& env_config();

using deg::kMaxThreads;  // deg/runtime.h

// `text` as a thread count for `what` (the option or variable): an integer in [0, kMaxThreads].
int parse_thread_count(const std::string& text, const std::string& what);

}  // namespace deg
