#include "train/cuda/staged_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace trex::train {

namespace {

struct Done final : comm::Work {
  bool test() override { return true; }
  void wait() override {}
};

// A device copy of a host buffer (bytes may be 0).
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) {
    if (bytes) TREX_CUDA(cudaMalloc(&p, bytes));
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

void h2d(void* d, const void* h, size_t n) {
  if (n) TREX_CUDA(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
}
void d2h(void* h, const void* d, size_t n) {
  if (n) TREX_CUDA(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

class Staged final : public comm::Communicator {
 public:
  Staged(comm::Communicator& in, std::unique_ptr<comm::Communicator> owned) : in_(in), owned_(std::move(owned)) {
    set_timeout_seconds(in.timeout_seconds());
  }
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  std::string backend() const override { return in_.backend() + "-staged"; }

  comm::WorkPtr all_reduce(void* buf, size_t count, comm::ElemType t, comm::ReduceOp op) override {
    const size_t n = count * comm::elem_size(t);
    Dev d(n);
    h2d(d.p, buf, n);
    finish(in_.all_reduce(d.p, count, t, op));
    d2h(buf, d.p, n);
    return done();
  }
  comm::WorkPtr all_gather(const void* send, void* recv, size_t count, comm::ElemType t) override {
    const size_t n = count * comm::elem_size(t);
    Dev s(n), r(n * size_t(size()));
    h2d(s.p, send, n);
    finish(in_.all_gather(s.p, r.p, count, t));
    d2h(recv, r.p, n * size_t(size()));
    return done();
  }
  comm::WorkPtr reduce_scatter(const void* send, void* recv, size_t count, comm::ElemType t,
                               comm::ReduceOp op) override {
    const size_t n = count * comm::elem_size(t);
    Dev s(n * size_t(size())), r(n);
    h2d(s.p, send, n * size_t(size()));
    finish(in_.reduce_scatter(s.p, r.p, count, t, op));
    d2h(recv, r.p, n);
    return done();
  }
  comm::WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                             const std::vector<size_t>& send_offsets, void* recv, const std::vector<size_t>& recv_bytes,
                             const std::vector<size_t>& recv_offsets) override {
    size_t ns = 0, nr = 0;
    for (size_t r = 0; r < send_bytes.size(); ++r) ns = std::max(ns, send_offsets[r] + send_bytes[r]);
    for (size_t r = 0; r < recv_bytes.size(); ++r) nr = std::max(nr, recv_offsets[r] + recv_bytes[r]);
    Dev s(ns), r(nr);
    h2d(s.p, send, ns);
    finish(in_.all_to_all_v(s.p, send_bytes, send_offsets, r.p, recv_bytes, recv_offsets));
    d2h(recv, r.p, nr);
    return done();
  }
  comm::WorkPtr broadcast(void* buf, size_t bytes, int root) override {
    Dev d(bytes);
    h2d(d.p, buf, bytes);
    finish(in_.broadcast(d.p, bytes, root));
    d2h(buf, d.p, bytes);
    return done();
  }
  comm::WorkPtr send(const void* buf, size_t bytes, int peer, int tag) override {
    Dev d(bytes);
    h2d(d.p, buf, bytes);
    finish(in_.send(d.p, bytes, peer, tag));
    return done();
  }
  comm::WorkPtr recv(void* buf, size_t bytes, int peer, int tag) override {
    Dev d(bytes);
    finish(in_.recv(d.p, bytes, peer, tag));
    d2h(buf, d.p, bytes);
    return done();
  }
  void barrier() override { in_.barrier(); }
  std::unique_ptr<comm::Communicator> split(int color, int key) override {
    std::unique_ptr<comm::Communicator> sub = in_.split(color, key);
    comm::Communicator& ref = *sub;
    return std::make_unique<Staged>(ref, std::move(sub));
  }

 private:
  static comm::WorkPtr done() { return std::make_unique<Done>(); }
  static void finish(comm::WorkPtr w) {
    w->wait();
    TREX_CUDA(cudaDeviceSynchronize());
  }
  comm::Communicator& in_;
  std::unique_ptr<comm::Communicator> owned_;
};

}  // namespace

std::unique_ptr<comm::Communicator> make_staged_communicator(comm::Communicator& inner,
                                                             std::unique_ptr<comm::Communicator> owned) {
  return std::make_unique<Staged>(inner, std::move(owned));
}

}  // namespace trex::train
