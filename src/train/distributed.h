// Where this process stands in a multi-process launch. torchrun (torch.distributed.run) and the
// launchers that mimic it describe a worker by RANK and WORLD_SIZE; mpirun by
// OMPI_COMM_WORLD_RANK / _SIZE (Open MPI) or PMI_RANK / PMI_SIZE (MPICH, Intel MPI); srun by
// SLURM_PROCID / SLURM_STEP_NUM_TASKS inside a job step; where rank 0 listens by MASTER_ADDR and
// MASTER_PORT (torchrun sets them; under mpirun or srun the job sets them). `deg pretrain` on the
// CPU trains data-parallel over such a launch (train/comm.h); on a GPU, and `deg train`, train in
// one process, so they refuse a launch of several (require_one_process: that many identical runs
// would write the same checkpoint directory) and say how to start them instead.
#pragma once

#include <functional>
#include <string>

namespace deg::train {

struct Launch {
  int rank = 0;             // -1: the launcher's rank variable is unset or not a number
  int world_size = 1;       // 1: a plain run
  std::string launcher;     // whose variables say so: "torchrun", "mpirun", "srun"; empty: none
  std::string master_addr;  // MASTER_ADDR, MASTER_PORT: where rank 0 listens (0: unset)
  int master_port = 0;
};

// Reads the launch from the variables above (`env`: name -> value, or null when unset; the
// process environment by default). Every launcher's world size is read, and the largest one
// counts (a leftover WORLD_SIZE=1 must not hide srun's four tasks). Throws deg::Error
// (invalid_argument) naming the variable when a world size is not a whole number from 1 up, or
// MASTER_PORT not a port.
Launch launch_from_env(const std::function<const char*(const char*)>& env = {});

// Throws deg::Error (unsupported) when `launch` has more than one process: `command` on a GPU
// trains in one process (no NCCL group yet) and must be started once, without the launcher, or
// on the CPU, where several processes train data-parallel (train/comm.h).
void require_one_process(const Launch& launch, const std::string& command);

}  // namespace deg::train
