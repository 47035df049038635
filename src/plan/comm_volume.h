// The planner's per-step communication of one rank, per collective kind: the bytes and calls the GPU trainer's
// collectives carry (ZeRO's bucket reduce-scatters and all-gathers, the experts' replica reduction, the expert
// exchange, the pipeline boundary, TP's all-reduces), counted as comm::EmulatedGroup::stats() counts them, so that
// `trex bench train --emulate-rank ... --sections` (its `emulated_comm_total`) can be compared with them one to one;
// and their time on two targets:
//  - the emulated rank (`--emulate-comm copy`): EmulatedGroup's local copies, on the compute stream (so fully
//    exposed): the bytes it really copies (a reduce-scatter / all-gather moves this rank's slice only, an
//    all-to-all every block of the send buffer, an all-reduce nothing), read and written at HBM speed, plus a cost
//    per device copy it issues (one cudaMemcpyAsync per peer block of an all-to-all); `--emulate-comm none`
//    moves only the operations below EmulatedGroup::kCountOnlyMovesBelow bytes;
//  - the real cluster: ring collectives over the group's links (NVLink inside the scale-up domain, the scale-out
//    fabric beyond it, HardwareProfile's bandwidths and per-hop latencies), bytes on the wire / bandwidth + calls x
//    hops x latency, before any overlap with compute (the estimator applies its overlap fractions).
//
// Where the bytes come from: the DP buckets are the GPU model's region A (model/cuda/gpu_params_cuda.cpp
// declare_all: one bucket for the embedding, one for the head + final norm, one per layer, one for the MTP module;
// the bf16-read trained tensors of dsv4::param_table at their TP-local shape, the routed experts too when ep is 1;
// each bucket padded to lcm(512, 8 x dp) elements); region X is this rank's routed experts under ep > 1 (padded
// the same way), reduce-scattered over the expert-data-parallel replicas; region R (the fp32-read tensors) is
// all-reduced. When the trainer reduces (model/cuda/gpu_model_cuda.cpp backward_impl): ZeRO-1 in the step's last
// backward only, ZeRO-2 / 3 in every backward; the post-step weight all-gather once per step (ZeRO-1 / 2), ZeRO-3's
// gathers per bucket use (weight_gather.h: a layer's forward and backward, the embedding's and head's once per
// micro-batch). The expert exchange (model/cuda/gpu_moe_cuda.cpp): per MoE block and forward pass (again in a
// full recomputation's replay) a counts exchange, the dispatch and the combine; in the backward the combine's and
// the dispatch's gradients; rows of tokens x topk x hidden bf16 (balanced routing). The pipeline boundary
// (train/cuda/gpu_pipeline_cuda.cpp): tokens x hc x hidden, bf16 forward, fp32 backward.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/dsv4/config.h"
#include "plan/layout.h"
#include "plan/profiles.h"

namespace trex::plan {

// Elements of each DP bucket unit of the GPU model, before padding (gpu_params_cuda.cpp declare_all).
struct BucketTable {
  int64_t embed = 0, head = 0;       // bf16-read trained tensors of the embedding / the head + final norm
  std::vector<int64_t> block;        // per block (main layers, then the MTP module's whole bucket): its bucket
  std::vector<int64_t> experts;      // per block: all its routed experts' elements (region X under ep > 1)
  std::vector<int64_t> fp32;         // per block: its fp32-read trained tensors (region R)
  int64_t head_fp32 = 0;             // the head's fp32-read tensors (hc_head_*)
};
// ep_split: the routed experts leave the layer buckets (ep > 1). tp: each tensor at its TP-local shape; etp (1 or
// tp): the routed experts' too (expert tensor parallelism).
BucketTable bucket_table(const dsv4::ModelConfig& cfg, bool ep_split, int64_t tp, int64_t etp = 1);
// A bucket of n elements as declared for dp ranks: padded to lcm(512, 8 dp) (zero stays zero).
int64_t padded_bucket(int64_t n, int64_t dp);

struct CommKind {
  std::string kind;        // e.g. "dp reduce_scatter (ZeRO grads)"
  std::string op;          // the EmulatedGroup operation: reduce_scatter, all_gather, all_to_all_v, send, ...
  std::string dim;         // the group: dp (ZeRO over DP x CP), edp (an expert's replicas), ep, pp, tp
  int64_t group = 1;       // ranks in the collective
  double bytes = 0;        // per step, as EmulatedGroup counts them (reduce_scatter: the whole send; all_gather: the
                           // send chunk; all_to_all_v: to peers other than this rank; all_reduce: the buffer)
  int64_t calls = 0;
  double moved = 0;        // bytes the emulation copies per step (--emulate-comm copy)
  int64_t copies = 0;      // device copies it issues
  double moved_none = 0;   // ... under --emulate-comm none (operations below 64 KiB still move)
  int64_t copies_none = 0;
  double wire = 0;         // bytes this rank sends on the links of the real collective (ring / all-to-all)
  double emulated_s = 0, emulated_none_s = 0, cluster_s = 0;  // seconds per step
};

struct RankComm {
  std::vector<CommKind> kinds;
  double emulated_s() const;
  double emulated_none_s() const;
  double cluster_s() const;
  double bytes(const std::string& op) const;  // summed over kinds of that EmulatedGroup operation
  int64_t calls(const std::string& op) const;
};

// One rank of pipeline stage `stage` of layout l: `blocks` are its blocks (every virtual chunk), `chunks` the
// virtual-stage index (c x pp + stage) of each of its chunks, micro_batches per step, tokens per micro-batch on
// this rank. first / last: whether the stage embeds / holds the head (and, with mtp_embed_copy, the MTP input's
// copy of the embedding, which the first stage does not share).
struct RankCommInputs {
  Layout layout;
  std::vector<int64_t> blocks;
  std::vector<int64_t> chunks;
  int64_t n_virtual = 1;  // pp x vpp
  bool first = true, last = true, mtp_embed_copy = false;
  int64_t micro_batches = 1;
  double tokens = 0;
  int64_t hidden = 0, hc = 0, topk = 0, experts = 0, q_lora_rank = 0, head_dim = 0;
  int64_t devices = 1;    // the layout's ranks (one scale-up domain when it fits)
};

// The comm kinds and their bytes / calls, and their time on both targets: hbm_eff the fraction of the hardware's
// HBM bandwidth a device copy reaches (the read and the write both count), comm_eff that of its links, copy_s the
// emulation's cost per device copy it issues (ImplProfile::emulated_copy_s).
RankComm rank_comm(const BucketTable& t, const RankCommInputs& in, const HardwareProfile& hw, double hbm_eff,
                   double comm_eff, double copy_s);

// A text table of the kinds (GiB and calls per step; seconds emulated with copies / count-only, on the cluster) and
// its JSON.
std::string comm_table(const RankComm& c);
nlohmann::json comm_to_json(const RankComm& c);

}  // namespace trex::plan
