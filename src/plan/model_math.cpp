#include "plan/model_math.h"

#include <algorithm>

#include "core/error.h"
#include "model/dsv4/param_table.h"

namespace trex::plan {

namespace {

// mean over t in [0, S) of min(t + 1, w)
double mean_window(int64_t S, int64_t w) {
  double sum = 0;
  if (S <= w) {
    sum = double(S) * double(S + 1) / 2.0;
  } else {
    sum = double(w) * double(w + 1) / 2.0 + double(S - w) * double(w);
  }
  return sum / double(S);
}

// mean over t of min(cap, floor((t + 1) / m)); cap < 0 means no cap
double mean_compressed(int64_t S, int64_t m, int64_t cap) {
  double sum = 0;
  for (int64_t u = 1; u <= S; ++u) {
    int64_t v = u / m;
    sum += double(cap >= 0 ? std::min(cap, v) : v);
  }
  return sum / double(S);
}

}  // namespace

dsv4::ModelConfig model_config(const ModelSpec& m) {
  dsv4::ModelConfig c;
  c.vocab_size = m.vocab, c.hidden = m.hidden, c.n_layers = m.n_layers, c.n_heads = m.n_heads;
  c.head_dim = m.head_dim, c.rope_dim = m.rope_dim, c.q_lora_rank = m.q_lora_rank, c.o_groups = m.o_groups;
  c.o_lora_rank = m.o_lora_rank, c.window = m.window, c.index_n_heads = m.index_n_heads;
  c.index_head_dim = m.index_head_dim, c.index_topk = m.index_topk, c.n_routed_experts = m.n_routed_experts;
  c.n_shared_experts = m.n_shared_experts, c.topk = m.topk, c.moe_inter = m.moe_inter, c.hc_mult = m.hc_mult;
  c.n_mtp = std::min<int64_t>(m.n_mtp, 1);
  c.compress_ratio = m.compress_ratio;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const AttnKind k = m.attn[size_t(l)];
    c.attn_types.push_back(k == AttnKind::Sliding ? dsv4::AttnType::Sliding
                           : k == AttnKind::CSA   ? dsv4::AttnType::CSA
                                                  : dsv4::AttnType::HCA);
    c.mlp_types.push_back(l < m.n_hash_layers ? dsv4::MlpType::HashMoE : dsv4::MlpType::MoE);
  }
  return c;
}

namespace {

// How tensor parallelism treats one tensor of the parameter table: routed experts split by EP x ETP; the tensors
// T-Rex splits over TP (dsv4::tp_split_axis); everything else whole on every TP rank. The matmul weights (the
// dense FLOPs) are the bf16 projections, split or not (mHC fn and the router are counted apart).
void add_to(BlockParams& p, const dsv4::ParamSpec& s) {
  const double n = double(numel(s.shape));
  const bool split = dsv4::tp_split_axis(s.name, dsv4::TpExperts::Whole) >= 0;  // the routed experts: apart
  if (s.expert >= 0) {
    p.experts += n;
    return;
  }
  (split ? p.sharded : p.replicated) += n;
  if (s.name.ends_with("ffn.gate.weight")) {
    p.router += n;
  } else if (!(s.dtype == DType::F32 || s.name.ends_with("norm.weight"))) {
    p.matmul += n;
    if (split) p.matmul_split += n;
  }
}

}  // namespace

