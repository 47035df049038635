// `trex bench train`: the GPU training step (forward, backward, AdamW) of a V4 config on random tokens, one JSON
// line with the fields of ../shared/bench/hf_baseline.py (tokens/s, model TFLOP/s, MFU with model_flops.py's
// convention, peak GiB), warm-up steps excluded.
#pragma once
#include <cstdint>
#include <string>

namespace trex::bench {

struct TrainBenchArgs {
  std::string config;
  int64_t seq = 4096, batch = 1;
  int steps = 5, warmup = 2;
  bool sections = false;  // add a per-section breakdown (CUDA events) to the JSON line
  bool deterministic = false;  // GpuModelOptions::deterministic (the trainer's train.deterministic)
  // "adamw": the baseline's torch AdamW (lr 1e-5, eps 1e-8, weight decay 0.01) on every tensor; "muon": the run
  // optimiser's Muon on the Muon group (design §5 defaults) with that AdamW on the rest (one GPU or pipeline stages).
  std::string optimizer = "adamw";
  // Routed-expert GEMMs: "grouped" (one grouped GEMM per product over all local experts, sized on the device: no
  // host synchronisation), "per-expert" (one cuBLASLt GEMM per expert after a host read of the counts), or
  // "default" (GpuModelOptions' default).
  std::string moe_gemm = "default";
  // Activation recomputation of the GPU model: none | selective | full (GpuModelOptions::recompute). The JSON line
  // gives the activation table's planned bytes (activations_planned_gib) beside the measured peak (peak_gib).
  std::string recompute = "none";
  int64_t recompute_full_layers = -1;  // --recompute-full-layers K (GpuModelOptions::recompute_full_layers)
  // Dense partitioning under data parallelism (GpuModelOptions::zero; the config's parallel.zero): 1, 2 or 3; and the
  // bucket reduction's dtype, fp32 or bf16 (parallel.grad_reduce_dtype). With --emulate-rank the emulated rank's.
  int zero = 1;
  std::string grad_reduce = "fp32";
  uint64_t seed = 1;
  // Multi-GPU layout, e.g. "dp=2" (data parallel, ZeRO-1), "pp=2,micro_batches=8", "ep=2"; empty = one GPU.
  // Pipeline: --batch sequences per step in micro_batches micro-batches (1F1B), "stage_layers=3+1" sets the layer
  // split (default: even, the remainder on the first stages).
  // Launched by mpirun / srun / torchrun, one process per GPU; rank 0 prints the JSON line. With dp = D each rank
  // trains on its own `batch` sequences of a global batch of D x batch (the same tokens one GPU gets with
  // --batch D x batch, so the losses compare).
  std::string mesh;
  // Rank emulation (bench_emulate.cpp): rank `emulate_rank` of `layout` ("pp=P,vpp=V,dp=D,ep=E,tp=T", mesh.h) alone
  // on this GPU, --batch the layout's global batch in micro-batches of micro_batch_seqs sequences per DP rank;
  // beside it the planner's prediction for that rank (hardware / impl profiles, `mode` cpt or sft).
  int emulate_rank = -1;
  std::string layout;
  bool no_mtp = false;  // --no-mtp: the emulated rank and the planner's prediction without the MTP module
  int64_t micro_batch_seqs = 1;
  // What the emulated collectives do with their bytes: "copy" (local copies of the real sizes, queued on the
  // compute's stream: the step then pays their memory traffic serially) or "none" (counted only: the rank's own
  // compute, what its MFU is judged on; a real collective runs on its own stream and links).
  std::string emulate_comm = "copy";
  std::string mode = "sft", hardware = "nvidia-h200", impl = "calibrated";  // calibrated: configs/plan/calibration-trex-<hardware>.json
};

// The GPU model's activation arena (activation_arena.h) is laid out once: the first step traces its requests and the
// second maps the arena. A timed window holding either measures that one-time layout (about 0.2 s of device idle on
// a V4-Flash rank), not the step, so both benchmarks refuse fewer warm-up steps than this.
inline constexpr int kArenaLayoutSteps = 2;
void check_warmup_covers_arena_layout(const TrainBenchArgs& a);
void check_recompute_full_layers(const TrainBenchArgs& a);

void bench_train(const TrainBenchArgs& a);
void bench_train_emulated(const TrainBenchArgs& a);

// Training FLOPs per token exactly as ../shared/bench/model_flops.py computes them from the config JSON.
double model_flops_per_token(const std::string& config_json_path, int64_t seq);

}  // namespace trex::bench
