// config.json parsing for both dialects (design §1.1) and writing either one back.
// rope_inv_freq (declared in config.h) lives in rope.cpp.
#include "model/dsv4/config.h"

#include <cmath>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace trex::dsv4 {

using json = nlohmann::json;

namespace {

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kCSA = "compressed_sparse_attention";
constexpr const char* kHCA = "heavily_compressed_attention";
constexpr const char* kHashMoE = "hash_moe";
constexpr const char* kMoE = "moe";
// The reference code makes ratio 4 the overlapped, indexed compressor (CSA); every other non-zero
// ratio is a non-overlapped HCA compressor. The official dialect can only express that split.
constexpr int64_t kOfficialCsaRatio = 4;
constexpr int64_t kDefaultHcaRatio = 128;

// Typed access that names the file and key in every error.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  const std::string& where() const { return where_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& at(const char* key) const {
    TREX_CHECK(has(key), "{}: missing required key '{}'", where_, key);
    return j_[key];
  }
  int64_t integer(const char* key) const { return as_int(at(key), key); }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  double number(const char* key) const { return as_double(at(key), key); }
  double number(const char* key, double dflt) const { return has(key) ? number(key) : dflt; }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    TREX_CHECK(j_[key].is_boolean(), "{}: key '{}' must be true or false, found {}", where_, key,
               j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    TREX_CHECK(j_[key].is_string(), "{}: key '{}' must be a string, found {}", where_, key, j_[key].dump());
    return j_[key].get<std::string>();
  }
  int64_t as_int(const json& v, const std::string& key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some writers emit integral values as floats (e.g. 16.0); accept those exactly.
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) < 9e15)
      return int64_t(v.get<double>());
    fail("{}: key '{}' must be an integer, found {}", where_, key, v.dump());
  }
  double as_double(const json& v, const std::string& key) const {
    TREX_CHECK(v.is_number(), "{}: key '{}' must be a number, found {}", where_, key, v.dump());
    return v.get<double>();
  }
  Reader sub(const char* key) const {
    const json& v = at(key);
    TREX_CHECK(v.is_object(), "{}: key '{}' must be an object, found {}", where_, key, v.dump());
    return Reader(v, where_ + ":" + key);
  }
  const json& raw() const { return j_; }

 private:
  const json& j_;
  std::string where_;
};

// YaRN / default parameters from a transformers rope_parameters entry or an official rope_scaling.
RopeParams parse_rope(const Reader& r, double theta) {
  RopeParams p;
  p.theta = theta;
  std::string type = r.string("rope_type", r.string("type", "default"));
  if (type == "default" || type == "none") return p;
  TREX_CHECK(type == "yarn", "{}: rope type '{}' is not supported (expected 'default' or 'yarn')", r.where(),
             type);
  p.yarn = true;
  p.factor = r.number("factor");
  p.original_max_position = r.integer("original_max_position_embeddings");
  p.beta_fast = r.number("beta_fast", 32.0);
  p.beta_slow = r.number("beta_slow", 1.0);
  // The reference applies no attention/m-scale factor (design §2.4.4); a file asking for one would
  // change the numerics silently, so say so.
  double af = r.number("attention_factor", 1.0);
  if (af != 1.0)
    log::warn("{}: attention_factor {} is ignored (DeepSeek-V4 applies no YaRN attention scale)", r.where(),
              af);
  double mscale = r.number("mscale", 0.0);
  if (mscale != 0.0 && mscale != 1.0)
    log::warn("{}: mscale {} is ignored (DeepSeek-V4 applies no YaRN attention scale)", r.where(), mscale);
  return p;
}

int64_t rope_dim_from_factor(const Reader& r, double factor, int64_t head_dim, const char* key) {
  double exact = factor * double(head_dim);
  int64_t dim = std::llround(exact);
  TREX_CHECK(std::fabs(exact - double(dim)) < 1e-6,
             "{}: {} {} x head_dim {} = {} is not a whole number of dims", r.where(), key, factor, head_dim,
             exact);
  return dim;
}

