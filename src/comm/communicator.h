// Communicators: one small interface over the distributed engines users already run (MPI on CPUs,
// NCCL on GPUs). Collectives are asynchronous: each returns a Work whose wait() completes it, so
// callers can overlap communication with compute (start, compute, wait). Blocking helpers wrap them.
//
// Failure behaviour: wait() gives up after the communicator's timeout, names the rank, the operation and
// its size, and aborts the whole job (every rank), so a dead or hung peer never causes a silent hang.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trex::comm {

enum class ReduceOp { Sum, Max, Min };
enum class ElemType { F32, F64, I32, I64, U8, BF16 };
size_t elem_size(ElemType t);

class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;  // non-blocking: true once complete
  virtual void wait() = 0;  // blocks (with the communicator's timeout)
};
using WorkPtr = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"

  // In place: buf holds count elements on every rank.
  virtual WorkPtr all_reduce(void* buf, size_t count, ElemType t, ReduceOp op) = 0;
  // send holds count elements; recv holds size()*count, rank r's block at r*count.
  virtual WorkPtr all_gather(const void* send, void* recv, size_t count, ElemType t) = 0;
  // send holds size()*count elements; recv gets the reduced block of this rank.
  virtual WorkPtr reduce_scatter(const void* send, void* recv, size_t count, ElemType t, ReduceOp op) = 0;
  // Variable all-to-all in bytes: send block for rank r at send_offsets[r] of send_bytes[r] bytes.
  virtual WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                               const std::vector<size_t>& send_offsets, void* recv,
                               const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets) = 0;
  virtual WorkPtr broadcast(void* buf, size_t bytes, int root) = 0;
  virtual WorkPtr send(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual WorkPtr recv(void* buf, size_t bytes, int peer, int tag) = 0;
  virtual void barrier() = 0;
  // A sub-communicator of the ranks passing the same color, ordered by key (MPI_Comm_split semantics).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // This rank failed and will not take part in any further operation (an exception it does not recover from):
  // the other ranks stop instead of waiting for it, with an error naming it ("rank R failed: why"). Thread groups
  // mark the job's groups failed (waiting and later operations throw); MPI prints the message and aborts the job
  // (MPI_Abort); NCCL prints it, aborts the communicator and exits the process, which the launcher (mpirun,
  // torchrun) turns into the end of every rank. The local communicator has nobody to tell.
  virtual void abort(const std::string& why) { (void)why; }

  void set_timeout_seconds(double s) { timeout_s_ = s; }
  double timeout_seconds() const { return timeout_s_; }

  // Blocking conveniences.
  void all_reduce_sum(float* buf, size_t count) { all_reduce(buf, count, ElemType::F32, ReduceOp::Sum)->wait(); }
  void all_reduce_sum(double* buf, size_t count) { all_reduce(buf, count, ElemType::F64, ReduceOp::Sum)->wait(); }

 protected:
  double timeout_s_ = 600.0;
};

// The single-process communicator: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_local_communicator();

// The world communicator for this process, chosen from the launch environment (launch_env.h):
// MPI when launched by mpirun/srun and built with MPI, the local one for a single process.
// backend: "auto", "mpi", "local".
std::unique_ptr<Communicator> make_world_communicator(const std::string& backend = "auto");

}  // namespace trex::comm
