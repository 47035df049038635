// The few DeepSeek-V4 shape fields the planner needs, read from either config.json dialect (official
// `compress_ratios`, or transformers' `layer_types` + `compress_rates`) or taken from the built-in
// presets for V4-Flash / V4-Pro (design/deepseek-v4.md §1.1). model_math.h turns it into a dsv4::ModelConfig
// and counts parameters from the model's own table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trex::plan {

enum class AttnKind { Sliding, CSA, HCA };  // compress ratio 0, overlapped small ratio, large ratio

struct ModelSpec {
  std::string name;
  int64_t vocab = 0;
  int64_t hidden = 0;  // d
  int64_t n_layers = 0;
  int64_t n_heads = 0;   // n_h
  int64_t head_dim = 0;  // c
  int64_t rope_dim = 64;  // r (qk_rope_head_dim): shapes do not depend on it, the attention dims check it
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t window = 0;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t topk = 0;       // K
  int64_t moe_inter = 0;  // f
  int64_t hc_mult = 4;
  int64_t n_mtp = 0;  // MTP blocks in the checkpoint (0 or 1)
  int64_t n_hash_layers = 0;
  std::vector<AttnKind> attn;            // per main layer
  std::vector<int64_t> compress_ratio;   // per main layer, 0 for sliding

  int64_t count(AttnKind k) const;
};

// "flash" / "pro" (also "v4-flash", "deepseek-v4-pro", ...), else throws.
ModelSpec model_preset(const std::string& name);
bool is_model_preset(const std::string& name);
// Either dialect; `where` names the source in errors.
ModelSpec parse_model_spec(const nlohmann::json& j, const std::string& where);
// A preset name or a config.json path.
ModelSpec load_model_spec(const std::string& name_or_path);

}  // namespace trex::plan
