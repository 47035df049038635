#include "train/cuda/gpu_step_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace trex::train {

GpuLayout parse_gpu_layout(const std::string& text) {
  GpuLayout l;
  l.text = text.empty() ? "single" : text;
  if (text.empty()) return l;
  std::string spec_text;
  for (size_t i = 0; i <= text.size();) {  // micro_batches=M and stage_layers=a+b are the pipeline's, the rest the mesh's
    const size_t j = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, j - i);
    if (item.rfind("micro_batches=", 0) == 0) {
      l.micro_batches = std::stoll(item.substr(14));
    } else if (item.rfind("stage_layers=", 0) == 0) {
      const std::string v = item.substr(13);
      for (size_t k = 0; k < v.size();) {
        const size_t e = std::min(v.find('+', k), v.size());
        l.stage_layers.push_back(std::stoll(v.substr(k, e - k)));
        k = e + 1;
      }
    } else if (!item.empty()) {
      spec_text += (spec_text.empty() ? "" : ",") + item;
    }
    i = j + 1;
  }
  l.mesh = parallel::parse_mesh_spec(spec_text);
  TREX_CHECK(l.mesh.vpp == 1, "GPU layout {}: interleaved stages (vpp) are not implemented on the GPU", text);
  if (l.mesh.pp > 1)
    TREX_CHECK(l.mesh.dp == 1 && l.mesh.ep == 1, "GPU layout {}: pipeline parallelism combines with no dp / ep yet",
               text);
  if (l.mesh.ep > 1 && l.mesh.dp < l.mesh.ep) l.mesh.dp = l.mesh.ep;  // "ep=2" alone: EP folded into DP=2
  return l;
}

GpuStepEngine::GpuStepEngine(const dsv4::ModelConfig& cfg, const GpuLayout& layout, dsv4gpu::GpuModelOptions mo,
                             double comm_timeout_s)
    : layout_(layout), mo_(mo) {
  const int P = layout_.mesh.pp;
  if (P > 1) {
    const int64_t M = layout_.micro_batches;
    TREX_CHECK(M >= 1, "GPU layout {}: micro_batches {} must be at least 1", layout_.text, M);
    world_ = comm::make_nccl_world_communicator(comm_timeout_s);
    const int r = world_->rank();
    TREX_CHECK(world_->size() == P, "rank {}: layout {} needs {} processes (pp only), got {}", r, layout_.text, P,
               world_->size());
    // Layer split: stage_layers, else as even as possible (earlier stages get the remainder: the last one has the
    // head).
    counts_ = layout_.stage_layers;
    if (counts_.empty())
      for (int i = 0; i < P; ++i) counts_.push_back(cfg.n_layers / P + (i < cfg.n_layers % P ? 1 : 0));
    int64_t sum = 0;
    for (int64_t c : counts_) sum += c;
    TREX_CHECK(int(counts_.size()) == P && sum == cfg.n_layers,
               "rank {}: stage_layers must give {} stages summing to {} layers", r, P, cfg.n_layers);
    TREX_CHECK(counts_[size_t(r)] >= 1, "rank {}: stage {} has no layers", r, r);
    int64_t l0 = 0;
    for (int i = 0; i < r; ++i) l0 += counts_[size_t(i)];
    mo_.layer_begin = l0, mo_.layer_end = l0 + counts_[size_t(r)];
    // 1F1B needs P - r slots; a second one on the last stages decouples a backward from the previous input-gradient
    // send (its buffer lives in the slot) at no activation cost (slots are freed by their backward).
    mo_.stage_slots = std::max(P - r, 2);
    act_ = world_->split(0, r), grad_ = world_->split(0, r);
    if (cfg.n_mtp > 0) {  // the last stage's tied copy of embed.weight (GpuModelOptions::embed_group)
      const bool ends = r == 0 || r == P - 1;
      embed_ = world_->split(ends ? 0 : 1 + r, r);
      if (ends) mo_.embed_group = embed_.get();
    }
  } else if (!layout_.one_gpu()) {
    world_ = comm::make_nccl_world_communicator(comm_timeout_s);
    mesh_ = parallel::build_mesh(*world_, layout_.mesh, {int(cfg.n_layers), int(cfg.n_routed_experts)});
    // EP is folded into DP: dense gradients reduce over the DP group; the MoE sends each expert's tokens to its
    // owner over the EP group, and the owner's expert gradients are summed over the DP group like every other
    // gradient (every rank keeps all expert weights).
    mo_.dp = mesh_.dp_group.get();
    if (layout_.mesh.ep > 1) mo_.ep = mesh_.ep_group.get();
  }
  model_ = std::make_unique<dsv4gpu::GpuModel>(cfg, mo_);
  opt_ = std::make_unique<dsv4gpu::GpuOptimizer>(*model_);
  if (P > 1) pipe_ = std::make_unique<dsv4gpu::GpuPipeline>(*model_, *act_, *grad_, layout_.micro_batches);
}

GpuStepEngine::~GpuStepEngine() = default;

int GpuStepEngine::world_rank() const { return world_ ? world_->rank() : 0; }
int GpuStepEngine::world_size() const { return world_ ? world_->size() : 1; }
int GpuStepEngine::dp() const { return mo_.dp ? mo_.dp->size() : 1; }
int GpuStepEngine::dp_rank() const { return mo_.dp ? mo_.dp->rank() : 0; }

