// GpuOptimizer (gpu_optimizer.h): the flat AdamW pass (sharded under ZeRO-1, each bucket's updated bf16 slice
// all-gathered as soon as it is written) and the run's Muon / AdamW step over a plan of the model's arena.
#include "train/cuda/gpu_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "comm/nccl_communicator.h"
#include "kernels/cuda/muon.h"
#include "model/cuda/gpu_impl.h"
#include "optim/param_groups.h"

namespace trex::dsv4gpu {

// Which tensors the run's optimiser updates how, in arena order: AdamW segments (adjacent AdamW tensors with the
// same decay rule merged: the padding between them has zero w, g, m, v and stays zero) and the Muon matrices
// bucketed by shape into batches of at most kMuonBatchElems elements (the Newton-Schulz scratch).
struct OptPlan {
  std::string kind;
  bool decay_vectors = true;
  struct Segment {
    int64_t offset = 0, n = 0;
    bool decay = true;
  };
  std::vector<Segment> adamw;
  struct MuonBatch {
    int64_t rows = 0, cols = 0, count = 0;
    DevMem offsets;  // int64 [count], element offsets of the matrices
  };
  std::vector<MuonBatch> muon;
  int64_t muon_matrices = 0;
  cuda::MuonScratch scratch;
};

namespace {
// 512 MiB of fp32 X per batch (plus bf16 X, A, B: about 1 GiB of scratch): 16 of flash-l4's 2048 x 4096 expert
// matrices per batch run their Newton-Schulz at 569 TFLOP/s against 527 with 4 (MuonGpu.NewtonSchulzThroughput*).
constexpr int64_t kMuonBatchElems = int64_t(1) << 27;
}

struct GpuOptimizer::Impl {
  DevMem m, v;  // fp32, the master's (shard) layout
  std::unique_ptr<OptPlan> plan;  // built on the first step(), rebuilt when the kind or decay rule changes
};

GpuOptimizer::GpuOptimizer(GpuModel& model) : model_(model), impl_(std::make_unique<Impl>()) {
  GpuModel::Impl& m = model_.impl();
  m.require_gradients("an optimiser");
  const size_t ns = size_t(m.shard_elems());
  impl_->m = DevMem(ns * 4), impl_->v = DevMem(ns * 4);
  TREX_CUDA(cudaMemsetAsync(impl_->m.as<float>(), 0, ns * 4, nullptr));
  TREX_CUDA(cudaMemsetAsync(impl_->v.as<float>(), 0, ns * 4, nullptr));
}

GpuOptimizer::~GpuOptimizer() = default;

void GpuOptimizer::adamw_step(const cuda::AdamWStep& a_in) {
  GpuModel::Impl& m = model_.impl();
  DevMem &adam_m = impl_->m, &adam_v = impl_->v;
  m.section("optimizer", true);
  // The gradients stay (zero_grads() clears them): folding the zeroing into this pass (AdamWStep::zero_grad) saves
  // nothing, since zero_grads()'s memset is a pure 4 B/param write, the same bytes the fold writes, and the fold
  // is not faster (MuonGpu.AdamWZeroGradFoldIsExactAndTimed times both).
  const cuda::AdamWStep& a = a_in;
  if (m.dp_size == 1) {
    cuda::adamw_step(m.master.as<float>(), m.grads.as<float>(), adam_m.as<float>(), adam_v.as<float>(),
                     m.compute.as<bf16>(), m.total, a);
    m.section("optimizer", false);
    return;
  }
  // Gradients: every bucket's reduce-scatter, the region-R all-reduce and (expert parallel with replicas) the
  // region-X reduce-scatter must have landed.
  m.reduce_expert_grads();
  m.wait_grad_work();
  float* g = m.grads.as<float>();
  bf16* c = m.compute.as<bf16>();
  // Region X (expert parallel): this rank's slice of its experts (all of them without replicas); with replicas
  // the updated bf16 slice is all-gathered over them, which the compute stream waits for at the end.
  comm::WorkPtr expert_gather;
  if (m.x_shard > 0) {
    cuda::adamw_step(m.master.as<float>(), g + m.x_own, adam_m.as<float>(), adam_v.as<float>(), c + m.x_own, m.x_shard,
                     a);
    if (m.experts_sharded())
      expert_gather = m.edp->all_gather(c + m.x_own, c, size_t(m.x_shard), comm::ElemType::BF16);
  }
  // Region R first (replicated, read in fp32 by the next forward), then each bucket's own slice, whose
  // all-gather starts right away so it overlaps the remaining updates and the next forward's first layers.
  const int64_t nr = m.total - m.region_a;
  cuda::adamw_step(m.master.as<float>() + m.shard_a, g + m.region_a, adam_m.as<float>() + m.shard_a,
                   adam_v.as<float>() + m.shard_a, c + m.region_a, nr, a);
  m.gather_work.clear();
  m.gather_work.resize(m.buckets.size());
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    const GpuModel::Impl::Bucket& b = m.buckets[bi];
    const int64_t n = b.slice(m.dp_size), own = b.begin + m.dp_rank * n;
    cuda::adamw_step(m.master.as<float>() + b.shard_off, g + own, adam_m.as<float>() + b.shard_off,
                     adam_v.as<float>() + b.shard_off, c + own, n, a);
    m.gather_work[bi] = m.dp->all_gather(c + own, c + b.begin, size_t(n), comm::ElemType::BF16);
  }
  if (expert_gather) m.stream_wait(*expert_gather);
  m.section("optimizer", false);
}

