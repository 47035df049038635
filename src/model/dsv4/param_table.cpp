#include "model/dsv4/param_table.h"

#include <fmt/format.h>

#include "model/dsv4/attention.h"

namespace trex::dsv4 {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

ParamInit init_of(const std::string& n) {
  const bool hc = n.find("hc_") != std::string::npos;
  if (ends_with(n, "norm.weight") || (hc && ends_with(n, "_scale"))) return ParamInit::One;
  if ((hc && ends_with(n, "_base")) || ends_with(n, "attn_sink") || ends_with(n, ".ape")) return ParamInit::Zero;
  return ParamInit::Normal;
}

class TableBuilder {
 public:
  explicit TableBuilder(std::vector<ParamSpec>& out) : out_(out) {}
  ParamPart part = ParamPart::Layer;
  int64_t layer = -1;
  std::string prefix;

  void weight(const std::string& n, Shape shape, bool lm_grad = true, int64_t expert = -1) {
    ParamSpec s;
    s.name = prefix + n;
    s.shape = std::move(shape);
    s.dtype = keeps_fp32(s.name) ? DType::F32 : DType::BF16;
    s.part = part, s.layer = layer, s.expert = expert;
    s.init = init_of(s.name);
    s.lm_grad = lm_grad;
    out_.push_back(std::move(s));
  }
  void router_bias(int64_t E) {
    ParamSpec s;
    s.name = prefix + "ffn.gate.bias";
    s.shape = {E};
    s.dtype = DType::F32, s.kind = ParamKind::RouterBias, s.init = ParamInit::Zero;
    s.part = part, s.layer = layer, s.lm_grad = false;
    out_.push_back(std::move(s));
  }
  void hash_table(int64_t V, int64_t K) {
    ParamSpec s;
    s.name = prefix + "ffn.gate.tid2eid";
    s.shape = {V, K};
    s.dtype = DType::I64, s.kind = ParamKind::HashTable, s.init = ParamInit::HashTable;
    s.part = part, s.layer = layer, s.lm_grad = false;
    out_.push_back(std::move(s));
  }

  // One block of the extended config (block index `b`: a main layer, or cfg.n_layers for the MTP block).
  void block(const ModelConfig& c, int64_t b) {
    const int64_t d = c.hidden, hc = c.hc_mult, mix = (2 + hc) * hc, E = c.n_routed_experts, f = c.moe_inter;
    weight("attn_norm.weight", {d});
    weight("ffn_norm.weight", {d});
    for (const char* site : {"attn", "ffn"}) {
      weight(fmt::format("hc_{}_fn", site), {mix, hc * d});
      weight(fmt::format("hc_{}_base", site), {mix});
      weight(fmt::format("hc_{}_scale", site), {3});
    }
    for (const AttentionParamSpec& s : attention_param_specs(c, b)) weight(s.name, s.shape, s.lm_grad);
    weight("ffn.gate.weight", {E, d});
    if (c.mlp_types[size_t(b)] == MlpType::HashMoE)
      hash_table(c.vocab_size, c.topk);
    else
      router_bias(E);
    const int64_t fs = f * c.n_shared_experts;
    if (fs > 0) {
      weight("ffn.shared_experts.w1.weight", {fs, d});
      weight("ffn.shared_experts.w3.weight", {fs, d});
      weight("ffn.shared_experts.w2.weight", {d, fs});
    }
    for (int w : {1, 3, 2})
      for (int64_t e = 0; e < E; ++e)
        weight(fmt::format("ffn.experts.{}.w{}.weight", e, w), w == 2 ? Shape{d, f} : Shape{f, d}, true, e);
  }

 private:
  std::vector<ParamSpec>& out_;
};

}  // namespace

ModelConfig with_mtp_block(const ModelConfig& cfg) {
  ModelConfig c = cfg;
  if (cfg.n_mtp > 0) {
    c.n_layers = cfg.n_layers + 1;
    c.attn_types.push_back(AttnType::Sliding);
    c.compress_ratio.push_back(0);
    c.mlp_types.push_back(MlpType::MoE);
  }
  return c;
}