ModelMath::ModelMath(const ModelSpec& m, int64_t seq, AttnCompute mode) : m_(m), seq_(seq) {
  TREX_CHECK(seq > 0, "sequence length must be positive, got {}", seq);
  // Parameters from the model's own table; the MTP block is always counted (block n_layers) so that callers can
  // choose with or without it.
  dsv4::ModelConfig cfg = model_config(m);
  cfg.n_mtp = 1;
  params_.assign(size_t(m.n_layers + 1), BlockParams{});
  mhc_fn_.assign(size_t(m.n_layers + 1), 0.0);
  for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) {
    if (s.kind == dsv4::ParamKind::HashTable) continue;  // a routing table, not parameters
    if (s.part == dsv4::ParamPart::Embed) {
      embed_ += double(numel(s.shape));
      continue;
    }
    if (s.part == dsv4::ParamPart::Head) {
      (s.name == "head.weight" ? head_ : final_misc_) += double(numel(s.shape));
      continue;
    }
    const int64_t b = s.part == dsv4::ParamPart::Mtp ? m.n_layers : s.layer;
    add_to(params_[size_t(b)], s);
    if (s.name.ends_with("_fn") && s.name.find("hc_head") == std::string::npos)
      mhc_fn_[size_t(b)] += double(numel(s.shape));
  }

  const double d = double(m.hidden), nh = double(m.n_heads), c = double(m.head_dim);
  const double E = double(m.n_routed_experts), K = double(m.topk);
  const double nI = double(m.index_n_heads), cI = double(m.index_head_dim);
  const double hc = double(m.hc_mult);
  const double S = double(seq);
  const double wbar = mode == AttnCompute::Sparse ? mean_window(seq, m.window) : S;

  for (int64_t b = 0; b <= m.n_layers; ++b) {
    const bool mtp = b == m.n_layers;
    const int64_t ratio = mtp ? 0 : m.compress_ratio[size_t(b)];
    const AttnKind kind = mtp ? AttnKind::Sliding : m.attn[size_t(b)];
    const BlockParams& p = params_[size_t(b)];
    BlockFlops fl;
    double keys = wbar, idx = 0;
    if (kind == AttnKind::CSA) {
      const double visible = mode == AttnCompute::Sparse ? mean_compressed(seq, ratio, m.index_topk)
                                                         : S / double(ratio);
      keys += visible;
      const double scored = mode == AttnCompute::Sparse ? mean_compressed(seq, ratio, -1) : S / double(ratio);
      idx = nI * (2 * cI + 2) * scored;
    } else if (kind == AttnKind::HCA) {
      keys += mode == AttnCompute::Sparse ? mean_compressed(seq, ratio, -1) : S / double(ratio);
    }
    // Weights in matmuls per token (design §4.2 P_mm): the bf16 projections, both mHC fn and the router;
    // the MTP block's h_proj is one [d, d] weight applied to each of the hc streams (hc x its FLOPs).
    const double dense_mm = p.matmul + mhc_fn_[size_t(b)] + p.router + (mtp ? (hc - 1) * d * d : 0.0);
    fl.dense_mm = 2 * dense_mm;
    fl.dense_mm_split = 2 * p.matmul_split;
    fl.expert_mm = 2 * K * p.experts / E;
    fl.attn_core = 4 * nh * c * keys;
    fl.indexer = idx;
    flops_.push_back(fl);
    keys_.push_back(keys);
  }
}

double ModelMath::head_flops() const {
  const double d = double(m_.hidden), hc = double(m_.hc_mult);
  return 2 * (hc * hc * d + double(m_.vocab) * d);
}

ParamCounts ModelMath::params() const {
  ParamCounts pc;
  const double K = double(m_.topk), E = double(m_.n_routed_experts);
  pc.embed = embed_;
  pc.head = head_;
  pc.final_misc = final_misc_;
  pc.main_total = pc.embed + pc.head + pc.final_misc;
  double inactive = 0;
  for (int64_t b = 0; b < m_.n_layers; ++b) {
    pc.main_total += params_[size_t(b)].total();
    pc.routed_main += params_[size_t(b)].experts;
    inactive += params_[size_t(b)].experts * (E - K) / E;
  }
  const BlockParams& mtp = params_.back();
  pc.mtp = mtp.total();
  pc.activated = pc.main_total - pc.embed - inactive;
  pc.activated_with_embed = pc.activated + pc.embed;
  pc.activated_with_mtp = pc.activated + pc.mtp - mtp.experts * (E - K) / E;
  return pc;
}

double ModelMath::train_flops_per_token(bool with_mtp) const {
  double fwd = head_flops();
  for (int64_t b = 0; b < m_.n_layers; ++b) fwd += flops_[size_t(b)].total();
  if (with_mtp && m_.n_mtp > 0) fwd += flops_.back().total() + head_flops();
  return 3.0 * fwd;
}

}  // namespace trex::plan
