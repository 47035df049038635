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
  std::vector<GpuModel*> ch;  // chunk c: virtual stage c P + r
  comm::Communicator& act;
  comm::Communicator& grad;
  comm::Communicator* act_wrap = nullptr;   // last rank -> rank 0 (chunk c -> c + 1)
  comm::Communicator* grad_wrap = nullptr;  // rank 0 -> last rank (chunk c -> c - 1)
  int64_t M = 1;
  int r = 0, P = 1, V = 1;
  parallel::ScheduleSpec spec;  // of the step
  std::vector<int> slots;       // per chunk: its GpuModel's stage_slots
  int64_t elems = 0;            // boundary tensor elements of the current micro-batch shape
  DevMem recv_act[2], recv_grad[2];  // alternating receive buffers (bf16 / fp32)
  comm::WorkPtr recv_act_w[2], recv_grad_w[2];
  int64_t n_recv_act = 0, n_recv_grad = 0;  // receives so far (which buffer is next)
  // Per chunk and stage slot: the last send out of it.
  std::vector<std::vector<comm::WorkPtr>> send_act_w, send_grad_w;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> fwd_ev, bwd_ev;
  PipelineStats acc;

  Impl(std::vector<GpuModel*> c, comm::Communicator& a, comm::Communicator& g) : ch(std::move(c)), act(a), grad(g) {}
  ~Impl() {
    for (auto* v : {&fwd_ev, &bwd_ev})
      for (auto& [x, y] : *v) cudaEventDestroy(x), cudaEventDestroy(y);
  }
  int stage(int c) const { return c * P + r; }
  int n_stages() const { return P * V; }
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
  // The activation entering chunk c (virtual stage g > 0) comes from g - 1: rank r - 1, or the last rank's
  // previous chunk over the wrap communicator; its gradient goes back the same way.
  comm::Communicator& act_in() { return r > 0 ? act : *act_wrap; }
  comm::Communicator& act_out() { return r < P - 1 ? act : *act_wrap; }
  comm::Communicator& grad_in() { return r < P - 1 ? grad : *grad_wrap; }
  comm::Communicator& grad_out() { return r > 0 ? grad : *grad_wrap; }
  // The message tag of the boundary tensor of micro-batch m entering virtual stage `to` (activations) or leaving
  // it backwards (gradients): unique within the step (parallel::pipe_message_tag's numbering, without its MPI tag
  // range limit: NCCL matches in posting order, the thread group by tag).
  int tag(bool gradient, int to, int64_t m) const {
    return int(((gradient ? n_stages() : 0) + to) * M + m);
  }
  int prev_rank() const { return (r + P - 1) % P; }
  int next_rank() const { return (r + 1) % P; }
  // Returns the buffer the activation of (m, c) lands in.
  void* post_recv_act(int64_t m, int c) {
    const int b = int(n_recv_act++ % 2);
    recv_act_w[b] = act_in().recv(recv_act[b].as<void>(), size_t(elems) * 2, prev_rank(),
                                   tag(false, stage(c), m));
    wait_recv(recv_act_w[b]);
    return recv_act[b].as<void>();
  }
  const float* post_recv_grad(int64_t m, int c) {
    const int b = int(n_recv_grad++ % 2);
    recv_grad_w[b] = grad_in().recv(recv_grad[b].as<void>(), size_t(elems) * 4, next_rank(),
                                     tag(true, stage(c) + 1, m));
    wait_recv(recv_grad_w[b]);
    return recv_grad[b].as<float>();
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
    : GpuPipeline(std::vector<GpuModel*>{&stage}, act, grad, nullptr, nullptr, micro_batches) {}

GpuPipeline::GpuPipeline(std::vector<GpuModel*> chunks, comm::Communicator& act, comm::Communicator& grad,
                         comm::Communicator* act_wrap, comm::Communicator* grad_wrap, int64_t micro_batches)
    : impl_(std::make_unique<Impl>(std::move(chunks), act, grad)) {
  Impl& p = *impl_;
  rank_ = act.rank(), P_ = act.size(), V_ = int(p.ch.size());
  p.r = rank_, p.P = P_, p.V = V_, p.M = micro_batches;
  TREX_CHECK(V_ >= 1, "pipeline rank {}: no model chunk", rank_);
  for (int c = 0; c < V_; ++c) TREX_CHECK(p.ch[size_t(c)], "pipeline rank {}: chunk {} is null", rank_, c);
  TREX_CHECK(grad.size() == P_ && grad.rank() == rank_,
             "pipeline rank {}: the activation and gradient communicators differ (sizes {} / {}, ranks {} / {})",
             rank_, P_, grad.size(), rank_, grad.rank());
  TREX_CHECK(P_ >= 2 && micro_batches >= 1, "pipeline rank {}: needs >= 2 stages ({}) and >= 1 micro-batch ({})",
             rank_, P_, micro_batches);
  if (V_ > 1) {
    TREX_CHECK(act_wrap && grad_wrap, "pipeline rank {}: {} interleaved chunks need the wrap communicators (last "
               "rank -> rank 0 activations, rank 0 -> last rank gradients)", rank_, V_);
    for (comm::Communicator* w : {act_wrap, grad_wrap})
      TREX_CHECK(w->size() == P_ && w->rank() == rank_ && device_memory_comm(*w),
                 "pipeline rank {}: a wrap communicator has size {} / rank {} / backend '{}' (want {} / {} on device "
                 "memory)", rank_, w->size(), w->rank(), w->backend(), P_, rank_);
    p.act_wrap = act_wrap, p.grad_wrap = grad_wrap;
  }
  TREX_CHECK(device_memory_comm(act) && device_memory_comm(grad),
             "pipeline rank {}: the boundary communicators must work on device memory (nccl, or threads for stages "
             "sharing one GPU), got '{}', '{}'", rank_, act.backend(), grad.backend());
  p.spec.pp = P_, p.spec.vpp = V_, p.spec.micro_batches = micro_batches;
  p.spec.kind = V_ > 1 ? parallel::ScheduleKind::Interleaved : parallel::ScheduleKind::OneFOneB;
  const std::string why = parallel::check_schedule_spec(p.spec);
  TREX_CHECK(why.empty(), "pipeline rank {}: pp={} x vpp={} over {} micro-batches: {}", rank_, P_, V_,
             micro_batches, why);
  const std::vector<int> need = chunk_slots(rank_, P_, V_, micro_batches);
  const int S = P_ * V_;
  for (int c = 0; c < V_; ++c) {
    GpuModel::Impl& m = p.ch[size_t(c)]->impl();
    const int g = c * P_ + rank_;
    p.slots.push_back(int(m.slots.size()));
    TREX_CHECK(p.slots.back() >= need[size_t(c)], "pipeline rank {}: {} keeps up to {} micro-batches in flight on "
               "chunk {} (virtual stage {}), its model has stage_slots = {}", rank_,
               V_ > 1 ? "the interleaved schedule" : "1F1B", need[size_t(c)], c, g, p.slots.back());
    TREX_CHECK(m.first_stage() == (g == 0) && m.last_stage() == (g == S - 1),
               "pipeline rank {} of {}: chunk {} (virtual stage {} of {}) holds layers [{}, {}) (first / last stage "
               "mismatch)", rank_, P_, c, g, S, m.l0, m.l1);
    if (c > 0)
      TREX_CHECK(m.l0 >= p.ch[size_t(c - 1)]->impl().l1, "pipeline rank {}: chunk {} holds layers [{}, {}), before "
                 "chunk {}'s [{}, {})", rank_, c, m.l0, m.l1, c - 1, p.ch[size_t(c - 1)]->impl().l0,
                 p.ch[size_t(c - 1)]->impl().l1);
    p.send_act_w.emplace_back(size_t(p.slots.back()));
    p.send_grad_w.emplace_back(size_t(p.slots.back()));
  }
  // Connect every direction now, in pipeline order (NCCL sets up a peer connection on its first send / recv and
  // the host can block there until the peer's matching call): activations 0 -> P-1 (and P-1 -> 0 on the wrap),
  // then gradients P-1 -> 0 (and 0 -> P-1 on the wrap).
  DevMem tiny(16);
  if (rank_ > 0) act.recv(tiny.as<void>(), 16, rank_ - 1, 0)->wait();
  if (rank_ < P_ - 1) act.send(tiny.as<void>(), 16, rank_ + 1, 0)->wait();
  if (V_ > 1 && rank_ == 0) act_wrap->recv(tiny.as<void>(), 16, P_ - 1, 0)->wait();
  if (V_ > 1 && rank_ == P_ - 1) act_wrap->send(tiny.as<void>(), 16, 0, 0)->wait();
  if (rank_ < P_ - 1) grad.recv(tiny.as<void>(), 16, rank_ + 1, 0)->wait();
  if (rank_ > 0) grad.send(tiny.as<void>(), 16, rank_ - 1, 0)->wait();
  if (V_ > 1 && rank_ == P_ - 1) grad_wrap->recv(tiny.as<void>(), 16, 0, 0)->wait();
  if (V_ > 1 && rank_ == 0) grad_wrap->send(tiny.as<void>(), 16, P_ - 1, 0)->wait();
  TREX_CUDA(cudaDeviceSynchronize());
}

GpuPipeline::~GpuPipeline() {
  // Outstanding sends / receives read or write buffers owned here and by the stage: let them finish.
  cudaDeviceSynchronize();
}

std::vector<int64_t> GpuPipeline::one_f_one_b(int r, int P, int64_t M) {
  std::vector<int64_t> order;
  for (const ComputeOp& o : compute_order(r, P, 1, M)) order.push_back(o.forward ? o.micro + 1 : -(o.micro + 1));
  return order;
}

std::vector<GpuPipeline::ComputeOp> GpuPipeline::compute_order(int r, int P, int V, int64_t M) {
  // The compute actions of the project's schedule generator (the boundary posts are this file's own).
  parallel::ScheduleSpec spec;
  spec.pp = P, spec.vpp = V, spec.micro_batches = M;
  spec.kind = V > 1 ? parallel::ScheduleKind::Interleaved : parallel::ScheduleKind::OneFOneB;
  const parallel::Schedule sch = parallel::make_schedule(spec);
  TREX_CHECK(r >= 0 && r < P, "pipeline: rank {} outside [0, {})", r, P);
  std::vector<ComputeOp> order;
  for (const parallel::PipeAction& a : sch.ranks[size_t(r)]) {
    if (a.op == parallel::PipeOp::Forward) order.push_back({true, a.chunk, a.micro});
    if (a.op == parallel::PipeOp::Backward) order.push_back({false, a.chunk, a.micro});
  }
  return order;
}

std::vector<int> GpuPipeline::chunk_slots(int r, int P, int V, int64_t M) {
  // Each chunk's forwards and backwards run in micro-batch order, so the micro-batches in flight on it are
  // consecutive and micro-batch m's slot m % slots is free again when m + slots starts.
  std::vector<int> live(size_t(V), 0), most(size_t(V), 1);
  for (const ComputeOp& o : compute_order(r, P, V, M)) {
    int& n = live[size_t(o.chunk)];
    if (o.forward) most[size_t(o.chunk)] = std::max(most[size_t(o.chunk)], ++n);
    else --n;
  }
  return most;
}

double GpuPipeline::step(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout) {
  Impl& p = *impl_;
  GpuModel& st = *p.ch[0];
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
  // The MTP head's normaliser likewise (its targets are token t + 2 within t's document), when this rank holds
  // the MTP module: on its last chunk (interleaved: the last virtual stage is the last rank's last chunk).
  int64_t mtp_targets = -1;
  if (p.ch.back()->impl().mtp()) {
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
  return step_chunks(mbs, p.M, {});
}

double GpuPipeline::step(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
                         const std::function<void(int64_t)>& after_forward) {
  TREX_CHECK(!after_forward || V_ == 1, "pipeline rank {}: {} chunks: the per-chunk callback (step_chunks) says "
             "which chunk's forward ran", rank_, V_);
  std::function<void(int64_t, int)> each;
  if (after_forward) each = [&after_forward](int64_t m, int) { after_forward(m); };
  return step_chunks(micro, step_micro_batches, each);
}

double GpuPipeline::step_chunks(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
                                const std::function<void(int64_t, int)>& after_chunk_forward) {
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
  return run(micro, step_micro_batches, after_chunk_forward);
}

double GpuPipeline::run(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
                        const std::function<void(int64_t, int)>& after_forward) {
  Impl& p = *impl_;
  const int S = p.n_stages();
  // The gradients are reduced over DP in each chunk's last backward (every chunk runs its backwards in micro-batch
  // order, ending with M - 1); each forward sets its micro-batch's normaliser (begin_step before it: the head
  // reads it in the forward).
  for (GpuModel* c : p.ch) c->begin_step(micro[0].normaliser, micro[0].mtp_normaliser, step_micro_batches, p.M - 1);
  const int64_t elems = p.ch[0]->stream_elems(*micro[0].layout);
  if (elems != p.elems) {  // (re)size the receive buffers; nothing is in flight between steps
    TREX_CUDA(cudaDeviceSynchronize());
    const bool any_act_in = p.r > 0 || p.V > 1, any_grad_in = p.r < p.P - 1 || p.V > 1;
    for (int i = 0; i < 2; ++i) {
      p.recv_act[i] = DevMem(any_act_in ? size_t(elems) * 2 : 0);
      p.recv_grad[i] = DevMem(any_grad_in ? size_t(elems) * 4 : 0);
    }
    p.elems = elems;
  }
  // Receives are posted just before the compute that needs them: a receive posted earlier whose matching send
  // the peer issues only after this rank's next compute deadlocks as soon as that compute synchronises the device
  // (cudaFree, a pinned allocation, a cuBLASLt workspace) while the receive kernel spins. The transfer (about
  // 1 ms of a 100+ ms micro-batch) is then exposed; the sends still overlap the next compute.
  double loss = 0;
  for (const ComputeOp& op : compute_order(p.r, p.P, p.V, p.M)) {
    const int64_t m = op.micro;
    const int c = op.chunk, g = p.stage(c);
    const bool first = g == 0, last = g == S - 1;
    GpuModel& st = *p.ch[size_t(c)];
    const int s = int(m % p.slots[size_t(c)]);
    const MicroBatch& b = micro[size_t(m)];
    comm::WorkPtr& sent_act = p.send_act_w[size_t(c)][size_t(s)];
    comm::WorkPtr& sent_grad = p.send_grad_w[size_t(c)][size_t(s)];
    if (op.forward) {
      const void* x_in = first ? nullptr : p.post_recv_act(m, c);
      Impl::wait_send(sent_act);  // the slot's previous output has left
      st.begin_step(b.normaliser, b.mtp_normaliser, step_micro_batches, p.M - 1);
      auto e = p.begin_ev();
      loss += st.forward_stage(m, b.ids, b.labels, *b.layout, x_in);
      p.end_ev(e, p.fwd_ev);
      if (after_forward) after_forward(m, c);
      if (!last)
        sent_act = p.act_out().send(st.stage_output(m), size_t(elems) * 2, p.next_rank(),
                                     p.tag(false, g + 1, m));
    } else {
      const float* dx_out = last ? nullptr : p.post_recv_grad(m, c);
      Impl::wait_send(sent_act);   // the forward output is freed by this backward
      Impl::wait_send(sent_grad);  // the slot's previous input gradient has left
      auto e = p.begin_ev();
      st.backward_stage(m, dx_out);
      p.end_ev(e, p.bwd_ev);
      if (!first)
        sent_grad = p.grad_out().send(st.stage_input_grad(m), size_t(elems) * 4, p.prev_rank(),
                                       p.tag(true, g, m));
    }
  }
  ++p.acc.steps;
  return loss;  // the last virtual stage's CE share plus every chunk's balance terms (forward_stage)
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
