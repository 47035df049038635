#include "plan/model_math.h"

#include <algorithm>

#include "core/error.h"

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

ModelMath::ModelMath(const ModelSpec& m, int64_t seq, AttnCompute mode) : m_(m), seq_(seq) {
  TREX_CHECK(seq > 0, "sequence length must be positive, got {}", seq);
  const double d = double(m.hidden), nh = double(m.n_heads), c = double(m.head_dim);
  const double qr = double(m.q_lora_rank), g = double(m.o_groups), dg = double(m.o_lora_rank);
  const double E = double(m.n_routed_experts), K = double(m.topk), f = double(m.moe_inter);
  const double ns = double(m.n_shared_experts), nI = double(m.index_n_heads), cI = double(m.index_head_dim);
  const double hc = double(m.hc_mult);
  const double attn_w = d * qr + qr * nh * c + d * c + nh * c * dg + g * dg * d;
  const double mhc_w = 2.0 * (2 + hc) * hc * hc * d;
  const double S = double(seq);
  const double wbar = mode == AttnCompute::Sparse ? mean_window(seq, m.window) : S;

  for (int64_t b = 0; b <= m.n_layers; ++b) {
    const bool mtp = b == m.n_layers;
    const int64_t ratio = mtp ? 0 : m.compress_ratio[size_t(b)];
    const AttnKind kind = mtp ? AttnKind::Sliding : m.attn[size_t(b)];
    const bool hash = !mtp && b < m.n_hash_layers;
    BlockParams p;
    BlockFlops fl;
    // Weights in matmuls (design §4.2 P_mm), then the rest of the block's parameters (§4.1).
    double sharded_mm = attn_w + ns * 3 * f * d;
    p.replicated = mhc_w + 2 * ((2 + hc) * hc + 3)  // mHC fn of both sites, their base and scale
                   + 2 * d + qr + c                   // attn_norm, ffn_norm, q_norm, kv_norm
                   + nh                               // attention sinks
                   + E * d + (hash ? 0.0 : E);        // router weight (+ bias on score-routed blocks)
    p.router = E * d;
    p.experts = E * 3 * f * d;
    double keys = wbar, idx = 0;
    if (kind == AttnKind::CSA) {
      const double comp = 2 * d * 2 * c, icomp = 2 * d * 2 * cI, iq = qr * nI * cI, iw = d * nI;
      sharded_mm += comp + icomp + iq + iw;
      p.replicated += 4 * 2 * c + c + 4 * 2 * cI + cI;  // ape and norms of both compressors
      const double visible = mode == AttnCompute::Sparse ? mean_compressed(seq, ratio, m.index_topk)
                                                         : S / double(ratio);
      keys += visible;
      const double scored = mode == AttnCompute::Sparse ? mean_compressed(seq, ratio, -1) : S / double(ratio);
      idx = nI * (2 * cI + 2) * scored;
    } else if (kind == AttnKind::HCA) {
      sharded_mm += 2 * d * c;
      p.replicated += double(ratio) * c + c;
      keys += mode == AttnCompute::Sparse ? mean_compressed(seq, ratio, -1) : S / double(ratio);
    }
    if (mtp) {
      sharded_mm += d * d + hc * d * d;  // e_proj once, h_proj once per stream
      p.replicated += 3 * d + hc * hc * d + hc + 1;  // enorm, hnorm, norm, MTP hc_head
    }
    // h_proj is one [d, d] weight applied to each of the hc streams: hc x the FLOPs, once the parameters.
    p.sharded = mtp ? sharded_mm - (hc - 1) * d * d : sharded_mm;
    fl.dense_mm = 2 * (sharded_mm + mhc_w + E * d);
    fl.expert_mm = 2 * K * 3 * f * d;
    fl.attn_core = 4 * nh * c * keys;
    fl.indexer = idx;
    params_.push_back(p);
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
  const double d = double(m_.hidden), hc = double(m_.hc_mult);
  const double K = double(m_.topk), E = double(m_.n_routed_experts);
  pc.embed = double(m_.vocab) * d;
  pc.head = double(m_.vocab) * d;
  pc.final_misc = d + hc * hc * d + hc + 1;
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
