// `trex bench train --emulate-rank R --layout pp=P,dp=D,ep=E`: one rank of a large layout alone on this GPU
// (train/cuda/emulated_rank.h), printed beside the planner's prediction for that rank (src/plan, the same layout
// and the same stage layers). Refuses before allocating the model when the rank's weights, gradients and optimizer
// state (GpuModel::footprint, from the parameter table) exceed the device's free memory.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "bench_train.h"
#include "core/error.h"
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
  spec.n_mtp = 0;  // as the emulated rank (no MTP on GPU pipeline stages yet)
  plan::Workload w;
  w.seq = a.seq, w.gbs = a.batch, w.mode = a.mode;
  w.frozen_router = false;  // the GPU model trains the router (freeze is not on the GPU yet)
  w.mtp = false;
  plan::Estimator est(spec, plan::load_hardware(a.hardware), plan::load_impl(a.impl), w);
  std::vector<std::vector<int64_t>> chunks;
  for (const dsv4::ModelPartition& part : dsv4::split_layers(cfg, p.spec.pp)) {
    chunks.emplace_back();
    for (int64_t l = part.layer_begin; l < part.layer_end; ++l) chunks.back().push_back(l);
  }
  est.set_partition(p.spec.pp, 1, chunks);
  plan::Layout l;
  l.pp = p.spec.pp, l.dp = p.spec.dp, l.ep = p.spec.ep, l.mbs = p.micro_batch_seqs, l.zero = 1;
  const plan::Estimate e = est.estimate(l, int64_t(p.world_size));
  nlohmann::json j;
  j["hardware"] = a.hardware, j["impl"] = a.impl;
  if (!e.valid) {
    j["error"] = e.reason;
    return j;
  }
  const plan::MemoryBreakdown& m = e.stage_mem[size_t(p.pp_rank)];
  if (mem_out) *mem_out = m;
  j["memory_gib"] = {{"weights", r3(m.weights)},         {"grads", r3(m.grads)},
                     {"optimizer", r3(m.optimizer)},     {"activations", r3(m.activations)},
                     {"logits", r3(m.logits)},           {"comm_buffers", r3(m.comm_buffers)},
                     {"fixed", r3(m.fixed)},             {"total", r3(m.total)},
                     {"in_flight", m.inflight},          {"capacity", r3(m.capacity)}};
  const double rank_s = e.stage_compute[size_t(p.pp_rank)] + e.time.optimizer + e.time.overhead;
  j["rank_compute_s"] = r3(e.stage_compute[size_t(p.pp_rank)]);  // the stage's micro-batches, exposed TP/EP
  j["optimizer_s"] = r3(e.time.optimizer);
  j["rank_step_s"] = r3(rank_s);  // what the emulated rank runs: its compute + optimizer, no bubble, no DP traffic
  j["pipeline_step_s"] = r3(e.time.step);  // the whole layout's step (bubble, DP, exposed communication)
  j["mfu_layout"] = std::round(e.mfu * 1e4) / 1e4;
  if (!e.fits) j["does_not_fit"] = e.reason;
  return j;
}

