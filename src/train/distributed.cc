#include "train/distributed.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>

#include "core/error.h"

namespace deg::train {
namespace {

// A whole decimal number (digits only) in [lo, INT_MAX]; nullopt otherwise.
std::optional<int> whole_number(const char* text, int lo) {
  if (!std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end != '\0' || errno == ERANGE || v < lo || v > std::numeric_limits<int>::max())
    return std::nullopt;
  return int(v);
}

}  // namespace

Launch launch_from_env(const std::function<const char*(const char*)>& env) {
  auto get = [&](const char* name) -> const char* {
    const char* v = env ? env(name) : std::getenv(name);
    return v && *v ? v : nullptr;
  };
  struct Scheme {
    const char *launcher, *rank, *size;
  };
  constexpr Scheme kSchemes[] = {
      {"torchrun", "RANK", "WORLD_SIZE"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"mpirun", "PMI_RANK", "PMI_SIZE"},
      {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},
  };
  Launch l;
  for (const Scheme& s : kSchemes) {
    const char* size = get(s.size);
    if (!size) continue;
    const std::optional<int> n = whole_number(size, 1);
    if (!n) {
      throw Error(
          ErrorKind::invalid_argument,
          fmt::format("{}={} is not a whole number of processes (1 or more)", s.size, size));
    }
    if (!l.launcher.empty() && *n <= l.world_size) continue;
    l.launcher = s.launcher;
    l.world_size = *n;
    const char* rank = get(s.rank);
    const std::optional<int> r = rank ? whole_number(rank, 0) : std::nullopt;
    l.rank = r && *r < *n ? *r : -1;
  }
  if (const char* addr = get("MASTER_ADDR")) l.master_addr = addr;
  if (const char* port = get("MASTER_PORT")) {
    const std::optional<int> p = whole_number(port, 1);
    if (!p || *p > 65535)
      throw Error(ErrorKind::invalid_argument,
                  fmt::format("MASTER_PORT={} is not a port (1 to 65535)", port));
    l.master_port = *p;
  }
  return l;
}

void require_one_process(const Launch& launch, const std::string& command) {
  if (launch.world_size <= 1) return;
  const std::string which = launch.rank >= 0
                                ? fmt::format("process {} of {}", launch.rank, launch.world_size)
                                : fmt::format("one of {} processes", launch.world_size);
  throw Error(ErrorKind::unsupported,
              fmt::format("{} was started as {} ({}), but on a GPU it trains in one process "
                          "(data-parallel GPUs need NCCL, not built yet); {} copies would each run "
                          "the whole training and write the same output directory. Start it once, "
                          "without the launcher, or train data-parallel on the CPU (--device cpu)",
                          command, which, launch.launcher, launch.world_size));
}

}  // namespace deg::train
