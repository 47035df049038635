// Which launcher started this process, and where it sits: mpirun (Open MPI), Slurm's srun, torchrun
// (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, e.g. `torchrun --no-python`), or none.
#pragma once
#include <string>

namespace trex::comm {

struct LaunchEnv {
  std::string launcher = "none";  // "mpirun", "srun", "torchrun", "none"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // torchrun rendezvous (also usable for NCCL unique-id exchange)
  int master_port = 0;
};

// Reads the environment; throws trex::Error for inconsistent values (rank >= world size, ...).
LaunchEnv detect_launch_env();

}  // namespace trex::comm
