// MPI implementation of the Communicator (CPU collectives; also bootstraps NCCL on GPUs).
#pragma once
#include <memory>

#include "comm/communicator.h"

namespace trex::comm {
// Initialises MPI on first use (MPI_THREAD_FUNNELED) and finalises it at exit.
std::unique_ptr<Communicator> make_mpi_world_communicator();
}  // namespace trex::comm