std::vector<ParamSpec> param_table(const ModelConfig& cfg) {
  TREX_CHECK(cfg.n_mtp >= 0 && cfg.n_mtp <= 1, "parameter table: {} MTP modules configured; only 0 or 1 is supported",
             cfg.n_mtp);
  TREX_CHECK(int64_t(cfg.attn_types.size()) == cfg.n_layers && int64_t(cfg.mlp_types.size()) == cfg.n_layers &&
                 int64_t(cfg.compress_ratio.size()) == cfg.n_layers,
             "parameter table: the config lists {} attention types, {} compress ratios and {} MLP types for {} layers",
             cfg.attn_types.size(), cfg.compress_ratio.size(), cfg.mlp_types.size(), cfg.n_layers);
  std::vector<ParamSpec> out;
  TableBuilder t(out);
  const int64_t d = cfg.hidden, hc = cfg.hc_mult;
  t.part = ParamPart::Embed;
  t.weight("embed.weight", {cfg.vocab_size, d});
  t.part = ParamPart::Head;
  t.weight("head.weight", {cfg.vocab_size, d});
  t.weight("norm.weight", {d});
  t.weight("hc_head_fn", {hc, hc * d});
  t.weight("hc_head_base", {hc});
  t.weight("hc_head_scale", {1});
  const ModelConfig ext = with_mtp_block(cfg);
  t.part = ParamPart::Layer;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    t.layer = l, t.prefix = fmt::format("layers.{}.", l);
    t.block(ext, l);
  }
  for (int64_t m = 0; m < cfg.n_mtp; ++m) {
    t.part = ParamPart::Mtp, t.layer = m, t.prefix = fmt::format("mtp.{}.", m);
    t.block(ext, cfg.n_layers + m);
    t.weight("e_proj.weight", {d, d});
    t.weight("h_proj.weight", {d, d});
    t.weight("enorm.weight", {d});
    t.weight("hnorm.weight", {d});
    t.weight("norm.weight", {d});
    t.weight("hc_head_fn", {hc, hc * d});
    t.weight("hc_head_base", {hc});
    t.weight("hc_head_scale", {1});
  }
  return out;
}

bool partition_holds(const ModelPartition& p, const ParamSpec& s, bool with_mtp) {
  if (s.expert >= 0 && (s.expert < p.expert_begin || s.expert >= p.expert_end)) return false;
  switch (s.part) {
    case ParamPart::Embed:
      return p.embed || (with_mtp && p.head);
    case ParamPart::Head:
      return p.head;
    case ParamPart::Layer:
      return s.layer >= p.layer_begin && s.layer < p.layer_end;
    case ParamPart::Mtp:
      return with_mtp && p.head;
  }
  return false;
}

bool keeps_fp32(const std::string& n) {
  return n.find("hc_") != std::string::npos || ends_with(n, ".ape") || ends_with(n, ".attn_sink") ||
         ends_with(n, "ffn.gate.bias");
}

int tp_split_axis(const std::string& n, TpExperts experts) {
  if (ends_with(n, ".attn.wq_b.weight") || ends_with(n, ".attn.wo_a.weight") || ends_with(n, ".attn.attn_sink") ||
      ends_with(n, ".ffn.shared_experts.w1.weight") || ends_with(n, ".ffn.shared_experts.w3.weight"))
    return 0;
  if (ends_with(n, ".attn.wo_b.weight") || ends_with(n, ".ffn.shared_experts.w2.weight")) return 1;
  if (experts == TpExperts::Split && n.find(".ffn.experts.") != std::string::npos) {
    if (ends_with(n, ".w1.weight") || ends_with(n, ".w3.weight")) return 0;
    if (ends_with(n, ".w2.weight")) return 1;
  }
  return -1;
}

Shape tp_local_shape(const Shape& full, int axis, int tp) {
  if (axis < 0 || tp == 1) return full;
  TREX_CHECK(axis < int(full.size()) && full[size_t(axis)] % tp == 0,
             "tensor parallelism: {} ranks do not split axis {} of shape {}", tp, axis, shape_str(full));
  Shape s = full;
  s[size_t(axis)] /= tp;
  return s;
}

}  // namespace trex::dsv4