void parse_common(const Reader& r, ModelConfig& c) {
  std::string model_type = r.string("model_type", "deepseek_v4");
  TREX_CHECK(model_type == "deepseek_v4", "{}: model_type '{}' is not 'deepseek_v4'", r.where(), model_type);
  c.vocab_size = r.integer("vocab_size");
  c.hidden = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.head_dim = r.integer("head_dim");
  c.q_lora_rank = r.integer("q_lora_rank");
  c.o_groups = r.integer("o_groups");
  c.o_lora_rank = r.integer("o_lora_rank");
  c.window = r.integer("sliding_window");
  c.index_n_heads = r.integer("index_n_heads", 0);
  c.index_head_dim = r.integer("index_head_dim", 0);
  c.index_topk = r.integer("index_topk", 0);
  c.n_routed_experts = r.integer("n_routed_experts");
  c.n_shared_experts = r.integer("n_shared_experts", 1);
  c.topk = r.integer("num_experts_per_tok");
  c.moe_inter = r.integer("moe_intermediate_size");
  c.routed_scale = r.number("routed_scaling_factor", 1.0);
  c.swiglu_limit = r.number("swiglu_limit", 0.0);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.score_func = r.string("scoring_func", "sqrtsoftplus");
  c.hc_mult = r.integer("hc_mult", 4);
  c.hc_sinkhorn_iters = r.integer("hc_sinkhorn_iters", 20);
  c.hc_eps = r.number("hc_eps", 1e-6);
  c.rms_eps = r.number("rms_norm_eps", 1e-6);
  c.n_mtp = r.integer("num_nextn_predict_layers", 0);
  c.bos_token_id = r.integer("bos_token_id", 0);
  if (r.has("eos_token_id") && r.raw()["eos_token_id"].is_array()) {
    const json& e = r.raw()["eos_token_id"];
    TREX_CHECK(!e.empty(), "{}: eos_token_id is an empty list", r.where());
    c.eos_token_id = r.as_int(e[0], "eos_token_id[0]");
  } else {
    c.eos_token_id = r.integer("eos_token_id", 1);
  }
  c.max_position = r.integer("max_position_embeddings", 0);
  int64_t kv_heads = r.integer("num_key_value_heads", 1);
  TREX_CHECK(kv_heads == 1, "{}: num_key_value_heads is {}; DeepSeek-V4 has one shared K=V head", r.where(),
             kv_heads);
  TREX_CHECK(!r.boolean("tie_word_embeddings", false),
             "{}: tie_word_embeddings is true; DeepSeek-V4 has an untied head", r.where());
  TREX_CHECK(c.n_layers > 0, "{}: num_hidden_layers must be positive, found {}", r.where(), c.n_layers);
}