void GpuOptimizer::step(const optim::OptimizerConfig& c, double lr, int64_t step, float grad_scale) {
  GpuModel::Impl& m = model_.impl();
  TREX_CHECK(c.kind == "muon" || c.kind == "adamw", "GPU optimizer: kind '{}' (expected muon or adamw)", c.kind);
  TREX_CHECK(step >= 1, "GPU optimizer: step {} must be >= 1", step);
  cuda::AdamWStep a;
  a.lr = lr, a.beta1 = c.adamw.beta1, a.beta2 = c.adamw.beta2, a.eps = c.adamw.eps;
  a.weight_decay = c.adamw.weight_decay, a.step = step, a.grad_scale = grad_scale;
  if (c.kind == "adamw" && c.adamw.decay_vectors) {  // one decay rule: the flat pass (sharded under DP)
    adamw_step(a);
    return;
  }
  TREX_CHECK(m.dp_size == 1,
             "GPU model rank {}: optimizer kind '{}'{} is not implemented under data parallelism ({} ranks, ZeRO-1): "
             "a rank's optimiser shard is a flat slice of the arena, while Muon orthogonalises whole matrices; use "
             "optimizer kind adamw with decay_vectors true, or one GPU",
             m.dp_rank, c.kind, c.kind == "adamw" ? " with decay_vectors false" : "", m.dp_size);
  if (!impl_->plan || impl_->plan->kind != c.kind || impl_->plan->decay_vectors != c.adamw.decay_vectors) {
    auto plan = std::make_unique<OptPlan>();
    plan->kind = c.kind, plan->decay_vectors = c.adamw.decay_vectors;
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> by_shape;
    bool prev_adamw = false;
    int64_t end = 0;
    for (const GpuParam& p : m.params) {
      TREX_CHECK(p.offset >= end, "GPU optimizer: parameter '{}' is not in arena order", p.name);
      end = p.offset + p.numel;
      const optim::ParamGroup g = optim::dsv4_param_group(p.name, p.shape);
      TREX_CHECK(g == optim::ParamGroup::Muon || g == optim::ParamGroup::AdamW,
                 "GPU optimizer: parameter '{}' is in group {} (the GPU arena holds trained tensors only)", p.name,
                 optim::group_name(g));
      if (c.kind == "muon" && g == optim::ParamGroup::Muon) {
        TREX_CHECK(p.shape.size() >= 2, "GPU optimizer: '{}' {} is in the Muon group but is not a matrix", p.name,
                   shape_str(p.shape));
        const int64_t rows = p.shape[p.shape.size() - 2], cols = p.shape.back();
        auto& list = by_shape[{rows, cols}];
        for (int64_t k = 0; k < p.numel / (rows * cols); ++k) list.push_back(p.offset + k * rows * cols);
        prev_adamw = false;
        continue;
      }
      const bool decay = c.adamw.decay_vectors || p.shape.size() >= 2;
      if (prev_adamw && plan->adamw.back().decay == decay)
        plan->adamw.back().n = end - plan->adamw.back().offset;
      else
        plan->adamw.push_back({p.offset, p.numel, decay});
      prev_adamw = true;
    }
    for (const auto& [shape, offs] : by_shape) {
      const int64_t per = std::max<int64_t>(1, std::min<int64_t>(65535, kMuonBatchElems / (shape.first * shape.second)));
      for (size_t i = 0; i < offs.size(); i += size_t(per)) {
        OptPlan::MuonBatch b;
        b.rows = shape.first, b.cols = shape.second;
        b.count = std::min<int64_t>(per, int64_t(offs.size() - i));
        b.offsets = DevMem(size_t(b.count) * sizeof(int64_t));
        TREX_CUDA(cudaMemcpy(b.offsets.as<int64_t>(), offs.data() + i, size_t(b.count) * sizeof(int64_t),
                             cudaMemcpyHostToDevice));
        plan->muon_matrices += b.count;
        plan->muon.push_back(std::move(b));
      }
    }
    impl_->plan = std::move(plan);
  }
  OptPlan& plan = *impl_->plan;
  m.section("optimizer", true);
  float *w = m.master.as<float>(), *g = m.grads.as<float>(), *mom = impl_->m.as<float>(), *v = impl_->v.as<float>();
  bf16* wb = m.compute.as<bf16>();
  for (const auto& s : plan.adamw) {
    cuda::AdamWStep sa = a;
    if (!s.decay) sa.weight_decay = 0.0;  // shrink 1, as the CPU's decay = false
    cuda::adamw_step(w + s.offset, g + s.offset, mom + s.offset, v + s.offset, wb + s.offset, s.n, sa);
  }
  cuda::MuonStep ms;
  ms.lr = lr * c.muon_lr_scale, ms.momentum = c.muon.momentum, ms.nesterov = c.muon.nesterov;
  ms.ns_fast_steps = c.muon.ns_fast_steps, ms.ns_final_steps = c.muon.ns_final_steps;
  ms.update_rms = c.muon.update_rms, ms.weight_decay = c.muon.weight_decay, ms.grad_scale = grad_scale;
  // Muon's momentum lives in the AdamW first-moment arena (same offsets); its second moment is unused.
  for (const auto& b : plan.muon)
    cuda::muon_step_batched(m.gemm, plan.scratch, b.offsets.as<int64_t>(), b.count, b.rows, b.cols, w, g, mom, wb,
                            ms);
  m.section("optimizer", false);
}

