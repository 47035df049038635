// NCCL implementation of the Communicator, on device pointers. Every collective runs on the communicator's own
// (non-blocking) CUDA stream, ordered after the work already queued on its input stream (the legacy default
// stream unless set_input_stream says otherwise), so compute keeps running while data moves. The returned Work
// holds an event recorded after the operation: wait() blocks the host (polling, with the communicator's timeout:
// past it the rank prints rank + operation + size, aborts the NCCL communicator and exits); stream_wait() makes
// a stream wait for it without blocking the host (the overlap path).
//
// Bootstrap: the NCCL unique id travels over MPI when launched by mpirun/srun (a bootstrap Communicator), over a
// TCP rendezvous at MASTER_ADDR:(MASTER_PORT+1) for torchrun (port overridable by TREX_NCCL_PORT; torchrun's own
// store holds MASTER_PORT), or in memory for threads of one process (tests).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace trex::comm {

using NcclId = std::array<char, 128>;  // ncclUniqueId's bytes

NcclId nccl_new_id();  // rank 0 calls it, then ships it to the others

// One rank of a size-rank NCCL communicator on `device` (cudaSetDevice is called). Every rank passes the same id.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                                                     double timeout_s = 600.0);

// The id from rank 0 to all over an existing (CPU) communicator, e.g. the MPI world.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device, double timeout_s = 600.0);

// The id from rank 0 (which listens on `port`) to the others over TCP; the others connect to addr:port, retrying
// until timeout_s.
NcclId tcp_rendezvous_id(const std::string& addr, int port, int rank, int size, double timeout_s);

// The world NCCL communicator from the launch environment (launch_env.h): mpirun/srun bootstrap through MPI,
// torchrun through the TCP rendezvous, a single process alone. The device is the local rank
// (mod visible devices).
std::unique_ptr<Communicator> make_nccl_world_communicator(double timeout_s = 600.0);

// Makes `s` wait (on the device, not the host) for a Work of the NCCL or the thread-group backend (thread_group.h:
// after a host wait for the other ranks to arrive); any other Work is waited for on the host.
void stream_wait(Work& w, cudaStream_t s);

// The NCCL communicator's extras: its stream, and which stream its operations start after.
class NcclCommunicatorApi : public Communicator {
 public:
  virtual cudaStream_t stream() const = 0;
  virtual void set_input_stream(cudaStream_t s) = 0;
};

}  // namespace trex::comm
