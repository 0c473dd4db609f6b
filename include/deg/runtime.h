// Process-wide settings of the library and what this build can run on: what `deg --version`,
// `--threads` and `--log-level` stand on.
#pragma once

#include <string>

namespace deg {

// Worker threads `--threads` / DEG_THREADS may ask for (docs/hardening.md).
inline constexpr int kMaxThreads = 1024;

struct RuntimeOptions {
  std::string
      log_level;        // trace, debug, info, warn, error or off; empty: $DEG_LOG_LEVEL, else warn
  std::string threads;  // 0 to kMaxThreads (0: one per core); empty: $DEG_THREADS, else per core
};

// Applies `options` before any model work. Throws deg::Error naming the flag or variable whose
// value is bad.
void runtime_setup(const RuntimeOptions& options);

// A line on stderr, shown when the level runtime_setup chose lets it through (the server's
// request lines are info).
void log_info(const std::string& line);
void log_error(const std::string& line);

// "deg <version> (<git describe>)" and a line per visible CUDA device (or why there are none).
std::string build_description();

}  // namespace deg
