// `trex bench gemm`: cuBLASLt bf16 GEMM throughput on the GEMM shapes of a model config's training step
// (forward and the two backward products of each projection), against the H200 ceilings in
// docs/performance.md. Prints one JSON line per shape and a summary line.
#include <fmt/format.h>

#include <cstdio>

#include "bench_load.h"
#include "bench_ops.h"
#include "bench_train.h"
#include "command.h"
#include "core/error.h"
#include "core/files.h"
#ifdef TREX_HAVE_CUDA
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#endif

namespace {

struct GemmCase {
  std::string name;
  int64_t m, n, k;
};

// y[T,out] = x[T,in] W^T for the main projections of one V4 layer at T tokens; the routed experts are
// one expert's share of T*topk/E tokens.
std::vector<GemmCase> model_gemms(const trex::json& cfg, int64_t tokens) {
  auto g = [&](const char* k) { return cfg.at(k).get<int64_t>(); };
  int64_t d = g("hidden_size"), h = g("num_attention_heads"), c = g("head_dim"), qr = g("q_lora_rank");
  int64_t og = g("o_groups"), orank = g("o_lora_rank"), f = g("moe_intermediate_size");
  int64_t e = g("n_routed_experts"), k = g("num_experts_per_tok"), v = g("vocab_size");
  int64_t per_expert = tokens * k / e;
  return {
      {"wq_a", tokens, qr, d},
      {"wq_b", tokens, h * c, qr},
      {"wkv", tokens, c, d},
      {"wo_a (one group)", tokens, orank, h * c / og},
      {"wo_b", tokens, d, og * orank},
      {"expert w1|w3", per_expert, 2 * f, d},
      {"expert w2", per_expert, d, f},
      {"lm head (8192-row chunk)", tokens, 8192 < v ? 8192 : v, d},
  };
}

void bench_gemm(const std::string& config, int64_t tokens, int reps) {
#ifndef TREX_HAVE_CUDA
  trex::fail("trex bench gemm needs a build with CUDA (TREX_CUDA=ON) and a GPU");
#else
  auto cfg = trex::read_json_file(config);
  trex::cuda::Gemm gemm;
  double total_flop = 0, total_s = 0;
  for (const auto& gc : model_gemms(cfg, tokens)) {
    // Forward y = x W^T, then dX = dY W and dW = dY^T X: the three products of a training step.
    struct P {
      const char* what;
      trex::cuda::GemmShape s;
    } products[] = {
        {"fwd", {gc.m, gc.n, gc.k, false, true}},
        {"dgrad", {gc.m, gc.k, gc.n, false, false}},
        {"wgrad", {gc.n, gc.k, gc.m, true, false}},
    };
    for (auto& p : products) {
      int64_t m = p.s.m, n = p.s.n, k = p.s.k;
      std::vector<uint16_t> ha(size_t(m * k)), hb(size_t(k * n));
      std::mt19937 rng(7);
      std::normal_distribution<float> nd;
      for (auto& x : ha) x = trex::f32_to_bf16(nd(rng));
      for (auto& x : hb) x = trex::f32_to_bf16(nd(rng));
      auto a = trex::cuda::DeviceBuffer::from_host(ha), b = trex::cuda::DeviceBuffer::from_host(hb);
      trex::cuda::DeviceBuffer c(size_t(m * n) * 2);
      for (int i = 0; i < 3; ++i) gemm.run(p.s, a.as(), b.as(), c.as());
      cudaEvent_t t0, t1;
      TREX_CUDA(cudaEventCreate(&t0));
      TREX_CUDA(cudaEventCreate(&t1));
      TREX_CUDA(cudaEventRecord(t0));
      for (int i = 0; i < reps; ++i) gemm.run(p.s, a.as(), b.as(), c.as());
      TREX_CUDA(cudaEventRecord(t1));
      TREX_CUDA(cudaEventSynchronize(t1));
      float ms = 0;
      TREX_CUDA(cudaEventElapsedTime(&ms, t0, t1));
      double s = ms / 1e3 / reps, flop = 2.0 * double(m) * double(n) * double(k);
      total_flop += flop;
      total_s += s;
      std::printf("%s\n", fmt::format(R"({{"gemm": "{} {}", "m": {}, "n": {}, "k": {}, "us": {:.1f}, "tflops": {:.1f}}})",
                                      gc.name, p.what, m, n, k, s * 1e6, flop / s / 1e12)
                              .c_str());
      cudaEventDestroy(t0);
      cudaEventDestroy(t1);
    }
  }
  std::printf("%s\n", fmt::format(R"({{"summary": "all GEMMs", "tokens": {}, "tflops": {:.1f}}})", tokens,
                                  total_flop / total_s / 1e12)
                          .c_str());
#endif
}

const bool registered = trex::cli::register_command(
    {"bench", "Benchmarks (GPU kernels; training throughput lands with the CUDA model)", [](CLI::App& app) {
       app.require_subcommand(1);
       auto* g = app.add_subcommand("gemm", "cuBLASLt bf16 GEMM throughput on a model config's training GEMMs");
       auto config = std::make_shared<std::string>();
       auto tokens = std::make_shared<int64_t>(8192);
       auto reps = std::make_shared<int>(20);
       g->add_option("--config", *config, "model config.json (e.g. ../shared/bench/flash-l4.json)")->required();
       g->add_option("--tokens", *tokens, "tokens per step (sequence x batch)")->capture_default_str();
       g->add_option("--reps", *reps, "timed repetitions per GEMM")->capture_default_str();
       g->callback([=] { bench_gemm(*config, *tokens, *reps); });
       auto* o = app.add_subcommand("ops", "CUDA kernels (attention, mHC, router, head+CE) at config shapes");
       auto ocfg = std::make_shared<std::string>();
       auto otok = std::make_shared<int64_t>(8192);
       auto oreps = std::make_shared<int>(10);
       o->add_option("--config", *ocfg, "model config.json (e.g. ../shared/bench/flash-l4.json)")->required();
       o->add_option("--tokens", *otok, "tokens on this GPU (one packed sequence)")->capture_default_str();
       o->add_option("--reps", *oreps, "timed repetitions (median reported)")->capture_default_str();
       o->callback([=] { trex::bench::bench_ops(*ocfg, *otok, *oreps); });
       auto* l = app.add_subcommand("load", "GPU checkpoint load (FP8 / FP4 de-quantised on the device) of one "
                                            "emulated rank's part: one JSON line");
       auto largs = std::make_shared<trex::bench::LoadBenchArgs>();
       l->add_option("--config", largs->config, "the released config.json (e.g. ../shared/bench/v4-flash.json)")
           ->required();
       l->add_option("--dir", largs->dir, "checkpoint directory: written (released format) unless it holds one")
           ->required();
       l->add_option("--layers", largs->layers, "main layers of the written checkpoint")->capture_default_str();
       l->add_option("--layout", largs->layout, "the real layout whose rank is emulated")->capture_default_str();
       l->add_option("--emulate-rank", largs->rank, "the emulated rank")->capture_default_str();
       l->add_option("--staging-mb", largs->staging_mb, "pinned staging buffer (MB)")->capture_default_str();
       l->add_option("--block", largs->block, "FP8 block of a written checkpoint")->capture_default_str();
       l->callback([=] { trex::bench::bench_load(*largs); });
       auto* t = app.add_subcommand("train", "GPU training step (fwd + bwd + AdamW) on random tokens: one JSON line");
       auto targs = std::make_shared<trex::bench::TrainBenchArgs>();
       auto tdev = std::make_shared<std::string>("cuda");
       t->add_option("--config", targs->config, "model config.json (e.g. ../shared/bench/small-s6.json)")->required();
       t->add_option("--seq", targs->seq, "sequence length")->capture_default_str();
       t->add_option("--batch", targs->batch, "sequences per step")->capture_default_str();
       t->add_option("--steps", targs->steps, "timed steps")->capture_default_str();
       t->add_option("--warmup", targs->warmup,
                     "untimed warm-up steps (at least 2: the activation arena is traced in step 1 and laid out in "
                     "step 2)")
           ->capture_default_str();
       t->add_option("--device", *tdev, "cuda (the only backend of this benchmark)")->capture_default_str();
       t->add_flag("--sections", targs->sections, "per-section CUDA-event breakdown in the JSON line");
       t->add_flag("--deterministic", targs->deterministic,
                   "bitwise reproducible backward (train.deterministic: fixed-order attention dK/dV sums, slower)");
       t->add_option("--optimizer", targs->optimizer, "adamw (the baseline's) or muon (Muon group + AdamW)")
           ->check(CLI::IsMember({"adamw", "muon"}))
           ->capture_default_str();
       t->add_option("--moe-gemm", targs->moe_gemm,
                     "routed-expert GEMMs: grouped (sized on the device, no host sync), per-expert (cuBLASLt per "
                     "expert after a host read of the counts) or default")
           ->check(CLI::IsMember({"default", "grouped", "per-expert"}))
           ->capture_default_str();
       t->add_option("--emulate-rank", targs->emulate_rank,
                     "run rank R of --layout alone on this GPU: its partition, its pipeline step, collectives as local "
                     "copies of the real sizes, balanced routing; --batch is the layout's global batch");
       t->add_option("--layout", targs->layout, "the emulated layout, e.g. pp=4,dp=32,ep=32 or "
                     "tp=2,pp=8,vpp=4,dp=32,ep=32 (EP folded into DP; vpp: interleaved stages)");
       t->add_flag("--no-mtp", targs->no_mtp,
                   "emulation: leave the config's MTP module out (by default the rank holding the head runs it, as "
                   "the trainer does, and the planner's prediction counts it)");
       t->add_option("--micro-batch-seqs", targs->micro_batch_seqs, "sequences per micro-batch (emulation)")
           ->capture_default_str();
       t->add_option("--emulate-comm", targs->emulate_comm,
                     "emulated collectives: copy (local copies of the real sizes, serial with the compute) or none "
                     "(counted only: the rank's own compute time and MFU)")
           ->check(CLI::IsMember({"copy", "none"}))
           ->capture_default_str();
       t->add_option("--mode", targs->mode, "planner workload for the prediction: cpt or sft")->capture_default_str();
       t->add_option("--hardware", targs->hardware, "planner hardware profile")->capture_default_str();
       t->add_option("--impl", targs->impl, "planner profile for --emulate-rank: calibrated (configs/plan/calibration-trex-<hardware>.json), trex-prior or a file")->capture_default_str();
       t->add_option("--recompute", targs->recompute,
                     "activation recomputation: none, selective (cheap large activations rebuilt before each "
                     "block's backward) or full (each block's forward re-run before its backward)")
           ->check(CLI::IsMember({"none", "selective", "full"}))
           ->capture_default_str();
       t->add_option("--recompute-full-layers", targs->recompute_full_layers,
                     "with --recompute full: only main layers [0, K) replay in full, the later ones recompute "
                     "selectively (memory for time, layer by layer); default: every layer")
           ->check(CLI::NonNegativeNumber);
       t->add_option("--zero", targs->zero,
                     "dense partitioning over dp: 1 (optimiser state sharded), 2 (gradients sharded too) or 3 "
                     "(the dense bf16 weights too, gathered per layer ahead of use)")
           ->check(CLI::Range(1, 3))
           ->capture_default_str();
       t->add_option("--grad-reduce", targs->grad_reduce, "the gradient buckets' reduction dtype: fp32 or bf16")
           ->check(CLI::IsMember({"fp32", "bf16"}))
           ->capture_default_str();
       t->add_option("--mesh", targs->mesh, "multi-GPU layout under mpirun/srun/torchrun, e.g. dp=2 (ZeRO-1), ep=2 (experts sharded, folded in DP), pp=2,micro_batches=8,stage_layers=3+1 (1F1B)");
       t->callback([=] {
         TREX_CHECK(*tdev == "cuda", "bench train: --device {} unsupported (only cuda)", *tdev);
         if (targs->emulate_rank >= 0 || !targs->layout.empty()) {
           TREX_CHECK(targs->emulate_rank >= 0, "bench train: --layout goes with --emulate-rank R");
           trex::bench::bench_train_emulated(*targs);
         } else {
           trex::bench::bench_train(*targs);
         }
       });
     }});

}  // namespace
