// GpuOptimizer (gpu_optimizer.h): the flat AdamW pass (sharded under ZeRO-1, each bucket's updated bf16 slice
// all-gathered as soon as it is written) and the run's Muon / AdamW step over a plan of the model's arena.
#include "train/cuda/gpu_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "comm/nccl_communicator.h"
#include "kernels/cuda/muon.h"
#include "model/cuda/gpu_impl.h"
#include "optim/param_groups.h"

namespace trex::dsv4gpu {

// Which tensors the run's optimiser updates how. One GPU, in arena order: AdamW segments (adjacent AdamW tensors
// with the same decay rule merged: the padding between them has zero w, g, m, v and stays zero) and the Muon
// matrices bucketed by shape into batches of at most kMuonBatchElems elements (the Newton-Schulz scratch).
// Data parallel (ZeRO-1), this rank's pieces of every tensor: AdamW runs (arena offset for g and the bf16 copy,
// shard offset for w, m, v) per region (the local experts or this replica's slice of them, region R, each
// bucket), the Muon elements it holds (momentum runs), the buckets whose Muon inputs are all-gathered, and the Muon
// matrices it holds a part of, with that part (lo, hi, shard offset). Frozen tensors appear nowhere.
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
    DevMem offsets;  // int64 [count], element offsets of the matrices (arena)
    DevMem ranges;   // data parallel: int64 [count, 3], this rank's part of each (cuda::muon_apply_ranges)
  };
  std::vector<MuonBatch> muon;
  int64_t muon_matrices = 0;
  cuda::MuonScratch scratch;
  // Data parallel.
  // arena: the offset of the bf16 copy (and, ZeRO-1, of the gradient); grad: the gradient's index in the
  // persistent gradient array (GpuModel::Impl::grad_index: the arena offset under ZeRO-1, the shard's under
  // ZeRO-2); shard: the master's and the moments'.
  struct Run {
    int64_t arena = 0, shard = 0, n = 0;
    bool decay = true;
    int64_t grad = 0;
  };
  std::vector<Run> local_adamw;                // region X and region R
  std::vector<std::vector<Run>> bucket_adamw;  // per bucket
  std::vector<char> bucket_trained;            // per bucket: any tensor not frozen (the same on every rank)
  std::vector<Run> momentum;                   // this rank's Muon elements
  std::vector<int> input_buckets;              // buckets holding Muon matrices (the same on every rank)
  // Region X (the local experts) when it is sharded over the expert-data-parallel replicas (the same on every
  // replica): any expert trained (its bf16 slice all-gathered after the update), any expert a Muon matrix (the
  // Newton-Schulz inputs all-gathered in fp32 first, as the buckets').
  bool experts_trained = false, muon_experts = false;
};

