// DeepSeek-V4 model configuration: one struct for both config.json dialects (design §1.1):
//  - official: compress_ratios, num_hash_layers, rope_scaling, qk_rope_head_dim
//  - transformers: layer_types, mlp_layer_types, compress_rates, rope_parameters.main/compress,
//    partial_rotary_factor
// Parsing rejects unknown layer types and inconsistent sizes with an error naming the file and key.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trex::dsv4 {

enum class AttnType { Sliding, CSA, HCA };  // compress ratio 0, overlapped m (4), non-overlapped m' (128)
enum class MlpType { HashMoE, MoE };        // tid2eid routing, or sqrtsoftplus + noaux bias top-k

struct RopeParams {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden = 0;          // d
  int64_t n_layers = 0;        // main blocks L (MTP not counted)
  int64_t n_heads = 0;         // n_h
  int64_t head_dim = 0;        // c (q, k, v)
  int64_t rope_dim = 0;        // r: the last r dims of each head are rotated (interleaved pairs)
  int64_t q_lora_rank = 0;     // d_c
  int64_t o_groups = 0;        // g
  int64_t o_lora_rank = 0;     // d_g
  int64_t window = 0;          // sliding window including the current token
  int64_t index_n_heads = 0;   // n_I
  int64_t index_head_dim = 0;  // c_I
  int64_t index_topk = 0;      // k_sel
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t topk = 0;            // K routed experts per token
  int64_t moe_inter = 0;       // f
  double routed_scale = 1.0;   // rho
  double swiglu_limit = 0.0;   // 0 = no clamp
  bool norm_topk_prob = true;
  std::string score_func = "sqrtsoftplus";
  int64_t hc_mult = 4;         // n_hc streams
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_eps = 1e-6;
  int64_t n_mtp = 0;           // num_nextn_predict_layers (0 or 1)
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t max_position = 0;

  // Per main layer (size n_layers). compress_ratio: 0 sliding, else the compression rate.
  std::vector<AttnType> attn_types;
  std::vector<int64_t> compress_ratio;
  std::vector<MlpType> mlp_types;
  // The MTP block: sliding attention, score-routed MoE (design §2.10).

  RopeParams rope_main;      // sliding layers (and MTP)
  RopeParams rope_compress;  // CSA / HCA layers: compress_rope_theta with YaRN

  std::string source_dialect;  // "official" or "transformers": what the file was written in

  int64_t n_hash_layers() const;
  const RopeParams& rope_for(int64_t layer) const {
    return compress_ratio.at(size_t(layer)) == 0 ? rope_main : rope_compress;
  }
  void validate() const;  // throws trex::Error naming the inconsistent fields
};

enum class Dialect { Official, Transformers };

ModelConfig parse_model_config(const nlohmann::json& j, const std::string& where);
ModelConfig load_model_config(const std::filesystem::path& config_json);
nlohmann::json model_config_to_json(const ModelConfig& cfg, Dialect dialect);

// Inverse frequencies of one rotary table (rope_dim/2 entries), YaRN applied as the reference
// does it (design §2.4.4): ramp indexed by pair, low/high computed in full-dimension units.
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rope_dim);

}  // namespace trex::dsv4
