#include "bench_train.h"
#include "model/dsv4/config.h"
#include "model/dsv4/recompute.h"
#include "train/dsv4_trainable.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#ifdef TREX_HAVE_CUDA
#include "bench_gpu_metrics.h"
#include "comm/launch_env.h"
#include "train/cuda/gpu_step_engine.h"
#endif

namespace trex::bench {

namespace {

constexpr double kH200Bf16Peak = 989.4e12;

#ifdef TREX_HAVE_CUDA
double r2(double x) { return std::round(x * 100) / 100; }

// The benchmark's optimiser step: the baseline's AdamW (opt) on everything, or Muon on the Muon group with that
// AdamW on the rest (--optimizer muon).
void bench_optimizer_step(train::GpuStepEngine& engine, const TrainBenchArgs& a, const cuda::AdamWStep& opt,
                          bool timed) {
  if (a.optimizer == "adamw") {
    engine.torch_adamw_step(opt, timed);
    return;
  }
  TREX_CHECK(a.optimizer == "muon", "bench train: --optimizer {} (expected adamw or muon)", a.optimizer);
  optim::OptimizerConfig oc;
  oc.kind = "muon";
  oc.adamw.beta1 = opt.beta1, oc.adamw.beta2 = opt.beta2, oc.adamw.eps = opt.eps;
  oc.adamw.weight_decay = opt.weight_decay;
  engine.optimizer_step(oc, opt.lr, opt.step, 1.f, timed);
}

// Pipeline parallel (--mesh pp=P,micro_batches=M[,stage_layers=a+b+...]): one process per stage, the global
// batch of --batch sequences cut into M micro-batches of batch / M sequences, 1F1B (src/train/cuda/gpu_pipeline.h).
// Rank 0 prints one JSON line with the step's throughput and, per stage, compute / idle / receive-wait times.
void bench_train_pp(const TrainBenchArgs& a, const dsv4::ModelConfig& cfg, double flops_tok,
                    const train::GpuLayout& layout, const dsv4gpu::GpuModelOptions& mo) {
  const int P = layout.mesh.pp;
  const int64_t M = layout.micro_batches;
  TREX_CHECK(M >= 1 && a.batch % M == 0, "bench train: --batch {} must be a multiple of micro_batches {}", a.batch,
             M);
  // A 45 s communicator timeout: a stuck transfer aborts the job with the rank and operation, not a hang.
  train::GpuStepEngine engine(cfg, layout, mo, 45.0);
  const int r = engine.world_rank();
  const std::vector<int64_t>& counts = engine.stage_layer_counts();
  dsv4gpu::GpuModel& model = engine.model();
  model.init_random(a.seed);
  const int64_t N = a.seq * a.batch, B_mb = a.batch / M;
  std::mt19937_64 g(a.seed + 1);  // the same tokens one GPU gets with --batch B
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& t : ids) t = int32_t(g() % uint64_t(cfg.vocab_size));
  const std::vector<int32_t> labels = ids;
  const dsv4::SeqLayout mb_layout = dsv4::SeqLayout::unpacked(B_mb, a.seq);
  cuda::AdamWStep opt;
  opt.lr = 1e-5, opt.eps = 1e-8, opt.weight_decay = 0.01;
  int64_t step = 0;
  std::vector<double> losses;
  auto train_step = [&](bool timed) {
    engine.zero_grads();
    losses.push_back(engine.forward_backward(ids.data(), labels.data(), mb_layout));
    opt.step = ++step;
    bench_optimizer_step(engine, a, opt, timed);
  };
  for (int i = 0; i < a.warmup; ++i) train_step(false);
  engine.synchronize();
  engine.reset_peak_memory();
  engine.reset_stats();
  engine.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) train_step(true);
  engine.synchronize();
  engine.barrier();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  const dsv4gpu::PipelineStats ps = engine.pipeline_stats();
  const uint64_t used_high = engine.peak_memory_bytes();
  // One boundary tensor's transfer alone (both ranks ready): the cost the schedule has to hide.
  const double xfer_ms = engine.boundary_transfer_ms(mb_layout);
  const std::vector<double> all_losses = engine.global_losses(losses);
  // Per-stage numbers to rank 0: fwd, bwd, opt, recv wait (ms per step), peak GiB, params.
  const double st = double(a.steps);
  const std::vector<double> mine = {ps.fwd_ms / st, ps.bwd_ms / st, engine.optimizer_ms() / st,
                                    ps.recv_wait_ms / st, double(used_high) / double(1ull << 30),
                                    double(model.n_params()),
                                    double(engine.planned_activation_bytes(mb_layout)) / double(1ull << 30)};
  const size_t K = mine.size();
  const std::vector<double> all = engine.all_gather(mine);
  if (r != 0) return;
  const double tok_s = double(N) / dt, tok_s_gpu = tok_s / P, tflops = tok_s_gpu * flops_tok / 1e12;
  const double step_ms = dt * 1e3;
  // The 1F1B schedule of the measured per-micro-batch stage times T_s = (fwd + bwd) / M with free transfers:
  // (M - 1) max_s T_s + sum_s T_s (fill and drain), then the slowest optimizer. What the step takes beyond it is
  // communication (and host gaps) on the critical path: the exposed communication.
  double t_max = 0, t_sum = 0, opt_max = 0, peak = 0, n_params = 0;
  nlohmann::json stages = nlohmann::json::array();
  int64_t lb = 0;
  for (int s = 0; s < P; ++s) {
    const double* v = &all[size_t(s) * K];
    const double T = (v[0] + v[1]) / double(M);
    t_max = std::max(t_max, T), t_sum += T, opt_max = std::max(opt_max, v[2]), peak = std::max(peak, v[4]);
    n_params += v[5];
    const double busy = v[0] + v[1] + v[2];
    nlohmann::json j;
    j["layers"] = fmt::format("[{}, {})", lb, lb + counts[size_t(s)]);
    j["fwd_ms"] = r2(v[0]), j["bwd_ms"] = r2(v[1]), j["opt_ms"] = r2(v[2]);
    j["fwd_bwd_ms_per_micro_batch"] = r2(T);
    j["recv_wait_ms"] = r2(v[3]);  // host blocked on incoming tensors (bubble + transfer)
    j["idle_ms"] = r2(step_ms - busy);
    j["bubble_measured"] = std::round((step_ms - busy) / step_ms * 1e4) / 1e4;  // stage idle / step
    j["peak_gib"] = std::round(v[4] * 10) / 10;
    j["activations_planned_gib"] = std::round(v[6] * 100) / 100;  // the activation table (activation_plan.h)
    j["params"] = int64_t(v[5]);
    stages.push_back(j);
    lb += counts[size_t(s)];
  }
  const double sched_ms = (double(M) - 1) * t_max + t_sum + opt_max;
  nlohmann::json j;
  j["system"] = "trex-cuda";
  j["config"] = std::filesystem::path(a.config).filename().string();
  j["seq"] = a.seq;
  j["batch"] = a.batch;
  j["micro_batches"] = M;
  j["optimizer"] = a.optimizer;
  j["moe_gemm"] = mo.moe_grouped_gemm ? "grouped" : "per-expert";
  j["deterministic"] = mo.deterministic;
  j["recompute"] = dsv4::to_string(mo.recompute);
  j["micro_batch_seqs"] = B_mb;
  j["params"] = int64_t(n_params);
  j["step_s"] = std::round(dt * 1e4) / 1e4;
  j["mesh"] = a.mesh;
  j["gpus"] = P;
  j["launcher"] = comm::detect_launch_env().launcher;
  j["tokens_per_s"] = std::llround(tok_s);
  j["tokens_per_s_per_gpu"] = std::llround(tok_s_gpu);
  j["model_tflops"] = std::round(tflops * 10) / 10;
  j["mfu"] = std::round(tflops * 1e12 / kH200Bf16Peak * 1e4) / 1e4;
  j["peak_gib"] = std::round(peak * 10) / 10;  // max over stages, stream-ordered pool high-water
  j["gflop_per_token"] = std::round(flops_tok / 1e6) / 1e3;
  j["bubble_ideal"] = std::round(double(P - 1) / double(M + P - 1) * 1e4) / 1e4;  // (P-1)/(M+P-1)
  j["schedule_ms"] = r2(sched_ms);  // 1F1B of the measured stage times, free transfers
  j["exposed_comm_ms"] = r2(std::max(0.0, step_ms - sched_ms));
  j["boundary_transfer_ms"] = r2(xfer_ms);  // one bf16 [tokens, hc, d] tensor alone
  j["stages"] = stages;
  j["rank0_activation_arena"] = arena_json(model);
  j["loss_first"] = all_losses.front();
  j["loss_last"] = all_losses.back();
  j["warmup"] = a.warmup;
  j["steps"] = a.steps;
  if (a.sections) {
    nlohmann::json s;
    for (const auto& [name, ms] : model.section_ms()) s[name] = r2(ms / a.steps);
    j["rank0_section_ms_per_step"] = s;
  }
  std::printf("%s\n", j.dump().c_str());
}
#endif

}  // namespace

