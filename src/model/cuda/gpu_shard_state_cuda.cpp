// GpuModel's data-parallel shard state by tensor (gpu_model.h): whole tensors gathered from / written into the
// ZeRO-1 shard layout (checkpoints of the official names), the distributed gradient norm, gradient accumulation
// across in-place reduce-scatters, and a stage step's router selections. The shard layout (gpu_impl.h): the local
// experts (region X: this replica's slice [x_own, x_own + x_shard), all of it without replicas), bucket b's slice
// dp_rank (length (end - begin) / dp_size, at shard_off), then region R (replicated) at shard_a.
#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/grad_buckets.h"

namespace trex::dsv4gpu {

// The pieces of p in this rank's shard (one GPU, or a local expert of region X without replicas: the whole
// tensor at its arena offset; with replicas its part of this replica's region-X slice).
std::vector<GpuModel::Impl::ShardPiece> GpuModel::Impl::own_pieces(const GpuParam& p) const {
  const int64_t lo = p.offset, hi = p.offset + p.numel;
  if (dp_size == 1 || (hi <= region_x && !experts_sharded())) return {{0, lo, p.numel}};
  if (hi <= region_x) {
    const int64_t a = std::max(lo, x_own), e = std::min(hi, x_own + x_shard);
    if (a >= e) return {};
    return {{a - lo, a - x_own, e - a}};
  }
  if (lo >= region_a) return {{0, shard_a + (lo - region_a), p.numel}};
  std::vector<ShardPiece> out;
  for (const Bucket& b : buckets) {
    const int64_t n = b.slice(dp_size), own0 = b.begin + dp_rank * n, own1 = own0 + n;
    const int64_t a = std::max(lo, own0), e = std::min(hi, own1);
    if (a < e) out.push_back({a - lo, b.shard_off + (a - own0), e - a});
  }
  return out;
}

namespace {

// Held whole by this rank: one GPU, region R (replicated), or a local expert without replicas (whole on its
// owner).
bool replicated(const GpuModel::Impl& m, const GpuParam& p) {
  return m.dp_size == 1 || p.offset >= m.region_a || (p.offset + p.numel <= m.region_x && !m.experts_sharded());
}

// y += x on the device (cuBLAS saxpy with alpha 1: exact fp32 adds, in element order).
struct Axpy {
  cublasHandle_t h = nullptr;
  Axpy() {
    TREX_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "GPU model: cublasCreate failed");
  }
  ~Axpy() { cublasDestroy(h); }
  void operator()(float* y, const float* x, int64_t n) {
    const float one = 1.f;
    for (int64_t i = 0; i < n;) {  // cuBLAS counts in int
      const int64_t k = std::min<int64_t>(n - i, int64_t(1) << 30);
      TREX_CHECK(cublasSaxpy(h, int(k), &one, x + i, 1, y + i, 1) == CUBLAS_STATUS_SUCCESS,
                 "GPU model: cublasSaxpy failed");
      i += k;
    }
  }
};

double host_sum_squares(const float* x, int64_t n, double* scratch) {
  if (n <= 0) return 0.0;
  cuda::sum_squares_f32(x, n, scratch);
  double ss = 0;
  TREX_CUDA(cudaMemcpy(&ss, scratch, sizeof(double), cudaMemcpyDeviceToHost));
  return ss;
}

std::vector<float> gather_local(const GpuModel::Impl& m, const GpuParam& p, const float* shard);
void set_local(GpuModel::Impl& m, const GpuParam& p, const float* local, float* shard);

}  // namespace

int64_t GpuModel::shard_elems() const { return impl_->shard_elems(); }