void parse_transformers(const Reader& r, ModelConfig& c) {
  int64_t csa_rate = 4, hca_rate = kDefaultHcaRatio;
  if (r.has("compress_rates")) {
    Reader rates = r.sub("compress_rates");
    csa_rate = rates.integer(kCSA, csa_rate);
    hca_rate = rates.integer(kHCA, hca_rate);
  }
  const json& lt = r.at("layer_types");
  TREX_CHECK(lt.is_array(), "{}: layer_types must be a list", r.where());
  TREX_CHECK(int64_t(lt.size()) == c.n_layers, "{}: layer_types has {} entries but num_hidden_layers is {}",
             r.where(), lt.size(), c.n_layers);
  for (size_t i = 0; i < lt.size(); ++i) {
    std::string t = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
    if (t == kSliding) {
      c.attn_types.push_back(AttnType::Sliding);
      c.compress_ratio.push_back(0);
    } else if (t == kCSA) {
      c.attn_types.push_back(AttnType::CSA);
      c.compress_ratio.push_back(csa_rate);
    } else if (t == kHCA) {
      c.attn_types.push_back(AttnType::HCA);
      c.compress_ratio.push_back(hca_rate);
    } else {
      fail("{}: layer_types[{}] is '{}'; expected {}, {} or {}", r.where(), i, t, kSliding, kCSA, kHCA);
    }
  }
  if (r.has("mlp_layer_types")) {
    const json& mt = r.at("mlp_layer_types");
    TREX_CHECK(mt.is_array(), "{}: mlp_layer_types must be a list", r.where());
    TREX_CHECK(int64_t(mt.size()) == c.n_layers,
               "{}: mlp_layer_types has {} entries but num_hidden_layers is {}", r.where(), mt.size(),
               c.n_layers);
    for (size_t i = 0; i < mt.size(); ++i) {
      std::string t = mt[i].is_string() ? mt[i].get<std::string>() : mt[i].dump();
      if (t == kHashMoE) {
        c.mlp_types.push_back(MlpType::HashMoE);
      } else if (t == kMoE) {
        c.mlp_types.push_back(MlpType::MoE);
      } else {
        fail("{}: mlp_layer_types[{}] is '{}'; expected {} or {}", r.where(), i, t, kHashMoE, kMoE);
      }
    }
  } else {
    int64_t nh = r.integer("num_hash_layers");  // required when mlp_layer_types is absent
    for (int64_t i = 0; i < c.n_layers; ++i) c.mlp_types.push_back(i < nh ? MlpType::HashMoE : MlpType::MoE);
  }

  // rope_parameters: either {main: {...}, compress: {...}} as saved by transformers, or the flat form
  // given to the constructor (its YaRN settings then describe the compress table, whose base is
  // compress_rope_theta; the main table is plain rope_theta).
  double theta = r.number("rope_theta", 10000.0);
  double compress_theta = r.number("compress_rope_theta", 160000.0);
  double prf = r.number("partial_rotary_factor", 0.0);
  if (r.has("rope_parameters")) {
    Reader rp = r.sub("rope_parameters");
    if (rp.has("main") || rp.has("compress")) {
      Reader main = rp.sub("main");
      Reader comp = rp.sub("compress");
      c.rope_main = parse_rope(main, main.number("rope_theta", theta));
      c.rope_compress = parse_rope(comp, comp.number("rope_theta", compress_theta));
      if (prf == 0.0) prf = main.number("partial_rotary_factor", 0.0);
      double cprf = comp.number("partial_rotary_factor", prf);
      if (prf == 0.0) prf = cprf;
      TREX_CHECK(cprf == prf,
                 "{}: rope_parameters.compress.partial_rotary_factor {} differs from {} (main / top level)",
                 r.where(), cprf, prf);
    } else {
      c.rope_main.theta = rp.number("rope_theta", theta);
      c.rope_compress = parse_rope(rp, compress_theta);
      if (prf == 0.0) prf = rp.number("partial_rotary_factor", 0.0);
    }
  } else {
    c.rope_main.theta = theta;
    c.rope_compress.theta = compress_theta;
  }
  int64_t from_factor = prf > 0.0 ? rope_dim_from_factor(r, prf, c.head_dim, "partial_rotary_factor") : 0;
  c.rope_dim = r.integer("qk_rope_head_dim", from_factor);
  TREX_CHECK(c.rope_dim > 0, "{}: neither qk_rope_head_dim nor partial_rotary_factor gives the rope dims",
             r.where());
  TREX_CHECK(from_factor == 0 || from_factor == c.rope_dim,
             "{}: qk_rope_head_dim {} disagrees with partial_rotary_factor {} x head_dim {} = {}", r.where(),
             c.rope_dim, prf, c.head_dim, from_factor);
}