double model_flops_per_token(const std::string& path, int64_t seq) {
  // One formula for the project (model_flops.py's convention): the trainer's, on the parsed config.
  return trex::train::dsv4_flops_per_token(trex::dsv4::load_model_config(path), seq);
}

void check_warmup_covers_arena_layout(const TrainBenchArgs& a) {
  TREX_CHECK(a.warmup >= kArenaLayoutSteps,
             "bench train: --warmup {} would time the GPU model's one-time activation-arena layout (step 1 traces the "
             "activations' requests, step 2 maps the arena): give --warmup {} or more", a.warmup, kArenaLayoutSteps);
}

void check_recompute_full_layers(const TrainBenchArgs& a) {
  TREX_CHECK(a.recompute_full_layers < 0 || a.recompute == "full",
             "bench train: --recompute-full-layers {} goes with --recompute full (got --recompute {})",
             a.recompute_full_layers, a.recompute);
}

void bench_train(const TrainBenchArgs& a) {
#ifndef TREX_HAVE_CUDA
  (void)a;
  fail("bench train: this build has no CUDA backend (configure with -DTREX_CUDA=ON)");
#else
  TREX_CHECK(a.seq > 0 && a.batch > 0 && a.steps > 0 && a.warmup >= 0, "bench train: seq {}, batch {}, steps {}, "
             "warmup {} must be positive", a.seq, a.batch, a.steps, a.warmup);
  check_warmup_covers_arena_layout(a);
  const dsv4::ModelConfig cfg = dsv4::load_model_config(a.config);
  const double flops_tok = model_flops_per_token(a.config, a.seq);
  dsv4gpu::GpuModelOptions mo;
  mo.timing = a.sections;
  mo.deterministic = a.deterministic;
  if (a.moe_gemm != "default") mo.moe_grouped_gemm = a.moe_gemm == "grouped";
  mo.recompute = dsv4::parse_recompute(a.recompute, "bench train --recompute");
  check_recompute_full_layers(a);
  mo.recompute_full_layers = a.recompute_full_layers;
  mo.zero = a.zero, mo.grad_reduce_bf16 = a.grad_reduce == "bf16";
  // Multi-GPU: the world NCCL communicator from the launcher, split into the layout's groups (the step engine).
  const train::GpuLayout layout = train::parse_gpu_layout(a.mesh);
  if (layout.mesh.pp > 1) {
    bench_train_pp(a, cfg, flops_tok, layout, mo);
    return;
  }
  train::GpuStepEngine engine(cfg, layout, mo);
  const int dp = engine.dp(), dp_rank = engine.dp_rank();
  const int world_size = engine.world_size(), world_rank = engine.world_rank();
  dsv4gpu::GpuModel& model = engine.model();
  model.init_random(a.seed);
  const int64_t N = a.seq * a.batch;
  // The global batch (dp x batch sequences) from one seed; this rank trains on its dp_rank-th part.
  std::mt19937_64 g(a.seed + 1);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int r = 0; r < dp; ++r)
    for (int64_t i = 0; i < N; ++i) {
      const int32_t t = int32_t(g() % uint64_t(cfg.vocab_size));
      if (r == dp_rank) ids[size_t(i)] = t;
    }
  const std::vector<int32_t> labels = ids;  // as the baseline: labels = input ids, shifted inside the loss
  const dsv4::SeqLayout seq_layout = dsv4::SeqLayout::unpacked(a.batch, a.seq);
  cuda::AdamWStep opt;
  opt.lr = 1e-5, opt.eps = 1e-8, opt.weight_decay = 0.01;  // the baseline: torch AdamW defaults, lr 1e-5
  int64_t step = 0;
  double first_loss = 0, last_loss = 0;
  auto train_step = [&] {
    engine.zero_grads();  // before the forward: a training forward accumulates the LM head's gradient
    const double loss = engine.forward_backward(ids.data(), labels.data(), seq_layout);
    opt.step = ++step;
    bench_optimizer_step(engine, a, opt, false);
    return loss;
  };
  for (int i = 0; i < a.warmup; ++i) first_loss = train_step();
  engine.synchronize();
  engine.reset_peak_memory();
  model.reset_sections();
  const dsv4gpu::GpuModel::GatherTimes gathers_before = model.weight_gather_times();
  engine.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) {
    last_loss = train_step();
    if (step == 1) first_loss = last_loss;
  }
  engine.synchronize();
  engine.barrier();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  const double exposed_ms = model.exposed_comm_ms() / a.steps;
  const nlohmann::json zero3 = gather_json(gathers_before, model.weight_gather_times(), a.steps);
  const uint64_t used_high = engine.peak_memory_bytes(), device_used = engine.device_used_bytes();
  const int64_t planned_acts = engine.planned_activation_bytes(seq_layout);
  // Tokens of the whole job; TFLOP/s and MFU per GPU.
  const double tok_s = double(N) * dp / dt;
  const double tok_s_gpu = tok_s / world_size;
  const double tflops = tok_s_gpu * flops_tok / 1e12;
  const nlohmann::json sections = a.sections ? nlohmann::json(model.section_ms()) : nlohmann::json();
  if (world_rank != 0) return;
  nlohmann::json j;
  j["system"] = "trex-cuda";
  j["config"] = std::filesystem::path(a.config).filename().string();
  j["seq"] = a.seq;
  j["batch"] = a.batch;
  j["params"] = model.n_params();
  j["step_s"] = std::round(dt * 1e4) / 1e4;
  j["mesh"] = a.mesh.empty() ? "single" : a.mesh;
  j["optimizer"] = a.optimizer;
  j["moe_gemm"] = mo.moe_grouped_gemm ? "grouped" : "per-expert";
  j["deterministic"] = mo.deterministic;
  j["recompute"] = dsv4::to_string(mo.recompute);
  j["gpus"] = world_size;
  j["launcher"] = a.mesh.empty() ? "none" : comm::detect_launch_env().launcher;
  j["tokens_per_s"] = std::llround(tok_s);
  j["tokens_per_s_per_gpu"] = std::llround(tok_s_gpu);
  j["exposed_comm_ms"] = std::round(exposed_ms * 100) / 100;  // compute-stream stalls on DP communication
  j["model_tflops"] = std::round(tflops * 10) / 10;
  j["mfu"] = std::round(tflops * 1e12 / kH200Bf16Peak * 1e4) / 1e4;
  j["peak_gib"] = std::round(double(used_high) / double(1ull << 30) * 10) / 10;  // stream-ordered pool high-water
  j["device_used_gib"] = std::round(double(device_used) / double(1ull << 30) * 10) / 10;
  // The activation table's planned peak (kept + one block's recomputation scratch; activation_plan.h), part of
  // peak_gib with the parameters, gradients, optimiser state and the ops' temporaries.
  j["activations_planned_gib"] = std::round(double(planned_acts) / double(1ull << 30) * 100) / 100;
  j["activation_arena"] = arena_json(model);
  j["zero"] = mo.zero;
  if (!zero3.is_null()) j["zero3_weight_gather"] = zero3;
  j["gflop_per_token"] = std::round(flops_tok / 1e6) / 1e3;
  j["loss_first"] = first_loss;
  j["loss_last"] = last_loss;
  j["warmup"] = a.warmup;
  j["steps"] = a.steps;
  if (a.sections) {
    nlohmann::json s;
    for (const auto& [name, ms] : sections.items()) s[name] = std::round(ms.get<double>() / a.steps * 100) / 100;
    j["section_ms_per_step"] = s;
  }
  std::printf("%s\n", j.dump().c_str());
#endif
}

}  // namespace trex::bench
