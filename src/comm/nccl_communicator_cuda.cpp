// NCCL on device pointers (see nccl_communicator.h): one non-blocking stream per communicator, an event per
// operation, host waits that poll with a timeout and abort the communicator naming rank and operation.
#include "comm/nccl_communicator.h"

#ifdef TREX_HAVE_NCCL
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/launch_env.h"
#include "comm/thread_group.h"
#include "core/error.h"
#ifdef TREX_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif

namespace trex::comm {

namespace {

#define TREX_NCCL_CUDA(call)                                                                                  \
  do {                                                                                                        \
    cudaError_t e_ = (call);                                                                                  \
    if (e_ != cudaSuccess) fail("NCCL communicator: CUDA error {} in {}", cudaGetErrorString(e_), #call);     \
  } while (0)

void nccl_check(ncclResult_t r, int rank, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress)
    fail("rank {}: NCCL {} failed: {} ({})", rank, what, ncclGetErrorString(r), ncclGetLastError(nullptr));
}

ncclDataType_t nccl_type(ElemType t) {
  switch (t) {
    case ElemType::F32:
      return ncclFloat32;
    case ElemType::F64:
      return ncclFloat64;
    case ElemType::I32:
      return ncclInt32;
    case ElemType::I64:
      return ncclInt64;
    case ElemType::U8:
      return ncclUint8;
    case ElemType::BF16:
      return ncclBfloat16;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

// Completion of one operation: an event recorded on the communicator's stream after it.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t ev, ncclComm_t comm, int rank, std::string what, double timeout_s)
      : ev_(ev), comm_(comm), rank_(rank), what_(std::move(what)), timeout_s_(timeout_s) {}
  ~NcclWork() override { cudaEventDestroy(ev_); }
  bool test() override {
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) fail("rank {}: {} failed on the device: {}", rank_, what_, cudaGetErrorString(e));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      fail("rank {}: {} failed: {} ({})", rank_, what_, ncclGetErrorString(async), ncclGetLastError(comm_));
    return false;
  }
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (!test()) {
      if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 10000 ? 1000 : 20));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) {
        std::fprintf(stderr,
                     "error: rank %d: NCCL %s did not complete within %.1f s (a peer rank died or hangs); aborting "
                     "the communicator and the job\n",
                     rank_, what_.c_str(), timeout_s_);
        std::fflush(stderr);
        // Abort the communicator so peers' kernels and the network threads stop, but never let the abort
        // itself (which can block on a wedged device) keep this rank alive.
        ncclComm_t c = comm_;
        std::thread([c] { ncclCommAbort(c); }).detach();
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        std::_Exit(3);
      }
    }
  }
  void stream_wait(cudaStream_t s) { TREX_NCCL_CUDA(cudaStreamWaitEvent(s, ev_, 0)); }

 private:
  cudaEvent_t ev_;
  ncclComm_t comm_;
  int rank_;
  std::string what_;
  double timeout_s_;
};

