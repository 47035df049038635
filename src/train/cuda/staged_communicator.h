// Host-buffer collectives over a communicator that takes device buffers (NCCL, or a thread group of ranks on one
// GPU): every call copies its host buffers to the device, runs the inner operation, waits, and copies back. The
// trainer's host-side agreements (a checkpoint save's "did every rank succeed", rank 0's run preparation, the
// metrics' maxima, loss and target counts) run on it, so a GPU mesh needs no second (MPI) world. Small messages
// only: each call synchronises.
#pragma once
#include <memory>

#include "comm/communicator.h"

namespace trex::train {

// `inner` is not owned (it must outlive the result) unless `owned` is given.
std::unique_ptr<comm::Communicator> make_staged_communicator(comm::Communicator& inner,
                                                             std::unique_ptr<comm::Communicator> owned = nullptr);

}  // namespace trex::train
