// The pipeline step over GpuModel stages (gpu_pipeline.h): the shared executor (parallel/pipeline_executor.h)
// over this file's device memory (bf16 / fp32 boundary buffers, stream waits, CUDA-event timing) and stage
// adapter (a GpuModel chunk sending from its own slots), on one NCCL communicator per direction.
#include "train/cuda/gpu_pipeline.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/nccl_communicator.h"
#include "model/dsv4/loss.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_schedule.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

namespace {

// The device side of the shared executor's memory (parallel/pipeline_memory.h): activations cross as bf16 (what
// the next stage's kernels read), gradients as fp32 (what the previous stage accumulates in); two alternating
// receive buffers per direction (the stages copy what they keep into their slots, and each communicator's
// stream runs after the compute queued before it); sends leave from the stages' own slots.
class DevicePipelineMemory final : public parallel::PipelineMemory {
 public:
  DevicePipelineMemory(bool any_act_in, bool any_grad_in) : any_act_in_(any_act_in), any_grad_in_(any_grad_in) {}
  ~DevicePipelineMemory() override {
    for (auto* v : {&fwd_ev_, &bwd_ev_})
      for (auto& [x, y] : *v) cudaEventDestroy(x), cudaEventDestroy(y);
  }
  size_t act_elem_bytes() const override { return 2; }
  size_t grad_elem_bytes() const override { return 4; }
  void resize(int64_t elems) override {
    if (elems == elems_) return;
    TREX_CUDA(cudaDeviceSynchronize());  // (re)size the receive buffers; nothing is in flight between steps
    for (int i = 0; i < 2; ++i) {
      recv_act_[i] = DevMem(any_act_in_ ? size_t(elems) * 2 : 0);
      recv_grad_[i] = DevMem(any_grad_in_ ? size_t(elems) * 4 : 0);
    }
    elems_ = elems;
  }
  void* take(parallel::BoundaryRole role) override {
    switch (role) {
      case parallel::BoundaryRole::ActIn: return recv_act_[n_recv_act_++ % 2].as<void>();
      case parallel::BoundaryRole::GradIn: return recv_grad_[n_recv_grad_++ % 2].as<void>();
      default: break;
    }
    throw Error("GPU pipeline: the stages send their outputs from their own slots (no output buffer to take)");
  }
  void give(parallel::BoundaryRole, void*) override {}  // the alternating buffers are reused in turn
  // The host waited for the receive (the communicator's timeout turns a lost peer into an error naming the rank
  // and transfer instead of a hang); the compute stream is ordered after it.
  void after_receive(comm::Work& w) override { comm::stream_wait(w, nullptr); }
  // A slot's buffers are rewritten only after its last send has left, without blocking the host.
  void before_reuse(comm::Work& w) override { comm::stream_wait(w, nullptr); }
  void compute_begin(int, bool) override {
    cur_ = {nullptr, nullptr};
    TREX_CUDA(cudaEventCreate(&cur_.first));
    TREX_CUDA(cudaEventCreate(&cur_.second));
    TREX_CUDA(cudaEventRecord(cur_.first, nullptr));
  }
  void compute_end(int, bool backward) override {
    TREX_CUDA(cudaEventRecord(cur_.second, nullptr));
    (backward ? bwd_ev_ : fwd_ev_).push_back(cur_);
  }
  // Device milliseconds of the forwards / backwards since the last call (the device must be synchronised).
  double drain(bool backward) {
    auto& v = backward ? bwd_ev_ : fwd_ev_;
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

 private:
  bool any_act_in_, any_grad_in_;
  int64_t elems_ = 0;
  DevMem recv_act_[2], recv_grad_[2];
  int64_t n_recv_act_ = 0, n_recv_grad_ = 0;  // receives so far (which buffer is next)
  std::pair<cudaEvent_t, cudaEvent_t> cur_{nullptr, nullptr};
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> fwd_ev_, bwd_ev_;
};

// One GpuModel chunk as the shared executor's stage: its boundary outputs stay in its activation slots.
class GpuChunkStage final : public parallel::PipelineStage {
 public:
  GpuChunkStage(GpuModel& m, int slots) : m_(m), slots_(slots) {}
  // The step's micro-batches (each forward sets its own normaliser: the head reads it in the forward).
  void set_step(const std::vector<GpuPipeline::MicroBatch>* micro, int64_t step_micro_batches) {
    micro_ = micro, step_micro_batches_ = step_micro_batches;
  }
  int64_t boundary_elems() const override { return m_.stream_elems(*(*micro_)[0].layout); }
  bool is_first() const override { return m_.impl().first_stage(); }
  bool is_last() const override { return m_.impl().last_stage(); }
  double forward(int64_t m, const void* x_in, void*) override {
    const GpuPipeline::MicroBatch& b = (*micro_)[size_t(m)];
    m_.begin_step(b.normaliser, b.mtp_normaliser, step_micro_batches_, int64_t(micro_->size()) - 1);
    return m_.forward_stage(m, b.ids, b.labels, *b.layout, x_in);
  }
  void backward(int64_t m, const void* dx_out, void*) override {
    m_.backward_stage(m, static_cast<const float*>(dx_out));
  }
  int owned_slots() const override { return slots_; }
  const void* output(int64_t m) const override { return m_.stage_output(m); }
  const void* input_grad(int64_t m) const override { return m_.stage_input_grad(m); }

