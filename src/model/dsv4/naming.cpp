#include "model/dsv4/naming.h"

#include <charconv>
#include <optional>

#include "core/error.h"

namespace trex::dsv4 {

namespace {

struct Pair {
  const char* official;
  const char* transformers;
};

// Whole keys outside the layers.
constexpr Pair kGlobal[] = {
    {"embed.weight", "model.embed_tokens.weight"}, {"head.weight", "lm_head.weight"},
    {"norm.weight", "model.norm.weight"},          {"hc_head_fn", "model.hc_head.hc_fn"},
    {"hc_head_base", "model.hc_head.hc_base"},     {"hc_head_scale", "model.hc_head.hc_scale"},
};

// Parameters inside a layer that are not `<module>.weight|scale` (suffix after "layers.N.").
constexpr Pair kLayerParams[] = {
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
};

// Modules inside a layer, whose leaves are `weight` (and `scale` <-> `weight_scale_inv` for FP8).
constexpr Pair kLayerModules[] = {
    {"attn_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"attn.wq_a", "self_attn.q_a_proj"},
    {"attn.q_norm", "self_attn.q_a_norm"},
    {"attn.wq_b", "self_attn.q_b_proj"},
    {"attn.wkv", "self_attn.kv_proj"},
    {"attn.kv_norm", "self_attn.kv_norm"},
    {"attn.wo_a", "self_attn.o_a_proj"},
    {"attn.wo_b", "self_attn.o_b_proj"},
    {"attn.compressor.wkv", "self_attn.compressor.kv_proj"},
    {"attn.compressor.wgate", "self_attn.compressor.gate_proj"},
    {"attn.compressor.norm", "self_attn.compressor.kv_norm"},
    {"attn.indexer.compressor.wkv", "self_attn.compressor.indexer.kv_proj"},
    {"attn.indexer.compressor.wgate", "self_attn.compressor.indexer.gate_proj"},
    {"attn.indexer.compressor.norm", "self_attn.compressor.indexer.kv_norm"},
    {"attn.indexer.wq_b", "self_attn.compressor.indexer.q_b_proj"},
    {"attn.indexer.weights_proj", "self_attn.compressor.indexer.scorer.weights_proj"},
    {"ffn.gate", "mlp.gate"},
    {"ffn.shared_experts.w1", "mlp.shared_experts.gate_proj"},
    {"ffn.shared_experts.w3", "mlp.shared_experts.up_proj"},
    {"ffn.shared_experts.w2", "mlp.shared_experts.down_proj"},
};

// Other transformers spellings accepted on input (module level).
constexpr Pair kTransformersAliases[] = {
    {"attn.q_norm", "self_attn.q_norm"},
    {"attn.indexer.weights_proj", "self_attn.compressor.indexer.weights_proj"},
};

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// "<prefix><digits>.<rest>" -> (digits, rest).
bool split_indexed(std::string_view name, std::string_view prefix, int64_t* index, std::string_view* rest) {
  if (!starts_with(name, prefix)) return false;
  std::string_view tail = name.substr(prefix.size());
  size_t dot = tail.find('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(tail.data(), tail.data() + dot, v);
  if (ec != std::errc() || p != tail.data() + dot) return false;
  *index = v;
  *rest = tail.substr(dot + 1);
  return true;
}

// Maps a layer-relative key through the tables, official -> transformers or back.
std::optional<std::string> map_layer_rest(std::string_view rest, bool to_transformers) {
  for (const Pair& p : kLayerParams) {
    std::string_view from = to_transformers ? p.official : p.transformers;
    if (rest == from) return std::string(to_transformers ? p.transformers : p.official);
  }
  size_t dot = rest.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  std::string_view module = rest.substr(0, dot), leaf = rest.substr(dot + 1);
  std::string_view out_leaf;
  if (to_transformers) {
    if (leaf == "weight")
      out_leaf = "weight";
    else if (leaf == "scale")
      out_leaf = "weight_scale_inv";
    else
      return std::nullopt;
  } else {
    if (leaf == "weight")
      out_leaf = "weight";
    else if (leaf == "weight_scale_inv")
      out_leaf = "scale";
    else
      return std::nullopt;
  }
  auto emit = [&](const char* m) { return std::string(m) + "." + std::string(out_leaf); };
  for (const Pair& p : kLayerModules) {
    if (module == (to_transformers ? p.official : p.transformers))
      return emit(to_transformers ? p.transformers : p.official);
  }
  if (!to_transformers) {
    for (const Pair& p : kTransformersAliases)
      if (module == p.transformers) return emit(p.official);
    // Per-expert transformers layout (older exports): mlp.experts.E.{gate,up,down}_proj.
    int64_t e = 0;
    std::string_view leaf_module;
    if (split_indexed(module, "mlp.experts.", &e, &leaf_module)) {
      const char* w = leaf_module == "gate_proj"   ? "w1"
                      : leaf_module == "up_proj"   ? "w3"
                      : leaf_module == "down_proj" ? "w2"
                                                   : nullptr;
      if (w) return "ffn.experts." + std::to_string(e) + "." + w + "." + std::string(out_leaf);
    }
  }
  return std::nullopt;
}

}  // namespace

std::string official_to_transformers(std::string_view name) {
  if (starts_with(name, "mtp.")) return std::string(name);  // kept as is: transformers has no MTP
  for (const Pair& p : kGlobal)
    if (name == p.official) return p.transformers;
  int64_t layer = 0;
  std::string_view rest;
  if (split_indexed(name, "layers.", &layer, &rest)) {
    ExpertKey ek;
    TREX_CHECK(!parse_official_expert_key(name, &ek),
               "tensor '{}': routed experts are stacked in transformers naming (mlp.experts.gate_up_proj / "
               "down_proj); convert the whole layer, not one key",
               name);
    if (auto r = map_layer_rest(rest, true)) return "model.layers." + std::to_string(layer) + "." + *r;
  }
  fail("tensor '{}' is not a DeepSeek-V4 key in official naming", name);
}

std::string transformers_to_official(std::string_view name) {
  if (starts_with(name, "mtp.")) return std::string(name);
  for (const Pair& p : kGlobal)
    if (name == p.transformers) return p.official;
  int64_t layer = 0;
  std::string_view rest;
  if (split_indexed(name, "model.layers.", &layer, &rest)) {
    bool gate_up = false;
    TREX_CHECK(!parse_transformers_stacked_key(name, &layer, &gate_up),
               "tensor '{}': stacked routed experts have no single official name (they are "
               "layers.N.ffn.experts.E.w1/w3/w2); convert the whole layer",
               name);
    if (auto r = map_layer_rest(rest, false)) return "layers." + std::to_string(layer) + "." + *r;
  }
  fail("tensor '{}' is not a DeepSeek-V4 key in transformers naming", name);
}

bool parse_official_expert_key(std::string_view name, ExpertKey* out) {
  std::string_view rest;
  int64_t idx = 0;
  std::string block;
  if (split_indexed(name, "layers.", &idx, &rest)) {
    block = "layers." + std::to_string(idx);
  } else if (split_indexed(name, "mtp.", &idx, &rest)) {
    block = "mtp." + std::to_string(idx);
  } else {
    return false;
  }
  int64_t expert = 0;
  std::string_view tail;
  if (!split_indexed(rest, "ffn.experts.", &expert, &tail)) return false;
  int w = tail.substr(0, 3) == "w1."   ? 1
          : tail.substr(0, 3) == "w2." ? 2
          : tail.substr(0, 3) == "w3." ? 3
                                       : 0;
  if (w == 0) return false;
  std::string_view leaf = tail.substr(3);
  if (leaf != "weight" && leaf != "scale") return false;
  out->block = std::move(block);
  out->expert = expert;
  out->w = w;
  out->scale = leaf == "scale";
  return true;
}

std::string official_expert_key(const std::string& block, int64_t expert, int w, bool scale) {
  return block + ".ffn.experts." + std::to_string(expert) + ".w" + std::to_string(w) +
         (scale ? ".scale" : ".weight");
}

std::string transformers_gate_up_key(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts.gate_up_proj";
}
std::string transformers_down_key(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts.down_proj";
}

bool parse_transformers_stacked_key(std::string_view name, int64_t* layer, bool* gate_up) {
  int64_t l = 0;
  std::string_view rest;
  if (!split_indexed(name, "model.layers.", &l, &rest)) return false;
  if (rest == "mlp.experts.gate_up_proj") {
    *gate_up = true;
  } else if (rest == "mlp.experts.down_proj") {
    *gate_up = false;
  } else {
    return false;
  }
  *layer = l;
  return true;
}

Naming detect_naming(const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (starts_with(n, "model.") || n == "lm_head.weight") return Naming::Transformers;
  return Naming::Official;
}

const char* naming_name(Naming n) {
  return n == Naming::Official ? "official" : "transformers";
}

}  // namespace trex::dsv4
