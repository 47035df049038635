// Ranks as threads of one process: make_thread_group(n) returns n communicators, one per rank, to be driven by n
// threads (one each). Every operation of comm::Communicator works, on host memory and, in CUDA builds, on device
// memory of the current device (pointers are classified with cudaPointerGetAttributes). This is what lets tests
// run several ranks of the partitioned GPU trainer on ONE GPU: NCCL refuses two ranks of one communicator on the
// same device, while threads of one process share one device and one CUDA context, so a rank's buffers are plain
// device pointers every other rank can copy from (no CUDA IPC or second process needed).
//
// Semantics (those of the MPI / NCCL backends):
//  - collectives match by call order on each rank (the k-th collective of every rank is one operation; kind and
//    sizes must agree, else every rank gets an error naming the disagreement); send / recv match by (source,
//    destination, tag) in posting order, and complete together (rendezvous: nothing is buffered, as with NCCL);
//  - the rank whose call completes an operation executes it: on the host (memcpy / loops) for host buffers, or on
//    the group's own non-blocking CUDA stream for device buffers, after every rank's work queued on the legacy
//    default stream before its call (an event per rank), with cudaMemcpyAsync and a small reduction kernel;
//  - reductions run in rank order 0, 1, ..., n-1 (accumulated in fp32 for bf16, in the element type otherwise), so
//    results are bit-reproducible and equal to a single-rank sum in that order;
//  - Work::wait() blocks the host until the operation ran (and, on the device, finished); comm::stream_wait (
//    nccl_communicator.h) makes a stream wait on the device instead. A wait gives up after timeout_seconds(),
//    throws trex::Error naming the rank, the operation and the ranks that never arrived, and marks the group
//    failed so that every other waiting rank stops too (no hang);
//  - split follows MPI_Comm_split (ranks of one color ordered by key, then by parent rank); a negative color
//    returns null (MPI_UNDEFINED).
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace trex::comm {

// n >= 1 communicators of one group: element r is rank r. backend() is "threads".
std::vector<std::unique_ptr<Communicator>> make_thread_group(int n, double timeout_s = 600.0);

// If w is a thread-group Work: waits on the host until the operation has been queued (timeout as wait()), makes
// `stream` (a cudaStream_t) wait for it on the device and returns true. False for any other Work.
bool thread_group_stream_wait(Work& w, void* stream);

}  // namespace trex::comm
