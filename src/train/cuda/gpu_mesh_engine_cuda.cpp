#include "train/cuda/gpu_mesh_engine.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <set>

#include "comm/launch_env.h"
#include "comm/nccl_communicator.h"
#include "comm/thread_group.h"
#include "core/error.h"
#include "core/log.h"
#include "data/chat.h"
#include "kernels/cuda/cuda_check.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/loss.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/param_table.h"
#include "optim/param_groups.h"
#include "parallel/mesh.h"
#include "parallel/rank_partition.h"
#include "train/cuda/gpu_mesh_pipeline.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/rank_memory.h"
#include "train/cuda/staged_communicator.h"
#include "train/gpu_mesh_config.h"
#include "train/sharded_checkpoint.h"
#include "train/trainer.h"

namespace trex::train {

namespace fs = std::filesystem;

namespace {

struct Entry {  // a checkpointed tensor: name, shape, optimiser group; the routed expert (-1: dense)
  std::string name;
  Shape shape;
  optim::ParamGroup group;
  int64_t expert = -1;
  bool held = true;  // in this rank's partition (every dense tensor; under ep only the rank's own experts)
  int chunk = 0;     // interleaved stages (vpp > 1): the rank's model chunk holding it
};

}  // namespace

struct GpuMeshEngine::State {
  TrainConfig cfg;
  dsv4::ModelConfig mc;
  Dsv4TrainOptions o;
  comm::Communicator& world;
  std::unique_ptr<comm::Communicator> host;  // host-buffer collectives over `world`
  parallel::Mesh mesh;
  int D = 1;
  // pp > 1 with MTP: the first and the last stage's ranks of this rank's DP / TP coordinates (the tied embedding's
  // gradient sum); a group of one on the middle stages.
  std::unique_ptr<comm::Communicator> embed_group;
  std::unique_ptr<dsv4gpu::GpuModel> gpu;  // chunk 0 (the only one with vpp = 1)
  std::unique_ptr<dsv4gpu::GpuOptimizer> opt;
  // Interleaved stages (vpp > 1): chunks 1 .. vpp-1 of this rank (virtual stages c pp + pp_rank), each its own
  // GpuModel with its optimiser, on the stage's DP / EP groups.
  std::vector<std::unique_ptr<dsv4gpu::GpuModel>> more;
  std::vector<std::unique_ptr<dsv4gpu::GpuOptimizer>> more_opt;
  int n_chunks() const { return 1 + int(more.size()); }
  dsv4gpu::GpuModel& chunk(int c) const { return c == 0 ? *gpu : *more[size_t(c - 1)]; }
  dsv4gpu::GpuOptimizer& chunk_opt(int c) const { return c == 0 ? *opt : *more_opt[size_t(c - 1)]; }
  std::unique_ptr<GpuMeshPipeline> pipe;  // pp > 1: this rank's stage in the pipeline (gpu_mesh_pipeline.h)
  std::vector<Entry> params, buffers;
  std::vector<std::vector<int64_t>> load_sum;  // per block (the MTP block last), this rank's step so far
  float* acc = nullptr;                        // D > 1, M > 1: the reduced shard held between backwards
  float pending_scale = 1.f;                   // applied by the next optimiser step (1 / M, clipping)
  int64_t steps = 0;
  double exposed_ms_seen = 0;  // GpuModel::exposed_comm_ms() at the last step's report (it accumulates)
  double gather_ms_seen = 0, gather_exposed_ms_seen = 0;  // GpuModel::weight_gather_times(), the same way
  bool mtp = false;  // the MTP module trained (model.use_mtp and the config has it)

  State(const TrainConfig& c, const dsv4::ModelConfig& m, const Dsv4TrainOptions& opts, comm::Communicator& w)
      : cfg(c), mc(m), o(opts), world(w) {}
  ~State() {
    if (acc) cudaFree(acc);
  }
  std::string who() const { return fmt::format("{}: device cuda (rank {} of {})", cfg.where, world.rank(), world.size()); }

