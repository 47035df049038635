// The 1F1B pipeline step over GpuModel stages (gpu_pipeline.h): schedule, boundary sends / early receives on two
// NCCL communicators, device-side waits, per-stage timing.
#include "train/cuda/gpu_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "comm/nccl_communicator.h"
#include "model/dsv4/loss.h"
#include "parallel/pipeline_schedule.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

struct GpuPipeline::Impl {
  GpuModel& st;
  comm::Communicator& act;
  comm::Communicator& grad;
  int64_t M = 1;
  int r = 0, P = 1, slots = 1;
  int64_t elems = 0;            // boundary tensor elements of the current micro-batch shape
  DevMem recv_act[2], recv_grad[2];  // alternating receive buffers (bf16 / fp32)
  comm::WorkPtr recv_act_w[2], recv_grad_w[2];
  std::vector<comm::WorkPtr> send_act_w, send_grad_w;  // per stage slot: the last send out of it
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> fwd_ev, bwd_ev;
  PipelineStats acc;

  Impl(GpuModel& s, comm::Communicator& a, comm::Communicator& g) : st(s), act(a), grad(g) {}
  ~Impl() {
    for (auto* v : {&fwd_ev, &bwd_ev})
      for (auto& [x, y] : *v) cudaEventDestroy(x), cudaEventDestroy(y);
  }
  std::pair<cudaEvent_t, cudaEvent_t> begin_ev() {
    std::pair<cudaEvent_t, cudaEvent_t> e{nullptr, nullptr};
    TREX_CUDA(cudaEventCreate(&e.first));
    TREX_CUDA(cudaEventCreate(&e.second));
    TREX_CUDA(cudaEventRecord(e.first, nullptr));
    return e;
  }
  void end_ev(std::pair<cudaEvent_t, cudaEvent_t> e, std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& into) {
    TREX_CUDA(cudaEventRecord(e.second, nullptr));
    into.push_back(e);
  }
  // The host waits for an incoming tensor (the communicator's timeout turns a lost peer into an error naming the
  // rank and transfer instead of a hang), then the compute stream is ordered after it. Host wait time measured.
  void wait_recv(comm::WorkPtr& w) {
    TREX_CHECK(w, "pipeline rank {}: waiting for a receive that was never posted", r);
    const auto t0 = std::chrono::steady_clock::now();
    w->wait();
    acc.recv_wait_ms += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3;
    comm::stream_wait(*w, nullptr);
    w.reset();
  }
  // Before a slot's buffers are freed or reused: its last send must have left.
  static void wait_send(comm::WorkPtr& w) {
    if (!w) return;
    comm::stream_wait(*w, nullptr);
    w.reset();
  }
  void post_recv_act(int64_t m) {
    recv_act_w[m % 2] = act.recv(recv_act[m % 2].as<void>(), size_t(elems) * 2, r - 1, int(m));
  }
  void post_recv_grad(int64_t m) {
    recv_grad_w[m % 2] = grad.recv(recv_grad[m % 2].as<void>(), size_t(elems) * 4, r + 1, int(m));
  }
  static double drain(std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& v) {
    double t = 0;
    for (auto& [a, b] : v) {
      float ms = 0.f;
      TREX_CUDA(cudaEventElapsedTime(&ms, a, b));
      t += ms;
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    v.clear();
    return t;
  }
};

GpuPipeline::GpuPipeline(GpuModel& stage, comm::Communicator& act, comm::Communicator& grad, int64_t micro_batches)
    : impl_(std::make_unique<Impl>(stage, act, grad)) {
  Impl& p = *impl_;
  rank_ = act.rank(), P_ = act.size();
  p.r = rank_, p.P = P_, p.M = micro_batches;
  TREX_CHECK(grad.size() == P_ && grad.rank() == rank_,
             "pipeline rank {}: the activation and gradient communicators differ (sizes {} / {}, ranks {} / {})",
             rank_, P_, grad.size(), rank_, grad.rank());
  TREX_CHECK(P_ >= 2 && micro_batches >= 1, "pipeline rank {}: needs >= 2 stages ({}) and >= 1 micro-batch ({})",
             rank_, P_, micro_batches);
  TREX_CHECK(device_memory_comm(act) && device_memory_comm(grad),
             "pipeline rank {}: the boundary communicators must work on device memory (nccl, or threads for stages "
             "sharing one GPU), got '{}', '{}'", rank_, act.backend(), grad.backend());
  GpuModel::Impl& m = stage.impl();
  p.slots = int(m.slots.size());
  TREX_CHECK(p.slots >= P_ - rank_, "pipeline rank {}: 1F1B keeps up to {} micro-batches in flight, the stage has "
             "stage_slots = {}", rank_, P_ - rank_, p.slots);
  TREX_CHECK(m.first_stage() == (rank_ == 0) && m.last_stage() == (rank_ == P_ - 1),
             "pipeline rank {} of {}: the stage holds layers [{}, {}) (first / last stage mismatch)", rank_, P_, m.l0,
             m.l1);
  p.send_act_w.resize(size_t(p.slots));
  p.send_grad_w.resize(size_t(p.slots));
  // Connect both directions now, in pipeline order (NCCL sets up a peer connection on its first send / recv and
  // the host can block there until the peer's matching call): activations 0 -> P-1, then gradients P-1 -> 0.
  DevMem tiny(16);
  if (rank_ > 0) act.recv(tiny.as<void>(), 16, rank_ - 1, 0)->wait();
  if (rank_ < P_ - 1) act.send(tiny.as<void>(), 16, rank_ + 1, 0)->wait();
  if (rank_ < P_ - 1) grad.recv(tiny.as<void>(), 16, rank_ + 1, 0)->wait();
  if (rank_ > 0) grad.send(tiny.as<void>(), 16, rank_ - 1, 0)->wait();
  TREX_CUDA(cudaDeviceSynchronize());
}

GpuPipeline::~GpuPipeline() {
  // Outstanding sends / receives read or write buffers owned here and by the stage: let them finish.
  cudaDeviceSynchronize();
}

std::vector<int64_t> GpuPipeline::one_f_one_b(int r, int P, int64_t M) {
  // The compute actions of the project's schedule generator (the boundary posts are this file's own).
  parallel::ScheduleSpec spec;
  spec.pp = P, spec.vpp = 1, spec.micro_batches = M, spec.kind = parallel::ScheduleKind::OneFOneB;
  const parallel::Schedule sch = parallel::make_schedule(spec);
  TREX_CHECK(r >= 0 && r < P, "pipeline: rank {} outside [0, {})", r, P);
  std::vector<int64_t> order;
  for (const parallel::PipeAction& a : sch.ranks[size_t(r)]) {
    if (a.op == parallel::PipeOp::Forward) order.push_back(a.micro + 1);
    if (a.op == parallel::PipeOp::Backward) order.push_back(-(a.micro + 1));
  }
  return order;
}

double GpuPipeline::step(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout) {
  Impl& p = *impl_;
  GpuModel& st = p.st;
  const int64_t n_mb = layout.B * layout.T, V = st.impl().cfg.vocab_size;
  // The loss normaliser: labelled targets of the whole step (with a DP group: of every DP rank's micro-batches).
  int64_t targets = 0;
  for (int64_t m = 0; m < p.M; ++m)
    for (int32_t t : dsv4::shifted_targets(labels + m * n_mb, layout.doc_start.data(), layout.B, layout.T, 1, V))
      targets += t >= 0;
  GpuModel::Impl& mi = st.impl();
  if (mi.dp_size > 1) {
    double h = double(targets);
    DevMem d(sizeof(double));
    TREX_CUDA(cudaMemcpy(d.as<double>(), &h, sizeof(double), cudaMemcpyHostToDevice));
    mi.dp->all_reduce(d.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
    TREX_CUDA(cudaMemcpy(&h, d.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
    targets = int64_t(std::llround(h));
  }
  // The MTP head's normaliser likewise (its targets are token t + 2 within t's document).
  int64_t mtp_targets = -1;
  if (mi.mtp()) {
    mtp_targets = 0;
    for (int64_t m = 0; m < p.M; ++m)
      for (int32_t t : dsv4::shifted_targets(labels + m * n_mb, layout.doc_start.data(), layout.B, layout.T, 2, V))
        mtp_targets += t >= 0;
    if (mi.dp_size > 1) {
      double h = double(mtp_targets);
      DevMem d(sizeof(double));
      TREX_CUDA(cudaMemcpy(d.as<double>(), &h, sizeof(double), cudaMemcpyHostToDevice));
      mi.dp->all_reduce(d.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
      TREX_CUDA(cudaMemcpy(&h, d.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
      mtp_targets = int64_t(std::llround(h));
    }
  }
  std::vector<MicroBatch> mbs(size_t(p.M));
  for (int64_t m = 0; m < p.M; ++m)
    mbs[size_t(m)] = {ids + m * n_mb, labels + m * n_mb, &layout, targets, mtp_targets};
  return run(mbs, p.M, {});
}

double GpuPipeline::step(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
                         const std::function<void(int64_t)>& after_forward) {
  Impl& p = *impl_;
  TREX_CHECK(int64_t(micro.size()) == p.M, "pipeline rank {}: {} micro-batches for a pipeline of {}", p.r,
             micro.size(), p.M);
  for (size_t m = 0; m < micro.size(); ++m) {
    const MicroBatch& b = micro[m];
    TREX_CHECK(b.ids && b.labels && b.layout && b.normaliser >= 0,
               "pipeline rank {}: micro-batch {} lacks its ids, labels, layout or normaliser", p.r, m);
    TREX_CHECK(b.layout->B * b.layout->T == micro[0].layout->B * micro[0].layout->T,
               "pipeline rank {}: micro-batch {} has {} tokens, micro-batch 0 {} (the boundary tensors are sized "
               "once per step)", p.r, m, b.layout->B * b.layout->T, micro[0].layout->B * micro[0].layout->T);
  }
  return run(micro, step_micro_batches, after_forward);
}

double GpuPipeline::run(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
                        const std::function<void(int64_t)>& after_forward) {
  Impl& p = *impl_;
  GpuModel& st = p.st;
  const bool first = p.r == 0, last = p.r == p.P - 1;
  // The gradients are reduced over DP in the step's last backward (1F1B ends with micro-batch M - 1 everywhere);
  // each forward sets its micro-batch's normaliser (begin_step before it: the head reads it in the forward).
  st.begin_step(micro[0].normaliser, micro[0].mtp_normaliser, step_micro_batches, p.M - 1);
  const int64_t elems = st.stream_elems(*micro[0].layout);
  if (elems != p.elems) {  // (re)size the receive buffers; nothing is in flight between steps
    TREX_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < 2; ++i) {
      p.recv_act[i] = DevMem(first ? 0 : size_t(elems) * 2);
      p.recv_grad[i] = DevMem(last ? 0 : size_t(elems) * 4);
    }
    p.elems = elems;
  }
  // Receives are posted just before the compute that needs them: a receive posted earlier whose matching send
  // the peer issues only after this rank's next compute deadlocks as soon as that compute synchronises the device
  // (cudaFree, a pinned allocation, a cuBLASLt workspace) while the receive kernel spins. The transfer (about
  // 1 ms of a 100+ ms micro-batch) is then exposed; the sends still overlap the next compute.
  double loss = 0;
  for (int64_t op : one_f_one_b(p.r, p.P, p.M)) {
    const int64_t m = std::abs(op) - 1;
    const int s = int(m % p.slots);
    const MicroBatch& b = micro[size_t(m)];
    if (op > 0) {  // forward of m
      if (!first) p.post_recv_act(m), p.wait_recv(p.recv_act_w[m % 2]);
      Impl::wait_send(p.send_act_w[size_t(s)]);  // the slot's previous output has left
      st.begin_step(b.normaliser, b.mtp_normaliser, step_micro_batches, p.M - 1);
      auto e = p.begin_ev();
      loss += st.forward_stage(m, b.ids, b.labels, *b.layout, first ? nullptr : p.recv_act[m % 2].as<void>());
      p.end_ev(e, p.fwd_ev);
      if (after_forward) after_forward(m);
      if (!last) p.send_act_w[size_t(s)] = p.act.send(st.stage_output(m), size_t(elems) * 2, p.r + 1, int(m));
    } else {  // backward of m
      if (!last) p.post_recv_grad(m), p.wait_recv(p.recv_grad_w[m % 2]);
      Impl::wait_send(p.send_act_w[size_t(s)]);   // the forward output is freed by this backward
      Impl::wait_send(p.send_grad_w[size_t(s)]);  // the slot's previous input gradient has left
      auto e = p.begin_ev();
      st.backward_stage(m, last ? nullptr : p.recv_grad[m % 2].as<float>());
      p.end_ev(e, p.bwd_ev);
      if (!first) p.send_grad_w[size_t(s)] = p.grad.send(st.stage_input_grad(m), size_t(elems) * 4, p.r - 1, int(m));
    }
  }
  ++p.acc.steps;
  return loss;  // the last stage's CE share plus this stage's balance terms (forward_stage)
}

std::vector<double> GpuPipeline::global_losses(const std::vector<double>& local) {
  Impl& p = *impl_;
  if (local.empty()) return {};
  TREX_CUDA(cudaDeviceSynchronize());
  DevMem d(local.size() * sizeof(double));
  std::vector<double> v(local);  // every stage's: the other stages' are their balance terms
  TREX_CUDA(cudaMemcpy(d.as<double>(), v.data(), v.size() * sizeof(double), cudaMemcpyHostToDevice));
  p.act.all_reduce(d.as<double>(), v.size(), comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  TREX_CUDA(cudaMemcpy(v.data(), d.as<double>(), v.size() * sizeof(double), cudaMemcpyDeviceToHost));
  return v;
}

PipelineStats GpuPipeline::stats() {
  Impl& p = *impl_;
  TREX_CUDA(cudaDeviceSynchronize());
  p.acc.fwd_ms += Impl::drain(p.fwd_ev);
  p.acc.bwd_ms += Impl::drain(p.bwd_ev);
  return p.acc;
}

void GpuPipeline::reset_stats() {
  stats();
  impl_->acc = PipelineStats{};
}

}  // namespace trex::dsv4gpu
