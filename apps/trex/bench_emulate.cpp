// `trex bench train --emulate-rank R --layout pp=P,vpp=V,dp=D,ep=E,tp=T`: one rank of a large layout alone on this
// GPU (train/cuda/emulated_rank.h: its stage or interleaved chunks, the MTP module on the head's rank unless
// --no-mtp), printed beside the planner's prediction for that rank (src/plan, the same layout and the same stage
// layers). Refuses before allocating the model when the rank's count (train/cuda/rank_memory.h, the count
// `trex train` makes too: parameter state, activations per chunk and slot, workspaces, bucket buffers) exceeds the
// device's free memory, with the planner's breakdown for its stage beside it (a warning when only the planner's
// exceeds it); an allocation that fails later exits with the pool's use by category (EmulatedRank::memory_report)
// beside the same counts.
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
#include "model/dsv4/recompute.h"
#include "bench_gpu_metrics.h"
#include "train/cuda/emulated_rank.h"
#include "train/cuda/rank_memory.h"
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
  // The bytes first (train/cuda/rank_memory.h, the count `trex train` makes before allocating): every chunk's
  // parameter state, activations per chunk and slot, the workspaces and the bucket buffers.
  dsv4gpu::GpuModelOptions base;
  base.timing = a.sections;
  base.deterministic = a.deterministic;
  base.recompute = dsv4::parse_recompute(a.recompute, "bench train --recompute");
  base.recompute_full_layers = a.recompute_full_layers;
  base.zero = a.zero, base.grad_reduce_bf16 = a.grad_reduce == "bf16";
  if (a.moe_gemm != "default") base.moe_grouped_gemm = a.moe_gemm == "grouped";
  const train::RankMemory rm = train::count_rank_memory(cfg, p, a.seq, base);
  const double need = double(rm.total());
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const std::string counted = fmt::format(
      "the rank's count {}. The planner's count for stage {} (plan/estimate.h, the same stage layers): {:.2f} GiB = "
      "weights {:.2f}, grads {:.2f}, optimizer {:.2f}, activations {:.2f} ({} in flight), logits {:.2f}, comm buffers "
      "{:.2f}, workspace {:.2f}, fixed {:.2f}",
      rm.describe(), p.pp_rank, pm.total, pm.weights, pm.grads, pm.optimizer, pm.activations, pm.inflight, pm.logits,
      pm.comm_buffers, pm.workspace, pm.fixed);
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
  j["params"] = rm.params.n_params;
  j["step_s"] = std::round(dt * 1e4) / 1e4;
  j["tokens_per_s"] = std::llround(tok_s);  // this rank's tokens (its TP group's, under tp)
  j["stage_gflop_per_token"] = std::round(stage_flops / 1e6) / 1e3;
  j["model_tflops"] = std::round(tflops * 10) / 10;
  j["mfu"] = std::round(tflops * 1e12 / peak_flops * 1e4) / 1e4;  // the rank's own compute
  // Memory: the arena and optimizer state exactly; the rest of the pool's high-water mark is activations and
  // workspaces (the in-flight micro-batches' saved tensors, the LM head's scratch, the expert exchange buffers).
  const double opt_bytes = double(rm.params.master_bytes() + rm.params.adamw_bytes());
  j["memory_gib"] = {{"weights", gib(double(rm.params.compute_bytes()))},
                     {"grads", gib(double(rm.params.grad_bytes()))},
                     {"optimizer", gib(opt_bytes)},  // fp32 master shard + AdamW moments (the planner's split)
                     {"activations_and_workspace", gib(double(used_high) - double(rm.parameter_state()))},
                     {"activations_planned", gib(double(rm.activations))},  // the table's, before allocating
                     {"activations_per_micro_batch", gib(double(rm.kept_per_micro_batch()))},
                     {"workspace_estimated", gib(double(rm.workspaces()))},
                     {"grad_buckets_estimated", gib(double(rm.params.grad_buffer_bytes))},  // ZeRO-2 / bf16 reduction
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
