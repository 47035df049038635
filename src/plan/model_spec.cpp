#include "plan/model_spec.h"

#include <algorithm>

#include "core/error.h"
#include "core/files.h"

namespace trex::plan {

int64_t ModelSpec::count(AttnKind k) const { return int64_t(std::count(attn.begin(), attn.end(), k)); }

namespace {

AttnKind kind_of_ratio(int64_t r) {
  // The overlapped compressor is used for small ratios (4), the dense one for large ratios (128).
  if (r == 0) return AttnKind::Sliding;
  return r <= 8 ? AttnKind::CSA : AttnKind::HCA;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  TREX_CHECK(j.contains(key), "{}: missing key '{}'", where, key);
  TREX_CHECK(j[key].is_number_integer() || j[key].is_number_float(), "{}: key '{}' must be a number", where,
             key);
  double v = j[key].get<double>();
  TREX_CHECK(v >= 0 && v == double(int64_t(v)), "{}: key '{}' must be a non-negative integer, got {}", where,
             key, v);
  return int64_t(v);
}

int64_t get_int_or(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return get_int(j, key, where);
}

}  // namespace

ModelSpec parse_model_spec(const nlohmann::json& j, const std::string& where) {
  TREX_CHECK(j.is_object(), "{}: a model config must be a JSON object", where);
  ModelSpec m;
  m.name = j.value("_name", std::string());
  m.vocab = get_int(j, "vocab_size", where);
  m.hidden = get_int(j, "hidden_size", where);
  m.n_layers = get_int(j, "num_hidden_layers", where);
  m.n_heads = get_int(j, "num_attention_heads", where);
  m.head_dim = get_int(j, "head_dim", where);
  m.rope_dim = get_int_or(j, "qk_rope_head_dim", m.rope_dim, where);
  m.q_lora_rank = get_int(j, "q_lora_rank", where);
  m.o_groups = get_int(j, "o_groups", where);
  m.o_lora_rank = get_int(j, "o_lora_rank", where);
  m.window = get_int(j, "sliding_window", where);
  m.index_n_heads = get_int(j, "index_n_heads", where);
  m.index_head_dim = get_int(j, "index_head_dim", where);
  m.index_topk = get_int(j, "index_topk", where);
  m.n_routed_experts = get_int(j, "n_routed_experts", where);
  m.n_shared_experts = get_int_or(j, "n_shared_experts", 1, where);
  m.topk = get_int(j, "num_experts_per_tok", where);
  m.moe_inter = get_int(j, "moe_intermediate_size", where);
  m.hc_mult = get_int_or(j, "hc_mult", 4, where);
  m.n_mtp = get_int_or(j, "num_nextn_predict_layers", 0, where);
  m.n_hash_layers = get_int_or(j, "num_hash_layers", -1, where);

  if (j.contains("compress_ratios")) {  // official dialect: one entry per main layer (+ one for MTP)
    const auto& r = j["compress_ratios"];
    TREX_CHECK(r.is_array() && int64_t(r.size()) >= m.n_layers,
               "{}: 'compress_ratios' must be a list with at least num_hidden_layers={} entries", where,
               m.n_layers);
    for (int64_t l = 0; l < m.n_layers; ++l) {
      TREX_CHECK(r[size_t(l)].is_number_integer(), "{}: compress_ratios[{}] must be an integer", where, l);
      int64_t ratio = r[size_t(l)].get<int64_t>();
      TREX_CHECK(ratio >= 0, "{}: compress_ratios[{}] = {} is negative", where, l, ratio);
      m.compress_ratio.push_back(ratio);
      m.attn.push_back(kind_of_ratio(ratio));
    }
  } else if (j.contains("layer_types")) {  // transformers dialect
    const auto& t = j["layer_types"];
    TREX_CHECK(t.is_array() && int64_t(t.size()) == m.n_layers,
               "{}: 'layer_types' must list num_hidden_layers={} entries", where, m.n_layers);
    int64_t csa = 4, hca = 128;
    if (j.contains("compress_rates") && j["compress_rates"].is_object()) {
      csa = j["compress_rates"].value("compressed_sparse_attention", csa);
      hca = j["compress_rates"].value("heavily_compressed_attention", hca);
    }
    for (size_t l = 0; l < t.size(); ++l) {
      std::string s = t[l].is_string() ? t[l].get<std::string>() : std::string("<not a string>");
      if (s == "sliding_attention") {
        m.attn.push_back(AttnKind::Sliding), m.compress_ratio.push_back(0);
      } else if (s == "compressed_sparse_attention") {
        m.attn.push_back(AttnKind::CSA), m.compress_ratio.push_back(csa);
      } else if (s == "heavily_compressed_attention") {
        m.attn.push_back(AttnKind::HCA), m.compress_ratio.push_back(hca);
      } else {
        fail("{}: layer_types[{}] = '{}' is not sliding_attention, compressed_sparse_attention or "
             "heavily_compressed_attention",
             where, l, s);
      }
    }
    if (m.n_hash_layers < 0 && j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array()) {
      m.n_hash_layers = 0;
      for (const auto& x : j["mlp_layer_types"]) m.n_hash_layers += (x == "hash_moe");
    }
  } else {
    fail("{}: neither 'compress_ratios' (official) nor 'layer_types' (transformers) is present", where);
  }
  if (m.n_hash_layers < 0) m.n_hash_layers = 0;
  TREX_CHECK(m.hidden > 0 && m.n_layers > 0 && m.n_heads > 0 && m.head_dim > 0 && m.vocab > 0,
             "{}: hidden_size, num_hidden_layers, num_attention_heads, head_dim and vocab_size must be > 0",
             where);
  TREX_CHECK(m.o_groups > 0 && m.n_heads % m.o_groups == 0,
             "{}: num_attention_heads={} must be a multiple of o_groups={}", where, m.n_heads, m.o_groups);
  TREX_CHECK(m.topk > 0 && m.topk <= m.n_routed_experts,
             "{}: num_experts_per_tok={} must be in [1, n_routed_experts={}]", where, m.topk,
             m.n_routed_experts);
  return m;
}

namespace {

ModelSpec preset_json(bool pro) {
  nlohmann::json j = {
      {"vocab_size", 129280},       {"hidden_size", pro ? 7168 : 4096},
      {"num_hidden_layers", pro ? 61 : 43},
      {"num_attention_heads", pro ? 128 : 64},
      {"head_dim", 512},            {"q_lora_rank", pro ? 1536 : 1024},
      {"o_groups", pro ? 16 : 8},   {"o_lora_rank", 1024},
      {"sliding_window", 128},      {"index_n_heads", 64},
      {"index_head_dim", 128},      {"index_topk", pro ? 1024 : 512},
      {"n_routed_experts", pro ? 384 : 256},
      {"n_shared_experts", 1},      {"num_experts_per_tok", 6},
      {"moe_intermediate_size", pro ? 3072 : 2048},
      {"hc_mult", 4},               {"num_nextn_predict_layers", 1},
      {"num_hash_layers", 3}};
  // design/deepseek-v4.md §1.1: Flash [0, 0, (4, 128) x 20, 4, 0]; Pro [128, 128, (4, 128) x 29, 4, 0].
  std::vector<int64_t> r = pro ? std::vector<int64_t>{128, 128} : std::vector<int64_t>{0, 0};
  for (int i = 0; i < (pro ? 29 : 20); ++i) r.push_back(4), r.push_back(128);
  r.push_back(4);
  r.push_back(0);  // the MTP block
  j["compress_ratios"] = r;
  ModelSpec m = parse_model_spec(j, pro ? "preset v4-pro" : "preset v4-flash");
  m.name = pro ? "DeepSeek-V4-Pro" : "DeepSeek-V4-Flash";
  return m;
}

}  // namespace

bool is_model_preset(const std::string& name) {
  std::string s = lower(name);
  return s == "flash" || s == "v4-flash" || s == "deepseek-v4-flash" || s == "pro" || s == "v4-pro" ||
         s == "deepseek-v4-pro";
}

ModelSpec model_preset(const std::string& name) {
  TREX_CHECK(is_model_preset(name), "unknown model preset '{}' (expected flash or pro, or a config.json path)",
             name);
  return preset_json(lower(name).find("pro") != std::string::npos);
}

ModelSpec load_model_spec(const std::string& name_or_path) {
  if (is_model_preset(name_or_path)) return model_preset(name_or_path);
  TREX_CHECK(fs::exists(name_or_path), "model '{}' is neither a preset (flash, pro) nor an existing file",
             name_or_path);
  ModelSpec m = parse_model_spec(read_json_file(name_or_path), name_or_path);
  if (m.name.empty()) m.name = fs::path(name_or_path).filename().string();
  return m;
}

}  // namespace trex::plan