namespace {
// 512 MiB of fp32 X per batch (plus bf16 X, A, B: about 1 GiB of scratch): 16 of flash-l4's 2048 x 4096 expert
// matrices per batch run their Newton-Schulz at 569 TFLOP/s against 527 with 4 (MuonGpu.NewtonSchulzThroughput*).
constexpr int64_t kMuonBatchElems = int64_t(1) << 27;

// A Muon matrix (or a part of it) of the plan: arena offset, then the data-parallel part.
struct MuonEntry {
  int64_t offset = 0, lo = 0, hi = 0, shard = 0;
};

void add_muon_batches(OptPlan& plan, const std::map<std::pair<int64_t, int64_t>, std::vector<MuonEntry>>& by_shape,
                      bool with_ranges) {
  for (const auto& [shape, list] : by_shape) {
    const int64_t per = std::max<int64_t>(1, std::min<int64_t>(65535, kMuonBatchElems / (shape.first * shape.second)));
    for (size_t i = 0; i < list.size(); i += size_t(per)) {
      OptPlan::MuonBatch b;
      b.rows = shape.first, b.cols = shape.second;
      b.count = std::min<int64_t>(per, int64_t(list.size() - i));
      std::vector<int64_t> offs, ranges;
      for (int64_t k = 0; k < b.count; ++k) {
        const MuonEntry& e = list[i + size_t(k)];
        offs.push_back(e.offset);
        ranges.insert(ranges.end(), {e.lo, e.hi, e.shard});
      }
      b.offsets = DevMem(offs.size() * sizeof(int64_t));
      TREX_CUDA(cudaMemcpy(b.offsets.as<int64_t>(), offs.data(), offs.size() * sizeof(int64_t),
                           cudaMemcpyHostToDevice));
      if (with_ranges) {
        b.ranges = DevMem(ranges.size() * sizeof(int64_t));
        TREX_CUDA(cudaMemcpy(b.ranges.as<int64_t>(), ranges.data(), ranges.size() * sizeof(int64_t),
                             cudaMemcpyHostToDevice));
      }
      plan.muon_matrices += b.count;
      plan.muon.push_back(std::move(b));
    }
  }
}

// The group the run's optimiser gives p (frozen tensors excluded by the caller).
optim::ParamGroup trained_group(const GpuParam& p) {
  const optim::ParamGroup g = optim::dsv4_param_group(p.name, p.shape);
  TREX_CHECK(g == optim::ParamGroup::Muon || g == optim::ParamGroup::AdamW,
             "GPU optimizer: parameter '{}' is in group {} (the GPU arena holds trained tensors only)", p.name,
             optim::group_name(g));
  return g;
}

void check_muon_matrix(const GpuParam& p) {
  TREX_CHECK(p.shape.size() >= 2, "GPU optimizer: '{}' {} is in the Muon group but is not a matrix", p.name,
             shape_str(p.shape));
}

// One GPU: the arena's segments and matrices.
std::unique_ptr<OptPlan> one_gpu_plan(const GpuModel::Impl& m, const optim::OptimizerConfig& c,
                                      const std::set<std::string>& frozen) {
  auto plan = std::make_unique<OptPlan>();
  plan->kind = c.kind, plan->decay_vectors = c.adamw.decay_vectors;
  std::map<std::pair<int64_t, int64_t>, std::vector<MuonEntry>> by_shape;
  bool prev_adamw = false;
  int64_t end = 0;
  for (const GpuParam& p : m.params) {
    TREX_CHECK(p.offset >= end, "GPU optimizer: parameter '{}' is not in arena order", p.name);
    end = p.offset + p.numel;
    if (frozen.count(p.name)) {
      prev_adamw = false;
      continue;
    }
    const optim::ParamGroup g = trained_group(p);
    if (c.kind == "muon" && g == optim::ParamGroup::Muon) {
      check_muon_matrix(p);
      const int64_t rows = p.shape[p.shape.size() - 2], cols = p.shape.back();
      auto& list = by_shape[{rows, cols}];
      for (int64_t k = 0; k < p.numel / (rows * cols); ++k) list.push_back({p.offset + k * rows * cols});
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
  add_muon_batches(*plan, by_shape, false);
  return plan;
}

// Data parallel: this rank's pieces.
std::unique_ptr<OptPlan> sharded_plan(const GpuModel::Impl& m, const optim::OptimizerConfig& c,
                                      const std::set<std::string>& frozen) {
  auto plan = std::make_unique<OptPlan>();
  plan->kind = c.kind, plan->decay_vectors = c.adamw.decay_vectors;
  plan->bucket_adamw.resize(m.buckets.size());
  plan->bucket_trained.assign(m.buckets.size(), 0);
  std::vector<char> muon_bucket(m.buckets.size(), 0);
  auto bucket_of = [&](const GpuParam& p) {  // -1: region X or R
    if (p.offset < m.region_x || p.offset >= m.region_a) return -1;
    for (size_t b = 0; b < m.buckets.size(); ++b)
      if (p.offset >= m.buckets[b].begin && p.offset < m.buckets[b].end) return int(b);
    fail("GPU optimizer: parameter '{}' (arena offset {}) is in no bucket", p.name, p.offset);
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<MuonEntry>> by_shape;
  bool prev_adamw = false;
  int prev_region = -2;
  for (const GpuParam& p : m.params) {
    const int bucket = bucket_of(p);
    if (frozen.count(p.name)) {
      prev_adamw = false;
      continue;
    }
    if (bucket >= 0) plan->bucket_trained[size_t(bucket)] = 1;
    const optim::ParamGroup g = trained_group(p);
    const bool expert = p.offset < m.region_x;
    plan->experts_trained = plan->experts_trained || expert;
    plan->muon_experts = plan->muon_experts || (expert && c.kind == "muon" && g == optim::ParamGroup::Muon);
    const std::vector<GpuModel::Impl::ShardPiece> pieces = m.own_pieces(p);
    if (c.kind == "muon" && g == optim::ParamGroup::Muon) {
      check_muon_matrix(p);
      // The Newton-Schulz batches address the gradients by arena offset (a bucket's inputs all-gathered whole
      // into the arena): ZeRO-2 keeps no such arena beyond region X (the local experts).
      TREX_CHECK(expert || !m.zero2(), "GPU optimizer: Muon on '{}' under parallel.zero 2 needs whole-matrix "
                 "gradients, which ZeRO-2 does not keep (not implemented); use zero 1 or optimizer.kind adamw",
                 p.name);
      const int64_t rows = p.shape[p.shape.size() - 2], cols = p.shape.back(), rc = rows * cols;
      if (bucket >= 0) muon_bucket[size_t(bucket)] = 1;
      for (const auto& w : pieces) {
        OptPlan::Run r{p.offset + w.t, w.s, w.n, true, m.grad_index(p.offset + w.t)};
        if (!plan->momentum.empty()) {  // contiguous in the arena, the gradients and the shard: one run
          OptPlan::Run& last = plan->momentum.back();
          if (last.arena + last.n == r.arena && last.shard + last.n == r.shard && last.grad + last.n == r.grad) {
            last.n += r.n;
            r.n = 0;
          }
        }
        if (r.n > 0) plan->momentum.push_back(r);
        // Every matrix this piece touches, with the part of it held here.
        for (int64_t k = w.t / rc; k * rc < w.t + w.n; ++k) {
          const int64_t a = std::max(w.t, k * rc), e = std::min(w.t + w.n, (k + 1) * rc);
          by_shape[{rows, cols}].push_back({p.offset + k * rc, a - k * rc, e - k * rc, w.s + (a - w.t)});
        }
      }
      prev_adamw = false;
      continue;
    }
    const bool decay = c.adamw.decay_vectors || p.shape.size() >= 2;
    std::vector<OptPlan::Run>& runs = bucket >= 0 ? plan->bucket_adamw[size_t(bucket)] : plan->local_adamw;
    for (const auto& w : pieces) {
      const OptPlan::Run r{p.offset + w.t, w.s, w.n, decay, m.grad_index(p.offset + w.t)};
      // Merged with the previous AdamW tensor's run across the padding between them when that padding lies in
      // this rank's part of the same region (the same gap in the arena and in the shard).
      if (prev_adamw && prev_region == bucket && !runs.empty()) {
        OptPlan::Run& last = runs.back();
        const int64_t gap = r.arena - (last.arena + last.n);
        if (last.decay == decay && gap >= 0 && r.shard - (last.shard + last.n) == gap &&
            r.grad - (last.grad + last.n) == gap) {
          last.n = r.arena + r.n - last.arena;
          continue;
        }
      }
      runs.push_back(r);
    }
    prev_adamw = true;
    prev_region = bucket;
  }
  for (size_t b = 0; b < m.buckets.size(); ++b)
    if (muon_bucket[b]) plan->input_buckets.push_back(int(b));
  add_muon_batches(*plan, by_shape, true);
  return plan;
}

cuda::AdamWStep without_decay(cuda::AdamWStep a, bool decay) {
  if (!decay) a.weight_decay = 0.0;  // shrink 1, as the CPU's decay = false
  return a;
}
}  // namespace

struct GpuOptimizer::Impl {
  DevMem m, v;  // fp32, the master's (shard) layout
  std::unique_ptr<OptPlan> plan;  // built on the first step(), rebuilt when the kind, decay rule or frozen set changes
  std::set<std::string> frozen;
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

void GpuOptimizer::set_frozen(const std::vector<std::string>& names) {
  const GpuModel::Impl& m = model_.impl();
  for (const std::string& n : names) (void)m.info(n);  // an unknown name is an error naming it
  impl_->frozen = std::set<std::string>(names.begin(), names.end());
  impl_->plan.reset();
}

void GpuOptimizer::zero_frozen_grads() {
  if (impl_->frozen.empty()) return;
  GpuModel::Impl& m = model_.impl();
  m.wait_grad_work();  // a reduction still writing them would undo the zeroing
  for (const std::string& n : impl_->frozen) {
    const GpuParam& p = m.info(n);
    if (!m.zero2() || p.offset < m.region_x || p.offset >= m.region_a) {  // held whole
      TREX_CUDA(cudaMemsetAsync(m.grads.as<float>() + m.grad_index(p.offset), 0, size_t(p.numel) * 4, nullptr));
      continue;
    }
    for (const auto& w : m.own_pieces(p))  // ZeRO-2: this rank's slice of it
      TREX_CUDA(cudaMemsetAsync(m.grads.as<float>() + m.grad_index(p.offset + w.t), 0, size_t(w.n) * 4, nullptr));
  }
}

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
  cuda::adamw_step(m.master.as<float>() + m.shard_a, g + m.grad_index(m.region_a), adam_m.as<float>() + m.shard_a,
                   adam_v.as<float>() + m.shard_a, m.weight_at(m.region_a), nr, a);
  m.gather_work.clear();
  m.gather_work.resize(m.buckets.size());
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    const GpuModel::Impl::Bucket& b = m.buckets[bi];
    const int64_t n = b.slice(m.dp_size), own = b.begin + m.dp_rank * n;
    if (n == 0) continue;  // another pipeline stage's bucket (empty here)
    cuda::adamw_step(m.master.as<float>() + b.shard_off, g + m.grad_index(own), adam_m.as<float>() + b.shard_off,
                     adam_v.as<float>() + b.shard_off, m.weight_at(own), n, a);
    // ZeRO-3 keeps the slice: the next forward gathers each bucket ahead of use (model/cuda/weight_gather.h).
    if (!m.zero3()) m.gather_work[bi] = m.dp->all_gather(c + own, c + b.begin, size_t(n), comm::ElemType::BF16);
  }
  m.weights_changed();
  if (expert_gather) m.stream_wait(*expert_gather);
  m.section("optimizer", false);
}

void GpuOptimizer::step(const optim::OptimizerConfig& c, double lr, int64_t step, float grad_scale) {
  GpuModel::Impl& m = model_.impl();
  TREX_CHECK(c.kind == "muon" || c.kind == "adamw", "GPU optimizer: kind '{}' (expected muon or adamw)", c.kind);
  TREX_CHECK(step >= 1, "GPU optimizer: step {} must be >= 1", step);
  // Newton-Schulz orthogonalises a matrix whole; a tensor-parallel rank holds slices of the split ones.
  TREX_CHECK(c.kind != "muon" || model_.tp_size() == 1,
             "GPU optimizer: Muon under tensor parallelism ({} TP ranks) is not implemented (the split attention / "
             "shared-expert matrices would be orthogonalised slice by slice); use adamw", model_.tp_size());
  cuda::AdamWStep a;
  a.lr = lr, a.beta1 = c.adamw.beta1, a.beta2 = c.adamw.beta2, a.eps = c.adamw.eps;
  a.weight_decay = c.adamw.weight_decay, a.step = step, a.grad_scale = grad_scale;
  if (c.kind == "adamw" && c.adamw.decay_vectors && impl_->frozen.empty()) {  // one rule: the flat pass
    adamw_step(a);
    return;
  }
  if (!impl_->plan || impl_->plan->kind != c.kind || impl_->plan->decay_vectors != c.adamw.decay_vectors)
    impl_->plan = m.dp_size == 1 ? one_gpu_plan(m, c, impl_->frozen) : sharded_plan(m, c, impl_->frozen);
  OptPlan& plan = *impl_->plan;
  cuda::MuonStep ms;
  ms.lr = lr * c.muon_lr_scale, ms.momentum = c.muon.momentum, ms.nesterov = c.muon.nesterov;
  ms.ns_fast_steps = c.muon.ns_fast_steps, ms.ns_final_steps = c.muon.ns_final_steps;
  ms.update_rms = c.muon.update_rms, ms.weight_decay = c.muon.weight_decay, ms.grad_scale = grad_scale;
  m.section("optimizer", true);
  float *w = m.master.as<float>(), *g = m.grads.as<float>(), *mom = impl_->m.as<float>(), *v = impl_->v.as<float>();
  bf16* wb = m.compute.as<bf16>();
  if (m.dp_size == 1) {
    for (const auto& s : plan.adamw)
      cuda::adamw_step(w + s.offset, g + s.offset, mom + s.offset, v + s.offset, wb + s.offset, s.n,
                       without_decay(a, s.decay));
    // Muon's momentum lives in the AdamW first-moment arena (same offsets); its second moment is unused.
    for (const auto& b : plan.muon)
      cuda::muon_step_batched(m.gemm, plan.scratch, b.offsets.as<int64_t>(), b.count, b.rows, b.cols, w, g, mom, wb,
                              ms);
    m.section("optimizer", false);
    return;
  }
  // Data parallel: the reduced gradients (and the local experts' over their replicas) first.
  m.reduce_expert_grads();
  m.wait_grad_work();
  // Muon: the momentum of the elements held here, their Newton-Schulz inputs left in the gradient arena; the
  // buckets' inputs all-gathered (each rank holds a slice), so every matrix this rank holds a part of is whole
  // here; orthogonalised, and the own part of it updated.
  for (const auto& r : plan.momentum) cuda::muon_momentum_range(g + r.grad, mom + r.shard, r.n, ms);
  for (int bi : plan.input_buckets) {
    const GpuModel::Impl::Bucket& b = m.buckets[size_t(bi)];
    const int64_t n = b.slice(m.dp_size), own = b.begin + m.dp_rank * n;
    auto work = m.dp->all_gather(g + own, g + b.begin, size_t(n), comm::ElemType::F32);
    m.stream_wait(*work);
  }
  if (plan.muon_experts && m.experts_sharded()) {  // the local experts' inputs, sliced over their replicas
    auto work = m.edp->all_gather(g + m.x_own, g, size_t(m.x_shard), comm::ElemType::F32);
    m.stream_wait(*work);
  }
  for (const auto& b : plan.muon) {
    cuda::muon_orthogonalise_batched(m.gemm, plan.scratch, b.offsets.as<int64_t>(), b.count, b.rows, b.cols, g, ms);
    cuda::muon_apply_ranges(plan.scratch, b.offsets.as<int64_t>(), b.ranges.as<int64_t>(), b.count, b.rows, b.cols, w,
                            wb, ms);
  }
  // AdamW: region X and R, then each bucket's runs with the all-gather of its updated bf16 slice.
  for (const auto& r : plan.local_adamw)
    cuda::adamw_step(w + r.shard, g + r.grad, mom + r.shard, v + r.shard, m.weight_at(r.arena), r.n,
                     without_decay(a, r.decay));
  comm::WorkPtr expert_gather;  // the updated bf16 slice of the local experts, over their replicas
  if (plan.experts_trained && m.experts_sharded())
    expert_gather = m.edp->all_gather(wb + m.x_own, wb, size_t(m.x_shard), comm::ElemType::BF16);
  m.gather_work.clear();
  m.gather_work.resize(m.buckets.size());
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    for (const auto& r : plan.bucket_adamw[bi])
      cuda::adamw_step(w + r.shard, g + r.grad, mom + r.shard, v + r.shard, m.weight_at(r.arena), r.n,
                       without_decay(a, r.decay));
    if (!plan.bucket_trained[bi] || m.zero3()) continue;  // all frozen / ZeRO-3: gathered ahead of the next use
    const GpuModel::Impl::Bucket& b = m.buckets[bi];
    const int64_t n = b.slice(m.dp_size), own = b.begin + m.dp_rank * n;
    m.gather_work[bi] = m.dp->all_gather(wb + own, wb + b.begin, size_t(n), comm::ElemType::BF16);
  }
  m.weights_changed();
  if (expert_gather) m.stream_wait(*expert_gather);
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
