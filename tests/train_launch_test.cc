// train/distributed.h: a launcher's variables read into a Launch, and `deg pretrain` / `deg
// train` refusing to run as one of several processes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

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

// launcher / rank / world size / local rank, as one string (one comparison, a readable failure).
std::string seen(const Launch& l) {
  return l.launcher + " " + std::to_string(l.rank) + "/" + std::to_string(l.world_size) +
         " local " + std::to_string(l.local_rank);
}

TEST(TrainLaunch, NoLauncherIsOneProcess) {
  const Launch l = read({});
  EXPECT_EQ(l.world_size, 1);
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.launcher, "");
  EXPECT_NO_THROW(require_one_process(l, "deg pretrain"));
  // Empty values count as unset.
  EXPECT_EQ(read({{"WORLD_SIZE", ""}}).world_size, 1);
}

TEST(TrainLaunch, ReadsTorchrunVariables) {
  const Launch l = read({{"RANK", "3"},
                         {"WORLD_SIZE", "4"},
                         {"LOCAL_RANK", "1"},
                         {"MASTER_ADDR", "10.0.0.2"},
                         {"MASTER_PORT", "29500"}});
  EXPECT_EQ(seen(l), "torchrun 3/4 local 1");
  EXPECT_EQ(l.master_addr, "10.0.0.2");
  EXPECT_EQ(l.master_port, 29500);
  // torchrun with one process: a plain run.
  EXPECT_NO_THROW(require_one_process(read({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), "deg train"));
}

TEST(TrainLaunch, ReadsMpiAndSlurmVariables) {
  EXPECT_EQ(seen(read({{"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}})),
            "mpirun 1/2 local 1");
  EXPECT_EQ(seen(read({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}})), "mpirun 5/8 local 0");
  EXPECT_EQ(
      seen(read({{"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_LOCALID", "0"}})),
      "srun 2/3 local 0");
  // A batch script's SLURM_NTASKS alone does not make deg one of several processes.
  EXPECT_EQ(read({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}).world_size, 1);
  // torchrun's variables win.
  EXPECT_EQ(seen(read({{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}})),
            "torchrun 0/1 local 0");
}

TEST(TrainLaunch, RejectsMalformedAndInconsistentValues) {
  EXPECT_NE(read_error({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE=two"), std::string::npos);
  EXPECT_NE(read_error({{"WORLD_SIZE", "0"}}).find("from 1"), std::string::npos);
  EXPECT_NE(read_error({{"WORLD_SIZE", "4x"}}), "");
  EXPECT_NE(read_error({{"WORLD_SIZE", "99999999999999999999"}}), "");
  // A rank must be below the world size.
  EXPECT_NE(read_error(
                {{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}})
                .find("RANK=2"),
            std::string::npos);
  EXPECT_NE(read_error({{"PMI_SIZE", "2"}, {"PMI_RANK", "-1"}}).find("PMI_RANK"),
            std::string::npos);
  // Several torchrun processes need the rendezvous address.
  EXPECT_NE(read_error({{"WORLD_SIZE", "2"}, {"RANK", "0"}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(
      read_error(
          {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT=70000"),
      std::string::npos);
}

TEST(TrainLaunch, SeveralProcessesAreRefusedWithAWayOut) {
  const Launch l =
      read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}});
  try {
    require_one_process(l, "deg pretrain");
    ADD_FAILURE() << "two processes were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(e.message().find("process 1 of 2 (torchrun)"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("Start it once, without the launcher"), std::string::npos)
        << e.message();
  }
}

// The command line, as torchrun would start it: the refusal comes before anything is read or
// written.
TEST(TrainLaunch, CliPretrainAndTrainRefuseToRunAsOneOfSeveral) {
  deg::testing::TempDir t;
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  const auto pre =
      deg::testing::run_deg({"pretrain", "--config", "tiny", "--data", (t / "none").string(),
                             "--steps", "1", "--out", (t / "pre").string()});
  const auto tune = deg::testing::run_deg({"train", "--base", (t / "none").string(), "--out",
                                           (t / "tuned").string(), "--task", "s.json:t.jsonl"});
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  for (const auto* r : {&pre, &tune}) {
    EXPECT_NE(r->exit_code, 0);
    EXPECT_NE(r->err.find("process 0 of 2 (torchrun)"), std::string::npos) << r->err;
  }
  EXPECT_FALSE(std::filesystem::exists(t / "pre"));
  EXPECT_FALSE(std::filesystem::exists(t / "tuned"));
}

}  // namespace
}  // namespace deg::train
