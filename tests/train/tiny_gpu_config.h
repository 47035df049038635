// The tiny DeepSeek-V4 config the GPU tests share (training parity, DP, EP, PP, the inference engine): every
// layer kind (sliding, CSA m=4, HCA m=16; one hash and two score MoE layers with a shared expert) at shapes the
// fast CUDA kernels accept (head_dim 256, 4 streams), small enough that the CPU reference runs in milliseconds.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/dsv4/config.h"

namespace trex::testing {

// The config.json mapping (run configs inline it as model.dsv4); n_mtp 1: with the MTP module (its block is a
// sliding layer: compress ratio 0).
inline nlohmann::json tiny_gpu_config_json(int64_t n_mtp = 0) {
  nlohmann::json j = {{"vocab_size", 256},
                      {"hidden_size", 64},
                      {"num_hidden_layers", 3},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 1},
                      {"head_dim", 256},
                      {"qk_rope_head_dim", 64},
                      {"q_lora_rank", 32},
                      {"o_groups", 2},
                      {"o_lora_rank", 16},
                      {"n_routed_experts", 8},
                      {"num_experts_per_tok", 2},
                      {"n_shared_experts", 1},
                      {"moe_intermediate_size", 32},
                      {"routed_scaling_factor", 1.5},
                      {"scoring_func", "sqrtsoftplus"},
                      {"norm_topk_prob", true},
                      {"swiglu_limit", 10.0},
                      {"index_n_heads", 4},
                      {"index_head_dim", 64},
                      {"index_topk", 4},
                      {"sliding_window", 16},
                      {"compress_ratios", {0, 4, 16}},
                      {"num_hash_layers", 1},
                      {"hc_mult", 4},
                      {"hc_sinkhorn_iters", 20},
                      {"hc_eps", 1e-6},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000},
                      {"compress_rope_theta", 160000},
                      {"rope_scaling",
                       {{"type", "yarn"},
                        {"factor", 4},
                        {"original_max_position_embeddings", 64},
                        {"beta_fast", 32},
                        {"beta_slow", 1}}},
                      {"max_position_embeddings", 4096},
                      {"num_nextn_predict_layers", n_mtp},
                      {"bos_token_id", 0},
                      {"eos_token_id", 1}};
  if (n_mtp > 0) j["compress_ratios"].push_back(0);
  return j;
}

inline dsv4::ModelConfig tiny_gpu_config(const std::string& where, int64_t n_mtp = 0) {
  return dsv4::parse_model_config(tiny_gpu_config_json(n_mtp), where);
}

}  // namespace trex::testing
