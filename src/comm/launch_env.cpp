#include "comm/launch_env.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace trex::comm {

namespace {
bool env_int(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TREX_CHECK(end && *end == '\0', "environment variable {}='{}' is not an integer", name, v);
  *out = int(x);
  return true;
}
}  // namespace

LaunchEnv detect_launch_env() {
  LaunchEnv e;
  if (env_int("OMPI_COMM_WORLD_RANK", &e.rank)) {
    e.launcher = "mpirun";
    env_int("OMPI_COMM_WORLD_SIZE", &e.world_size);
    env_int("OMPI_COMM_WORLD_LOCAL_RANK", &e.local_rank);
    env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &e.local_world_size);
  } else if (env_int("SLURM_PROCID", &e.rank) && std::getenv("SLURM_NTASKS")) {
    e.launcher = "srun";
    env_int("SLURM_NTASKS", &e.world_size);
    env_int("SLURM_LOCALID", &e.local_rank);
    if (!env_int("SLURM_NTASKS_PER_NODE", &e.local_world_size)) e.local_world_size = e.world_size;
  } else if (env_int("RANK", &e.rank) && std::getenv("WORLD_SIZE")) {
    e.launcher = "torchrun";
    env_int("WORLD_SIZE", &e.world_size);
    env_int("LOCAL_RANK", &e.local_rank);
    env_int("LOCAL_WORLD_SIZE", &e.local_world_size);
    if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
    env_int("MASTER_PORT", &e.master_port);
    TREX_CHECK(!e.master_addr.empty() && e.master_port > 0,
               "torchrun environment: MASTER_ADDR and MASTER_PORT must be set (RANK={}, WORLD_SIZE={})", e.rank,
               e.world_size);
  }
  TREX_CHECK(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size,
             "launcher {}: rank {} is not in [0, world size {})", e.launcher, e.rank, e.world_size);
  return e;
}

}  // namespace trex::comm
