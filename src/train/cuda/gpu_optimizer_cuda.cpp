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
#include "model/cuda/grad_buckets.h"
#include "optim/param_groups.h"

namespace trex::dsv4gpu {

// Which tensors the run's optimiser updates how. One GPU, in arena order: AdamW segments (adjacent AdamW tensors
// with the same decay rule merged: the padding between them has zero w, g, m, v and stays zero) and the Muon
// matrices bucketed by shape into batches of at most kMuonBatchElems elements (the Newton-Schulz scratch).
// Data parallel (ZeRO-1), this rank's pieces of every tensor: AdamW runs (arena offset for g and the bf16 copy,
// shard offset for w, m, v) per region (the local experts or this replica's slice of them, region R, each
// bucket), the Muon elements it holds (momentum runs), the buckets whose Muon inputs are all-gathered, and the Muon
// matrices it holds a part of, with that part (lo, hi, shard offset). Frozen tensors appear nowhere. ZeRO-1
// gathers a bucket's inputs into the gradient arena itself; ZeRO-2 (and ZeRO-3, whose gradients are ZeRO-2's)
// keeps only the rank's slices, so each bucket's are gathered into a transient fp32 buffer of the bucket
// (GpuOptimizer::step) and its matrices are batched on their own, addressed from the bucket's start. Where the
// updated bf16 element lands is planned apart from where its input is read (MuonBatch::wb_offsets): the arena
// under ZeRO-1 / 2, the rank's own slices under ZeRO-3 (GpuModel::Impl::weight_at).
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
    // ZeRO-2: the bucket whose transient gathered inputs the batch reads, its offsets from the bucket's begin; -1:
    // arena offsets (one GPU, ZeRO-1, and the local experts of region X, whose gradients stay whole and first in
    // grad_index's layout); kRegionR: ZeRO-2's region R, offsets from region_a (its gradients sit after the
    // bucket slices in grad_index's layout, its bf16 weights at their arena offsets).
    int bucket = -1;
    DevMem offsets;  // int64 [count], element offsets of the matrices (arena, or from the bucket's begin)
    DevMem ranges;   // data parallel: int64 [count, 3], this rank's part of each (cuda::muon_apply_ranges)
    // Data parallel: int64 [count], where each matrix's bf16 copy lies in `compute` less the element's index in
    // the matrix (element i of this rank's part at wb_offsets + i; may be negative under ZeRO-3, where `compute`
    // holds only the rank's slice of the bucket and a matrix can start before it).
    DevMem wb_offsets;
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
  // Tensor parallel: the Muon matrices split over the TP ranks (GpuParam::tp_axis), orthogonalised whole. Each
  // TP rank's slice of a matrix's Newton-Schulz input (in g after the momentum, and after the DP all-gather of
  // its bucket) is all-gathered over TP in rank order, laid out as the official matrix (a row split is that
  // order already; a column split is re-strided), the whole matrices of one shape orthogonalised as a batch, and
  // this rank's slice of the result (its DP piece of it) applied. Every TP rank runs the same Newton-Schulz on
  // the same bits, so the slices of one matrix are updated consistently.
  struct TpMatrix {
    int64_t grad = 0, nl = 0;  // this rank's slice: its Newton-Schulz input's index (TpBatch::bucket), elements
    int axis = 0;              // 0: rows split (the slice is one block of the matrix), 1: columns split
  };
  struct TpBatch {
    int64_t rows = 0, cols = 0;  // the official matrix
    // ZeRO-2 / 3: the bucket whose transient gathered inputs the batch reads (TpMatrix::grad then counts from the
    // bucket's begin); -1: the gradient array (one GPU per TP rank, ZeRO-1).
    int bucket = -1;
    std::vector<TpMatrix> mats;
    DevMem in_offsets;     // int64 [count]: k rows cols (the gathered whole matrices, tp_whole)
    DevMem apply_offsets;  // int64 [count]: the slice's bf16 index in `compute` - tp_rank nl (muon_apply_ranges's)
    DevMem ranges;         // int64 [count, 3]: this rank's elements of the matrix with its slice made contiguous
  };
  std::vector<TpBatch> tp_muon;
  std::vector<Run> tp_momentum;  // one GPU per TP rank (dp 1): the split matrices' momentum (arena = shard)
  DevMem tp_whole, tp_stack;     // one batch's gathered matrices (fp32), and the column splits' staging
};