namespace {
void check_state_access(const GpuModel::Impl& m, const GpuParam& p, int which, size_t n, const char* what) {
  TREX_CHECK(m.dp_size == 1, "GPU optimizer: {} needs the whole model on one GPU (data-parallel size {})", what,
             m.dp_size);
  TREX_CHECK(which == 0 || which == 1, "GPU optimizer {}: which {} (0 or 1)", what, which);
  TREX_CHECK(int64_t(n) == p.numel, "GPU optimizer {}: '{}' has {} elements, got {}", what, p.name, p.numel, n);
}
}  // namespace

std::vector<float> GpuOptimizer::state(const std::string& name, int which) const {
  const GpuModel::Impl& m = model_.impl();
  const GpuParam& p = m.info(name);
  check_state_access(m, p, which, size_t(p.numel), "state");
  std::vector<float> v(size_t(p.numel));
  const float* src = (which == 0 ? impl_->m : impl_->v).as<float>() + p.offset;
  TREX_CUDA(cudaMemcpy(v.data(), src, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

void GpuOptimizer::set_state(const std::string& name, int which, const std::vector<float>& v) {
  const GpuModel::Impl& m = model_.impl();
  const GpuParam& p = m.info(name);
  check_state_access(m, p, which, v.size(), "set_state");
  float* dst = (which == 0 ? impl_->m : impl_->v).as<float>() + p.offset;
  TREX_CUDA(cudaMemcpy(dst, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
}

int64_t GpuOptimizer::state_bytes() const { return int64_t(impl_->m.bytes() + impl_->v.bytes()); }

float* GpuOptimizer::moment(int which) {
  TREX_CHECK(which == 0 || which == 1, "GPU optimizer moment: which {} (0 or 1)", which);
  return (which == 0 ? impl_->m : impl_->v).as<float>();
}

}  // namespace trex::dsv4gpu