  // "layers.L.ffn.gate.bias" -> L; the MTP block's "mtp.0.ffn.gate.bias" -> n_layers (as the CPU's blocks).
  int64_t layer_of(const std::string& name) const {
    if (name.rfind("mtp.0.", 0) == 0) return mc.n_layers;
    int64_t l = -1;
    TREX_CHECK(std::sscanf(name.c_str(), "layers.%ld.", &l) == 1 && l >= 0 && l < mc.n_layers,
               "{}: unexpected router bias '{}'", who(), name);
    return l;
  }
  void add_loads(int64_t n_tok, int64_t micro, int c = 0) {
    std::vector<int64_t> load(size_t(mc.n_routed_experts));
    for (const Entry& b : buffers) {
      if (b.chunk != c) continue;  // another chunk's layer (its forward adds it)
      const int64_t l = layer_of(b.name);
      const std::vector<int32_t> sel =
          D > 1 || pipe ? chunk(c).stage_router_selection(micro, l) : gpu->router_selection(l);
      dsv4::moe_expert_load(sel.data(), n_tok, mc.topk, mc.n_routed_experts, load.data());
      for (size_t e = 0; e < load.size(); ++e) load_sum[size_t(l)][e] += load[e];
    }
  }
  // The MTP head's labelled targets of a micro-batch (token t + 2 within t's document, dsv4::shifted_targets).
  int64_t mtp_targets(const data::Batch& b, const dsv4::SeqLayout& layout) const {
    const std::vector<int32_t> t =
        dsv4::shifted_targets(b.labels.data(), layout.doc_start.data(), b.batch, b.seq, 2, mc.vocab_size);
    return int64_t(std::count_if(t.begin(), t.end(), [](int32_t x) { return x >= 0; }));
  }
  // The optimiser state names of one parameter (optim::Optimizer::state_tensors) and the GPU moment of each: none
  // for a frozen one (the CPU optimiser keeps no state for it either).
  std::vector<std::pair<std::string, int>> state_names(const Entry& p) const {
    if (p.group == optim::ParamGroup::Frozen) return {};
    if (cfg.optimizer.kind == "muon" && p.group == optim::ParamGroup::Muon) return {{".momentum", 0}};
    return {{".exp_avg", 0}, {".exp_avg_sq", 1}};
  }
};

namespace {

// pp = 1, dp > 1, several micro-batches per DP rank, ZeRO-1: the reduced shard is kept aside between backwards (ZeRO-2
// and -3 accumulate in their gradient shard).
bool holds_accumulation_shard(const TrainConfig& cfg, const parallel::MeshSpec& spec) {
  return spec.pp == 1 && spec.dp > 1 && cfg.grad_accum / spec.dp > 1 && cfg.parallel.zero == 1;
}

// Refuses the layout before anything is allocated when this rank's count (rank_memory.h: its partition of the
// layout, micro-batches of data.batch_size sequences of data.seq_len tokens) exceeds train.device_memory_gib, or the
// ranks on its device together exceed what the device has free. Collective over the world.
void check_rank_memory(GpuMeshEngine::State& s, const parallel::MeshSpec& spec, const dsv4::ModelConfig& gpu_cfg,
                       const dsv4gpu::GpuModelOptions& base) {
  const TrainConfig& cfg = s.cfg;
  const parallel::RankPartition p = parallel::rank_partition(spec, s.world.rank(), gpu_cfg,
                                                             cfg.grad_accum * cfg.batch_size, cfg.batch_size,
                                                             cfg.parallel.pad_layers);
  RankMemory m = count_rank_memory(gpu_cfg, p, cfg.seq_len, base);
  if (holds_accumulation_shard(cfg, spec)) m.accumulation = 4 * m.params.shard_elems;
  const std::string layout = fmt::format(
      "layout pp={}{} dp={} ep={} tp={}{}, ZeRO-{}, recompute {}, micro-batches of {} x {} tokens", spec.pp,
      spec.vpp > 1 ? fmt::format(" vpp={}", spec.vpp) : "", spec.dp, spec.ep, spec.tp,
      spec.etp > 1 ? fmt::format(" etp={}", spec.etp) : "", cfg.parallel.zero, dsv4::to_string(base.recompute),
      cfg.batch_size, cfg.seq_len);
  // Without model.init_from every rank first builds the host model's seeded init (Dsv4Trainable: the whole model's
  // fp32 values and gradients) and copies its part over.
  int64_t host_need = 0;
  if (!cfg.model.contains("init_from"))
    for (const dsv4::ParamSpec& t : dsv4::param_table(gpu_cfg)) host_need += 8 * numel(t.shape);
  check_device_memory(*s.host, claim_device_memory(m.total(), cfg.device_memory_gib, host_need),
                      fmt::format("{}, {}", s.who(), layout),
                      m.describe() + ". recompute: full or selective, a smaller data.batch_size, more pipeline stages, a "
                      "larger ep or parallel.zero 2 / 3 shrink it");
}

}  // namespace

GpuMeshEngine::GpuMeshEngine(const TrainConfig& cfg, const dsv4::ModelConfig& mc_in, const Dsv4TrainOptions& o,
                             comm::Communicator& world)
    : s_(std::make_unique<State>(cfg, mc_in, o, world)) {
  State& s = *s_;
  const std::string why = check_gpu_mesh_config(cfg, world.size());
  TREX_CHECK(why.empty(), "{}: {}", s.who(), why);
  dsv4::ModelConfig gpu_cfg = s.mc;
  if (!o.model.use_mtp) gpu_cfg.n_mtp = 0;  // the host model declares no MTP tensors either
  s.mtp = gpu_cfg.n_mtp > 0;
  parallel::MeshSpec spec = cfg.parallel.present ? cfg.parallel.mesh : parallel::MeshSpec{1, world.size(), 1, 1};
  // Before anything is allocated: ep must divide dp and the routed experts (with the numbers).
  const std::string bad = parallel::check_mesh(spec, world.size(), {int(s.mc.n_layers), int(s.mc.n_routed_experts)});
  TREX_CHECK(bad.empty(), "{}: impossible parallel layout: {}", s.who(), bad);
  TREX_CHECK(cfg.grad_accum % spec.dp == 0, "{}: grad_accum {} is not a multiple of dp={}", s.who(), cfg.grad_accum,
             spec.dp);
  s.host = make_staged_communicator(world);

  // The options every chunk shares; the groups join them once the mesh is built.
  dsv4gpu::GpuModelOptions go;
  go.balance_alpha = o.model.balance_alpha;  // under dp: each micro-batch's share (its sequences are this rank's)
  go.balance_hash_layers = o.model.balance_hash_layers;
  go.deterministic = o.deterministic;
  go.mtp_weight = o.model.mtp_weight;  // then the schedule's, step by step (begin_step)
  go.recompute = o.recompute;
  go.recompute_full_layers = o.recompute_full_layers;
  go.zero = cfg.parallel.zero;  // 1 (default), 2 or 3, with AdamW or Muon, with tp too
  go.grad_reduce_bf16 = cfg.parallel.grad_reduce_dtype == "bf16";
  // Before anything is allocated (the mesh's communicators included): this rank's count against its device, and
  // the counts of the ranks sharing a device against its free memory (rank_memory.h).
  check_rank_memory(s, spec, gpu_cfg, go);

  s.mesh = parallel::build_mesh(world, spec, {int(s.mc.n_layers), int(s.mc.n_routed_experts)});
  s.D = s.mesh.spec.dp;
  if (s.D > 1) go.dp = s.mesh.dp_group.get();
  if (s.mesh.spec.ep > 1) go.ep = s.mesh.ep_group.get();
  // Tensor parallel inside the stage: the model splits heads and the shared expert over the TP group; set_shard /
  // gather_shard / load_from take and give the official tensors, so the checkpoints below are the unsplit ones.
  if (s.mesh.spec.tp > 1) go.tp = s.mesh.tp_group.get();
  go.expert_tp = s.mesh.spec.etp > 1;  // parallel.etp = tp: the routed experts split over the TP group too
  // This rank's layers only: its stage, or with vpp > 1 its chunks (each a GpuModel on the stage's groups).
  std::vector<dsv4gpu::GpuModelOptions> chunk_opts{go};
  if (s.mesh.spec.pp > 1)
    chunk_opts = gpu_stage_chunks(go, s.mc, s.mesh, cfg.parallel.pad_layers, cfg.grad_accum / s.D);
  if (s.mesh.spec.pp > 1 && s.mtp) {
    // The MTP module runs on the last (virtual) stage with its own copy of embed.weight; the copies' gradients are
    // summed over {first stage, last stage} of the same DP / EP / TP coordinates (Megatron's embedding group), so
    // both take the same update. Collective over the world (every rank splits; a middle stage gets a group of
    // one). With vpp > 1 the embedding is on rank 0's chunk 0 and the copy on the last rank's last chunk.
    const int P = s.mesh.spec.pp, coord = s.mesh.dp_rank * s.mesh.spec.tp + s.mesh.tp_rank;
    const bool ends = s.mesh.pp_rank == 0 || s.mesh.pp_rank == P - 1;
    const int colour = ends ? coord : s.D * s.mesh.spec.tp + world.rank();
    s.embed_group = world.split(colour, s.mesh.pp_rank);
    if (ends)
      for (auto& o : chunk_opts)
        if ((s.mesh.pp_rank == 0 && o.layer_begin == 0) || (s.mesh.pp_rank == P - 1 && o.layer_end == s.mc.n_layers))
          o.embed_group = s.embed_group.get();
  }
  s.gpu = std::make_unique<dsv4gpu::GpuModel>(gpu_cfg, chunk_opts[0]);
  s.opt = std::make_unique<dsv4gpu::GpuOptimizer>(*s.gpu);
  for (size_t c = 1; c < chunk_opts.size(); ++c) {
    s.more.push_back(std::make_unique<dsv4gpu::GpuModel>(gpu_cfg, chunk_opts[c]));
    s.more_opt.push_back(std::make_unique<dsv4gpu::GpuOptimizer>(*s.more.back()));
  }
  // Every trained tensor of the model (the parameter table's order, the same on every rank) and the router
  // biases, with the freeze list applied as the CPU trainer applies it (optim::apply_freeze: a pattern matching
  // nothing is an error; buffers stay buffers), each marked with whether this rank holds it: under ep a rank holds
  // its own experts only.
  std::map<std::string, int> mine;  // name -> the chunk holding it
  for (int c = 0; c < s.n_chunks(); ++c)
    for (const auto& n : s.chunk(c).param_names()) mine[n] = c;
  std::vector<optim::ParamRef> refs;
  std::vector<int64_t> expert_of;
  for (const dsv4::ParamSpec& t : dsv4::param_table(gpu_cfg))
    if (t.trained()) {
      refs.push_back({t.name, t.shape, nullptr, nullptr, optim::dsv4_param_group(t.name, t.shape)});
      expert_of.push_back(t.expert);
    }
  TREX_CHECK(int64_t(mine.size()) ==
                 int64_t(std::count_if(refs.begin(), refs.end(), [&](const auto& r) { return mine.count(r.name); })),
             "{}: the GPU model holds tensors outside the parameter table", s.who());
  std::map<std::string, int> bias_chunk;
  for (int c = 0; c < s.n_chunks(); ++c)
    for (const auto& n : s.chunk(c).router_bias_names()) {
      refs.push_back({n, {s.mc.n_routed_experts}, nullptr, nullptr, optim::ParamGroup::Buffer});
      bias_chunk[n] = c;
    }
  try {
    optim::apply_freeze(refs, cfg.freeze);
  } catch (const Error& e) {
    fail("{}: freeze: {}", s.who(), e.what());
  }
  std::vector<std::vector<std::string>> frozen(size_t(s.n_chunks()));
  for (size_t i = 0; i < refs.size(); ++i) {
    const optim::ParamRef& r = refs[i];
    if (r.group == optim::ParamGroup::Buffer) {
      s.buffers.push_back({r.name, r.shape, r.group, -1, true, bias_chunk.at(r.name)});
      continue;
    }
    const auto at = mine.find(r.name);
    const bool held = at != mine.end();
    const int c = held ? at->second : 0;
    s.params.push_back({r.name, r.shape, r.group, expert_of[i], held, c});
    if (r.group == optim::ParamGroup::Frozen && held) frozen[size_t(c)].push_back(r.name);
  }
  for (int c = 0; c < s.n_chunks(); ++c) s.chunk_opt(c).set_frozen(frozen[size_t(c)]);

  const bool lead_rank = world.rank() == 0;
  if (cfg.model.contains("init_from")) {
    // Straight from the checkpoint files to this rank's shard, one tensor at a time (no host model).
    const fs::path dir = cfg.model["init_from"].get<std::string>();
    const dsv4::CheckpointReader reader(dir);
    dsv4gpu::GpuModel::LoadStats st = s.gpu->load_checkpoint(reader);
    for (auto& m : s.more) {  // each chunk its own tensors
      const dsv4gpu::GpuModel::LoadStats c = m->load_checkpoint(reader);
      st.tensors += c.tensors, st.bytes += c.bytes, st.seconds += c.seconds;
      st.largest_tensor_bytes = std::max(st.largest_tensor_bytes, c.largest_tensor_bytes);
    }
    if (lead_rank)
      log::info("init_from {}: {} tensors of this rank, {:.2f} GB read ({:.2f} GB fp32 on the GPU) in {:.2f} s, "
                "{:.2f} GB/s read; host high-water {:.1f} MB (staging)",
                dir.string(), st.tensors, double(st.stored_bytes) / 1e9, double(st.bytes) / 1e9, st.seconds,
                double(st.stored_bytes) / 1e9 / std::max(st.seconds, 1e-9), double(st.host_peak_bytes) / 1e6);
  } else {
    // The host model's seeded init (design §5), so the run starts where one process and the CPU start.
    Dsv4Trainable init(s.mc, o, cfg.seed);
    for (int c = 0; c < s.n_chunks(); ++c) s.chunk(c).load_from(init.model().params());
  }
  if (cfg.model.contains("init_from_run")) {
    const fs::path run_dir = cfg.model["init_from_run"].get<std::string>();
    auto last = latest_checkpoint(run_dir / "checkpoints");
    TREX_CHECK(last.has_value(), "{}: init_from_run: no checkpoint in {}", s.who(), (run_dir / "checkpoints").string());
    const auto t0 = std::chrono::steady_clock::now();
    const CheckpointReader r(*last);
    std::vector<float> buf;
    for (const Entry& p : s.params) {
      if (!p.held) continue;  // another expert-parallel rank's expert: never read here
      buf.assign(size_t(numel(p.shape)), 0.f);
      r.read_param(p.name, p.shape, buf.data());
      s.chunk(p.chunk).set_shard(p.name, buf);
    }
    for (const Entry& b : s.buffers) {
      buf.assign(size_t(numel(b.shape)), 0.f);
      r.read_param(b.name, b.shape, buf.data());
      s.chunk(b.chunk).set_router_bias(b.name, buf);
    }
    if (lead_rank)
      log::info("initialised from {} in {:.2f} s", last->string(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  s.load_sum.assign(size_t(s.mc.n_layers + 1), std::vector<int64_t>(size_t(s.mc.n_routed_experts), 0));
  if (s.mesh.spec.pp > 1) {
    std::vector<dsv4gpu::GpuModel*> chunks;
    for (int c = 0; c < s.n_chunks(); ++c) chunks.push_back(&s.chunk(c));
    s.pipe = std::make_unique<GpuMeshPipeline>(std::move(chunks), s.mesh, world, cfg.grad_accum / s.D);
  }
  else if (holds_accumulation_shard(s.cfg, s.mesh.spec))
    TREX_CUDA(cudaMalloc(&s.acc, size_t(s.gpu->shard_elems()) * sizeof(float)));
}

GpuMeshEngine::~GpuMeshEngine() = default;

std::string GpuMeshEngine::describe() const {
  const State& s = *s_;
  int64_t n = 0;  // the whole model's, whatever this rank holds
  for (const Entry& p : s.params) n += numel(p.shape);
  return fmt::format("DeepSeek-V4 on CUDA (hidden {}, {} layers, {} experts top-{}, vocab {}, {} parameters): GPU "
                     "mesh pp={}{} dp={} ep={} tp={}{}, {} micro-batches per DP rank",
                     s.mc.hidden, s.mc.n_layers, s.mc.n_routed_experts, s.mc.topk, s.mc.vocab_size, n,
                     s.mesh.spec.pp, s.mesh.spec.vpp > 1 ? fmt::format(" vpp={}", s.mesh.spec.vpp) : std::string(),
                     s.D, s.mesh.spec.ep, s.mesh.spec.tp,
                     s.D > 1 ? fmt::format(" (ZeRO-{}{})", s.cfg.parallel.zero,
                                           s.cfg.parallel.grad_reduce_dtype == "bf16" ? ", bf16 reduction" : "")
                             : std::string(),
                     s.cfg.grad_accum / s.D);
}

int64_t GpuMeshEngine::n_params() const {
  int64_t n = n_trained();
  for (const Entry& b : s_->buffers) n += numel(b.shape);
  return n;
}

int64_t GpuMeshEngine::n_trained() const {
  int64_t n = 0;
  for (const Entry& p : s_->params)
    if (p.group != optim::ParamGroup::Frozen) n += numel(p.shape);
  return n;
}

double GpuMeshEngine::flops_per_token(int64_t seq_len) const { return dsv4_flops_per_token(s_->mc, seq_len); }
int GpuMeshEngine::ranks() const { return s_->world.size(); }
bool GpuMeshEngine::lead() const { return s_->world.rank() == 0; }
comm::Communicator& GpuMeshEngine::host_world() { return *s_->host; }
void GpuMeshEngine::barrier() { s_->world.barrier(); }

void GpuMeshEngine::max_over_ranks(double* v, int n) {
  if (s_->world.size() > 1) s_->host->all_reduce(v, size_t(n), comm::ElemType::F64, comm::ReduceOp::Max)->wait();
}

bool GpuMeshEngine::runs_micro_batch(int64_t micro, int64_t n_micro) const {
  return micro / (n_micro / s_->D) == s_->mesh.dp_rank;
}

void GpuMeshEngine::begin_step(const StepControls& c) {
  State& s = *s_;
  for (int k = 0; k < s.n_chunks(); ++k) {
    s.chunk(k).set_mtp_weight(c.mtp_weight);  // the schedule's (Dsv4Trainable::set_controls)
    s.chunk(k).zero_grads();
  }
  for (auto& l : s.load_sum) std::fill(l.begin(), l.end(), 0);
  s.pending_scale = 1.f;
}

EngineStep GpuMeshEngine::forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) {
  State& s = *s_;
  const int64_t M = n_micro / s.D;
  TREX_CHECK(int64_t(mine.size()) == M, "{}: {} micro-batches for a DP share of {}", s.who(), mine.size(), M);
  double local = 0;
  int64_t targets = 0, tokens = 0;
  if (s.pipe) {  // 1F1B over the stages; the loss and the batch's counts from the last stage
    const bool loads = s.o.bias_update_speed != 0 && !s.buffers.empty();
    local = s.pipe->step_chunks(mine, n_micro, [&](int64_t k, int c) {
      if (loads) s.add_loads(mine[size_t(k)].batch * mine[size_t(k)].seq, k, c);
    });
    if (s.pipe->last_stage())
      for (const data::Batch& b : mine) targets += b.n_targets, tokens += b.batch * b.seq;
  }
  for (int64_t k = 0; k < (s.pipe ? 0 : M); ++k) {
    const data::Batch& b = mine[size_t(k)];
    const dsv4::SeqLayout layout = batch_layout(b);
    if (s.D == 1) {
      // The local engine's step: each micro-batch's mean loss, its gradient accumulated in the arena.
      local += s.gpu->forward(b.input_ids.data(), b.labels.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad) /
               double(n_micro);
      s.add_loads(layout.n_tokens(), k);
      s.gpu->backward();
    } else if (s.acc == nullptr && M > 1) {
      // ZeRO-2 (parallel.zero 2): every backward reduce-scatters its buckets and adds this rank's slices into the
      // gradient shard, so micro-batches accumulate there; region R (all-reduced in place) and the experts
      // (reduced over their replicas at the step's end) accumulate in place and are reduced once, in the last
      // micro-batch's backward (reduce_micro M - 1; one slot, so micro-batch k runs in slot 0 as above).
      s.gpu->begin_step(b.n_targets * n_micro, s.mtp ? s.mtp_targets(b, layout) * n_micro : -1, n_micro, M - 1);
      local += s.gpu->forward_stage(k, b.input_ids.data(), b.labels.data(), layout, nullptr);
      s.add_loads(layout.n_tokens(), k);
      s.gpu->backward_stage(k, nullptr);
    } else {
      if (k == 1) TREX_CUDA(cudaMemset(s.acc, 0, size_t(s.gpu->shard_elems()) * sizeof(float)));
      if (k >= 1) {  // the previous backward's reduced shard aside, then a clean arena (the head's gradient
        s.gpu->add_reduced_grads_to(s.acc);  // is accumulated by the forward)
        s.gpu->zero_grads();
      }
      // Normalisers: this micro-batch's targets (and MTP targets) x grad_accum, so the sum over ranks and
      // micro-batches is the gradient of the mean of the global batch's micro-batch means; its balance loss
      // weighs 1 / grad_accum likewise.
      s.gpu->begin_step(b.n_targets * n_micro, s.mtp ? s.mtp_targets(b, layout) * n_micro : -1, n_micro);
      local += s.gpu->forward_stage(0, b.input_ids.data(), b.labels.data(), layout, nullptr);
      s.add_loads(layout.n_tokens(), 0);
      s.gpu->backward_stage(0, nullptr);
    }
    targets += b.n_targets;
    tokens += b.batch * b.seq;
  }
  if (!s.pipe && s.D > 1 && M > 1 && s.acc) s.gpu->add_held_grads(s.acc);
  for (int c = 0; c < s.n_chunks(); ++c) {
    s.chunk(c).wait_grad_reductions();      // a skipped step's next zero_grads() must find them done
    s.chunk(c).sum_tied_embedding_grads();  // pp > 1 with MTP: the two embed.weight copies' gradients summed
  }
  if (s.D == 1 && !s.pipe) s.pending_scale = float(1.0 / double(n_micro));  // the pipeline's are normalised
  // The TP ranks of a DP rank ran the same micro-batches (the same loss): one of them counts them.
  if (s.mesh.tp_rank != 0) local = 0, targets = 0, tokens = 0;
  double red[3] = {local, double(targets), double(tokens)};
  if (s.world.size() > 1) s.host->all_reduce(red, 3, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  EngineStep r;
  r.loss = red[0];
  r.targets = int64_t(red[1]);
  r.tokens = int64_t(red[2]);
  if (s.pipe) {  // the slowest rank's, as the CPU mesh engine reports its pipeline
    const GpuMeshPipeline::StepTimes& t = s.pipe->last_times();
    r.slowest = {{"pipeline_wait_s", t.wait_s}, {"stage_forward_s", t.forward_s}, {"stage_backward_s", t.backward_s}};
    r.extra = {{"bubble_fraction", s.pipe->ideal_bubble_fraction()}};
  }
  if (s.D > 1) {
    // Exposed communication: how long the compute stream waited on the gradient reduce-scatters of this step's
    // backwards and the previous optimiser step's parameter all-gathers (the model's stall events; metrics report
    // the slowest rank's).
    double total_ms = 0;
    for (int c = 0; c < s.n_chunks(); ++c) total_ms += s.chunk(c).exposed_comm_ms();
    r.slowest.push_back({"exposed_comm_s", (total_ms - s.exposed_ms_seen) / 1e3});
    s.exposed_ms_seen = total_ms;
  }
  if (s.D > 1 && s.cfg.parallel.zero == 3) {
    // ZeRO-3's weight gathers (weight_gather.h): their own time this step and the part the compute stream waited
    // for (also inside exposed_comm_s); the rest ran under compute.
    double gather = 0, exposed = 0;
    for (int c = 0; c < s.n_chunks(); ++c) {
      const dsv4gpu::GpuModel::GatherTimes t = s.chunk(c).weight_gather_times();
      gather += t.total_ms, exposed += t.exposed_ms;
    }
    r.slowest.push_back({"zero3_gather_s", (gather - s.gather_ms_seen) / 1e3});
    r.slowest.push_back({"zero3_gather_exposed_s", (exposed - s.gather_exposed_ms_seen) / 1e3});
    s.gather_ms_seen = gather, s.gather_exposed_ms_seen = exposed;
  }
  return r;
}

double GpuMeshEngine::clip_gradients() {
  State& s = *s_;
  double sq = 0;  // the rank's chunks' squares (each chunk's DP norm)
  for (int c = 0; c < s.n_chunks(); ++c) {
    s.chunk_opt(c).zero_frozen_grads();  // the norm leaves frozen tensors out, as the CPU optimiser's
    const double n = s.chunk(c).dp_grad_norm();
    sq += n * n;
  }
  double norm = std::sqrt(sq) * double(s.pending_scale);
  if (s.pipe) norm = s.pipe->global_norm(norm, *s.host);  // every stage's
  const double clip = s.cfg.optimizer.clip_grad_norm;
  if (clip > 0 && norm > clip && std::isfinite(norm))
    s.pending_scale *= float(clip / (norm + 1e-6));  // as optim::Optimizer::clip_gradients
  return norm;
}

void GpuMeshEngine::optimizer_step(double lr) {
  State& s = *s_;
  ++s.steps;
  for (int c = 0; c < s.n_chunks(); ++c) s.chunk_opt(c).step(s.cfg.optimizer, lr, s.steps, s.pending_scale);
  s.pending_scale = 1.f;
  // (A stage without a score-routed layer still joins the sum below: the other stages' ranks are in it.)
  if (s.o.bias_update_speed == 0 || (s.buffers.empty() && !s.pipe)) return;
  if (s.world.size() > 1) {
    // The global batch's loads. At pp = 1 every DP rank shares every layer; with stages, a layer's loads come
    // only from its stage's DP ranks (the other stages add zeros), so the world's sum is the stage's DP sum.
    std::vector<double> all;
    for (const auto& l : s.load_sum) all.insert(all.end(), l.begin(), l.end());
    if (s.mesh.tp_rank != 0) std::fill(all.begin(), all.end(), 0.0);  // TP rank 0's routing counts for its group
    s.host->all_reduce(all.data(), all.size(), comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
    size_t i = 0;
    for (auto& l : s.load_sum)
      for (auto& x : l) x = int64_t(std::llround(all[i++]));
  }
  for (const Entry& b : s.buffers) {
    const int64_t l = s.layer_of(b.name);
    std::vector<float> bias = s.chunk(b.chunk).router_bias(b.name);
    dsv4::router_bias_update(bias.data(), s.load_sum[size_t(l)].data(), int64_t(bias.size()), s.o.bias_update_speed);
    s.chunk(b.chunk).set_router_bias(b.name, bias);
  }
}

void GpuMeshEngine::save(const fs::path& root, const TrainState& st, int64_t keep_last, const FaultHook& fault) {
  State& s = *s_;
  // Each stage's tensors (all of them with pp = 1) are written by the ranks of its DP group; another stage's
  // (not held here) by that stage's.
  const int R = s.mesh.dp_rank, W = s.D;
  // A dense tensor is gathered whole from its ZeRO-1 slices (collective over the stage's DP group, in table order
  // on every rank) and written by one rank, round robin, so the files are of similar size. A routed expert under
  // ep is written (with its moments) by its owner, the edp-rank-0 holder of that expert, after a gather over its
  // replicas only (collective over them, in table order): never sent to a rank that does not hold it. Host memory:
  // the tensors this rank writes.
  std::deque<std::vector<float>> keep;
  std::vector<ShardedTensor> pt, ot;
  size_t dense = 0;
  // The last stage's tied copy of embed.weight (pp > 1 with MTP) equals the first stage's: written once, by it.
  const bool embed_copy = s.mtp && s.mesh.spec.pp > 1 && s.mesh.pp_rank != 0;
  for (const Entry& p : s.params) {
    if (!p.held) continue;  // another expert-parallel rank's expert (its owner writes it)
    if (embed_copy && p.name == "embed.weight") continue;
    const bool own_expert = p.expert >= 0 && s.mesh.spec.ep > 1;  // without ep an expert is a dense tensor
    const bool writer = own_expert ? s.mesh.edp_rank == 0 : int(dense++ % size_t(W)) == R;
    // Under tensor parallelism TP rank 0 writes (gather_shard gives every TP rank the whole official tensor).
    const bool mine = writer && s.mesh.tp_rank == 0;
    std::vector<float> v = s.chunk(p.chunk).gather_shard(p.name);
    if (mine) {
      keep.push_back(std::move(v));
      pt.push_back({p.name, p.shape, keep.back().data(), std::string(optim::group_name(p.group))});
    }
    for (const auto& [suffix, which] : s.state_names(p)) {
      std::vector<float> m = s.chunk(p.chunk).gather_shard(p.name, s.chunk_opt(p.chunk).moment(which));
      if (!mine) continue;
      keep.push_back(std::move(m));
      ot.push_back({p.name + suffix, p.shape, keep.back().data(), ""});
    }
  }
  if (R == 0 && s.mesh.tp_rank == 0)
    for (const Entry& b : s.buffers) {
      keep.push_back(s.chunk(b.chunk).router_bias(b.name));
      pt.push_back({b.name, b.shape, keep.back().data(), std::string(optim::group_name(b.group))});
    }
  ShardedSaveArgs sa;
  sa.keep_last = keep_last;
  sa.config = s.cfg.raw;
  sa.fault = fault;
  save_sharded_tensors(root, st, pt, ot, s.steps, s.mesh, *s.host, sa);
}

TrainState GpuMeshEngine::load(const fs::path& dir) {
  // Either format, saved by any layout (tensors by official name): every rank reads each whole tensor of its
  // partition (the dense ones, and under ep its own experts only) and keeps its shard of it.
  State& s = *s_;
  const CheckpointReader r(dir);
  std::vector<float> buf;
  for (const Entry& p : s.params) {
    if (!p.held) continue;
    buf.assign(size_t(numel(p.shape)), 0.f);
    r.read_param(p.name, p.shape, buf.data());
    dsv4gpu::GpuModel& m = s.chunk(p.chunk);
    m.set_shard(p.name, buf);
    for (const auto& [suffix, which] : s.state_names(p)) {
      r.read_optim(p.name + suffix, p.shape, buf.data());
      m.set_shard(p.name, buf, s.chunk_opt(p.chunk).moment(which));
    }
  }
  for (const Entry& b : s.buffers) {
    buf.assign(size_t(numel(b.shape)), 0.f);
    r.read_param(b.name, b.shape, buf.data());
    s.chunk(b.chunk).set_router_bias(b.name, buf);
  }
  s.steps = r.optimizer_steps();
  return r.state();
}

std::vector<float> GpuMeshEngine::value(const std::string& name) {
  State& s = *s_;
  for (const Entry& b : s.buffers)
    if (b.name == name) return s.chunk(b.chunk).router_bias(name);
  auto it = std::find_if(s.params.begin(), s.params.end(), [&](const Entry& p) { return p.name == name; });
  TREX_CHECK(it != s.params.end(), "{}: no parameter '{}'", s.who(), name);
  if (it->expert < 0 || s.mesh.spec.ep == 1) return s.chunk(it->chunk).gather_shard(name);
  // A routed expert under ep: its holders gather it (collective over its replicas), the edp-rank-0 holder
  // contributes it to a sum over the world that every other rank enters with zeros (x + 0 is exact).
  std::vector<double> sum(size_t(numel(it->shape)), 0.0);
  if (it->held) {
    const std::vector<float> v = s.chunk(it->chunk).gather_shard(name);
    if (s.mesh.edp_rank == 0 && s.mesh.tp_rank == 0) std::copy(v.begin(), v.end(), sum.begin());
  }
  s.host->all_reduce(sum.data(), sum.size(), comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  return std::vector<float>(sum.begin(), sum.end());
}

std::vector<std::string> GpuMeshEngine::param_names() const {
  std::vector<std::string> n;
  for (const Entry& p : s_->params) n.push_back(p.name);
  for (const Entry& b : s_->buffers) n.push_back(b.name);
  return n;
}

TrainResult run_gpu_mesh_training(const TrainConfig& cfg_in, const fs::path& config, const fs::path& out_dir,
                                  const RunOptions& opts) {
  TrainConfig cfg = cfg_in;
  // One process: a thread group of one rank (a device-memory communicator without an NCCL bootstrap; the step
  // of one rank runs no collective).
  std::unique_ptr<comm::Communicator> world =
      comm::detect_launch_env().world_size > 1 ? comm::make_nccl_world_communicator(cfg.parallel.timeout_s)
                                               : std::move(comm::make_thread_group(1, cfg.parallel.timeout_s)[0]);
  std::unique_ptr<comm::Communicator> host = make_staged_communicator(*world);
  if (!cfg.parallel.present) cfg.parallel.mesh = {1, world->size(), 1, 1};  // plain data parallelism
  data::Tokenizer tok = data::Tokenizer::load(cfg.tokenizer);
  const fs::path shards = prepare_run_on_lead(cfg, config, out_dir, opts, tok, *host);
  data::ShardDataset ds(shards);
  check_dataset(cfg, config, shards, ds, tok);
  dsv4::ModelConfig mc;
  Dsv4TrainOptions o;
  dsv4_model_setup(cfg, tok, &mc, &o);
  const std::string why = check_parallel_config(cfg, world->size(), {int(mc.n_layers), int(mc.n_routed_experts)});
  TREX_CHECK(why.empty(), "{}: impossible parallel layout: {}", config.string(), why);
  TrainerOptions topt;
  topt.stop_at = opts.max_steps;
  topt.show_progress = opts.show_progress;
  try {
    GpuMeshEngine engine(cfg, mc, o, *world);
    return Trainer(cfg, out_dir, engine, ds, data::ChatTokens::from(tok).eos, topt).run();
  } catch (const std::exception& e) {
    // This rank cannot go on: the others must not wait for it in a collective (NCCL: the message names this
    // rank, the communicator is aborted and the process exits; the launcher ends the rest).
    world->abort(e.what());
    throw;
  }
}

}  // namespace trex::train