class NcclCommunicator final : public NcclCommunicatorApi {
 public:
  NcclCommunicator(ncclComm_t comm, int device, double timeout_s) : comm_(comm), device_(device) {
    timeout_s_ = timeout_s;
    nccl_check(ncclCommUserRank(comm_, &rank_), -1, "comm user rank");
    nccl_check(ncclCommCount(comm_, &size_), rank_, "comm count");
    TREX_NCCL_CUDA(cudaSetDevice(device_));
    // Non-blocking: the legacy default stream (the GPU model's) must not serialise with communication.
    TREX_NCCL_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TREX_NCCL_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    TREX_NCCL_CUDA(cudaMalloc(&scratch_, 16));
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaFree(scratch_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  cudaStream_t stream() const override { return stream_; }
  void set_input_stream(cudaStream_t s) override { input_ = s; }

  WorkPtr all_reduce(void* buf, size_t count, ElemType t, ReduceOp op) override {
    begin();
    nccl_check(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), comm_, stream_), rank_, "all_reduce");
    return end("all_reduce", count * elem_size(t));
  }
  WorkPtr all_gather(const void* send, void* recv, size_t count, ElemType t) override {
    begin();
    nccl_check(ncclAllGather(send, recv, count, nccl_type(t), comm_, stream_), rank_, "all_gather");
    return end("all_gather", count * elem_size(t));
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, ElemType t, ReduceOp op) override {
    begin();
    nccl_check(ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_), rank_,
               "reduce_scatter");
    return end("reduce_scatter", count * elem_size(t));
  }
  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_off,
                       void* recv, const std::vector<size_t>& recv_bytes,
                       const std::vector<size_t>& recv_off) override {
    TREX_CHECK(int(send_bytes.size()) == size_ && int(recv_bytes.size()) == size_ &&
                   int(send_off.size()) == size_ && int(recv_off.size()) == size_,
               "rank {}: NCCL all_to_all_v: count/offset vectors must have one entry per rank ({})", rank_, size_);
    TREX_CHECK(send_bytes[size_t(rank_)] == recv_bytes[size_t(rank_)],
               "rank {}: NCCL all_to_all_v: {} bytes to itself but {} expected from itself", rank_,
               send_bytes[size_t(rank_)], recv_bytes[size_t(rank_)]);
    begin();
    const char* s = static_cast<const char*>(send);
    char* r = static_cast<char*>(recv);
    size_t total = 0;
    if (send_bytes[size_t(rank_)])
      TREX_NCCL_CUDA(cudaMemcpyAsync(r + recv_off[size_t(rank_)], s + send_off[size_t(rank_)],
                                     send_bytes[size_t(rank_)], cudaMemcpyDeviceToDevice, stream_));
    nccl_check(ncclGroupStart(), rank_, "group start");
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const size_t i = size_t(p);
      total += send_bytes[i];
      if (send_bytes[i]) nccl_check(ncclSend(s + send_off[i], send_bytes[i], ncclUint8, p, comm_, stream_), rank_, "send");
      if (recv_bytes[i]) nccl_check(ncclRecv(r + recv_off[i], recv_bytes[i], ncclUint8, p, comm_, stream_), rank_, "recv");
    }
    nccl_check(ncclGroupEnd(), rank_, "all_to_all_v group");
    return end("all_to_all_v", total);
  }
  WorkPtr broadcast(void* buf, size_t bytes, int root) override {
    begin();
    nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_), rank_, "broadcast");
    return end("broadcast", bytes);
  }
  // NCCL has no tags: messages between two ranks match in issue order. A send and a recv with the same peer
  // issued back to back by both sides must not deadlock, so each is its own group (NCCL buffers nothing: the
  // caller orders them, as a 1F1B schedule does).
  WorkPtr send(const void* buf, size_t bytes, int peer, int) override {
    begin();
    nccl_check(ncclSend(buf, bytes, ncclUint8, peer, comm_, stream_), rank_, "send");
    return end("send to rank " + std::to_string(peer), bytes);
  }
  WorkPtr recv(void* buf, size_t bytes, int peer, int) override {
    begin();
    nccl_check(ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream_), rank_, "recv");
    return end("recv from rank " + std::to_string(peer), bytes);
  }
  void barrier() override {
    begin();
    nccl_check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), rank_, "barrier");
    end("barrier", 0)->wait();
  }
  void abort(const std::string& why) override {
    std::fprintf(stderr, "error: rank %d failed: %s; aborting the NCCL communicator and the job\n", rank_, why.c_str());
    std::fflush(stderr);
    // As a timed-out wait: the abort may block on a wedged device, so it must not keep this process alive; the
    // launcher (mpirun, torchrun) ends the other ranks when this one exits non-zero.
    ncclComm_t c = comm_;
    std::thread([c] { ncclCommAbort(c); }).detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::_Exit(1);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    TREX_CHECK(color >= 0, "rank {}: NCCL split: color {} must be >= 0", rank_, color);
    nccl_check(ncclCommSplit(comm_, color, key, &sub, nullptr), rank_, "comm split");
    return std::make_unique<NcclCommunicator>(sub, device_, timeout_s_);
  }

 private:
  void begin() {
    TREX_NCCL_CUDA(cudaEventRecord(ready_, input_));
    TREX_NCCL_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  WorkPtr end(const std::string& op, size_t bytes) {
    cudaEvent_t ev;
    TREX_NCCL_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    TREX_NCCL_CUDA(cudaEventRecord(ev, stream_));
    return std::make_unique<NcclWork>(ev, comm_, rank_, fmt::format("{} ({} bytes)", op, bytes), timeout_s_);
  }

  ncclComm_t comm_;
  int device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr, input_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
};

void write_all(int fd, const char* p, size_t n) {
  while (n) {
    const ssize_t w = ::write(fd, p, n);
    TREX_CHECK(w > 0, "NCCL rendezvous: write failed: {}", std::strerror(errno));
    p += w, n -= size_t(w);
  }
}

void read_all(int fd, char* p, size_t n, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    const int left_ms = int(1000 * (timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
    TREX_CHECK(left_ms > 0 && ::poll(&pf, 1, left_ms) > 0, "NCCL rendezvous: no id from rank 0 within {} s", timeout_s);
    const ssize_t r = ::read(fd, p, n);
    TREX_CHECK(r > 0, "NCCL rendezvous: rank 0 closed the connection early");
    p += r, n -= size_t(r);
  }
}

}  // namespace

