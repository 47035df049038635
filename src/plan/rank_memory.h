// The planner's per-rank count of the parameter state `trex train --device cuda` allocates under data and expert
// parallelism (pp = 1), read from the model's parameter table (dsv4::param_table) with the GPU trainer's
// partition rules (docs/parallel.md):
// - every rank holds the dense tensors and its own E / ep routed experts (EP rank = DP rank mod ep, experts
//   [ep_rank E/ep, (ep_rank+1) E/ep)): their bf16 weights and fp32 gradients;
// - ZeRO-1 over the dp ranks: the fp32 master and the AdamW moments of the dense tensors the kernels read in bf16
//   are sharded dp ways; the small fp32-read tensors (mHC mixing, attention sinks, compressor ape) are replicated;
// - a routed expert's master and moments are sharded over its dp / ep expert-data-parallel replicas;
// - ZeRO-2 (parallel.zero 2): the fp32 gradients of the bucketed tensors persist as this rank's 1/dp share too:
//   the bf16-read dense tensors, and the routed experts when ep = 1 (they are then in their layer's bucket); the
//   fp32-read ones (region R) and, under ep > 1, the experts (region X) stay whole. The transient bucket buffers
//   (model/cuda/grad_buckets.h) and Muon's per-bucket Newton-Schulz gather are not parameter state and are not
//   counted here.
// - ZeRO-3 (parallel.zero 3): ZeRO-2's gradients, and the bf16 weights of every tensor in the data-parallel
//   buckets persist as this rank's 1/dp share: the bf16-read dense tensors, and without expert parallelism (ep 1)
//   the routed experts too (they sit in their layer's bucket); with ep > 1 the experts (region X) and always the
//   fp32-read tensors stay whole. The buckets' gathered buffers (model/cuda/weight_gather.h: two of the largest
//   layer's plus the embedding's, the head's and the MTP module's) are transient: `gathered` counts their peak.
// Element counts without the arena's alignment padding. A bucket's padding falls into its last ranks' slices, so
// a rank's real ZeRO-2 share of a bucket differs from the 1/dp share by less than the bucket alignment (512
// elements per bucket), and the shares sum over the dp ranks to the bucketed elements exactly. The GPU tests
// (tests/train/test_gpu_mesh_ep_gpu.cpp, test_gpu_zero_gpu.cpp) compare them with what each rank allocates.
#pragma once
#include <cstdint>

#include "model/dsv4/config.h"

namespace trex::plan {

struct RankParamState {
  int64_t dense = 0;      // dense parameter elements held (every rank)
  int64_t experts = 0;    // routed-expert parameter elements held (this rank's experts)
  double owned = 0;       // parameter elements whose fp32 master (and each AdamW moment) this rank owns
  double grads = 0;       // parameter elements with persistent fp32 gradients (held(); ZeRO-2: a share)
  double weights = 0;     // parameter elements of the persistent bf16 copy (held(); ZeRO-3: a share)
  double gathered = 0;    // ZeRO-3: elements of the gathered bf16 buffers at their peak (0 otherwise)
  int64_t held() const { return dense + experts; }
  // Bytes: bf16 weights, fp32 gradients, fp32 master + two fp32 moments, ZeRO-3's gathered bf16 buffers.
  double weight_bytes() const { return 2.0 * weights; }
  double grad_bytes() const { return 4.0 * grads; }
  double optimizer_bytes() const { return 12.0 * owned; }
  double gather_bytes() const { return 2.0 * gathered; }
};

// - tensor parallelism (tp ranks per DP rank, GpuModelOptions::tp): a TP-split tensor (dsv4::tp_split_axis:
//   the attention's wq_b / wo_a / wo_b / sinks, the shared expert) counts its 1 / tp slice; everything else is
//   held whole by every TP rank (the routed experts too at etp 1; at etp = tp each expert's 1 / tp slice,
//   GpuModelOptions::expert_tp). The counts are the same for every TP rank.
//
// DP rank dp_rank of a layout of dp ranks with ep folded in (ep divides dp and the routed experts; refused with
// the numbers otherwise) and tp TP ranks each. cfg as the GPU model is built (n_mtp 0 when the trainer runs
// without MTP). zero: 1, 2 or 3 (the GPU trainer's levels).
RankParamState rank_param_state(const dsv4::ModelConfig& cfg, int64_t dp, int64_t ep, int64_t dp_rank,
                                int zero = 1, int64_t tp = 1, int64_t etp = 1);

}  // namespace trex::plan
