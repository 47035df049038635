#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/mpi_communicator.h"
#include "core/error.h"

namespace trex::comm {

namespace {

MPI_Datatype mpi_type(ElemType t) {
  switch (t) {
    case ElemType::F32:
      return MPI_FLOAT;
    case ElemType::F64:
      return MPI_DOUBLE;
    case ElemType::I32:
      return MPI_INT32_T;
    case ElemType::I64:
      return MPI_INT64_T;
    case ElemType::U8:
      return MPI_UINT8_T;
    case ElemType::BF16:
      fail("MPI reductions of bf16 are not supported: reduce in fp32");
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail("MPI {} failed: {}", what, std::string(msg, size_t(len)));
  }
}

struct MpiRuntime {
  MpiRuntime() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owns = true;
    }
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns && !finalized) MPI_Finalize();
  }
  bool owns = false;
};

MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}

// Completes an MPI request, polling so that a dead or hung peer is detected: past the timeout the
// rank prints what it was waiting for and aborts the whole job.
class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request req, MPI_Comm comm, int rank, std::string what, double timeout_s,
          std::vector<int> keep_alive = {})
      : req_(req), comm_(comm), rank_(rank), what_(std::move(what)), timeout_s_(timeout_s),
        keep_alive_(std::move(keep_alive)) {}
  ~MpiWork() override {
    if (req_ != MPI_REQUEST_NULL) wait();
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), what_.c_str());
    return flag != 0;
  }
  void wait() override {
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (!test()) {
      if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 10000 ? 1000 : 20));
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) {
        std::fprintf(stderr,
                     "error: rank %d: %s did not complete within %.1f s (a peer rank died or hangs); aborting the "
                     "job\n",
                     rank_, what_.c_str(), timeout_s_);
        std::fflush(stderr);
        MPI_Abort(comm_, 3);
        std::_Exit(3);
      }
    }
  }

 private:
  MPI_Request req_;
  MPI_Comm comm_;
  int rank_;
  std::string what_;
  double timeout_s_;
  std::vector<int> keep_alive_;  // count/offset arrays MPI reads until the request completes
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as codes, so they turn into trex::Error with a message.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  WorkPtr all_reduce(void* buf, size_t count, ElemType t, ReduceOp op) override {
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, int(count), mpi_type(t), mpi_op(op), comm_, &r), "all_reduce");
    return work(r, "all_reduce", count * elem_size(t));
  }
  WorkPtr all_gather(const void* send, void* recv, size_t count, ElemType t) override {
    MPI_Request r;
    check(MPI_Iallgather(send, int(count), mpi_type(t), recv, int(count), mpi_type(t), comm_, &r), "all_gather");
    return work(r, "all_gather", count * elem_size(t));
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, ElemType t, ReduceOp op) override {
    MPI_Request r;
    check(MPI_Ireduce_scatter_block(send, recv, int(count), mpi_type(t), mpi_op(op), comm_, &r),
          "reduce_scatter");
    return work(r, "reduce_scatter", count * elem_size(t));
  }
  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_off,
                       void* recv, const std::vector<size_t>& recv_bytes,
                       const std::vector<size_t>& recv_off) override {
    TREX_CHECK(int(send_bytes.size()) == size_ && int(recv_bytes.size()) == size_ &&
                   int(send_off.size()) == size_ && int(recv_off.size()) == size_,
               "all_to_all_v: count/offset vectors must have one entry per rank ({})", size_);
    // MPI counts are ints: keep them (and so the bytes per peer) under 2 GiB. The arrays must outlive
    // the request, so they move into the Work.
    std::vector<int> arrays(4 * size_t(size_));
    int* sc = arrays.data();
    int* sd = sc + size_;
    int* rc = sd + size_;
    int* rd = rc + size_;
    size_t total = 0;
    for (int i = 0; i < size_; ++i) {
      TREX_CHECK(send_bytes[i] < (size_t(1) << 31) && recv_off[i] < (size_t(1) << 31) &&
                     send_off[i] < (size_t(1) << 31),
                 "all_to_all_v: a block of {} bytes exceeds MPI's int counts", send_bytes[i]);
      sc[i] = int(send_bytes[i]);
      sd[i] = int(send_off[i]);
      rc[i] = int(recv_bytes[i]);
      rd[i] = int(recv_off[i]);
      total += send_bytes[i];
    }
    MPI_Request r;
    check(MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, comm_, &r), "all_to_all_v");
    return std::make_unique<MpiWork>(r, comm_, rank_, fmt::format("all_to_all_v ({} bytes)", total), timeout_s_,
                                     std::move(arrays));
  }
  WorkPtr broadcast(void* buf, size_t bytes, int root) override {
    MPI_Request r;
    check(MPI_Ibcast(buf, int(bytes), MPI_BYTE, root, comm_, &r), "broadcast");
    return work(r, "broadcast", bytes);
  }
  WorkPtr send(const void* buf, size_t bytes, int peer, int tag) override {
    MPI_Request r;
    check(MPI_Isend(buf, int(bytes), MPI_BYTE, peer, tag, comm_, &r), "send");
    return work(r, "send to rank " + std::to_string(peer), bytes);
  }
  WorkPtr recv(void* buf, size_t bytes, int peer, int tag) override {
    MPI_Request r;
    check(MPI_Irecv(buf, int(bytes), MPI_BYTE, peer, tag, comm_, &r), "recv");
    return work(r, "recv from rank " + std::to_string(peer), bytes);
  }
  void barrier() override {
    MPI_Request r;
    check(MPI_Ibarrier(comm_, &r), "barrier");
    work(r, "barrier", 0)->wait();
  }
  void abort(const std::string& why) override {
    int world_rank = rank_;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::fprintf(stderr, "error: rank %d failed: %s; aborting the job\n", world_rank, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);  // mpirun ends every rank of the job
    std::_Exit(1);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "comm split");
    auto c = std::make_unique<MpiCommunicator>(sub, true);
    c->set_timeout_seconds(timeout_s_);
    return c;
  }

 private:
  WorkPtr work(MPI_Request r, const char* op, size_t bytes) {
    return std::make_unique<MpiWork>(r, comm_, rank_, fmt::format("{} ({} bytes)", op, bytes), timeout_s_);
  }
  WorkPtr work(MPI_Request r, const std::string& op, size_t bytes) { return work(r, op.c_str(), bytes); }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  runtime();
  MPI_Comm dup;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "comm dup");
  return std::make_unique<MpiCommunicator>(dup, true);
}

}  // namespace trex::comm
