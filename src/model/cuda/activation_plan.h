// The GPU model's activation table: the bytes a training forward of a batch layout keeps on the device, per block
// and in total, for a recomputation mode, and the one-block scratch recomputation needs in the backward; computed
// from the config and the layout alone (no device, no allocation), request by request as the GPU model's pools
// take them (a GPU test compares the two), so it is what `trex bench train` prints beside the measured peak and
// what the planner's activation model (src/plan/estimate.cpp) is checked against.
//
// Counted: the streams entering each layer and leaving the stage, the MTP streams and input, the heads'
// activations (a training forward's, HeadMode::LossAndGrad), every block's saved activations and selections.
// Not counted: per-op temporaries (freed when the op ends), the backward's gradient streams and one block's
// backward temporaries, the device layout. Under expert parallelism the expert-major rows a rank receives depend
// on the routing: they are counted as the N * topk rows of the single-GPU case.
#pragma once
#include <cstdint>
#include <vector>

#include "model/dsv4/config.h"
#include "model/dsv4/recompute.h"
#include "model/dsv4/seq_layout.h"

namespace trex::dsv4gpu {

// The mHC site's fp32 mixing row per token (pre, post, comb of 4 streams: kernels/cuda/mhc.h kMhcMix).
constexpr int64_t kPlanMhcMix = 24;

struct ActivationPlanShape {
  int64_t layer_begin = 0, layer_end = -1;  // the stage's layers (-1: to the last)
  bool mtp = false;                         // the MTP block (whole model only)
  dsv4::Recompute recompute = dsv4::Recompute::None;
  int64_t recompute_full_layers = -1;       // GpuModelOptions::recompute_full_layers
  bool head_grad = true;                    // HeadMode::LossAndGrad (d(normed) kept by the forward)
  bool balance = false, balance_hash_layers = false;
  // Tensor parallelism (GpuModelOptions::tp): a TP rank's block keeps its heads' and output groups' attention
  // activations and its share of the shared expert's; everything else (streams, mHC, the compressed query, K=V,
  // compressor, indexer, router, routed experts, the head) is whole on every TP rank (no sequence parallelism).
  int64_t tp = 1;
  // Expert parallelism (GpuModelOptions::ep, its size): above 1 a block also keeps its received expert-major rows.
  int64_t ep = 1;
  // Expert tensor parallelism (GpuModelOptions::expert_tp: etp = tp, else 1): a block keeps its share of the routed
  // experts' gate|up, and the shared expert's partial output is a temporary summed with theirs, not kept.
  int64_t etp = 1;
};

struct BlockActivations {
  int64_t kept = 0;     // what stays from the forward to the backward (selections included)
  int64_t dropped = 0;  // what recomputation rebuilds (0 with none)
};

struct ActivationPlan {
  int64_t streams = 0;  // X(l) of the stage's layers, the outgoing stream (last stage), the MTP streams
  int64_t heads = 0;    // head(s) and the MTP input
  std::vector<BlockActivations> blocks;  // the stage's layers, then the MTP block
  int64_t block_scratch = 0;  // max over blocks of dropped: rebuilt one block at a time
  int64_t kept() const;       // streams + heads + every block's kept
  int64_t total() const { return kept() + block_scratch; }  // the activations' peak
};

ActivationPlan plan_activations(const dsv4::ModelConfig& cfg, const dsv4::SeqLayout& layout,
                                const ActivationPlanShape& shape);

// The GPU model's largest transient buffers beside the activations, sized from the shapes the code allocates
// (what `trex bench train --emulate-rank` counts before allocating, and the planner's workspace term): per model
// chunk the backward's fp32 gradient streams ([tokens, hc, d]: two, and the input gradient kept for the send
// unless the chunk embeds) and one MoE layer's backward temporaries (bf16 rows of d and f for every routed row,
// the balanced exchange bringing tokens x topk of them: dye, the received and regrouped gradients, dxl; h, dh and
// the two halves of dgu); with pipeline stages the boundary's receive buffers and sources once per rank.
struct WorkspaceShape {
  int64_t tokens = 0;    // one micro-batch's tokens on the rank
  int64_t chunks = 1;    // model chunks on the rank (virtual stages)
  bool embeds = false;   // one of them holds the embedding
  bool stages = false;   // pipeline parallel
  bool act_in = false;   // activations arrive from a previous stage (some chunk does not embed)
  bool grad_in = false;  // gradients arrive from a later stage (some chunk has no head)
  int64_t etp = 1;       // expert tensor parallelism: the routed experts' width a rank holds is moe_inter / etp
};
struct Workspace {
  int64_t grad_streams = 0, moe_bwd = 0, boundary = 0;
  int64_t total() const { return grad_streams + moe_bwd + boundary; }
};
Workspace plan_workspace(const dsv4::ModelConfig& cfg, const WorkspaceShape& shape);

}  // namespace trex::dsv4gpu
