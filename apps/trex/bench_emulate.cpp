// `trex bench train --emulate-rank R --layout pp=P,vpp=V,dp=D,ep=E,tp=T`: one rank of a large layout alone on this
// GPU (train/cuda/emulated_rank.h: its stage or interleaved chunks, the MTP module on the head's rank unless
// --no-mtp), printed beside the planner's prediction for that rank (src/plan, the same layout and the same stage
// layers). Refuses before allocating the model when the rank's count (GpuModel::footprint's parameter state, the
// activation table per chunk and slot, the step's workspaces) exceeds the device's free memory, with the planner's
// breakdown for its stage beside it (a warning when only the planner's exceeds it); an allocation that fails later exits with the pool's use by category
// (EmulatedRank::memory_report) beside the same counts.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "bench_train.h"
#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/config.h"
#include "model/dsv4/partition.h"
#include "parallel/mesh.h"
#include "parallel/rank_partition.h"
#include "plan/estimate.h"
#include "plan/model_spec.h"
#include "plan/profiles.h"
#include "train/dsv4_trainable.h"
#ifdef TREX_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/lm_head_ce.h"
#include "model/cuda/activation_plan.h"
#include "model/dsv4/recompute.h"
#include "model/dsv4/seq_layout.h"
#include "bench_gpu_metrics.h"
#include "train/cuda/emulated_rank.h"
#endif

namespace trex::bench {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
double gib(double bytes) { return std::round(bytes / kGiB * 100) / 100; }
double r3(double x) { return std::round(x * 1000) / 1000; }
}  // namespace

// The planner's numbers for stage `stage` of the layout, with the trainer's stage layers (split_layers) in place of
// the planner's balanced partition.
nlohmann::json planner_prediction(const TrainBenchArgs& a, const dsv4::ModelConfig& cfg,
                                  const parallel::RankPartition& p, plan::MemoryBreakdown* mem_out) {
  plan::ModelSpec spec = plan::load_model_spec(a.config);
  spec.n_mtp = cfg.n_mtp;  // as the emulated rank (--no-mtp: without the MTP module)
  plan::Workload w;
  w.seq = a.seq, w.gbs = a.batch, w.mode = a.mode;
  w.frozen_router = false;  // the GPU model trains the router (freeze is not on the GPU yet)
  w.mtp = cfg.n_mtp > 0;
  // By default the T-Rex profile fitted to the recorded runs, these emulated ranks among them (trex plan-calibrate
  // --write configs/plan); --impl trex-prior or a file asks another.
  const std::string impl =
      a.impl == "calibrated"
          ? (trex::source_dir() / "configs" / "plan" / fmt::format("calibration-trex-{}.json", a.hardware)).string()
          : a.impl;
  const plan::ImplProfile profile = plan::load_impl(impl);
  plan::Estimator est(spec, plan::load_hardware(a.hardware), profile, w);
  // Every virtual stage's layers (the trainer's split, rank_partition's), the MTP block (the planner's block
  // n_layers) with the last.
  std::vector<std::vector<int64_t>> chunks;
  for (const dsv4::ModelPartition& part : dsv4::split_layers(cfg, int64_t(p.spec.pp) * p.spec.vpp)) {
    chunks.emplace_back();
    for (int64_t l = part.layer_begin; l < part.layer_end; ++l) chunks.back().push_back(l);
  }
  if (w.mtp) chunks.back().push_back(cfg.n_layers);
  est.set_partition(p.spec.pp, p.spec.vpp, chunks);
  plan::Layout l;
  l.pp = p.spec.pp, l.vpp = p.spec.vpp, l.dp = p.spec.dp, l.ep = p.spec.ep, l.tp = p.spec.tp, l.etp = p.spec.etp;
  l.mbs = p.micro_batch_seqs, l.zero = a.zero;
  l.recompute = plan::parse_recompute(a.recompute);
  l.rc_full_layers = a.recompute_full_layers;
  const plan::Estimate e = est.estimate(l, int64_t(p.world_size));
  nlohmann::json j;
  j["hardware"] = a.hardware, j["impl"] = impl;
  j["impl_note"] = profile.note;
  if (!e.valid) {
    j["error"] = e.reason;
    return j;
  }
  const plan::MemoryBreakdown& m = e.stage_mem[size_t(p.pp_rank)];
  if (mem_out) *mem_out = m;
  j["memory_gib"] = {{"weights", r3(m.weights)},         {"grads", r3(m.grads)},
                     {"optimizer", r3(m.optimizer)},     {"activations", r3(m.activations)},
                     {"logits", r3(m.logits)},           {"comm_buffers", r3(m.comm_buffers)},
                     {"workspace", r3(m.workspace)},     {"fixed", r3(m.fixed)},             {"total", r3(m.total)},
                     {"in_flight", m.inflight},          {"capacity", r3(m.capacity)}};
  const size_t st = size_t(p.pp_rank);
  j["rank_compute_s"] = r3(e.stage_compute[st]);  // the stage's micro-batches, exposed TP/EP (the real layout)
  j["optimizer_s"] = r3(e.stage_optimizer[st]);   // the stage's own shard
  // What the emulated rank runs (Estimate::stage_alone, as plan-calibrate predicts the emulated records): its
  // compute, its collectives as the emulation's local copies (or, under --emulate-comm none, only the small ones),
  // its optimizer shard; no bubble, no link time.
  j["rank_step_s"] = r3(a.emulate_comm == "none" ? e.stage_alone_none[st] : e.stage_alone[st]);
  nlohmann::json comm;
  for (const plan::CommKind& k : e.stage_comm[st].kinds)  // per step, as emulated_comm_total counts (x steps)
    comm[k.kind] = {{"group", k.dim}, {"calls", k.calls}, {"gib", gib(k.bytes)},
                    {"emulated_s", r3(a.emulate_comm == "none" ? k.emulated_none_s : k.emulated_s)}};
  j["comm_per_step"] = comm;
  j["pipeline_step_s"] = r3(e.time.step);  // the whole layout's step (bubble, DP, exposed communication)
  j["mfu_layout"] = std::round(e.mfu * 1e4) / 1e4;
  if (!e.fits) j["does_not_fit"] = e.reason;
  return j;
}