void parse_official(const Reader& r, ModelConfig& c) {
  const json& cr = r.at("compress_ratios");
  TREX_CHECK(cr.is_array(), "{}: compress_ratios must be a list", r.where());
  TREX_CHECK(
      int64_t(cr.size()) == c.n_layers + c.n_mtp,
      "{}: compress_ratios has {} entries; expected num_hidden_layers {} + num_nextn_predict_layers {} = {}",
      r.where(), cr.size(), c.n_layers, c.n_mtp, c.n_layers + c.n_mtp);
  for (size_t i = 0; i < cr.size(); ++i) {
    int64_t ratio = r.as_int(cr[i], fmt::format("compress_ratios[{}]", i));
    TREX_CHECK(ratio >= 0, "{}: compress_ratios[{}] is {}; ratios are 0 (sliding) or positive", r.where(), i,
               ratio);
    if (int64_t(i) >= c.n_layers) {  // the MTP block
      TREX_CHECK(ratio == 0,
                 "{}: compress_ratios[{}] (the MTP block) is {}; only sliding-window MTP is supported",
                 r.where(), i, ratio);
      continue;
    }
    c.compress_ratio.push_back(ratio);
    c.attn_types.push_back(ratio == 0                   ? AttnType::Sliding
                           : ratio == kOfficialCsaRatio ? AttnType::CSA
                                                        : AttnType::HCA);
  }
  int64_t nh = r.integer("num_hash_layers");
  TREX_CHECK(nh >= 0 && nh <= c.n_layers, "{}: num_hash_layers {} is outside [0, num_hidden_layers {}]",
             r.where(), nh, c.n_layers);
  for (int64_t i = 0; i < c.n_layers; ++i) c.mlp_types.push_back(i < nh ? MlpType::HashMoE : MlpType::MoE);

  c.rope_main.theta = r.number("rope_theta", 10000.0);
  c.rope_compress.theta = r.number("compress_rope_theta", 160000.0);
  if (r.has("rope_scaling")) {
    Reader rs = r.sub("rope_scaling");
    c.rope_compress = parse_rope(
        rs, c.rope_compress.theta);  // YaRN applies to the layers with a compressor only (design §2.4.4)
  }
  if (r.has("qk_rope_head_dim")) {
    c.rope_dim = r.integer("qk_rope_head_dim");
  } else {
    double prf = r.number("partial_rotary_factor");
    c.rope_dim = rope_dim_from_factor(r, prf, c.head_dim, "partial_rotary_factor");
  }
}

const char* attn_name(AttnType t) {
  return t == AttnType::Sliding ? kSliding : t == AttnType::CSA ? kCSA : kHCA;
}

json rope_to_transformers(const RopeParams& p, double partial) {
  json j = {{"rope_theta", p.theta}, {"partial_rotary_factor", partial}};
  if (p.yarn) {
    j["rope_type"] = "yarn";
    j["factor"] = p.factor;
    j["original_max_position_embeddings"] = p.original_max_position;
    j["beta_fast"] = p.beta_fast;
    j["beta_slow"] = p.beta_slow;
    j["attention_factor"] = 1.0;
  } else {
    j["rope_type"] = "default";
  }
  return j;
}

}  // namespace

int64_t ModelConfig::n_hash_layers() const {
  int64_t n = 0;
  for (MlpType t : mlp_types) n += t == MlpType::HashMoE;
  return n;
}

