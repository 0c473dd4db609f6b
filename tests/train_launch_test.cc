// train/distributed.h: a launcher's variables read into a Launch, the refusal to run as one of
// several processes (GPU training), and `deg pretrain` / `deg train` asking where rank 0 listens.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "deg/error.h"
#include "test_util.h"
#include "train/distributed.h"

namespace deg::train {
namespace {

using Env = std::map<std::string, std::string>;

Launch read(const Env& vars) {
  return launch_from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// launcher rank/world, as one string (one comparison, a readable failure).
std::string seen(const Env& vars) {
  const Launch l = read(vars);
  return l.launcher + " " + std::to_string(l.rank) + "/" + std::to_string(l.world_size);
}

// The message of the deg::Error that reading `vars` throws ("" when none is thrown).
std::string read_error(const Env& vars) {
  try {
    read(vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
    return e.message();
  }
  return "";
}

// The refusal's message for `vars` ("" when the launch is accepted).
std::string refusal(const Env& vars) {
  try {
    require_one_process(read(vars), "deg pretrain");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    return e.message();
  }
  return "";
}

TEST(TrainLaunch, NoLauncherIsOneProcess) {
  EXPECT_EQ(seen({}), " 0/1");
  EXPECT_EQ(refusal({}), "");
  EXPECT_EQ(seen({{"WORLD_SIZE", ""}}), " 0/1");  // empty values count as unset
  // One process under a launcher is a plain run, whatever its side variables say.
  EXPECT_EQ(seen({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), "torchrun 0/1");
  EXPECT_EQ(refusal({{"RANK", "x"}, {"WORLD_SIZE", "1"}}), "");
  // A batch script's SLURM_NTASKS alone does not make deg one of several processes.
  EXPECT_EQ(seen({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}), " 0/1");
}

TEST(TrainLaunch, ReadsEachLaunchersVariables) {
  EXPECT_EQ(seen({{"RANK", "3"}, {"WORLD_SIZE", "4"}}), "torchrun 3/4");
  EXPECT_EQ(seen({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "mpirun 1/2");
  EXPECT_EQ(seen({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}}), "mpirun 5/8");
  EXPECT_EQ(seen({{"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "3"}}), "srun 2/3");
  // A rank that is missing, not a number or not below the world size reads as -1.
  EXPECT_EQ(seen({{"WORLD_SIZE", "2"}}), "torchrun -1/2");
  EXPECT_EQ(seen({{"WORLD_SIZE", "2"}, {"RANK", "2"}}), "torchrun -1/2");
  EXPECT_EQ(seen({{"WORLD_SIZE", "2"}, {"RANK", "+1"}}), "torchrun -1/2");
}

TEST(TrainLaunch, TheLargestWorldCounts) {
  // A leftover WORLD_SIZE=1 must not hide srun's or mpirun's several processes.
  EXPECT_EQ(seen({{"WORLD_SIZE", "1"},
                  {"RANK", "0"},
                  {"SLURM_STEP_NUM_TASKS", "4"},
                  {"SLURM_PROCID", "3"}}),
            "srun 3/4");
  EXPECT_EQ(seen({{"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "mpirun -1/2");
  EXPECT_EQ(seen({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}}),
            "torchrun 1/2");
}

TEST(TrainLaunch, RejectsWorldSizesThatAreNotCounts) {
  for (const char* bad : {"two", "0", "-1", "4x", " 2", "+2", "99999999999999999999"}) {
    EXPECT_NE(read_error({{"WORLD_SIZE", bad}}).find(std::string("WORLD_SIZE=") + bad),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(read_error({{"PMI_SIZE", "1.5"}}).find("PMI_SIZE=1.5"), std::string::npos);
}

TEST(TrainLaunch, ReadsWhereRankZeroListens) {
  const Launch l = read({{"MASTER_ADDR", "node-0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(l.master_addr, "node-0");
  EXPECT_EQ(l.master_port, 29500);
  EXPECT_EQ(read({}).master_port, 0);
  for (const char* bad : {"0", "65536", "http", "-1"})
    EXPECT_NE(read_error({{"MASTER_PORT", bad}}).find(std::string("MASTER_PORT=") + bad),
              std::string::npos)
        << bad;
}

TEST(TrainLaunch, SeveralProcessesAreRefusedWithAWayOut) {
  const std::string m = refusal({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(m.find("deg pretrain was started as process 1 of 2 (torchrun)"), std::string::npos)
      << m;
  EXPECT_NE(m.find("Start it once, without the launcher, or train data-parallel on the CPU"),
            std::string::npos)
      << m;
  EXPECT_NE(refusal({{"SLURM_STEP_NUM_TASKS", "3"}}).find("one of 3 processes (srun)"),
            std::string::npos);
}

// Sets environment variables for its lifetime (the CLI test's child processes inherit them).
class ScopedEnv {
 public:
  explicit ScopedEnv(const Env& vars) {
    for (const auto& [k, v] : vars) {
      ::setenv(k.c_str(), v.c_str(), 1);
      names_.push_back(k);
    }
  }
  ~ScopedEnv() {
    for (const std::string& k : names_) ::unsetenv(k.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::string> names_;
};

// The command line, as torchrun would start it but without MASTER_ADDR / MASTER_PORT: the error
// comes before anything is read or written.
TEST(TrainLaunch, CliPretrainAndTrainAskWhereRankZeroListens) {
  deg::testing::TempDir t;
  deg::testing::CommandResult pre, tune;
  {
    const ScopedEnv env({{"WORLD_SIZE", "2"}, {"RANK", "0"}});
    pre = deg::testing::run_deg({"pretrain", "--config", "tiny", "--data", (t / "none").string(),
                                 "--steps", "1", "--out", (t / "pre").string()});
    tune = deg::testing::run_deg({"train", "--base", (t / "none").string(), "--out",
                                  (t / "tuned").string(), "--task", "s.json:t.jsonl"});
  }
  // Both train data-parallel on the CPU (train/comm.h), so they ask where rank 0 listens.
  for (const auto* r : {&pre, &tune}) {
    EXPECT_NE(r->exit_code, 0);
    EXPECT_NE(r->err.find("needs MASTER_ADDR and MASTER_PORT"), std::string::npos) << r->err;
  }
  EXPECT_FALSE(std::filesystem::exists(t / "pre"));
  EXPECT_FALSE(std::filesystem::exists(t / "tuned"));
}

}  // namespace
}  // namespace deg::train