#ifdef TREX_HAVE_CUDA
namespace {
// The rank's activation and workspace bytes before anything is allocated. Activations, per model chunk (each its
// own activation arena, activation_arena.h, whose regions keep their high-water mark for the step): the GPU
// model's activation table (model/cuda/activation_plan.h, what its pools take request by request) per micro-batch
// slot, times the micro-batches the schedule holds at once on that chunk, plus one block's recomputation scratch.
// Workspace: the GPU model's (dsv4gpu::plan_workspace, the planner's workspace term too) and the LM head's
// row-block logits on the head's chunk.
struct RankMemory {
  std::vector<dsv4gpu::ActivationPlan> plans;  // per chunk
  std::vector<int64_t> held;                   // per chunk: micro-batches held at once
  int64_t activations = 0;
  int64_t grad_streams = 0, boundary = 0, lm_head = 0, moe_bwd = 0;
  int64_t workspace() const { return grad_streams + boundary + lm_head + moe_bwd; }
  int64_t kept_per_micro_batch() const {  // the rank's whole: every chunk's one micro-batch
    int64_t n = 0;
    for (const auto& pl : plans) n += pl.kept();
    return n;
  }
};

RankMemory rank_memory(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
                       const dsv4gpu::GpuModelOptions& o) {
  RankMemory r;
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(p.micro_batch_seqs, seq);
  const int64_t N = mb.B * mb.T;
  for (const parallel::RankChunk& c : p.chunks) {
    dsv4gpu::ActivationPlanShape sh;
    sh.layer_begin = c.layer_begin, sh.layer_end = c.layer_end, sh.mtp = c.head && p.mtp;
    sh.recompute = o.recompute;
    sh.recompute_full_layers = o.recompute_full_layers;
    sh.ep = p.spec.ep;
    sh.head_grad = true;
    sh.tp = p.spec.tp, sh.etp = p.spec.etp;
    r.plans.push_back(dsv4gpu::plan_activations(cfg, mb, sh));
    r.held.push_back(std::min<int64_t>(c.slots, p.micro_batches));
    r.activations += r.held.back() * r.plans.back().kept() + r.plans.back().block_scratch;
  }
  dsv4gpu::WorkspaceShape ws;
  ws.tokens = N, ws.chunks = int64_t(p.chunks.size()), ws.embeds = p.embed, ws.stages = p.spec.pp > 1;
  ws.act_in = !p.embed || p.spec.vpp > 1, ws.grad_in = !p.head || p.spec.vpp > 1;
  ws.etp = p.spec.etp;
  const dsv4gpu::Workspace w = dsv4gpu::plan_workspace(cfg, ws);
  r.grad_streams = w.grad_streams, r.moe_bwd = w.moe_bwd, r.boundary = w.boundary;
  if (p.head) {
    cuda::LmHeadCeShape s{N, cfg.hidden, cfg.vocab_size, std::min(o.lm_chunk, cfg.vocab_size), o.lm_rows,
                          o.lm_grad_rows};
    r.lm_head = int64_t(cuda::lm_head_ce_fwd_grad_scratch_bytes(s));
  }
  return r;
}
}  // namespace
#endif