NcclId nccl_new_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), 0, "get unique id");
  NcclId out;
  static_assert(sizeof(id) == sizeof(NcclId));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclId& id, int rank, int size, int device,
                                                     double timeout_s) {
  TREX_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL communicator: rank {} not in [0, {})", rank, size);
  TREX_NCCL_CUDA(cudaSetDevice(device));
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, size, uid, rank), rank, fmt::format("init (world {}, device {})", size, device));
  return std::make_unique<NcclCommunicator>(comm, device, timeout_s);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device, double timeout_s) {
  NcclId id{};
  if (bootstrap.rank() == 0) id = nccl_new_id();
  bootstrap.broadcast(id.data(), id.size(), 0)->wait();
  return make_nccl_communicator(id, bootstrap.rank(), bootstrap.size(), device, timeout_s);
}

NcclId tcp_rendezvous_id(const std::string& addr, int port, int rank, int size, double timeout_s) {
  NcclId id{};
  if (size == 1) return nccl_new_id();
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  if (rank == 0) {
    id = nccl_new_id();
    const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    TREX_CHECK(lfd >= 0, "NCCL rendezvous: socket failed: {}", std::strerror(errno));
    const int one = 1;
    ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(uint16_t(port));
    TREX_CHECK(::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 && ::listen(lfd, size) == 0,
               "NCCL rendezvous: rank 0 cannot listen on port {}: {} (set TREX_NCCL_PORT to a free port)", port,
               std::strerror(errno));
    for (int served = 1; served < size;) {
      pollfd pf{lfd, POLLIN, 0};
      const int left_ms = int(1000 * (timeout_s - elapsed()));
      if (left_ms <= 0 || ::poll(&pf, 1, left_ms) <= 0) {
        ::close(lfd);
        fail("NCCL rendezvous: rank 0 saw {} of {} ranks on port {} within {} s", served, size, port, timeout_s);
      }
      const int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) continue;
      write_all(fd, id.data(), id.size());
      ::close(fd);
      ++served;
    }
    ::close(lfd);
    return id;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port_s = std::to_string(port);
  TREX_CHECK(::getaddrinfo(addr.c_str(), port_s.c_str(), &hints, &res) == 0 && res,
             "NCCL rendezvous: rank {} cannot resolve MASTER_ADDR '{}'", rank, addr);
  int fd = -1;
  while (true) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    TREX_CHECK(fd >= 0, "NCCL rendezvous: socket failed: {}", std::strerror(errno));
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    ::close(fd);
    if (elapsed() > timeout_s) {
      ::freeaddrinfo(res);
      fail("NCCL rendezvous: rank {} could not reach rank 0 at {}:{} within {} s", rank, addr, port, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(res);
  read_all(fd, id.data(), id.size(), timeout_s - elapsed());
  ::close(fd);
  return id;
}

std::unique_ptr<Communicator> make_nccl_world_communicator(double timeout_s) {
  const LaunchEnv env = detect_launch_env();
  int n_dev = 0;
  TREX_NCCL_CUDA(cudaGetDeviceCount(&n_dev));
  TREX_CHECK(n_dev > 0, "rank {}: NCCL communicator: no CUDA device visible", env.rank);
  const int device = env.local_rank % n_dev;
  if (env.world_size == 1) return make_nccl_communicator(nccl_new_id(), 0, 1, device, timeout_s);
  if (env.launcher == "torchrun") {
    int port = env.master_port + 1;
    if (const char* p = std::getenv("TREX_NCCL_PORT")) port = std::atoi(p);
    const NcclId id = tcp_rendezvous_id(env.master_addr, port, env.rank, env.world_size, timeout_s);
    return make_nccl_communicator(id, env.rank, env.world_size, device, timeout_s);
  }
#ifdef TREX_HAVE_MPI
  auto mpi = make_mpi_world_communicator();
  mpi->set_timeout_seconds(timeout_s);
  return make_nccl_communicator(*mpi, device, timeout_s);
#else
  fail("launched by {} with {} processes, but this build has no MPI to exchange the NCCL id: launch with torchrun "
       "or configure with TREX_MPI=ON", env.launcher, env.world_size);
#endif
}

void stream_wait(Work& w, cudaStream_t s) {
  if (auto* n = dynamic_cast<NcclWork*>(&w)) {
    n->stream_wait(s);
  } else if (!thread_group_stream_wait(w, s)) {
    w.wait();
  }
}

}  // namespace trex::comm

#else  // no NCCL in this build: the entry points say so

#include "comm/thread_group.h"
#include "core/error.h"

namespace trex::comm {
NcclId nccl_new_id() { fail("this build of trex has no NCCL (install it and configure with TREX_CUDA=ON)"); }
std::unique_ptr<Communicator> make_nccl_communicator(const NcclId&, int, int, int, double) { return nccl_new_id(), nullptr; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int, double) { return nccl_new_id(), nullptr; }
NcclId tcp_rendezvous_id(const std::string&, int, int, int, double) { return nccl_new_id(); }
std::unique_ptr<Communicator> make_nccl_world_communicator(double) { return nccl_new_id(), nullptr; }
void stream_wait(Work& w, cudaStream_t s) {
  if (!thread_group_stream_wait(w, s)) w.wait();
}
}  // namespace trex::comm
#endif
