// Process-wide settings and the build's description (deg/runtime.h).
#include "deg/runtime.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "deg/version.h"
#include "kernels/cuda_runtime.h"

namespace deg {

void runtime_setup(const RuntimeOptions& options) {
  log::setup(options.log_level.empty() ? env_config().log_level : options.log_level);
  if (!options.threads.empty()) {
    set_thread_count(parse_thread_count(options.threads, "--threads"));
  }
}

void log_info(const std::string& line) {
  log::info("{}", line);
}
void log_error(const std::string& line) {
  log::error("{}", line);
}

std::string build_description() {
  std::string v = std::string("deg ") + kVersion + " (" + kGitDescribe + ")\nCUDA: ";
  if (!cuda_built()) return v + "not built";
  const std::vector<CudaDeviceInfo> devices = cuda_devices();
  if (devices.empty()) return v + "built; no device visible";
  for (const auto& d : devices) {
    v += fmt::format("\n  [{}] {} (sm_{}, {} SMs, {:.0f} GiB)", d.index, d.name,
                     d.compute_capability, d.sm_count, double(d.memory_bytes) / (1 << 30));
  }
  return v;
}

}  // namespace deg
