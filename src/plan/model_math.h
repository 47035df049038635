// Parameter counts and FLOPs per token of a DeepSeek-V4 config (design/deepseek-v4.md §4), the counts (and the
// matmul weights behind the dense FLOPs) read from the model's parameter table (model/dsv4/param_table.h), in the
// project's MFU convention (shared/bench/model_flops.py): training = 3 x forward, every weight that
// takes part in a matmul for one token (activated experts only, LM head included), core attention over
// the keys each position really attends (causal-averaged), the indexer's dense scoring.
#pragma once
#include <cstdint>
#include <vector>

#include "model/dsv4/config.h"
#include "plan/model_spec.h"

namespace trex::plan {

// Parameters of one block, split the way parallelism splits them.
// Tensor parallelism as T-Rex runs it (model/cuda/gpu_model.h GpuModelOptions::tp, dsv4::tp_split_axis): the
// attention's wq_b / wo_a / wo_b / sinks and the shared expert split over TP; everything else held and computed
// whole on every TP rank (no sequence parallelism).
struct BlockParams {
  double sharded = 0;     // split by TP (dsv4::tp_split_axis): wq_b, wo_a, wo_b, attn_sink, the shared expert
  double replicated = 0;  // every TP rank whole: wq_a, K=V, compressors, indexer, mHC, norms, router, ape
  double experts = 0;     // routed experts, split by EP x ETP
  double router = 0;      // the router weight alone (frozen with --frozen-router)
  double matmul = 0;      // bf16 weights in matmuls per token but the router (split or not; experts apart)
  double matmul_split = 0;  // ... of them TP-split
  double total() const { return sharded + replicated + experts; }
};

struct ParamCounts {
  double embed = 0, head = 0, final_misc = 0;  // final_misc: final norm + hc_head
  double main_total = 0;                       // whole main model, no MTP
  double mtp = 0;                              // the MTP module (no embedding/head of its own)
  double routed_main = 0;
  double activated = 0;             // per token, excluding the input embedding, no MTP
  double activated_with_embed = 0;  // ... including the input embedding
  double activated_with_mtp = 0;    // ... including MTP, excluding the input embedding
};

// Forward FLOPs per token of one block, by kind of work (the kinds run at different efficiencies).
struct BlockFlops {
  double dense_mm = 0;   // attention/compressor/indexer projections, mHC, router, shared expert
  double dense_mm_split = 0;  // the part of dense_mm in TP-split weights (each TP rank runs 1 / tp of it)
  double expert_mm = 0;  // the K activated routed experts
  double attn_core = 0;  // QK and PV over the attended keys
  double indexer = 0;    // the lightning indexer's dense scoring
  double total() const { return dense_mm + expert_mm + attn_core + indexer; }
};

// How an implementation runs attention: only the keys each query attends (flash/sparse kernels), or
// every key of the sequence under a mask (eager attention), which costs S keys per query.
enum class AttnCompute { Sparse, DenseMasked };

// The model config the parameter table is built from (no RoPE or routing details: the planner needs shapes).
dsv4::ModelConfig model_config(const ModelSpec& m);

class ModelMath {
 public:
  ModelMath(const ModelSpec& m, int64_t seq, AttnCompute mode = AttnCompute::Sparse);
  const ModelSpec& spec() const { return m_; }
  int64_t seq() const { return seq_; }
  int64_t n_blocks(bool with_mtp) const { return m_.n_layers + (with_mtp && m_.n_mtp > 0 ? 1 : 0); }

  // Block b < n_layers is a main block; b == n_layers is the MTP block (its e/h projections included).
  const BlockParams& block_params(int64_t b) const { return params_.at(size_t(b)); }
  const BlockFlops& block_flops(int64_t b) const { return flops_.at(size_t(b)); }
  // LM head (and the hc_head collapse) forward FLOPs per token; the MTP block adds a second head pass.
  double head_flops() const;
  ParamCounts params() const;

  // Training FLOPs per token (3 x forward), the project's MFU numerator.
  double train_flops_per_token(bool with_mtp) const;
  // 6 x activated parameters (excluding the input embedding, no MTP): the "6N" convention.
  double six_n_flops_per_token() const { return 6.0 * params().activated; }
  // Forward core-attention keys per query, averaged over positions, for block b (design §4.2 K-bar).
  double mean_keys(int64_t b) const { return keys_.at(size_t(b)); }

 private:
  ModelSpec m_;
  int64_t seq_;
  std::vector<BlockParams> params_;
  std::vector<double> mhc_fn_;  // per block: both mHC sites' fn weights (matmuls, replicated)
  double embed_ = 0, head_ = 0, final_misc_ = 0;
  std::vector<BlockFlops> flops_;
  std::vector<double> keys_;
};

}  // namespace trex::plan