void bench_train_emulated(const TrainBenchArgs& a) {
  TREX_CHECK(!a.layout.empty(), "bench train --emulate-rank {}: give the layout (--layout pp=P,dp=D,ep=E,tp=T)",
             a.emulate_rank);
  TREX_CHECK(a.mesh.empty(), "bench train: --emulate-rank runs on one GPU; --mesh ({}) is for launched multi-GPU runs",
             a.mesh);
  check_warmup_covers_arena_layout(a);
  check_recompute_full_layers(a);
  dsv4::ModelConfig cfg = dsv4::load_model_config(a.config);
  const bool had_mtp = cfg.n_mtp > 0;
  if (a.no_mtp) cfg.n_mtp = 0;  // the old measurement: the rank without the MTP module
  const parallel::MeshSpec spec = parallel::parse_mesh_spec(a.layout);
  const parallel::RankPartition p = parallel::rank_partition(spec, a.emulate_rank, cfg, a.batch, a.micro_batch_seqs);
  std::fprintf(stderr, "emulating %s%s\n", p.describe().c_str(),
               had_mtp && a.no_mtp ? " (config's MTP module left out: --no-mtp)" : "");
  plan::MemoryBreakdown pm;
  const nlohmann::json pred = planner_prediction(a, cfg, p, &pm);
#ifndef TREX_HAVE_CUDA
  (void)pred;
  fail("bench train --emulate-rank: this build has no CUDA backend (configure with -DTREX_CUDA=ON)");
#else
  // The bytes first: every chunk's parameters, gradients and optimizer state, from the parameter table.
  parallel::EmulatedMesh sizing = parallel::make_emulated_mesh(p);
  dsv4gpu::GpuModelOptions base;
  base.timing = a.sections;
  base.deterministic = a.deterministic;
  base.recompute = dsv4::parse_recompute(a.recompute, "bench train --recompute");
  base.recompute_full_layers = a.recompute_full_layers;
  base.zero = a.zero, base.grad_reduce_bf16 = a.grad_reduce == "bf16";
  if (a.moe_gemm != "default") base.moe_grouped_gemm = a.moe_gemm == "grouped";
  dsv4gpu::GpuModel::Footprint fp;  // summed over the chunks
  for (int c = 0; c < int(p.chunks.size()); ++c) {
    const dsv4gpu::GpuModel::Footprint f =
        dsv4gpu::GpuModel::footprint(cfg, train::EmulatedRank::model_options(p, sizing, base, c));
    fp.weight_elems += f.weight_elems, fp.grad_elems += f.grad_elems, fp.shard_elems += f.shard_elems;
    fp.n_params += f.n_params, fp.grad_buffer_bytes += f.grad_buffer_bytes;
    fp.weight_buffer_bytes += f.weight_buffer_bytes;
  }
  const double fixed = double(fp.compute_bytes() + fp.grad_bytes() + fp.master_bytes() + fp.adamw_bytes());
  const RankMemory rm = rank_memory(cfg, p, a.seq, base);
  // ZeRO-2's transient bucket buffers (and the bf16 reduction's copies) come from the pool during backward, ZeRO-3's
  // gathered weight buffers during forward and backward.
  const double need = fixed + double(rm.activations) + double(rm.workspace()) + double(fp.grad_buffer_bytes) +
                      double(fp.weight_buffer_bytes);
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  std::string per_chunk;
  for (size_t c = 0; c < rm.plans.size(); ++c) {
    const dsv4gpu::ActivationPlan& pl = rm.plans[c];
    std::string per_layer;
    for (size_t i = 0; i < pl.blocks.size(); ++i)
      per_layer += fmt::format("{}{}: {:.2f}", i ? ", " : "", p.chunks[c].layer_begin + int64_t(i),
                               double(pl.blocks[i].kept) / kGiB);
    per_chunk += fmt::format("{}layers [{}, {}): {} micro-batches x {:.2f} (streams {:.2f}, head {:.2f}, layers {}) "
                             "+ recomputation scratch {:.2f}",
                             c ? "; " : "", p.chunks[c].layer_begin, p.chunks[c].layer_end, rm.held[c],
                             double(pl.kept()) / kGiB, double(pl.streams) / kGiB, double(pl.heads) / kGiB, per_layer,
                             double(pl.block_scratch) / kGiB);
  }
  const std::string counted = fmt::format(
      "the rank's count {:.2f} GiB: bf16 weights {:.2f}, fp32 gradients {:.2f}, fp32 master shard {:.2f}, AdamW "
      "moments {:.2f} ({} parameters{}); activations {:.2f} ({}); workspace {:.2f} (gradient streams {:.2f}, pipeline "
      "boundary {:.2f}, LM head {:.2f}, MoE backward {:.2f}); bucket buffers {:.2f} (ZeRO-2 gradients {:.2f}, ZeRO-3 "
      "gathers {:.2f}). The planner's count for stage {} (plan/estimate.h, the same stage layers): {:.2f} GiB = "
      "weights {:.2f}, grads {:.2f}, optimizer {:.2f}, activations {:.2f} ({} in flight), logits {:.2f}, comm buffers "
      "{:.2f}, workspace {:.2f}, fixed {:.2f}",
      need / kGiB, fp.compute_bytes() / kGiB, fp.grad_bytes() / kGiB, fp.master_bytes() / kGiB,
      fp.adamw_bytes() / kGiB, fp.n_params, p.mtp ? ", the MTP module's among them" : "",
      double(rm.activations) / kGiB, per_chunk, double(rm.workspace()) / kGiB, double(rm.grad_streams) / kGiB,
      double(rm.boundary) / kGiB, double(rm.lm_head) / kGiB, double(rm.moe_bwd) / kGiB,
      double(fp.grad_buffer_bytes + fp.weight_buffer_bytes) / kGiB, double(fp.grad_buffer_bytes) / kGiB,
      double(fp.weight_buffer_bytes) / kGiB, p.pp_rank, pm.total, pm.weights, pm.grads, pm.optimizer,
      pm.activations, pm.inflight, pm.logits, pm.comm_buffers, pm.workspace, pm.fixed);
  // Refused up front when the rank's count exceeds what the device has free. The planner's total (which counts what
  // the rank's table does not: the expert exchange's buffers, its fitted activation scale and fixed reserve) is
  // printed beside it; when only the planner's exceeds the free memory the run goes ahead with a warning, so the
  // measured peak settles which count is right.
  const double planner_need = pm.total * kGiB;
  if (need < double(free_b) && planner_need >= double(free_b))
    std::fprintf(stderr, "warning: the planner's count for this rank exceeds the device's %.2f GiB free, the rank's "
                 "own does not (running it): %s\n", double(free_b) / kGiB, counted.c_str());
  TREX_CHECK(need < double(free_b),
             "bench train --emulate-rank {} ({}, recompute {}, zero {}): does not fit: the device has {:.2f} GiB free "
             "of {:.2f}; {}. --recompute full or selective, a smaller --micro-batch-seqs, more pipeline stages or a "
             "larger ep shrink it",
             a.emulate_rank, a.layout, a.recompute, a.zero, double(free_b) / kGiB, double(total_b) / kGiB, counted);

  const auto payload = a.emulate_comm == "none" ? comm::EmulatedGroup::Payload::CountOnly
                                                 : comm::EmulatedGroup::Payload::Copy;
  // An allocation the device cannot serve exits with where the memory is (EmulatedRank::memory_report) beside what
  // was counted before allocating.
  auto out_of_memory = [&](const cuda::DeviceOutOfMemory& e) {
    fail("bench train --emulate-rank {} ({}, recompute {}, zero {}): {} Counted before allocating: {}",
         a.emulate_rank, a.layout, a.recompute, a.zero, e.what(), counted);
  };
  std::unique_ptr<train::EmulatedRank> owned;
  try {
    owned = std::make_unique<train::EmulatedRank>(cfg, p, a.seq, base, a.seed, payload);
  } catch (const cuda::DeviceOutOfMemory& e) {
    out_of_memory(e);
  }
  train::EmulatedRank& rank = *owned;
  cuda::AdamWStep opt;
  opt.lr = 1e-5, opt.eps = 1e-8, opt.weight_decay = 0.01;
  int64_t step = 0;
  double loss = 0;
  auto one = [&] {
    opt.step = ++step;
    try {
      loss = rank.step(opt);
    } catch (const cuda::DeviceOutOfMemory& e) {
      out_of_memory(e);
    }
  };
  for (int i = 0; i < a.warmup; ++i) one();
  TREX_CUDA(cudaDeviceSynchronize());
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t zero = 0;
  TREX_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  for (int c = 0; c < rank.chunks(); ++c) rank.model(c).reset_sections();
  const dsv4gpu::GpuModel::GatherTimes gathers_before = rank.model().weight_gather_times();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) one();
  TREX_CUDA(cudaDeviceSynchronize());
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  const nlohmann::json zero3 = gather_json(gathers_before, rank.model().weight_gather_times(), a.steps);
  uint64_t used_high = 0;
  TREX_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));

  // The rank's FLOPs per token (model_flops.py's convention, which does not count the MTP module): its chunks'
  // layers and the head. With MTP the rank does more work than this counts, so its MFU reads low.
  double stage_flops = 0;
  nlohmann::json chunk_layers = nlohmann::json::array();
  for (const parallel::RankChunk& c : p.chunks) {
    stage_flops += train::dsv4_stage_flops_per_token(cfg, a.seq, c.layer_begin, c.layer_end, c.head);
    chunk_layers.push_back(fmt::format("[{}, {})", c.layer_begin, c.layer_end));
  }
  const double tok = double(rank.tokens_per_step()), tok_s = tok / dt;
  // The tp ranks of a TP group run the same tokens, each its share of the model's work: a rank's model FLOPs are
  // its tokens' over tp.
  const double tflops = tok_s * stage_flops / double(p.spec.tp) / 1e12;
  const double peak_flops = plan::load_hardware(a.hardware).peak_bf16;
  nlohmann::json j;
  j["system"] = "trex-cuda";
  j["mode"] = "emulated-rank";
  j["config"] = std::filesystem::path(a.config).filename().string();
  j["layout"] = a.layout;
  j["rank"] = p.world_rank;
  j["ranks"] = p.world_size;
  std::vector<int> slots;
  for (const parallel::RankChunk& c : p.chunks) slots.push_back(c.slots);
  j["partition"] = {{"stage", p.pp_rank},           {"layers", p.spec.vpp == 1 ? chunk_layers[0] : chunk_layers},
                    {"embed", p.embed},             {"head", p.head},
                    {"dp_rank", p.dp_rank},         {"ep_rank", p.ep_rank},
                    {"edp_rank", p.edp_rank},       {"edp", p.edp_size},
                    {"tp_rank", p.tp_rank},
                    {"experts", fmt::format("[{}, {})", p.expert_begin, p.expert_end)},
                    {"micro_batches", p.micro_batches}, {"micro_batch_seqs", p.micro_batch_seqs},
                    {"in_flight", p.in_flight},     {"chunk_slots", slots}};
  j["mtp"] = !had_mtp ? "none in config" : a.no_mtp ? "left out (--no-mtp)" : p.mtp ? "on this rank" : "on the last stage";
  j["seq"] = a.seq;
  j["recompute"] = a.recompute;
  j["zero"] = a.zero;
  j["grad_reduce"] = a.grad_reduce;
  j["global_batch"] = a.batch;
  j["params"] = fp.n_params;
  j["step_s"] = std::round(dt * 1e4) / 1e4;
  j["tokens_per_s"] = std::llround(tok_s);  // this rank's tokens (its TP group's, under tp)
  j["stage_gflop_per_token"] = std::round(stage_flops / 1e6) / 1e3;
  j["model_tflops"] = std::round(tflops * 10) / 10;
  j["mfu"] = std::round(tflops * 1e12 / peak_flops * 1e4) / 1e4;  // the rank's own compute
  // Memory: the arena and optimizer state exactly; the rest of the pool's high-water mark is activations and
  // workspaces (the in-flight micro-batches' saved tensors, the LM head's scratch, the expert exchange buffers).
  const double opt_bytes = double(fp.master_bytes() + fp.adamw_bytes());
  j["memory_gib"] = {{"weights", gib(double(fp.compute_bytes()))},
                     {"grads", gib(double(fp.grad_bytes()))},
                     {"optimizer", gib(opt_bytes)},  // fp32 master shard + AdamW moments (the planner's split)
                     {"activations_and_workspace", gib(double(used_high) - fixed)},
                     {"activations_planned", gib(double(rm.activations))},  // the table's, before allocating
                     {"activations_per_micro_batch", gib(double(rm.kept_per_micro_batch()))},
                     {"workspace_estimated", gib(double(rm.workspace()))},
                     {"grad_buckets_estimated", gib(double(fp.grad_buffer_bytes))},  // ZeRO-2 / bf16 reduction
                     {"counted_before_allocating", gib(need)},
                     {"loopback_buffers", gib(double(rank.loopback_bytes()))},  // emulation only, outside the pool
                     {"pool_peak", gib(double(used_high))},
                     {"device_used", gib(double(total_b - free_b))}};
  j["activation_arena"] = arena_json(rank.model());
  // The emulated group's gathers are local copies on the compute stream: exposed whole (weight_gather.h).
  if (!zero3.is_null()) j["zero3_weight_gather"] = zero3;
  nlohmann::json comm;
  for (const auto& [group, ops] : rank.comm_stats())
    for (const auto& [op, s] : ops)
      comm[group][op] = {{"calls", s.calls}, {"gib", gib(double(s.bytes))}};
  j["emulated_comm_total"] = comm;  // warm-up and timed steps together
  j["emulated_comm"] = a.emulate_comm == "none" ? "counted only (own compute)" : "local copies";
  j["loss_last"] = loss;
  j["planner"] = pred;
  j["warmup"] = a.warmup;
  j["steps"] = a.steps;
  if (a.sections) {
    nlohmann::json s;
    std::map<std::string, double> ms;
    for (int c = 0; c < rank.chunks(); ++c)
      for (const auto& [name, v] : rank.model(c).section_ms()) ms[name] += v;
    for (const auto& [name, v] : ms) s[name] = std::round(v / a.steps * 100) / 100;
    j["section_ms_per_step"] = s;
  }
  std::printf("%s\n", j.dump().c_str());
#endif
}

}  // namespace trex::bench