GpuModel::ParamMemory GpuModel::param_memory() const {
  const Impl& m = *impl_;
  ParamMemory r;
  for (const GpuParam& p : m.params) {
    r.held_elems += p.numel;
    int64_t own = 0;
    for (const Impl::ShardPiece& w : m.own_pieces(p)) own += w.n;
    r.master_elems += own;
    // ZeRO-2: a bucket tensor's gradient persists only on this rank's slice; region X and R are held whole.
    const bool bucket = p.offset >= m.region_x && p.offset < m.region_a;
    r.grad_elems += m.zero2() && bucket ? own : p.numel;
    r.weight_elems += m.zero3() && bucket ? own : p.numel;  // ZeRO-3: a bucket tensor's bf16 as its slice
  }
  if (!m.opts.gradients) r.grad_elems = 0;
  r.weight_bytes = int64_t(m.compute.bytes());
  r.grad_bytes = int64_t(m.grads.bytes());
  r.master_bytes = int64_t(m.master.bytes());
  return r;
}
int GpuModel::dp_size() const { return impl_->dp_size; }

std::vector<float> GpuModel::gather_shard(const std::string& name, const float* shard) const {
  const Impl& m = *impl_;
  const GpuParam& p = m.info(name);
  if (p.tp_axis >= 0) {
    // This TP rank's slice (gathered over DP below), placed into a zeroed official tensor and summed over the TP
    // group: each element has one owner, and x + 0 is exact.
    const std::vector<float> mine = gather_local(m, p, shard);
    DevMem local(mine.size() * sizeof(float)), full(size_t(numel(p.full)) * sizeof(float));
    TREX_CUDA(cudaMemcpy(local.as<float>(), mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice));
    TREX_CUDA(cudaMemset(full.as<float>(), 0, full.bytes()));
    m.tp_place(p, local.as<float>(), full.as<float>(), cudaMemcpyDeviceToDevice);
    TREX_CUDA(cudaDeviceSynchronize());
    m.tp->all_reduce(full.as<float>(), size_t(numel(p.full)), comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
    std::vector<float> v(size_t(numel(p.full)));
    TREX_CUDA(cudaMemcpy(v.data(), full.as<float>(), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  return gather_local(m, p, shard);
}

namespace {
// p as this rank holds it (its TP slice under tensor parallelism), gathered over DP.
std::vector<float> gather_local(const GpuModel::Impl& m, const GpuParam& p, const float* shard) {
  const float* base = shard ? shard : m.master.as<float>();
  std::vector<float> v(size_t(p.numel));
  TREX_CUDA(cudaDeviceSynchronize());  // the optimiser's update of the shard has landed
  if (replicated(m, p)) {
    const GpuModel::Impl::ShardPiece w = m.own_pieces(p)[0];
    TREX_CUDA(cudaMemcpy(v.data(), base + w.s, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  // Each rank places its pieces into a zeroed copy of the tensor; the sum over the ranks is the tensor (x + 0 is
  // exact, and every element has one owner): the DP group for a dense tensor, a local expert's replicas for it.
  DevMem full(size_t(p.numel) * sizeof(float));
  TREX_CUDA(cudaMemset(full.as<float>(), 0, size_t(p.numel) * sizeof(float)));
  for (const GpuModel::Impl::ShardPiece& w : m.own_pieces(p))
    TREX_CUDA(cudaMemcpy(full.as<float>() + w.t, base + w.s, size_t(w.n) * sizeof(float), cudaMemcpyDeviceToDevice));
  TREX_CUDA(cudaDeviceSynchronize());
  comm::Communicator& group = p.offset < m.region_x ? *m.edp : *m.dp;
  group.all_reduce(full.as<float>(), size_t(p.numel), comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
  TREX_CUDA(cudaMemcpy(v.data(), full.as<float>(), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace

void GpuModel::set_shard(const std::string& name, const std::vector<float>& full, float* shard) {
  set_shard(name, full.data(), int64_t(full.size()), shard);
}

void GpuModel::set_shard(const std::string& name, const float* full, int64_t n, float* shard) {
  Impl& m = *impl_;
  const GpuParam& p = m.info(name);
  if (p.tp_axis >= 0) {  // the official tensor: this TP rank's slice of it
    TREX_CHECK(n == numel(p.full), "GPU model set_shard: '{}' has {} elements (shape {}), got {}", name,
               numel(p.full), shape_str(p.full), n);
    std::vector<float> mine(size_t(p.numel));
    m.tp_slice(p, full, mine.data(), cudaMemcpyHostToHost);
    set_local(m, p, mine.data(), shard);
    return;
  }
  TREX_CHECK(n == p.numel, "GPU model set_shard: '{}' has {} elements, got {}", name, p.numel, n);
  set_local(m, p, full, shard);
}

namespace {
void set_local(GpuModel::Impl& m, const GpuParam& p, const float* full, float* shard) {
  const int64_t n = p.numel;
  float* base = shard ? shard : m.master.as<float>();
  if (!shard && m.gbuckets)  // an all-gather of updated bf16 slices still in flight would overwrite the new copy
    m.gbuckets->wait_gathers();
  DevMem stage(size_t(p.numel) * sizeof(float));
  TREX_CUDA(cudaMemcpy(stage.as<float>(), full, size_t(n) * sizeof(float), cudaMemcpyHostToDevice));
  m.place_local(p, stage.as<float>(), base, !shard);
  TREX_CUDA(cudaDeviceSynchronize());
}

}  // namespace

void GpuModel::Impl::place_local(const GpuParam& p, const float* local, float* base, bool compute_copy) {
  for (const ShardPiece& w : own_pieces(p))
    TREX_CUDA(cudaMemcpyAsync(base + w.s, local + w.t, size_t(w.n) * sizeof(float), cudaMemcpyDeviceToDevice, nullptr));
  if (!compute_copy) return;
  const bool bucket = p.offset >= region_x && p.offset < region_a;
  if (zero3() && bucket) {  // ZeRO-3: the bf16 of this rank's slice of it only
    weights_changed();
    for (const ShardPiece& w : own_pieces(p)) cuda::cast_f32_to_bf16(weight_at(p.offset + w.t), local + w.t, w.n);
  } else {
    cuda::cast_f32_to_bf16(weight_at(p.offset), local, p.numel);  // held whole
  }
}

void GpuModel::Impl::tp_sum_squares(const std::vector<std::pair<int64_t, int64_t>>& ranges, double* split,
                                    double* rest) const {
  std::vector<std::pair<int64_t, int64_t>> cut;  // the TP-split tensors' arena intervals, in arena order
  for (const GpuParam& p : params)
    if (p.tp_axis >= 0) cut.emplace_back(p.offset, p.offset + p.numel);
  std::sort(cut.begin(), cut.end());
  DevMem scratch(size_t(cuda::kSumSquaresBlocks + 1) * sizeof(double));
  const float* g = grads.as<float>();
  // [a, e) are arena offsets; the gradients are read at grad_index's place: under ZeRO-2 / ZeRO-3 the array is
  // compact ([region X | own bucket slices | region R]), so the arena offset of a bucket slice past the first or
  // of region R lies elsewhere in it or past its end (another allocation's memory: a norm that changes from run to
  // run). Each range is one piece of that layout (region X, one bucket's own slice, region R), contiguous there.
  auto ss = [&](int64_t a, int64_t e) {
    if (a >= e) return 0.0;
    const int64_t i = grad_index(a);
    TREX_CHECK(i >= 0 && i + (e - a) <= grad_elems(),
               "GPU model (TP rank {}, DP rank {}): the norm's arena range [{}, {}) maps to gradient elements [{}, "
               "{}), past the gradient array's {}", tp_rank, dp_rank, a, e, i, i + (e - a), grad_elems());
    return host_sum_squares(g + i, e - a, scratch.as<double>());
  };
  for (const auto& [a, e] : ranges) {
    int64_t pos = a;
    for (const auto& [c0, c1] : cut) {
      if (c1 <= pos || c0 >= e) continue;
      *rest += ss(pos, std::max(pos, c0));
      *split += ss(std::max(pos, c0), std::min(e, c1));
      pos = std::min(e, c1);
    }
    *rest += ss(pos, e);
  }
}

double GpuModel::Impl::tp_grad_norm() {
  // Own ranges: the whole arena on one DP rank; else region X's slice and the bucket slices (summed over DP), and
  // region R (replicated over DP, counted once).
  std::vector<std::pair<int64_t, int64_t>> own, rep;
  if (dp_size == 1) {
    if (embed_copy()) {  // the tied embedding copy: the first stage counts it
      const Bucket& e = buckets[size_t(embed_bucket)];
      own.emplace_back(0, e.begin), own.emplace_back(e.end, total);
    } else {
      own.emplace_back(0, total);
    }
  } else {
    if (x_shard > 0) own.emplace_back(x_own, x_own + x_shard);
    for (size_t bi = 0; bi < buckets.size(); ++bi) {
      const Bucket& b = buckets[bi];
      const int64_t n = b.slice(dp_size);
      if (n > 0 && !(embed_copy() && int(bi) == embed_bucket))
        own.emplace_back(b.begin + dp_rank * n, b.begin + dp_rank * n + n);
    }
    rep.emplace_back(region_a, total);
  }
  double v[2] = {0, 0};  // split, rest of the DP-sharded ranges
  tp_sum_squares(own, &v[0], &v[1]);
  double split_r = 0, rest_r = 0;
  tp_sum_squares(rep, &split_r, &rest_r);
  DevMem d(2 * sizeof(double));
  TREX_CUDA(cudaMemcpy(d.as<double>(), v, sizeof(v), cudaMemcpyHostToDevice));
  if (dp_size > 1) dp->all_reduce(d.as<double>(), 2, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  TREX_CUDA(cudaMemcpy(v, d.as<double>(), sizeof(v), cudaMemcpyDeviceToHost));
  double split = v[0] + split_r;
  TREX_CUDA(cudaMemcpy(d.as<double>(), &split, sizeof(double), cudaMemcpyHostToDevice));
  tp->all_reduce(d.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  TREX_CUDA(cudaMemcpy(&split, d.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
  return std::sqrt(v[1] + rest_r + split);
}

double GpuModel::dp_grad_norm() {
  Impl& m = *impl_;
  if (m.dp_size == 1) return grad_norm();
  m.require_gradients("dp_grad_norm()");
  m.reduce_expert_grads();  // the experts' replicas summed first (the optimiser step then finds them reduced)
  m.wait_grad_work();
  if (m.tp_size > 1) return m.tp_grad_norm();
  DevMem scratch(size_t(cuda::kSumSquaresBlocks + 1) * sizeof(double));
  const float* g = m.grads.as<float>();
  // Region X (expert parallel): this rank's slice of its experts' reduced gradients (all of them without
  // replicas), so each expert element is counted once over the DP group.
  double own = host_sum_squares(g + m.x_own, m.x_shard, scratch.as<double>());
  // This rank's slices, in bucket order (deterministic).
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    const Impl::Bucket& b = m.buckets[bi];
    const int64_t n = b.slice(m.dp_size);
    if (n == 0) continue;  // another pipeline stage's bucket
    if (m.embed_copy() && int(bi) == m.embed_bucket) continue;  // the tied embedding copy: the first stage's counts
    own += host_sum_squares(g + m.grad_index(b.begin + m.dp_rank * n), n, scratch.as<double>());
  }
  const double r = host_sum_squares(g + m.grad_index(m.region_a), m.total - m.region_a, scratch.as<double>());
  DevMem d(sizeof(double));
  TREX_CUDA(cudaMemcpy(d.as<double>(), &own, sizeof(double), cudaMemcpyHostToDevice));
  m.dp->all_reduce(d.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  TREX_CUDA(cudaMemcpy(&own, d.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
  return std::sqrt(own + r);
}

void GpuModel::sum_tied_embedding_grads() {
  Impl& m = *impl_;
  comm::Communicator* g = m.opts.embed_group;
  if (g == nullptr || g->size() == 1 || m.cfg.n_mtp == 0) return;
  m.require_gradients("sum_tied_embedding_grads()");
  TREX_CHECK(g->size() == 2 && m.first_stage() != m.last_stage() && (m.first_stage() || m.embed_copy()),
             "GPU model stage [{}, {}): the tied-embedding group ({} ranks) joins the first and the last pipeline "
             "stage only", m.l0, m.l1, g->size());
  m.wait_grad_work();  // this stage's data-parallel reduction of the embedding's bucket is complete
  // This rank's reduced slice of the embedding's bucket (the whole bucket on one DP rank): the first and the last
  // stage's ranks of one DP index own the same slice (the bucket is the same size on both).
  const Impl::Bucket& b = m.buckets[size_t(m.embed_bucket)];
  const int64_t n = m.dp_size > 1 ? b.slice(m.dp_size) : b.end - b.begin;
  const int64_t own0 = m.dp_size > 1 ? b.begin + m.dp_rank * n : b.begin;
  float* grad = m.grads.as<float>() + m.grad_index(own0);
  m.stream_wait(*g->all_reduce(grad, size_t(n), comm::ElemType::F32, comm::ReduceOp::Sum));
  m.grads_zero = false;
}

void GpuModel::add_reduced_grads_to(float* acc) {
  Impl& m = *impl_;
  m.require_gradients("add_reduced_grads_to()");
  TREX_CHECK(m.dp_size > 1, "GPU model: add_reduced_grads_to is for data-parallel accumulation (one GPU "
             "accumulates in the arena)");
  m.reduce_expert_grads();  // region X: this backward's expert gradients reduce-scattered over the replicas
  m.wait_grad_work();
  Axpy axpy;
  const float* g = m.grads.as<float>();
  if (m.x_shard > 0) axpy(acc, g + m.x_own, m.x_shard);
  for (const Impl::Bucket& b : m.buckets) {
    const int64_t n = b.slice(m.dp_size);
    if (n > 0) axpy(acc + b.shard_off, g + m.grad_index(b.begin + m.dp_rank * n), n);
  }
  axpy(acc + m.shard_a, g + m.grad_index(m.region_a), m.total - m.region_a);
  TREX_CUDA(cudaDeviceSynchronize());
}

void GpuModel::add_held_grads(const float* acc) {
  Impl& m = *impl_;
  m.require_gradients("add_held_grads()");
  TREX_CHECK(m.dp_size > 1, "GPU model: add_held_grads is for data-parallel accumulation");
  m.reduce_expert_grads();  // the last backward's expert gradients, before the held ones are added
  m.wait_grad_work();
  Axpy axpy;
  float* g = m.grads.as<float>();
  if (m.x_shard > 0) axpy(g + m.x_own, acc, m.x_shard);
  for (const Impl::Bucket& b : m.buckets) {
    const int64_t n = b.slice(m.dp_size);
    if (n > 0) axpy(g + m.grad_index(b.begin + m.dp_rank * n), acc + b.shard_off, n);
  }
  axpy(g + m.grad_index(m.region_a), acc + m.shard_a, m.total - m.region_a);
  TREX_CUDA(cudaDeviceSynchronize());
  m.grads_zero = false;  // region X stays reduced (experts_reduced): the norm and the step must not sum it again
}

void GpuModel::wait_grad_reductions() { impl_->wait_grad_work(); }

std::vector<int32_t> GpuModel::stage_router_selection(int64_t micro, int64_t l) {
  Impl& m = *impl_;
  TREX_CHECK(micro >= 0, "GPU model: micro-batch {} must be >= 0", micro);
  const int s = int(micro % int64_t(m.slots.size()));
  m.swap_slot(s);
  std::vector<int32_t> v;
  try {
    v = router_selection(l);
  } catch (...) {
    m.swap_slot(s);
    throw;
  }
  m.swap_slot(s);
  return v;
}

}  // namespace trex::dsv4gpu