 private:
  GpuModel& m_;
  int slots_;
  const std::vector<GpuPipeline::MicroBatch>* micro_ = nullptr;
  int64_t step_micro_batches_ = 0;
};

}  // namespace

struct GpuPipeline::Impl {
  std::vector<GpuModel*> ch;  // chunk c: virtual stage c P + r
  comm::Communicator& act;
  int64_t M = 1;
  int r = 0, P = 1, V = 1;
  std::unique_ptr<DevicePipelineMemory> mem;
  std::vector<std::unique_ptr<GpuChunkStage>> stages;
  std::unique_ptr<parallel::PipelineExecutor> ex;  // destroyed first: it refers to mem and stages
  PipelineStats acc;

  Impl(std::vector<GpuModel*> c, comm::Communicator& a) : ch(std::move(c)), act(a) {}
};

GpuPipeline::GpuPipeline(GpuModel& stage, comm::Communicator& act, comm::Communicator& grad, int64_t micro_batches)
    : GpuPipeline(std::vector<GpuModel*>{&stage}, act, grad, nullptr, nullptr, micro_batches) {}

GpuPipeline::GpuPipeline(std::vector<GpuModel*> chunks, comm::Communicator& act, comm::Communicator& grad,
                         comm::Communicator* act_wrap, comm::Communicator* grad_wrap, int64_t micro_batches)
    : impl_(std::make_unique<Impl>(std::move(chunks), act)) {
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
  }
  TREX_CHECK(device_memory_comm(act) && device_memory_comm(grad),
             "pipeline rank {}: the boundary communicators must work on device memory (nccl, or threads for stages "
             "sharing one GPU), got '{}', '{}'", rank_, act.backend(), grad.backend());
  parallel::ScheduleSpec spec;
  spec.pp = P_, spec.vpp = V_, spec.micro_batches = micro_batches;
  spec.kind = V_ > 1 ? parallel::ScheduleKind::Interleaved : parallel::ScheduleKind::OneFOneB;
  // Receives are posted just before the compute that needs them: a receive posted earlier whose matching send
  // the peer issues only after this rank's next compute deadlocks as soon as that compute synchronises the device
  // (cudaFree, a pinned allocation, a cuBLASLt workspace) while the receive kernel spins. The transfer (about
  // 1 ms of a 100+ ms micro-batch) is then exposed; the sends still overlap the next compute.
  spec.lookahead = 0;
  const std::string why = parallel::check_schedule_spec(spec);
  TREX_CHECK(why.empty(), "pipeline rank {}: pp={} x vpp={} over {} micro-batches: {}", rank_, P_, V_,
             micro_batches, why);
  const std::vector<int> need = chunk_slots(rank_, P_, V_, micro_batches);
  const int S = P_ * V_;
  for (int c = 0; c < V_; ++c) {
    GpuModel::Impl& m = p.ch[size_t(c)]->impl();
    const int g = c * P_ + rank_;
    const int slots = int(m.slots.size());
    TREX_CHECK(slots >= need[size_t(c)], "pipeline rank {}: {} keeps up to {} micro-batches in flight on "
               "chunk {} (virtual stage {}), its model has stage_slots = {}", rank_,
               V_ > 1 ? "the interleaved schedule" : "1F1B", need[size_t(c)], c, g, slots);
    TREX_CHECK(m.first_stage() == (g == 0) && m.last_stage() == (g == S - 1),
               "pipeline rank {} of {}: chunk {} (virtual stage {} of {}) holds layers [{}, {}) (first / last stage "
               "mismatch)", rank_, P_, c, g, S, m.l0, m.l1);
    if (c > 0)
      TREX_CHECK(m.l0 >= p.ch[size_t(c - 1)]->impl().l1, "pipeline rank {}: chunk {} holds layers [{}, {}), before "
                 "chunk {}'s [{}, {})", rank_, c, m.l0, m.l1, c - 1, p.ch[size_t(c - 1)]->impl().l0,
                 p.ch[size_t(c - 1)]->impl().l1);
    p.stages.push_back(std::make_unique<GpuChunkStage>(*p.ch[size_t(c)], slots));
  }
  p.mem = std::make_unique<DevicePipelineMemory>(rank_ > 0 || V_ > 1, rank_ < P_ - 1 || V_ > 1);
  std::vector<parallel::PipelineStage*> stages;
  for (auto& st : p.stages) stages.push_back(st.get());
  parallel::PipelineExecutorOptions eo;
  eo.agree_boundary = false;  // every stage sizes its boundary from the same micro-batch shape (step_chunks)
  eo.mpi_tags = false;
  p.ex = std::make_unique<parallel::PipelineExecutor>(parallel::PipelineChannels{&act, &grad, act_wrap, grad_wrap},
                                                      spec, std::move(stages), *p.mem, eo);
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
  GpuModel::Impl& mi = st.impl();
  // Labelled targets `shift` tokens ahead within their document over the step's micro-batches, summed over the DP
  // group when there is one (a device all-reduce: the DP communicator works on device memory).
  auto step_targets = [&](int shift) {
    int64_t n = 0;
    for (int64_t m = 0; m < p.M; ++m)
      for (int32_t t : dsv4::shifted_targets(labels + m * n_mb, layout.doc_start.data(), layout.B, layout.T, shift, V))
        n += t >= 0;
    if (mi.dp_size == 1) return n;
    double h = double(n);
    DevMem d(sizeof(double));
    TREX_CUDA(cudaMemcpy(d.as<double>(), &h, sizeof(double), cudaMemcpyHostToDevice));
    mi.dp->all_reduce(d.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
    TREX_CUDA(cudaMemcpy(&h, d.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
    return int64_t(std::llround(h));
  };
  // The loss normaliser: labelled targets of the whole step (with a DP group: of every DP rank's micro-batches);
  // the MTP head's likewise (its targets are token t + 2 within t's document).
  const int64_t targets = step_targets(1);
  // The MTP module sits on this rank's last chunk (interleaved: the last virtual stage is the last rank's last chunk).
  const int64_t mtp_targets = p.ch.back()->impl().mtp() ? step_targets(2) : -1;
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
  // The gradients are reduced over DP in each chunk's last backward (every chunk runs its backwards in micro-batch
  // order, ending with M - 1); each forward sets its micro-batch's normaliser (begin_step before it: the head
  // reads it in the forward).
  for (GpuModel* c : p.ch) c->begin_step(micro[0].normaliser, micro[0].mtp_normaliser, step_micro_batches, p.M - 1);
  for (auto& st : p.stages) st->set_step(&micro, step_micro_batches);
  // The executor sizes the receive buffers from the stages' boundary, walks the schedule (receive, its host wait
  // and the stream wait after it, the slot's pending sends, compute, send), and times the compute on the device.
  const parallel::PipelineStepStats st = p.ex->run_step(false, nullptr, after_forward);
  for (auto& s : p.stages) s->set_step(nullptr, 0);
  p.acc.recv_wait_ms += st.wait_s * 1e3;
  ++p.acc.steps;
  return st.loss;  // the last virtual stage's CE share plus every chunk's balance terms (forward_stage)
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
  p.acc.fwd_ms += p.mem->drain(false);
  p.acc.bwd_ms += p.mem->drain(true);
  return p.acc;
}

void GpuPipeline::reset_stats() {
  stats();
  impl_->acc = PipelineStats{};
}

}  // namespace trex::dsv4gpu