void GpuStepEngine::zero_grads() { model_->zero_grads(); }

double GpuStepEngine::forward_backward(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                                       const std::function<void()>& after_forward) {
  if (pipe_) {
    const double l = pipe_->step(ids, labels, layout);
    model_->sum_tied_embedding_grads();  // with MTP: the two embed.weight copies' gradients (no-op otherwise)
    return l;
  }
  const double loss = model_->forward(ids, labels, layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
  if (after_forward) after_forward();
  model_->backward();
  return loss;
}

void GpuStepEngine::timed_optimizer(const std::function<void()>& f, bool timed) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (timed) {
    TREX_CUDA(cudaEventCreate(&e0));
    TREX_CUDA(cudaEventCreate(&e1));
    TREX_CUDA(cudaEventRecord(e0, nullptr));
  }
  f();
  if (timed) {
    TREX_CUDA(cudaEventRecord(e1, nullptr));
    TREX_CUDA(cudaEventSynchronize(e1));  // after the step's last compute: costs nothing on the device
    float ms = 0.f;
    TREX_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    opt_ms_ += ms;
    cudaEventDestroy(e0), cudaEventDestroy(e1);
  }
}

void GpuStepEngine::optimizer_step(const optim::OptimizerConfig& c, double lr, int64_t step, float grad_scale,
                                   bool timed) {
  timed_optimizer([&] { opt_->step(c, lr, step, grad_scale); }, timed);
}

void GpuStepEngine::torch_adamw_step(const cuda::AdamWStep& a, bool timed) {
  timed_optimizer([&] { opt_->adamw_step(a); }, timed);
}

void GpuStepEngine::synchronize() { TREX_CUDA(cudaDeviceSynchronize()); }

void GpuStepEngine::barrier() {
  if (world_) world_->barrier();
}

static cudaMemPool_t default_pool() {
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  return pool;
}

int64_t GpuStepEngine::planned_activation_bytes(const dsv4::SeqLayout& micro_batch) const {
  const dsv4gpu::ActivationPlan plan = model_->activation_plan(micro_batch);
  int64_t in_flight = 1;
  if (layout_.mesh.pp > 1)
    in_flight = std::min<int64_t>(layout_.mesh.pp - world_->rank(), std::max<int64_t>(layout_.micro_batches, 1));
  return plan.kept() * in_flight + plan.block_scratch;
}

void GpuStepEngine::reset_peak_memory() {
  uint64_t zero = 0;
  TREX_CUDA(cudaMemPoolSetAttribute(default_pool(), cudaMemPoolAttrUsedMemHigh, &zero));
}

uint64_t GpuStepEngine::peak_memory_bytes() const {
  uint64_t used_high = 0;
  TREX_CUDA(cudaMemPoolGetAttribute(default_pool(), cudaMemPoolAttrUsedMemHigh, &used_high));
  return used_high;
}

uint64_t GpuStepEngine::device_used_bytes() const {
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return uint64_t(total_b - free_b);
}

void GpuStepEngine::reset_stats() {
  opt_ms_ = 0;
  if (pipe_) pipe_->reset_stats();
  model_->reset_sections();
}

dsv4gpu::PipelineStats GpuStepEngine::pipeline_stats() {
  TREX_CHECK(pipe_, "GPU layout {}: pipeline statistics without a pipeline", layout_.text);
  return pipe_->stats();
}

std::vector<double> GpuStepEngine::global_losses(const std::vector<double>& local) {
  return pipe_ ? pipe_->global_losses(local) : local;
}

double GpuStepEngine::boundary_transfer_ms(const dsv4::SeqLayout& layout) {
  TREX_CHECK(pipe_, "GPU layout {}: a boundary transfer without a pipeline", layout_.text);
  const int r = world_->rank();
  const size_t bytes = size_t(model_->stream_elems(layout)) * 2;
  void* buf = nullptr;
  TREX_CUDA(cudaMalloc(&buf, bytes));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    world_->barrier();
    const auto x0 = std::chrono::steady_clock::now();
    if (r == 0) act_->send(buf, bytes, 1, 0)->wait();
    if (r == 1) act_->recv(buf, bytes, 0, 0)->wait();
    TREX_CUDA(cudaDeviceSynchronize());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - x0).count() * 1e3);
  }
  TREX_CUDA(cudaFree(buf));
  return best;
}

std::vector<double> GpuStepEngine::all_gather(const std::vector<double>& mine) {
  if (!world_) return mine;
  const size_t K = mine.size(), R = size_t(world_->size());
  double *dm = nullptr, *da = nullptr;  // NCCL collectives take device buffers
  TREX_CUDA(cudaMalloc(&dm, K * 8));
  TREX_CUDA(cudaMalloc(&da, K * 8 * R));
  TREX_CUDA(cudaMemcpy(dm, mine.data(), K * 8, cudaMemcpyHostToDevice));
  world_->all_gather(dm, da, K, comm::ElemType::F64)->wait();
  std::vector<double> all(K * R);
  TREX_CUDA(cudaDeviceSynchronize());
  TREX_CUDA(cudaMemcpy(all.data(), da, all.size() * 8, cudaMemcpyDeviceToHost));
  TREX_CUDA(cudaFree(dm));
  TREX_CUDA(cudaFree(da));
  return all;
}

}  // namespace trex::train
