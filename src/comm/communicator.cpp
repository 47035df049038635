#include "comm/communicator.h"

#include <cstring>

#include "comm/launch_env.h"
#include "core/error.h"
#ifdef TREX_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif

namespace trex::comm {

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::F32:
    case ElemType::I32:
      return 4;
    case ElemType::F64:
    case ElemType::I64:
      return 8;
    case ElemType::U8:
      return 1;
    case ElemType::BF16:
      return 2;
  }
  return 0;
}

namespace {

class DoneWork final : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}
};

WorkPtr done() { return std::make_unique<DoneWork>(); }

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  WorkPtr all_reduce(void*, size_t, ElemType, ReduceOp) override { return done(); }
  WorkPtr all_gather(const void* send, void* recv, size_t count, ElemType t) override {
    if (send != recv) std::memmove(recv, send, count * elem_size(t));
    return done();
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, ElemType t, ReduceOp) override {
    if (send != recv) std::memmove(recv, send, count * elem_size(t));
    return done();
  }
  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_off,
                       void* recv, const std::vector<size_t>& recv_bytes,
                       const std::vector<size_t>& recv_off) override {
    TREX_CHECK(send_bytes.size() == 1 && recv_bytes.size() == 1 && send_bytes[0] == recv_bytes[0],
               "all_to_all_v on 1 rank: {} bytes sent but {} expected", send_bytes.at(0), recv_bytes.at(0));
    std::memmove(static_cast<char*>(recv) + recv_off[0], static_cast<const char*>(send) + send_off[0],
                 send_bytes[0]);
    return done();
  }
  WorkPtr broadcast(void*, size_t, int root) override {
    TREX_CHECK(root == 0, "broadcast root {} on a 1-rank communicator", root);
    return done();
  }
  WorkPtr send(const void*, size_t, int peer, int) override { fail("send to rank {} on a 1-rank communicator", peer); }
  WorkPtr recv(void*, size_t, int peer, int) override { fail("recv from rank {} on a 1-rank communicator", peer); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<LocalCommunicator>(); }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> make_world_communicator(const std::string& backend) {
  LaunchEnv env = detect_launch_env();
  if (backend == "local") {
    TREX_CHECK(env.world_size == 1, "--comm local was asked for, but the launcher ({}) started {} processes",
               env.launcher, env.world_size);
    return make_local_communicator();
  }
#ifdef TREX_HAVE_MPI
  if (backend == "mpi" || (backend == "auto" && (env.launcher == "mpirun" || env.launcher == "srun"))) {
    return make_mpi_world_communicator();
  }
#else
  TREX_CHECK(backend != "mpi", "this build of trex has no MPI support (configure with TREX_MPI=ON)");
#endif
  TREX_CHECK(backend == "auto", "unknown communicator backend '{}' (expected auto, mpi or local)", backend);
  TREX_CHECK(env.world_size == 1,
             "launched by {} with {} processes, but CPU collectives need MPI: launch with mpirun or srun "
             "(torchrun is supported for the NCCL/GPU backend)",
             env.launcher, env.world_size);
  return make_local_communicator();
}

}  // namespace trex::comm
