// The GPU model's step: the block program (model/dsv4/program.h) over the CUDA backend (cuda_backend.h), with the
// data-parallel hooks around it (bucket all-gathers waited for before a block's forward, reduce-scatters started as
// the backward completes a block, the region-R all-reduce at the end), the loss normalisers, and the pipeline
// stage steps (a micro-batch's parked state swapped in around the program call).
#include <cmath>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/mhc_generic.h"
#include "model/cuda/activation_arena.h"
#include "model/cuda/cuda_backend.h"
#include "model/dsv4/program.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/grad_buckets.h"
#include "model/cuda/weight_gather.h"

namespace trex::dsv4gpu {

void rmsnorm_bwd_full(const Ctx& c, bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                      const float* rstd, int64_t n, int64_t d) {
  if (n == 0) return;
  if (!dw) {
    cuda::rmsnorm_bwd(dx, nullptr, dy, x, w, rstd, n, d);
    return;
  }
  const int64_t rows = cuda::rmsnorm_dw_partial_rows(n);
  Pool tmp(c.scratch);
  float* part = tmp.take<float>(rows * d);
  cuda::rmsnorm_bwd(dx, part, dy, x, w, rstd, n, d);
  cuda::rmsnorm_dw_reduce(dw, part, rows, d);
}

static_assert(cuda::kMhcMix == kPlanMhcMix, "activation_plan.h counts the mHC mixing row as kernels/cuda/mhc.h");

GpuModel::Impl::Impl(const dsv4::ModelConfig& c, const GpuModelOptions& o) : cfg(c), opts(o) {}

GpuModel::Impl::~Impl() {
  for (auto& s : open_sections) cudaEventDestroy(s.start), cudaEventDestroy(s.stop);
  for (auto& s : done_sections) cudaEventDestroy(s.start), cudaEventDestroy(s.stop);
}

void GpuModel::Impl::section(const char* name, bool begin) {
  if (!opts.timing) return;
  if (begin) {
    Section s{name, nullptr, nullptr};
    TREX_CUDA(cudaEventCreate(&s.start));
    TREX_CUDA(cudaEventCreate(&s.stop));
    TREX_CUDA(cudaEventRecord(s.start, nullptr));
    open_sections.push_back(s);
  } else {
    TREX_CHECK(!open_sections.empty() && open_sections.back().name == name, "GPU model: unbalanced section {}", name);
    Section s = open_sections.back();
    open_sections.pop_back();
    TREX_CUDA(cudaEventRecord(s.stop, nullptr));
    done_sections.push_back(s);
  }
}

Ctx GpuModel::Impl::ctx() {
  Ctx c;
  c.cfg = &cfg;
  c.gemm = gemm.get();
  c.lin = Linear{gemm.get()};
  c.lay = &lay;
  c.rope_main = &rope_main;
  c.rope_compress = &rope_compress;
  c.section = [this](const char* n, bool b) { section(n, b); };
  c.ep = opts.ep;
  if (tp_size > 1) c.tp = tp, c.tp_size = tp_size, c.expert_tp = tp_experts == dsv4::TpExperts::Split;
  c.expert_width = expert_width();
  c.grouped_experts = opts.moe_grouped_gemm;
  c.deterministic = opts.deterministic;
  if (arena) c.scratch = arena->temporaries;
  return c;
}

// Expert parallelism: which routed experts this rank holds (gpu_impl.h, region X), checked before any
// allocation; the expert-data-parallel group when DP is larger than EP.
static void configure_experts(GpuModel::Impl& m, const dsv4::ModelConfig& cfg, const GpuModelOptions& opts,
                              bool make_groups) {
  const int64_t E = cfg.n_routed_experts;
  if (opts.ep && opts.ep->size() > 1) {
    m.ep_size = opts.ep->size(), m.ep_rank = opts.ep->rank();
    TREX_CHECK(device_memory_comm(*opts.ep),
               "GPU model rank {}: the expert-parallel group must be a device-memory communicator (nccl or threads), "
               "got '{}'", m.ep_rank, opts.ep->backend());
    TREX_CHECK(E % m.ep_size == 0, "GPU model: {} expert-parallel ranks do not divide the {} routed experts",
               m.ep_size, E);
  }
  m.e_begin = m.ep_rank * (E / m.ep_size), m.e_end = m.e_begin + E / m.ep_size;
  if (m.ep_size > 1 && m.dp_size > 1) {
    TREX_CHECK(m.dp_size % m.ep_size == 0,
               "GPU model: expert parallelism folds into data parallelism: {} EP ranks must divide the {} DP ranks",
               m.ep_size, m.dp_size);
    // The DP ranks holding the same experts (same EP rank): sum their expert gradients.
    if (m.dp_size > m.ep_size && make_groups) m.edp = m.dp->split(m.ep_rank, m.dp_rank);
  }
}

// Tensor parallelism: the group, and the splits' divisibility (with the numbers) before any allocation.
static void configure_tp(GpuModel::Impl& m, const dsv4::ModelConfig& cfg, const GpuModelOptions& opts) {
  if (!opts.tp || opts.tp->size() == 1) {
    TREX_CHECK(!opts.expert_tp, "GPU model: expert tensor parallelism (expert_tp) needs a tensor-parallel group of "
               "two or more ranks");
    return;
  }
  m.tp = opts.tp, m.tp_size = opts.tp->size(), m.tp_rank = opts.tp->rank();
  TREX_CHECK(device_memory_comm(*m.tp),
             "GPU model rank {}: the tensor-parallel group must be a device-memory communicator (nccl or threads), "
             "got '{}'", m.tp_rank, m.tp->backend());
  const int T = m.tp_size;
  TREX_CHECK(cfg.n_heads % T == 0, "GPU model: tensor parallelism over {} ranks does not divide the {} attention "
             "query heads", T, cfg.n_heads);
  TREX_CHECK(cfg.o_groups % T == 0, "GPU model: tensor parallelism over {} ranks does not divide the attention's {} "
             "output-projection groups (o_groups)", T, cfg.o_groups);
  TREX_CHECK((cfg.moe_inter * cfg.n_shared_experts) % T == 0, "GPU model: tensor parallelism over {} ranks does not "
             "divide the shared expert's hidden width {}", T, cfg.moe_inter * cfg.n_shared_experts);
  if (opts.expert_tp) {
    // The grouped GEMMs take widths in multiples of 8 elements (16-byte rows).
    TREX_CHECK(cfg.moe_inter % (8 * T) == 0, "GPU model: expert tensor parallelism over {} ranks needs the routed "
               "experts' width {} to split into multiples of 8 (moe_inter % {} == 0)", T, cfg.moe_inter, 8 * T);
    m.tp_experts = dsv4::TpExperts::Split;
  }
}

// Everything the constructor decides before it allocates: the checks, the groups' sizes and ranks, the arena's
// declaration (offsets, buckets, regions). make_groups false (footprint()): no sub-communicator is split off.
static void plan_arena(GpuModel::Impl& m, const dsv4::ModelConfig& cfg, const GpuModelOptions& opts,
                       bool make_groups) {
  cfg.validate();
  // hc_mult 4: the fast mHC / hc_head kernels; 1..3 (the parity fixtures): the generic ones (mhc_generic.h, *_any).
  TREX_CHECK(cfg.hc_mult >= 1 && cfg.hc_mult <= cuda::kMhcGenericMaxStreams,
             "GPU model: hc_mult {} unsupported (the mHC kernels serve 1..{})", cfg.hc_mult,
             cuda::kMhcGenericMaxStreams);
  TREX_CHECK(cfg.score_func == "sqrtsoftplus" && cfg.norm_topk_prob,
             "GPU model: only sqrtsoftplus routing with normalised top-k weights is implemented");
  if (opts.dp && opts.dp->size() > 1) {
    m.dp = opts.dp, m.dp_size = opts.dp->size(), m.dp_rank = opts.dp->rank();
    TREX_CHECK(device_memory_comm(*m.dp),
               "GPU model rank {}: the data-parallel group must be a device-memory communicator (nccl or threads), "
               "got '{}'", m.dp_rank, m.dp->backend());
  }
  configure_experts(m, cfg, opts, make_groups);
  TREX_CHECK(opts.zero >= 1 && opts.zero <= 3,
             "GPU model: zero {} (parallel.zero): 1 (sharded optimiser), 2 (sharded gradients) or 3 (fully sharded "
             "dense weights)",
             opts.zero);
  m.zero = m.dp_size > 1 ? opts.zero : 1;  // one GPU: nothing to shard
  m.reduce_bf16 = opts.grad_reduce_bf16;
  configure_tp(m, cfg, opts);  // ZeRO-3 under TP: each TP rank's DP group gathers its own arena's buckets
  m.l0 = opts.layer_begin, m.l1 = opts.layer_end < 0 ? cfg.n_layers : opts.layer_end;
  TREX_CHECK(m.l0 >= 0 && m.l0 < m.l1 && m.l1 <= cfg.n_layers,
             "GPU model: stage layers [{}, {}) outside the model's {} layers (or empty)", m.l0, m.l1, cfg.n_layers);
  // A stage combines with data and expert parallelism: its dense buckets are ZeRO-1 sharded over the stage's DP
  // group (another stage's buckets are declared empty), its local experts (region X) are those of its own layers.
  TREX_CHECK(opts.stage_slots >= 1, "GPU model: stage_slots {} must be >= 1", opts.stage_slots);
  // The MTP module runs on the last stage (it reads the final streams); its input embeds token t+1, so a last
  // stage that is not also the first holds a copy of embed.weight (tied: Impl::embed_copy), whose gradient the
  // trainer sums with the first stage's over opts.embed_group (sum_tied_embedding_grads). Its routed experts are
  // placed over ep with the main layers' (region X).
  if (m.embed_copy())
    TREX_CHECK(opts.embed_group == nullptr || device_memory_comm(*opts.embed_group),
               "GPU model: the tied-embedding group must be a device-memory communicator (nccl or threads), got '{}'",
               opts.embed_group->backend());
  m.slots.resize(size_t(opts.stage_slots));
  for (auto& sl : m.slots) sl.blocks.resize(size_t(cfg.n_layers));
  m.declare_all();
  // The experts' ZeRO-1 over their replicas (region X is 512-aligned): replica r of R (the edp group's rank; the
  // mesh's rule dp_rank / ep when footprint() makes no group) owns slice r.
  m.x_shard = m.region_x, m.x_own = 0;
  if (m.ep_size > 1 && m.dp_size > m.ep_size) {
    const int R = m.dp_size / m.ep_size, r = m.edp ? m.edp->rank() : m.dp_rank / m.ep_size;
    TREX_CHECK(!m.edp || m.edp->size() == R, "GPU model: {} expert-data-parallel replicas, expected {}",
               m.edp ? m.edp->size() : 0, R);
    TREX_CHECK(m.region_x % (8 * R) == 0, "GPU model: region X ({} elements) does not split into {} aligned slices",
               m.region_x, R);
    m.x_shard = m.region_x / R, m.x_own = r * m.x_shard;
  }
  m.shard_a = m.x_shard + (m.region_a - m.region_x) / m.dp_size;
  int64_t off = m.x_shard;
  for (auto& b : m.buckets) b.shard_off = off, off += b.slice(m.dp_size);
}

GpuModel::Footprint GpuModel::footprint(const dsv4::ModelConfig& cfg, const GpuModelOptions& opts) {
  Impl m(cfg, opts);
  plan_arena(m, cfg, opts, false);
  Footprint f;
  f.arena_elems = m.total, f.shard_elems = m.shard_elems(), f.region_x_elems = m.region_x;
  f.weight_elems = m.zero3() ? m.grad_elems() : m.total;
  f.weight_buffer_bytes = WeightGather::transient_bytes(m);
  f.grad_elems = m.grad_elems();
  if (opts.gradients) f.grad_buffer_bytes = GradBuckets::transient_bytes(m);
  for (const GpuParam& p : m.params) f.n_params += p.numel;
  f.gradients = opts.gradients;
  return f;
}

GpuModel::GpuModel(const dsv4::ModelConfig& cfg, const GpuModelOptions& opts)
    : impl_(std::make_unique<Impl>(cfg, opts)) {
  // Keep freed stream-ordered memory in the pool (no release at synchronisation points).
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t threshold = UINT64_MAX;
  TREX_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  Impl& m = *impl_;
  m.gemm = std::make_unique<cuda::Gemm>();
  plan_arena(m, cfg, opts, true);
  const size_t n = size_t(m.total), ns = size_t(m.shard_elems());  // ns == n on one GPU
  // The bf16 compute copy: the arena, or under ZeRO-3 this rank's pieces in grad_index's layout.
  const size_t nw = m.zero3() ? size_t(m.grad_elems()) : n;
  m.master = DevMem(ns * 4), m.compute = DevMem(nw * 2);
  TREX_CUDA(cudaMemsetAsync(m.master.as<float>(), 0, ns * 4, nullptr));
  TREX_CUDA(cudaMemsetAsync(m.compute.as<bf16>(), 0, nw * 2, nullptr));
  if (m.zero3()) m.wgather = std::make_unique<WeightGather>(m);
  if (opts.gradients) {
    const size_t ng = size_t(m.grad_elems());  // n, or under ZeRO-2 the shard's
    m.grads = DevMem(ng * 4);
    TREX_CUDA(cudaMemsetAsync(m.grads.as<float>(), 0, ng * 4, nullptr));
    if (m.dp_size > 1) m.gbuckets = std::make_unique<GradBuckets>(m);
  }
  m.bind_all();
  m.backend = std::make_unique<CudaBackend>(m);
  dsv4::ProgramShape ps;
  ps.n_layers = m.l1 - m.l0, ps.embed = m.first_stage(), ps.head = m.last_stage(), ps.mtp = m.mtp();
  ps.vocab = cfg.vocab_size;
  for (int64_t l = m.l0; l < m.l1; ++l) ps.balance.push_back(!m.blocks[size_t(l)]->hash || opts.balance_hash_layers);
  for (int64_t l = m.l0; l < m.l1; ++l)
    ps.replay.push_back(m.blocks[size_t(l)]->recompute == dsv4::Recompute::Full);
  if (m.mtp()) ps.replay.push_back(m.mtp_block->recompute == dsv4::Recompute::Full);
  if (m.mtp()) ps.balance.push_back(1);  // the MTP block is score-routed
  m.program = std::make_unique<dsv4::BlockProgram>(*m.backend, std::move(ps));
  m.program->set_slots(opts.stage_slots + 1);
  m.program_slot = opts.stage_slots;
  if (opts.gradients && opts.activation_arena) activation_arena_bind(m);
}

GpuModel::~GpuModel() = default;

double GpuModel::forward(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                         const Injection* inject, HeadMode head) {
  TREX_CHECK(impl_->first_stage() && impl_->last_stage(),
             "GPU model: forward() needs the whole model; a pipeline stage (layers [{}, {})) runs forward_stage",
             impl_->l0, impl_->l1);
  impl_->step_mode = false;
  activation_arena_plan(*impl_);
  return forward_impl(ids, labels, layout, inject, nullptr, head);
}

int64_t GpuModel::Impl::head_normaliser(bool mtp, int64_t n_own) {
  int64_t& g = mtp ? global_mtp_targets : global_targets;
  if (step_mode) {
    TREX_CHECK(g >= 0, "GPU model: the step's MTP targets were not given (begin_step(step_targets, "
               "step_mtp_targets) with the MTP module)");
    return g;
  }
  g = n_own;
  if (dp_size > 1) {  // the loss normaliser over the whole DP batch
    double h1 = double(n_own);
    DevMem d1(sizeof(h1));
    TREX_CUDA(cudaMemcpy(d1.as<double>(), &h1, sizeof(h1), cudaMemcpyHostToDevice));
    dp->all_reduce(d1.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
    TREX_CUDA(cudaMemcpy(&h1, d1.as<double>(), sizeof(h1), cudaMemcpyDeviceToHost));
    g = int64_t(std::llround(h1));
  }
  return g;
}

double GpuModel::forward_impl(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                              const Injection* inject, const void* x_in, HeadMode head) {
  Impl& m = *impl_;
  if (head == HeadMode::LossAndGrad) m.require_gradients("a training forward (HeadMode::LossAndGrad)");
  const dsv4::ModelConfig& cfg = m.cfg;
  layout.validate();
  const int64_t N = layout.B * layout.T;
  TREX_CHECK(m.first_stage() || x_in, "GPU model stage [{}, {}): forward needs the incoming stream x_in", m.l0,
             m.l1);
  TREX_CHECK(!m.last_stage() || labels, "GPU model: the forward needs labels");
  // The balance loss is sequence-wise and reads the router's scores over all experts, which every rank computes
  // for its own rows before the expert exchange: each rank's (and each stage's) terms are local. Data parallelism
  // needs only each micro-batch's share of the step (1 / M, given by begin_step) in a stage step; a forward() over
  // a DP batch would need its rows' mean over every rank instead (not done: the trainer runs stage steps under DP).
  const bool balance = m.opts.balance_alpha != 0.0;
  TREX_CHECK(!balance || (m.step_mode ? m.step_micro_batches > 0 : m.dp_size == 1),
             "GPU model: the balance loss (balance_alpha {}) runs in forward() on one data-parallel rank or in stage "
             "steps whose begin_step gives the step's micro-batches",
             m.opts.balance_alpha);
  const double balance_alpha =
      m.step_mode && balance ? m.opts.balance_alpha / double(m.step_micro_batches) : m.opts.balance_alpha;
  m.backend->set_forward(inject, head);
  // ZeRO-2: a training forward accumulates head.weight's gradient (the fused CE), so the head's bucket buffer
  // opens here (grad_buckets.h).
  if (head == HeadMode::LossAndGrad && m.last_stage()) m.open_bucket(m.head_bucket);
  bf16* x_out = nullptr;
  if (!m.last_stage()) {  // the stream X[l1] for the next stage, written in place by the last block
    m.out.clear();
    x_out = m.out.take<bf16>(N * cfg.hc_mult * cfg.hidden);
    m.backend->place_output(x_out);
  }
  dsv4::MicroBatch mb;
  mb.slot = m.program_slot, mb.ids = ids, mb.labels = labels, mb.layout = &layout, mb.x_in = x_in, mb.x_out = x_out;
  // loss_scale 1: the heads' means are over the step's / DP batch's targets (Impl::head_normaliser), so the
  // micro-batches' and ranks' gradients sum to the step's.
  mb.loss_scale = 1.0, mb.mtp_weight = m.opts.mtp_weight, mb.balance_alpha = balance_alpha;
  const dsv4::LossParts& lp = m.program->forward(mb);
  m.forward_done = true;
  if (!m.last_stage()) return lp.total;  // no head here: the stage's balance terms (0 without the balance loss)
  if (m.step_mode || m.dp_size == 1) return lp.total;  // step mode: this micro-batch's share of the step's loss
  // The loss over the whole DP batch: the CE sums all-reduced, over the normalisers.
  std::vector<double> sums{m.backend->ce_sum(dsv4::HeadKind::Main)};
  if (m.mtp()) sums.push_back(m.backend->ce_sum(dsv4::HeadKind::Mtp));
  DevMem d1(sums.size() * sizeof(double));
  TREX_CUDA(cudaMemcpy(d1.as<double>(), sums.data(), sums.size() * sizeof(double), cudaMemcpyHostToDevice));
  m.dp->all_reduce(d1.as<double>(), sums.size(), comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  TREX_CUDA(cudaMemcpy(sums.data(), d1.as<double>(), sums.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double loss = (m.global_targets > 0 ? sums[0] / double(m.global_targets) : 0.0) + lp.balance;
  if (m.mtp())
    loss += m.opts.mtp_weight * (m.global_mtp_targets > 0 ? sums[1] / double(m.global_mtp_targets) : 0.0);
  return loss;
}

void GpuModel::backward() {
  TREX_CHECK(impl_->first_stage() && impl_->last_stage(),
             "GPU model: backward() needs the whole model; a pipeline stage (layers [{}, {})) runs backward_stage",
             impl_->l0, impl_->l1);
  backward_impl(nullptr);
}

void GpuModel::backward_impl(const float* dx_out) {
  Impl& m = *impl_;
  TREX_CHECK(m.forward_done, "GPU model: backward() called without a forward()");
  m.require_gradients("backward()");
  TREX_CHECK(m.last_stage() || dx_out, "GPU model stage [{}, {}): backward needs the gradient dx_out of its output",
             m.l0, m.l1);
  m.grads_zero = false;  // gradients accumulate from here on (zero_grads() must clear them again)
  m.experts_reduced = false;
  const int64_t n_blocks = m.l1 - m.l0;
  // dx_in: the gradient of x_in, kept (in grad_out) for the send to the previous stage.
  float* dx_in = nullptr;
  if (!m.first_stage()) dx_in = m.grad_out.take<float>(m.lay.N * m.cfg.hc_mult * m.cfg.hidden);
  m.dx_in = dx_in;
  // Each bucket's gradient reduce-scatter starts as soon as the backward completes it, overlapping the backward of
  // the layers below.
  // The MTP bucket also holds the MTP input's projections and norms, whose backward runs after the MTP block's:
  // it is complete with the head's.
  // ZeRO-2 (grad_buckets.h): the buckets a backward writes get their transient buffers just before their first
  // writer runs: the head's (its training forward may have opened it already), the MTP module's and, with MTP
  // (its input's backward adds to embed.weight), the embedding's at the start; each layer's when the layer above
  // it completes; the embedding's otherwise after the lowest layer. Every bucket is reduced in every backward,
  // its slice accumulating in the shard; only region R (all-reduced in place) waits for the step's last one.
  const bool z2 = m.zero2();
  const bool reduce_r = m.reduce_this_backward;
  auto open_layer = [&m, n_blocks](int64_t b) {  // block b's bucket, or the embedding's below block 0
    if (b >= 0 && b < n_blocks) m.open_bucket(m.layer_bucket[size_t(m.l0 + b)]);
    if (b < 0 && m.first_stage()) m.open_bucket(m.embed_bucket);
  };
  if (z2) {
    if (m.last_stage()) m.open_bucket(m.head_bucket);
    if (m.mtp()) m.open_bucket(m.mtp_bucket), m.open_bucket(m.embed_bucket);
    open_layer(n_blocks - 1);
  }
  auto ready = [&m, n_blocks, z2, reduce_r, &open_layer](int64_t b) {
    if (b == dsv4::kHeadReady) {
      if (m.mtp()) m.reduce_bucket(m.mtp_bucket);
      m.reduce_bucket(m.head_bucket);
    } else if (b >= 0) {
      if (b < n_blocks) {
        m.reduce_bucket(m.layer_bucket[size_t(m.l0 + b)]);
        if (z2) open_layer(b - 1);
      }
    } else {
      m.reduce_bucket(m.embed_bucket);
      if (m.dp_size > 1 && reduce_r)  // region R (fp32-read, replicated): summed on every rank
        m.grad_work.push_back(m.dp->all_reduce(m.grads.as<float>() + m.grad_index(m.region_a),
                                               size_t(m.total - m.region_a), comm::ElemType::F32, comm::ReduceOp::Sum));
    }
  };
  m.backend->begin_backward(dx_in);
  // A stage step accumulating micro-batches under DP reduces only in the step's last backward (begin_step's
  // reduce_micro): an earlier reduce-scatter would leave the arena unable to take the next micro-batch's sum.
  // ZeRO-2 reduces every bucket in every backward (into the shard) and defers region R alone.
  const bool reduces = m.gbuckets && (m.reduce_this_backward || z2);
  const dsv4::BlocksReady hooks = reduces ? dsv4::BlocksReady(ready) : dsv4::BlocksReady{};
  if (reduces) m.gbuckets->begin();
  m.program->backward(m.program_slot, dx_out, dx_in, hooks);
  if (reduces) m.gbuckets->finish();
  m.backend->end_backward();
  // ZeRO-3: nothing gathered outlives the backward (the optimiser step changes the slices; the next forward
  // gathers again).
  m.weights_changed();
  TREX_CUDA(cudaGetLastError());
}

// ---- Pipeline stage steps: the live batch state above belongs to one micro-batch at a time; the others are
// parked in slots and swapped in for their forward / backward.

void GpuModel::Impl::swap_slot(int s) {
  Slot& z = slots[size_t(s)];
  std::swap(lay, z.lay);
  std::swap(acts, z.acts), std::swap(grad_out, z.grad_out), std::swap(out, z.out);
  std::swap(X, z.X), std::swap(mtp_in, z.mtp_in), std::swap(mtp_out, z.mtp_out);
  std::swap(head, z.head), std::swap(mtp_head, z.mtp_head), std::swap(mtp_input, z.mtp_input);
  std::swap(dx_in, z.dx_in), std::swap(forward_done, z.forward_done);
  for (int64_t l = l0; l < l1; ++l) swap_saved(*blocks[size_t(l)], z.blocks[size_t(l)]);
  if (mtp_block) swap_saved(*mtp_block, z.mtp);
}

namespace {
// Swaps a slot in for one call and back out at the end (also on an exception).
struct SlotScope {
  GpuModel::Impl& m;
  int s;
  SlotScope(GpuModel::Impl& m_, int s_) : m(m_), s(s_) {
    m.swap_slot(s);
    m.program_slot = s;
  }
  ~SlotScope() {
    m.swap_slot(s);
    m.program_slot = int64_t(m.slots.size());
  }
};

int slot_of(const GpuModel::Impl& m, int64_t micro) {
  TREX_CHECK(micro >= 0, "GPU model: micro-batch {} must be >= 0", micro);
  return int(micro % int64_t(m.slots.size()));
}
}  // namespace

void GpuModel::begin_step(int64_t step_targets, int64_t step_mtp_targets, int64_t step_micro_batches,
                          int64_t reduce_micro) {
  TREX_CHECK(step_targets >= 0, "GPU model: step targets {} must be >= 0", step_targets);
  TREX_CHECK(step_micro_batches >= 0, "GPU model: step micro-batches {} must be >= 0", step_micro_batches);
  TREX_CHECK(reduce_micro >= -1, "GPU model: begin_step reduce_micro {} must be >= -1", reduce_micro);
  impl_->step_micro_batches = step_micro_batches;
  impl_->reduce_micro = reduce_micro;
  TREX_CHECK(!impl_->mtp() || step_mtp_targets >= 0,
             "GPU model: with the MTP module begin_step needs the step's MTP targets (got {})", step_mtp_targets);
  impl_->step_mode = true;
  impl_->global_targets = step_targets;
  impl_->global_mtp_targets = step_mtp_targets;
}

double GpuModel::forward_stage(int64_t micro, const int32_t* ids, const int32_t* labels,
                               const dsv4::SeqLayout& layout, const void* x_in) {
  Impl& m = *impl_;
  TREX_CHECK(m.step_mode, "GPU model: forward_stage before begin_step");
  activation_arena_plan(m);  // lays the arena out when no micro-batch is in flight and the last step overflowed
  SlotScope scope(m, slot_of(m, micro));
  TREX_CHECK(!m.forward_done, "GPU model stage [{}, {}): micro-batch {} reuses slot {} whose backward has not run "
             "(more micro-batches in flight than stage_slots = {})", m.l0, m.l1, micro, slot_of(m, micro),
             m.slots.size());
  return forward_impl(ids, labels, layout, nullptr, x_in, HeadMode::LossAndGrad);
}

const void* GpuModel::stage_output(int64_t micro) const {
  const Impl& m = *impl_;
  const Impl::Slot& z = m.slots[size_t(slot_of(m, micro))];
  TREX_CHECK(!m.last_stage() && z.forward_done && !z.X.empty() && z.X[size_t(m.l1)],
             "GPU model stage [{}, {}): no stage output for micro-batch {}", m.l0, m.l1, micro);
  return z.X[size_t(m.l1)];
}

void GpuModel::backward_stage(int64_t micro, const float* dx_out) {
  Impl& m = *impl_;
  SlotScope scope(m, slot_of(m, micro));
  TREX_CHECK(m.forward_done, "GPU model stage [{}, {}): backward of micro-batch {} without its forward", m.l0, m.l1,
             micro);
  m.grad_out.clear();
  m.dx_in = nullptr;
  m.reduce_this_backward = m.reduce_micro < 0 || micro == m.reduce_micro;
  try {
    backward_impl(dx_out);
  } catch (...) {
    m.reduce_this_backward = true;
    throw;
  }
  m.reduce_this_backward = true;
  m.forward_done = false;
  m.acts.clear(), m.out.clear();  // the slot's activations (and its sent output) are no longer needed
  for (int64_t l = m.l0; l < m.l1; ++l) m.blocks[size_t(l)]->keep.clear(), m.blocks[size_t(l)]->redo.clear();
  if (m.mtp_block) m.mtp_block->keep.clear(), m.mtp_block->redo.clear();
}

GpuModel::ActivationBytes GpuModel::activation_bytes() const {
  const Impl& m = *impl_;
  ActivationBytes a;
  // The live batch state and every parked pipeline slot's.
  a.kept = m.acts.bytes() + m.out.bytes();
  for (int64_t l = m.l0; l < m.l1; ++l) {
    const GpuBlock& b = *m.blocks[size_t(l)];
    a.kept += b.keep.bytes() + b.redo.bytes() + b.picks.bytes();
  }
  if (m.mtp_block) a.kept += m.mtp_block->keep.bytes() + m.mtp_block->redo.bytes() + m.mtp_block->picks.bytes();
  for (const Impl::Slot& z : m.slots) {
    a.kept += z.acts.bytes() + z.out.bytes();
    for (int64_t l = m.l0; l < m.l1; ++l) {
      const BlockSaved& b = z.blocks[size_t(l)];
      a.kept += b.keep.bytes() + b.redo.bytes() + b.picks.bytes();
    }
    a.kept += z.mtp.keep.bytes() + z.mtp.redo.bytes() + z.mtp.picks.bytes();
  }
  a.block_peak = m.act_block_peak;
  return a;
}

GpuModel::GatherTimes GpuModel::weight_gather_times() {
  GatherTimes g;
  if (!impl_->wgather) return g;
  const WeightGather::Times t = impl_->wgather->times();
  g.total_ms = t.total_ms, g.exposed_ms = t.exposed_ms, g.gathers = t.gathers;
  return g;
}

GpuModel::ArenaInfo GpuModel::activation_arena() const {
  ArenaInfo a;
  if (const ActivationArena* r = impl_->arena.get()) {
    a.bytes = r->bytes(), a.plans = r->plans, a.packed = r->packed;
    a.sum_of_peaks = r->sum_of_peaks(), a.peak_live = r->clock->last_step_peak;
    a.planned_peak_live = r->planned_peak_live;
  }
  return a;
}

ActivationPlan GpuModel::activation_plan(const dsv4::SeqLayout& layout) const {
  const Impl& m = *impl_;
  ActivationPlanShape s;
  s.layer_begin = m.l0, s.layer_end = m.l1, s.mtp = m.mtp(), s.recompute = m.opts.recompute;
  s.recompute_full_layers = m.opts.recompute_full_layers;
  s.ep = m.opts.ep ? m.opts.ep->size() : 1;
  s.head_grad = true;  // a training forward (HeadMode::LossAndGrad)
  s.balance = m.opts.balance_alpha != 0.0;
  s.balance_hash_layers = m.opts.balance_hash_layers;
  s.tp = m.tp_size;
  s.etp = m.tp_experts == dsv4::TpExperts::Split ? m.tp_size : 1;
  return plan_activations(m.cfg, layout, s);
}

const float* GpuModel::stage_input_grad(int64_t micro) const {
  const Impl& m = *impl_;
  const Impl::Slot& z = m.slots[size_t(slot_of(m, micro))];
  TREX_CHECK(!m.first_stage() && z.dx_in, "GPU model stage [{}, {}): no input gradient for micro-batch {}", m.l0,
             m.l1, micro);
  return z.dx_in;
}

int64_t GpuModel::layer_begin() const { return impl_->l0; }
int64_t GpuModel::layer_end() const { return impl_->l1; }
int64_t GpuModel::stream_elems(const dsv4::SeqLayout& layout) const {
  return layout.B * layout.T * impl_->cfg.hc_mult * impl_->cfg.hidden;
}

std::vector<float> GpuModel::final_normed() const {
  const Impl& m = *impl_;
  std::vector<bf16> v(size_t(m.lay.N * m.cfg.hidden));
  TREX_CHECK(m.head.normed, "GPU model: final_normed() needs a forward of the head stage");
  TREX_CUDA(cudaMemcpy(v.data(), m.head.normed, v.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = __bfloat162float(v[i]);
  return f;
}

std::vector<int64_t> GpuModel::csa_selection(int64_t l) const {
  const Impl& m = *impl_;
  TREX_CHECK(l >= 0 && l < m.cfg.n_layers && m.blocks[size_t(l)] &&
                 m.blocks[size_t(l)]->dims.type == dsv4::AttnType::CSA,
             "GPU model: layer {} is not a CSA layer", l);
  std::vector<int64_t> v(size_t(m.lay.N * m.cfg.index_topk));
  TREX_CUDA(cudaMemcpy(v.data(), m.blocks[size_t(l)]->at.sel, v.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<int32_t> GpuModel::router_selection(int64_t l) const {
  const Impl& m = *impl_;
  const bool mtp = l == m.cfg.n_layers && m.mtp_block;
  TREX_CHECK(mtp || (l >= 0 && l < m.cfg.n_layers && m.blocks[size_t(l)]), "GPU model: no layer {} (on this stage)",
             l);
  const GpuBlock& b = mtp ? *m.mtp_block : *m.blocks[size_t(l)];
  std::vector<int32_t> v(size_t(m.lay.N * m.cfg.topk));
  TREX_CUDA(cudaMemcpy(v.data(), b.mo.sel, v.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return v;
}

void GpuModel::set_mtp_weight(double w) { impl_->opts.mtp_weight = w; }

std::map<std::string, double> GpuModel::section_ms() {
  Impl& m = *impl_;
  TREX_CUDA(cudaDeviceSynchronize());
  for (auto& s : m.done_sections) {
    float ms = 0.f;
    TREX_CUDA(cudaEventElapsedTime(&ms, s.start, s.stop));
    m.section_totals[s.name] += ms;
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.stop);
  }
  m.done_sections.clear();
  return m.section_totals;
}

void GpuModel::reset_sections() {
  section_ms();
  impl_->section_totals.clear();
  exposed_comm_ms();
  impl_->exposed_ms = 0;
}

}  // namespace trex::dsv4gpu