void bench_train_emulated(const TrainBenchArgs& a) {
  TREX_CHECK(!a.layout.empty(), "bench train --emulate-rank {}: give the layout (--layout pp=P,dp=D,ep=E)",
             a.emulate_rank);
  TREX_CHECK(a.mesh.empty(), "bench train: --emulate-rank runs on one GPU; --mesh ({}) is for launched multi-GPU runs",
             a.mesh);
  dsv4::ModelConfig cfg = dsv4::load_model_config(a.config);
  const bool had_mtp = cfg.n_mtp > 0;
  cfg.n_mtp = 0;  // GPU pipeline stages do not hold the MTP module yet
  const parallel::MeshSpec spec = parallel::parse_mesh_spec(a.layout);
  const parallel::RankPartition p = parallel::rank_partition(spec, a.emulate_rank, cfg, a.batch, a.micro_batch_seqs);
  std::fprintf(stderr, "emulating %s%s\n", p.describe().c_str(), had_mtp ? " (config's MTP module left out)" : "");
  plan::MemoryBreakdown pm;
  const nlohmann::json pred = planner_prediction(a, cfg, p, &pm);
#ifndef TREX_HAVE_CUDA
  (void)pred;
  fail("bench train --emulate-rank: this build has no CUDA backend (configure with -DTREX_CUDA=ON)");
#else
  // The bytes first: the rank's parameters, gradients and optimizer state, from the parameter table.
  parallel::EmulatedMesh sizing = parallel::make_emulated_mesh(p);
  dsv4gpu::GpuModelOptions base;
  base.timing = a.sections;
  if (a.moe_gemm != "default") base.moe_grouped_gemm = a.moe_gemm == "grouped";
  const dsv4gpu::GpuModel::Footprint fp =
      dsv4gpu::GpuModel::footprint(cfg, train::EmulatedRank::model_options(p, sizing, base));
  const double fixed = double(fp.compute_bytes() + fp.grad_bytes() + fp.master_bytes() + fp.adamw_bytes());
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  TREX_CHECK(fixed < double(free_b),
             "bench train --emulate-rank {} ({}): the rank's parameters need {:.2f} GiB (bf16 weights {:.2f}, fp32 "
             "gradients {:.2f}, fp32 master shard {:.2f}, AdamW moments {:.2f}; {} parameters) but the device has "
             "{:.2f} GiB free of {:.2f}; the planner predicts {:.2f} GiB in all for this rank",
             a.emulate_rank, a.layout, fixed / kGiB, fp.compute_bytes() / kGiB, fp.grad_bytes() / kGiB,
             fp.master_bytes() / kGiB, fp.adamw_bytes() / kGiB, fp.n_params, double(free_b) / kGiB,
             double(total_b) / kGiB, pm.total);

  train::EmulatedRank rank(cfg, p, a.seq, base, a.seed);
  cuda::AdamWStep opt;
  opt.lr = 1e-5, opt.eps = 1e-8, opt.weight_decay = 0.01;
  int64_t step = 0;
  double loss = 0;
  auto one = [&] {
    opt.step = ++step;
    loss = rank.step(opt);
  };
  for (int i = 0; i < a.warmup; ++i) one();
  TREX_CUDA(cudaDeviceSynchronize());
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t zero = 0;
  TREX_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  rank.model().reset_sections();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) one();
  TREX_CUDA(cudaDeviceSynchronize());
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  uint64_t used_high = 0;
  TREX_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));

  const double stage_flops =
      train::dsv4_stage_flops_per_token(cfg, a.seq, p.layer_begin, p.layer_end, p.head);
  const double tok = double(rank.tokens_per_step()), tok_s = tok / dt;
  const double tflops = tok_s * stage_flops / 1e12;
  const double peak_flops = plan::load_hardware(a.hardware).peak_bf16;
  nlohmann::json j;
  j["system"] = "trex-cuda";
  j["mode"] = "emulated-rank";
  j["config"] = std::filesystem::path(a.config).filename().string();
  j["layout"] = a.layout;
  j["rank"] = p.world_rank;
  j["ranks"] = p.world_size;
  j["partition"] = {{"stage", p.pp_rank},           {"layers", fmt::format("[{}, {})", p.layer_begin, p.layer_end)},
                    {"embed", p.embed},             {"head", p.head},
                    {"dp_rank", p.dp_rank},         {"ep_rank", p.ep_rank},
                    {"edp_rank", p.edp_rank},       {"edp", p.edp_size},
                    {"experts", fmt::format("[{}, {})", p.expert_begin, p.expert_end)},
                    {"micro_batches", p.micro_batches}, {"micro_batch_seqs", p.micro_batch_seqs},
                    {"in_flight", p.in_flight}};
  j["mtp"] = had_mtp ? "left out (not on GPU pipeline stages yet)" : "none in config";
  j["seq"] = a.seq;
  j["global_batch"] = a.batch;
  j["params"] = fp.n_params;
  j["step_s"] = std::round(dt * 1e4) / 1e4;
  j["tokens_per_s"] = std::llround(tok_s);  // this rank's tokens
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
                     {"loopback_buffers", gib(double(rank.loopback_bytes()))},  // emulation only, outside the pool
                     {"pool_peak", gib(double(used_high))},
                     {"device_used", gib(double(total_b - free_b))}};
  nlohmann::json comm;
  for (const auto& [group, ops] : rank.comm_stats())
    for (const auto& [op, s] : ops)
      comm[group][op] = {{"calls", s.calls}, {"gib", gib(double(s.bytes))}};
  j["emulated_comm_total"] = comm;  // warm-up and timed steps together
  j["loss_last"] = loss;
  j["planner"] = pred;
  j["warmup"] = a.warmup;
  j["steps"] = a.steps;
  if (a.sections) {
    nlohmann::json s;
    for (const auto& [name, ms] : rank.model().section_ms()) s[name] = std::round(ms / a.steps * 100) / 100;
    j["section_ms_per_step"] = s;
  }
  std::printf("%s\n", j.dump().c_str());
#endif
}

}  // namespace trex::bench
