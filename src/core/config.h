// Process-wide settings read from the environment. This is the only place in src/ that reads
// environment variables (DESIGN.md §2); everything else takes settings as arguments.
#pragma once

#include <string>

namespace deg {

struct EnvConfig {
  int threads = 0;        // DEG_THREADS: worker threads; 0 = one per available core
  std::string log_level;  // DEG_LOG_LEVEL: trace, debug, info, warn, error, off (default warn)
  std::string hf_hub;     // DEG_HF_HUB, else HF_HUB_CACHE, else ~/.cache/huggingface/hub
};

// Read once, on first use.
const EnvConfig& env_config();

}  // namespace deg