namespace {
// 512 MiB of fp32 X per batch (plus bf16 X, A, B: about 1 GiB of scratch): 16 of flash-l4's 2048 x 4096 expert
// matrices per batch run their Newton-Schulz at 569 TFLOP/s against 527 with 4 (MuonGpu.NewtonSchulzThroughput*).
constexpr int64_t kMuonBatchElems = int64_t(1) << 27;

// A Muon matrix (or a part of it) of the plan: arena offset, then the data-parallel part.
struct MuonEntry {
  int64_t offset = 0, lo = 0, hi = 0, shard = 0, wb = 0;  // wb: MuonBatch::wb_offsets
};

using MuonByShape = std::map<std::pair<int64_t, int64_t>, std::vector<MuonEntry>>;

constexpr int kRegionR = -2;

DevMem upload_i64(const std::vector<int64_t>& v) {
  DevMem d(v.size() * sizeof(int64_t));
  TREX_CUDA(cudaMemcpy(d.as<int64_t>(), v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  return d;
}

// The index in `compute` of the bf16 copy of the arena element `arena` (a piece this rank holds), less `within`:
// the bf16 offset muon_apply_ranges adds an element's index in its matrix to.
int64_t bf16_base(const GpuModel::Impl& m, int64_t arena, int64_t within) {
  return int64_t(m.weight_at(arena) - m.compute.as<bf16>()) - within;
}

void add_muon_batches(OptPlan& plan, const MuonByShape& by_shape, bool with_ranges, int bucket = -1) {
  for (const auto& [shape, list] : by_shape) {
    const int64_t per = std::max<int64_t>(1, std::min<int64_t>(65535, kMuonBatchElems / (shape.first * shape.second)));
    for (size_t i = 0; i < list.size(); i += size_t(per)) {
      OptPlan::MuonBatch b;
      b.rows = shape.first, b.cols = shape.second, b.bucket = bucket;
      b.count = std::min<int64_t>(per, int64_t(list.size() - i));
      std::vector<int64_t> offs, ranges, wbs;
      for (int64_t k = 0; k < b.count; ++k) {
        const MuonEntry& e = list[i + size_t(k)];
        offs.push_back(e.offset);
        ranges.insert(ranges.end(), {e.lo, e.hi, e.shard});
        wbs.push_back(e.wb);
      }
      b.offsets = upload_i64(offs);
      if (with_ranges) b.ranges = upload_i64(ranges), b.wb_offsets = upload_i64(wbs);
      plan.muon_matrices += b.count;
      plan.muon.push_back(std::move(b));
    }
  }
}

// Tensor parallel: the TP batches hold fewer elements than kMuonBatchElems, since each needs the gathered whole
// matrices (and the column splits' staging) beside the Newton-Schulz scratch.
constexpr int64_t kTpMuonBatchElems = int64_t(1) << 25;

// A TP-split Muon matrix of the plan: the official shape, and the part of it this rank updates.
struct TpEntry {
  OptPlan::TpMatrix mat;
  int64_t rows = 0, cols = 0;
  int64_t apply_offset = 0, lo = 0, hi = 0, shard = 0;
};

bool tp_split_matrix(const GpuParam& p) { return p.tp_axis >= 0; }

// A TP-split Muon matrix p (2-D: dsv4::tp_split_axis splits wq_b / wo_a / shared w1, w3 by rows, wo_b / shared w2
// by columns); piece: the part of this rank's slice it updates (t, s, n as GpuModel::Impl::ShardPiece); input:
// where its slice's Newton-Schulz input starts (TpMatrix::grad).
TpEntry tp_entry(const GpuModel::Impl& m, const GpuParam& p, int64_t t, int64_t s, int64_t n, int64_t input) {
  TREX_CHECK(p.full.size() == 2 && (p.tp_axis == 0 || p.tp_axis == 1),
             "GPU optimizer: Muon under tensor parallelism orthogonalises 2-D matrices; '{}' is {} split on axis {}",
             p.name, shape_str(p.full), p.tp_axis);
  TpEntry e;
  e.rows = p.full[0], e.cols = p.full[1];
  e.mat.grad = input, e.mat.nl = p.numel, e.mat.axis = p.tp_axis;
  // The slice made contiguous: rank r's block at [r nl, (r + 1) nl) of the matrix's buffer (after the column
  // split's re-striding of the result, step_tp_muon), so this rank's element i of its slice is r nl + i.
  const int64_t base = int64_t(m.tp_rank) * p.numel;
  e.lo = base + t, e.hi = base + t + n, e.shard = s;
  e.apply_offset = bf16_base(m, p.offset + t, e.lo);
  return e;
}

using TpByShape = std::map<std::pair<int64_t, int64_t>, std::vector<TpEntry>>;

// The batches of one key (TpBatch::bucket); returns the largest batch's elements (the staging it needs).
size_t add_tp_batches(OptPlan& plan, const TpByShape& by_shape, int bucket) {
  size_t whole = 0;
  for (const auto& [shape, list] : by_shape) {
    const int64_t n = shape.first * shape.second;
    const int64_t per = std::max<int64_t>(1, std::min<int64_t>(65535, kTpMuonBatchElems / n));
    for (size_t i = 0; i < list.size(); i += size_t(per)) {
      OptPlan::TpBatch b;
      b.rows = shape.first, b.cols = shape.second, b.bucket = bucket;
      const int64_t count = std::min<int64_t>(per, int64_t(list.size() - i));
      std::vector<int64_t> in, apply, ranges;
      for (int64_t k = 0; k < count; ++k) {
        const TpEntry& e = list[i + size_t(k)];
        b.mats.push_back(e.mat);
        in.push_back(k * n);
        apply.push_back(e.apply_offset);
        ranges.insert(ranges.end(), {e.lo, e.hi, e.shard});
      }
      b.in_offsets = upload_i64(in), b.apply_offsets = upload_i64(apply), b.ranges = upload_i64(ranges);
      whole = std::max(whole, size_t(count * n));
      plan.muon_matrices += count;
      plan.tp_muon.push_back(std::move(b));
    }
  }
  return whole;
}

// The gathered matrices' buffers, shared by every TP batch (one runs at a time).
void alloc_tp_staging(OptPlan& plan, size_t whole) {
  if (whole == 0) return;
  // Zeroed once: an emulated TP group (comm/emulated_group.h) writes only its own rank's block of a gather.
  plan.tp_whole = DevMem(whole * sizeof(float)), plan.tp_stack = DevMem(whole * sizeof(float));
  TREX_CUDA(cudaMemset(plan.tp_whole.as<float>(), 0, plan.tp_whole.bytes()));
  TREX_CUDA(cudaMemset(plan.tp_stack.as<float>(), 0, plan.tp_stack.bytes()));
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
  TpByShape tp_by_shape;
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
      if (tp_split_matrix(p)) {  // this TP rank's slice: the momentum here, the Newton-Schulz on the whole
        plan->tp_momentum.push_back({p.offset, p.offset, p.numel, true, p.offset});
        tp_by_shape[{p.full[0], p.full[1]}].push_back(tp_entry(m, p, 0, p.offset, p.numel, p.offset));
        prev_adamw = false;
        continue;
      }
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
  alloc_tp_staging(*plan, add_tp_batches(*plan, tp_by_shape, -1));
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
  // Keyed by the batch's bucket: -1 (arena offsets) except a bucket's matrices under ZeRO-2 / 3.
  std::map<int, MuonByShape> by_bucket;
  std::map<int, TpByShape> tp_by_bucket;
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
      // ZeRO-2 / 3: the bucket's matrices read its transient gathered inputs, from the bucket's begin.
      const int key = !m.zero2() ? -1 : bucket >= 0 ? bucket : p.offset >= m.region_a ? kRegionR : -1;
      const int64_t base = key >= 0 ? m.buckets[size_t(bucket)].begin : key == kRegionR ? m.region_a : 0;
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
        if (tp_split_matrix(p)) {
          // The TP ranks of this DP rank hold the same pieces (the same arena layout, the same DP rank), so they
          // gather the same matrices; a bucket's slice meets a tensor in one piece. ZeRO-2 / 3: the slice's
          // inputs are whole only in its bucket's transient gather (the DP gather first, then the TP one).
          TREX_CHECK(pieces.size() == 1, "GPU optimizer: TP-split Muon matrix '{}' in {} pieces on DP rank {}",
                     p.name, pieces.size(), m.dp_rank);
          TREX_CHECK(!m.zero2() || key >= 0,
                     "GPU optimizer: TP-split Muon matrix '{}' (arena offset {}) is in no bucket under ZeRO-{} (the "
                     "TP gather reads a bucket's gathered inputs)",
                     p.name, p.offset, m.zero);
          const int64_t input = key >= 0 ? p.offset - base : m.grad_index(p.offset);
          tp_by_bucket[key][{p.full[0], p.full[1]}].push_back(tp_entry(m, p, w.t, w.s, w.n, input));
          continue;
        }
        // Every matrix this piece touches, with the part of it held here.
        for (int64_t k = w.t / rc; k * rc < w.t + w.n; ++k) {
          const int64_t a = std::max(w.t, k * rc), e = std::min(w.t + w.n, (k + 1) * rc);
          by_bucket[key][{rows, cols}].push_back({p.offset + k * rc - base, a - k * rc, e - k * rc, w.s + (a - w.t),
                                                   bf16_base(m, p.offset + a, a - k * rc)});
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
  for (const auto& [key, by_shape] : by_bucket) add_muon_batches(*plan, by_shape, true, key);
  size_t whole = 0;
  for (const auto& [key, by_shape] : tp_by_bucket) whole = std::max(whole, add_tp_batches(*plan, by_shape, key));
  alloc_tp_staging(*plan, whole);
  return plan;
}

// Tensor parallel: the split Muon matrices of the batches keyed `bucket` (OptPlan::TpBatch), their Newton-Schulz
// inputs already whole over DP in `in` (the gradient array under ZeRO-1, the bucket's transient gather under
// ZeRO-2 / 3): gathered whole over TP, orthogonalised, this rank's part updated (OptPlan::TpMatrix).
void step_tp_muon(GpuModel::Impl& m, OptPlan& plan, const cuda::MuonStep& ms, const float* in, int bucket, float* w,
                  bf16* wb) {
  const int T = m.tp_size, t = m.tp_rank;
  float *whole = plan.tp_whole.as<float>(), *stack = plan.tp_stack.as<float>();
  for (OptPlan::TpBatch& b : plan.tp_muon) {
    if (b.bucket != bucket) continue;
    const int64_t n = b.rows * b.cols, count = int64_t(b.mats.size());
    for (int64_t k = 0; k < count; ++k) {
      const OptPlan::TpMatrix& q = b.mats[size_t(k)];
      float* dst = q.axis == 0 ? whole + k * n : stack + k * n;  // a row split's rank order is the matrix's
      comm::WorkPtr work = m.tp->all_gather(in + q.grad, dst, size_t(q.nl), comm::ElemType::F32);
      m.stream_wait(*work);
      if (q.axis == 1) {  // rank r's [rows, cols / T] block -> columns [r cols / T, (r + 1) cols / T)
        const int64_t cl = b.cols / T;
        for (int r = 0; r < T; ++r)
          TREX_CUDA(cudaMemcpy2DAsync(whole + k * n + r * cl, size_t(b.cols) * 4, stack + k * n + r * q.nl,
                                      size_t(cl) * 4, size_t(cl) * 4, size_t(b.rows), cudaMemcpyDeviceToDevice,
                                      nullptr));
      }
    }
    cuda::muon_orthogonalise_batched(*m.gemm, plan.scratch, b.in_offsets.as<int64_t>(), count, b.rows, b.cols, whole,
                                     ms);
    // A column split's slice of the result made contiguous at [t nl, (t + 1) nl) of its matrix (through the
    // staging, which is free again), where the ranges address it.
    float* x = plan.scratch.x32();
    for (int64_t k = 0; k < count; ++k) {
      const OptPlan::TpMatrix& q = b.mats[size_t(k)];
      if (q.axis != 1) continue;
      const int64_t cl = b.cols / T;
      TREX_CUDA(cudaMemcpy2DAsync(stack + k * n, size_t(cl) * 4, x + k * n + t * cl, size_t(b.cols) * 4,
                                  size_t(cl) * 4, size_t(b.rows), cudaMemcpyDeviceToDevice, nullptr));
      TREX_CUDA(cudaMemcpyAsync(x + k * n + t * q.nl, stack + k * n, size_t(q.nl) * 4, cudaMemcpyDeviceToDevice,
                                nullptr));
    }
    cuda::muon_apply_ranges(plan.scratch, b.apply_offsets.as<int64_t>(), b.ranges.as<int64_t>(), count, b.rows,
                            b.cols, w, wb, ms);
  }
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
  m.gbuckets->wait_gathers();  // the last step's, should a forward not have read every bucket: the slices change now
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
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    const GpuModel::Impl::Bucket& b = m.buckets[bi];
    const int64_t n = b.slice(m.dp_size), own = b.begin + m.dp_rank * n;
    if (n == 0) continue;  // another pipeline stage's bucket (empty here)
    cuda::adamw_step(m.master.as<float>() + b.shard_off, g + m.grad_index(own), adam_m.as<float>() + b.shard_off,
                     adam_v.as<float>() + b.shard_off, m.weight_at(own), n, a);
    // ZeRO-3 keeps the slice: the next forward gathers each bucket ahead of use (model/cuda/weight_gather.h).
    if (!m.zero3()) m.gbuckets->start_gather(int(bi));
  }
  m.weights_changed();
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
      cuda::muon_step_batched(*m.gemm, plan.scratch, b.offsets.as<int64_t>(), b.count, b.rows, b.cols, w, g, mom, wb,
                              ms);
    for (const auto& r : plan.tp_momentum) cuda::muon_momentum_range(g + r.grad, mom + r.shard, r.n, ms);
    step_tp_muon(m, plan, ms, g, -1, w, wb);
    m.section("optimizer", false);
    return;
  }
  // Data parallel: the reduced gradients (and the local experts' over their replicas) first.
  m.reduce_expert_grads();
  m.wait_grad_work();
  m.gbuckets->wait_gathers();
  // Muon: the momentum of the elements held here, their Newton-Schulz inputs left in the gradient arena; the
  // buckets' inputs all-gathered (each rank holds a slice), so every matrix this rank holds a part of is whole
  // here; orthogonalised, and the own part of it updated.
  for (const auto& r : plan.momentum) cuda::muon_momentum_range(g + r.grad, mom + r.shard, r.n, ms);
  if (!m.zero2())
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
  // The inputs read at b.offsets from u; the bf16 copies written at b.wb_offsets in `compute`.
  auto orthogonalise = [&](const OptPlan::MuonBatch& b, const float* u) {
    cuda::muon_orthogonalise_batched(*m.gemm, plan.scratch, b.offsets.as<int64_t>(), b.count, b.rows, b.cols, u, ms);
    cuda::muon_apply_ranges(plan.scratch, b.wb_offsets.as<int64_t>(), b.ranges.as<int64_t>(), b.count, b.rows, b.cols,
                            w, wb, ms);
  };
  for (const auto& b : plan.muon)
    if (b.bucket == -1)
      orthogonalise(b, g);
    else if (b.bucket == kRegionR)
      orthogonalise(b, g + m.grad_index(m.region_a));
  if (!m.zero2()) step_tp_muon(m, plan, ms, g, -1, w, wb);
  if (m.zero2())
    // Each bucket's Newton-Schulz inputs (its ranks' slices, momentum applied) all-gathered into a transient fp32
    // buffer of the bucket, its matrices orthogonalised from there, the buffer freed (stream-ordered, so the next
    // bucket reuses it): the persistent gradients stay the rank's slices, and the transient is at most one bucket,
    // no more than the backward's own bucket buffers (GradBuckets::transient_bytes). Every rank gathers the same
    // buckets in the same order (input_buckets), holding a part of their matrices or not. Under tensor
    // parallelism the bucket's TP-split matrices are then gathered whole over TP from that buffer (the DP gather
    // first, then the TP one), while it is live, so the TP staging (tp_whole) adds at most one TP batch.
    //
    // ZeRO-3 takes the same path: its gradients are ZeRO-2's, and only where the updated bf16 element lands
    // differs (the rank's persistent slice, MuonBatch::wb_offsets), which the next forward's gather spreads.
    // Every rank holding a part of a matrix orthogonalises it whole and writes its own part, as under ZeRO-1 / 2,
    // rather than one owner per matrix: an owner would have to send the other holders their parts of the update
    // (one more collective per bucket) and would take the Newton-Schulz of every matrix it owns alone (the
    // buckets' slices cut few matrices, so the duplicated work is those few).
    for (int bi : plan.input_buckets) {
      const GpuModel::Impl::Bucket& b = m.buckets[size_t(bi)];
      const int64_t n = b.slice(m.dp_size), own = b.begin + m.dp_rank * n;
      float* u = nullptr;
      u = static_cast<float*>(cuda::device_malloc_async(size_t(b.end - b.begin) * sizeof(float), nullptr,
                                                         "a Muon bucket gather (ZeRO-2)"));
      auto work = m.dp->all_gather(g + m.grad_index(own), u, size_t(n), comm::ElemType::F32);
      m.stream_wait(*work);
      for (const auto& x : plan.muon)
        if (x.bucket == bi) orthogonalise(x, u);
      step_tp_muon(m, plan, ms, u, bi, w, wb);
      TREX_CUDA(cudaFreeAsync(u, nullptr));
    }
  // AdamW: region X and R, then each bucket's runs with the all-gather of its updated bf16 slice.
  for (const auto& r : plan.local_adamw)
    cuda::adamw_step(w + r.shard, g + r.grad, mom + r.shard, v + r.shard, m.weight_at(r.arena), r.n,
                     without_decay(a, r.decay));
  comm::WorkPtr expert_gather;  // the updated bf16 slice of the local experts, over their replicas
  if (plan.experts_trained && m.experts_sharded())
    expert_gather = m.edp->all_gather(wb + m.x_own, wb, size_t(m.x_shard), comm::ElemType::BF16);
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    for (const auto& r : plan.bucket_adamw[bi])
      cuda::adamw_step(w + r.shard, g + r.grad, mom + r.shard, v + r.shard, m.weight_at(r.arena), r.n,
                       without_decay(a, r.decay));
    if (!plan.bucket_trained[bi] || m.zero3()) continue;  // all frozen / ZeRO-3: gathered ahead of the next use
    m.gbuckets->start_gather(int(bi));
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
