// Where this process stands in a multi-process launch. torchrun (torch.distributed.run) and the
// launchers that mimic it describe a data-parallel worker by RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR and MASTER_PORT; mpirun by OMPI_COMM_WORLD_RANK / _SIZE (Open MPI) or PMI_RANK /
// PMI_SIZE (MPICH, Intel MPI); srun by SLURM_PROCID / SLURM_STEP_NUM_TASKS inside a job step.
// deg trains in one process today, so a launch of several processes would start that many
// identical runs writing the same checkpoint directory: `deg pretrain` and `deg train` refuse it
// (require_one_process) and say how to start them instead.
#pragma once

#include <functional>
#include <string>

namespace deg::train {

struct Launch {
  int rank = 0;
  int world_size = 1;  // 1: a plain run (no launcher variables)
  int local_rank = 0;
  std::string launcher;  // which variables said so: "torchrun", "mpirun", "srun"; empty: none
  std::string master_addr;
  int master_port = 0;
};

// Reads the launch from the variables above (`env`: name -> value, or null when unset; the
// process environment by default). torchrun's variables win over MPI's, MPI's over Slurm's.
// Throws deg::Error (invalid_argument) naming the variable when a value is not a number in
// range, a rank is not below the world size, or a torchrun world of several processes lacks
// MASTER_ADDR / MASTER_PORT.
Launch launch_from_env(const std::function<const char*(const char*)>& env = {});

// Throws deg::Error (unsupported) when `launch` has more than one process: `command` trains in
// one process (on one GPU or the CPU) and must be started once, without the launcher.
void require_one_process(const Launch& launch, const std::string& command);

}  // namespace deg::train
