#include "train/distributed.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace deg::train {
namespace {

// A whole decimal number in [lo, hi] from variable `name`; throws deg::Error otherwise.
int parse_int(const char* name, const char* text, int lo, int hi) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("{}={} is not a whole number from {} to {}", name, text, lo, hi));
  }
  return int(v);
}

}  // namespace

Launch launch_from_env(const std::function<const char*(const char*)>& env) {
  auto get = [&](const char* name) -> const char* {
    const char* v = env ? env(name) : std::getenv(name);
    return v && *v ? v : nullptr;
  };
  struct Scheme {
    const char* launcher;
    const char *rank, *size, *local_rank;
  };
  constexpr Scheme kSchemes[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"mpirun", "PMI_RANK", "PMI_SIZE", nullptr},
      {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
  };
  constexpr int kMax = std::numeric_limits<int>::max();
  Launch l;
  for (const Scheme& s : kSchemes) {
    const char* size = get(s.size);
    if (!size) continue;
    l.launcher = s.launcher;
    l.world_size = parse_int(s.size, size, 1, kMax);
    if (const char* r = get(s.rank)) l.rank = parse_int(s.rank, r, 0, l.world_size - 1);
    if (s.local_rank)
      if (const char* r = get(s.local_rank))
        l.local_rank = parse_int(s.local_rank, r, 0, l.world_size - 1);
    break;
  }
  if (l.launcher == "torchrun") {
    if (const char* a = get("MASTER_ADDR")) l.master_addr = a;
    if (const char* p = get("MASTER_PORT")) l.master_port = parse_int("MASTER_PORT", p, 1, 65535);
    if (l.world_size > 1 && (l.master_addr.empty() || l.master_port == 0)) {
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("WORLD_SIZE={} without MASTER_ADDR and MASTER_PORT: a launch of "
                              "several processes needs both (torchrun sets them)",
                              l.world_size));
    }
  }
  return l;
}

void require_one_process(const Launch& launch, const std::string& command) {
  if (launch.world_size <= 1) return;
  throw Error(
      ErrorKind::unsupported,
      fmt::format("{} was started as process {} of {} ({}), but it trains in one process "
                  "(one GPU or the CPU); {} copies would each run the whole training and "
                  "write the same output directory. Start it once, without the launcher",
                  command, launch.rank, launch.world_size, launch.launcher, launch.world_size));
}

}  // namespace deg::train