void ModelConfig::validate() const {
  auto positive = [&](int64_t v, const char* name) {
    TREX_CHECK(v > 0, "model config: {} must be positive, found {}", name, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden, "hidden_size");
  positive(n_layers, "num_hidden_layers");
  positive(n_heads, "num_attention_heads");
  positive(head_dim, "head_dim");
  positive(q_lora_rank, "q_lora_rank");
  positive(o_groups, "o_groups");
  positive(o_lora_rank, "o_lora_rank");
  positive(window, "sliding_window");
  positive(n_routed_experts, "n_routed_experts");
  positive(topk, "num_experts_per_tok");
  positive(moe_inter, "moe_intermediate_size");
  positive(hc_mult, "hc_mult");
  positive(hc_sinkhorn_iters, "hc_sinkhorn_iters");
  TREX_CHECK(n_shared_experts >= 0, "model config: n_shared_experts must be >= 0, found {}",
             n_shared_experts);
  TREX_CHECK(n_heads % o_groups == 0, "model config: num_attention_heads {} is not divisible by o_groups {}",
             n_heads, o_groups);
  TREX_CHECK(rope_dim > 0 && rope_dim % 2 == 0,
             "model config: rope dims (qk_rope_head_dim) {} must be positive and even", rope_dim);
  TREX_CHECK(rope_dim <= head_dim, "model config: rope dims {} exceed head_dim {}", rope_dim, head_dim);
  TREX_CHECK(topk <= n_routed_experts, "model config: num_experts_per_tok {} exceeds n_routed_experts {}",
             topk, n_routed_experts);
  TREX_CHECK(n_mtp == 0 || n_mtp == 1, "model config: num_nextn_predict_layers must be 0 or 1, found {}",
             n_mtp);
  TREX_CHECK(routed_scale > 0, "model config: routed_scaling_factor must be positive, found {}",
             routed_scale);
  TREX_CHECK(swiglu_limit >= 0, "model config: swiglu_limit must be >= 0 (0 = no clamp), found {}",
             swiglu_limit);
  TREX_CHECK(hc_eps > 0 && rms_eps > 0, "model config: hc_eps {} and rms_norm_eps {} must be positive",
             hc_eps, rms_eps);
  TREX_CHECK(score_func == "sqrtsoftplus" || score_func == "sigmoid" || score_func == "softmax",
             "model config: scoring_func '{}' is not one of sqrtsoftplus, sigmoid, softmax", score_func);
  TREX_CHECK(
      int64_t(attn_types.size()) == n_layers && int64_t(compress_ratio.size()) == n_layers &&
          int64_t(mlp_types.size()) == n_layers,
      "model config: per-layer lists have {} attention types, {} compress ratios, {} MLP types; expected {}",
      attn_types.size(), compress_ratio.size(), mlp_types.size(), n_layers);
  bool any_csa = false;
  for (int64_t l = 0; l < n_layers; ++l) {
    AttnType t = attn_types[size_t(l)];
    int64_t ratio = compress_ratio[size_t(l)];
    TREX_CHECK((t == AttnType::Sliding) == (ratio == 0),
               "model config: layer {} is {} but its compress ratio is {}", l, attn_name(t), ratio);
    TREX_CHECK(ratio >= 0, "model config: layer {} has negative compress ratio {}", l, ratio);
    any_csa = any_csa || t == AttnType::CSA;
  }
  if (any_csa) {
    positive(index_n_heads, "index_n_heads");
    positive(index_head_dim, "index_head_dim");
    positive(index_topk, "index_topk");
    TREX_CHECK(index_head_dim >= rope_dim, "model config: index_head_dim {} is smaller than the rope dims {}",
               index_head_dim, rope_dim);
  }
  for (const RopeParams* p : {&rope_main, &rope_compress}) {
    TREX_CHECK(p->theta > 1.0, "model config: rope theta {} must be > 1", p->theta);
    if (p->yarn)
      TREX_CHECK(
          p->factor >= 1.0 && p->original_max_position > 0 && p->beta_fast > p->beta_slow && p->beta_slow > 0,
          "model config: YaRN parameters (factor {}, original_max_position {}, beta_fast {}, beta_slow {}) "
          "need factor >= 1, length > 0 and beta_fast > beta_slow > 0",
          p->factor, p->original_max_position, p->beta_fast, p->beta_slow);
  }
}

ModelConfig parse_model_config(const json& j, const std::string& where) {
  TREX_CHECK(j.is_object(), "{}: config must be a JSON object", where);
  Reader r(j, where);
  ModelConfig c;
  parse_common(r, c);
  bool transformers = r.has("layer_types");
  bool official = r.has("compress_ratios");
  TREX_CHECK(
      transformers || official,
      "{}: neither 'layer_types' (transformers dialect) nor 'compress_ratios' (official dialect) is present",
      where);
  if (transformers) {
    parse_transformers(r, c);
    c.source_dialect = "transformers";
  } else {
    parse_official(r, c);
    c.source_dialect = "official";
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  fs::path p = config_json;
  if (fs::is_directory(p)) p /= "config.json";
  return parse_model_config(read_json_file(p), p.string());
}

json model_config_to_json(const ModelConfig& c, Dialect dialect) {
  c.validate();
  json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.rope_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.window;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.topk;
  j["moe_intermediate_size"] = c.moe_inter;
  j["routed_scaling_factor"] = c.routed_scale;
  j["swiglu_limit"] = c.swiglu_limit;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = c.score_func;
  j["topk_method"] = "noaux_tc";
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["rms_norm_eps"] = c.rms_eps;
  j["num_nextn_predict_layers"] = c.n_mtp;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["max_position_embeddings"] = c.max_position;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["tie_word_embeddings"] = false;
  j["rope_theta"] = c.rope_main.theta;
  j["compress_rope_theta"] = c.rope_compress.theta;

  if (dialect == Dialect::Official) {
    TREX_CHECK(!c.rope_main.yarn,
               "official config.json cannot express YaRN on the sliding-window rope table");
    json ratios = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      AttnType t = c.attn_types[size_t(l)];
      int64_t ratio = c.compress_ratio[size_t(l)];
      TREX_CHECK(t != AttnType::CSA || ratio == kOfficialCsaRatio,
                 "official config.json cannot express layer {}: CSA with ratio {} (official CSA ratio is {})",
                 l, ratio, kOfficialCsaRatio);
      TREX_CHECK(t != AttnType::HCA || ratio != kOfficialCsaRatio,
                 "official config.json cannot express layer {}: HCA with ratio {} (ratio {} means CSA)", l,
                 ratio, kOfficialCsaRatio);
      ratios.push_back(ratio);
    }
    for (int64_t m = 0; m < c.n_mtp; ++m) ratios.push_back(0);
    j["compress_ratios"] = ratios;
    int64_t nh = c.n_hash_layers();
    for (int64_t l = 0; l < c.n_layers; ++l)
      TREX_CHECK((c.mlp_types[size_t(l)] == MlpType::HashMoE) == (l < nh),
                 "official config.json cannot express hash-routed layers that are not the first {} layers",
                 nh);
    j["num_hash_layers"] = nh;
    if (c.rope_compress.yarn) {
      j["rope_scaling"] = {{"type", "yarn"},
                           {"factor", c.rope_compress.factor},
                           {"original_max_position_embeddings", c.rope_compress.original_max_position},
                           {"beta_fast", c.rope_compress.beta_fast},
                           {"beta_slow", c.rope_compress.beta_slow}};
    } else {
      j["rope_scaling"] = nullptr;
    }
  } else {
    int64_t csa = 0, hca = 0;
    json layer_types = json::array(), mlp_types = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      AttnType t = c.attn_types[size_t(l)];
      int64_t ratio = c.compress_ratio[size_t(l)];
      int64_t& rate = t == AttnType::CSA ? csa : hca;
      if (t != AttnType::Sliding) {
        TREX_CHECK(rate == 0 || rate == ratio,
                   "transformers config.json needs one ratio per compressed type; layer {} has {} after {}",
                   l, ratio, rate);
        rate = ratio;
      }
      layer_types.push_back(attn_name(t));
      mlp_types.push_back(c.mlp_types[size_t(l)] == MlpType::HashMoE ? kHashMoE : kMoE);
    }
    j["layer_types"] = layer_types;
    j["mlp_layer_types"] = mlp_types;
    j["compress_rates"] = {{kCSA, csa ? csa : kOfficialCsaRatio}, {kHCA, hca ? hca : kDefaultHcaRatio}};
    double partial = double(c.rope_dim) / double(c.head_dim);
    j["partial_rotary_factor"] = partial;
    j["rope_parameters"] = {{"main", rope_to_transformers(c.rope_main, partial)},
                            {"compress", rope_to_transformers(c.rope_compress, partial)}};
  }
  return j;
}

}  // namespace trex::dsv4
