#include "model/cuda/activation_plan.h"

#include <algorithm>

#include "core/error.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/compressor.h"
#include "model/dsv4/param_table.h"

namespace trex::dsv4gpu {

namespace {

// One block's requests, by the pool that holds them (gpu_internal.h GpuBlock: keep, redo, picks). A request of n
// elements of b bytes is max(n, 1) * b bytes, as Pool::take allocates.
struct BlockPools {
  int64_t keep = 0, redo = 0, picks = 0;
};

int64_t req(int64_t n, int64_t elem_bytes) { return std::max<int64_t>(n, 1) * elem_bytes; }

// The requests of one block's training forward in the order the GPU model makes them (cuda_backend_cuda.cpp
// site_norm_fwd, gpu_attention_cuda.cpp attention_fwd, gpu_moe_cuda.cpp moe_fwd, balance_fwd). `redo` names
// what selective recomputation rebuilds; under the other modes the model puts it in keep.
BlockPools block_pools(const dsv4::ModelConfig& ext, int64_t layer, const dsv4::SeqLayout& layout, int64_t N,
                       bool balance, int64_t tp, int64_t ep, int64_t etp) {
  BlockPools p;
  const int64_t d = ext.hidden, hc = ext.hc_mult;
  // mHC sites + norms.
  for (int site = 0; site < 2; ++site)
    p.keep += req(N * kPlanMhcMix, 4) + req(N, 4) + req(N * 4, 4) + req(N * 4, 4) + req(N * 16, 4);
  p.redo += req(N * d, 2) + req(N * hc * d, 2) + req(N * d, 2);         // a, X_mid, u
  p.keep += req(N, 4) + req(N * d, 2) + req(N, 4) + req(N * d, 2);     // a_rstd, y_a, u_rstd, y_f
  // Attention.
  const dsv4::AttentionDims D = dsv4::AttentionDims::from_config(ext, layer);
  // This TP rank's heads and output groups (GpuModel::Impl::bind_block divides them the same way).
  const int64_t H = D.n_heads / tp, hd = D.head_dim, dc = D.d_c, gd = D.o_groups / tp * D.o_rank;
  p.keep += req(N * dc, 2) + req(N, 4);                  // qa, qa_rstd
  p.redo += req(N * dc, 2);                              // cq
  p.keep += req(N * H * hd, 2) + req(N * H, 4);          // q_pre, q_rstd
  p.redo += req(N * H * hd, 2);                          // q
  p.keep += req(N * hd, 2) + req(N, 4);                  // kvp, kv_rstd
  p.redo += req(N * hd, 2);                              // kv
  if (D.type != dsv4::AttnType::Sliding) {
    const int64_t E = dsv4::make_compress_plan(layout, D.ratio).n_entries;
    const int64_t w = D.type == dsv4::AttnType::CSA ? 2 : 1;
    p.keep += req(E * hd, 2);                                                   // compressed entries
    p.keep += req(N * w * hd, 2) + req(N * w * hd, 2) + req(E * hd, 2) + req(E, 4);  // kv, gate, pooled, rstd
    if (D.type == dsv4::AttnType::CSA) p.picks += req(N * D.index_topk, 8);    // the indexer's selection
  }
  p.keep += req(N * H * hd, 2) + req(N * H, 4);  // o, lse
  p.redo += req(N * H * hd, 2);                  // og (the rotated, group-major output)
  p.keep += req(N * gd, 2);                      // r
  // MoE (the routed rows of one GPU: N * topk).
  const int64_t E = ext.n_routed_experts, K = ext.topk, f = ext.moe_inter, fs = f * ext.n_shared_experts / tp;
  p.keep += req(N * E, 4) + req(N * E, 4) + req(N * K, 4);   // logits, scores, weight
  p.picks += req(N * K, 4);                                  // sel
  p.keep += req(N * K, 4) + req(N * K, 4) + req(E + 1, 4);   // order, slot_pos, offsets
  p.keep += req(1, 4);                                       // the router's status flag
  if (fs > 0) p.keep += req(N * 2 * fs, 2);                  // shared expert: gate|up
  if (fs > 0 && etp == 1) p.keep += req(N * d, 2);           // its output (under ETP a partial sum, not kept)
  // Expert parallel: the received rows, regrouped expert-major, stay for the experts' weight gradients (one GPU
  // re-gathers its own rows instead). As many as the rank sends under balanced routing: N * topk.
  if (ep > 1) p.keep += req(N * K * d, 2);
  p.keep += req(N * K * 2 * f / etp, 2) + req(N * K * d, 2); // experts' gate|up (this rank's width), outputs
  if (balance) p.keep += req(N * E, 4);                      // d(balance)/d(scores)
  return p;
}

}  // namespace

int64_t ActivationPlan::kept() const {
  int64_t k = streams + heads;
  for (const BlockActivations& b : blocks) k += b.kept;
  return k;
}

ActivationPlan plan_activations(const dsv4::ModelConfig& cfg, const dsv4::SeqLayout& layout,
                                const ActivationPlanShape& shape) {
  const int64_t l0 = shape.layer_begin, l1 = shape.layer_end < 0 ? cfg.n_layers : shape.layer_end;
  TREX_CHECK(l0 >= 0 && l0 < l1 && l1 <= cfg.n_layers, "activation plan: layers [{}, {}) outside the model's {}",
             l0, l1, cfg.n_layers);
  TREX_CHECK(!shape.mtp || (cfg.n_mtp > 0 && l1 == cfg.n_layers),
             "activation plan: the MTP block needs a config with it and the last stage");
  TREX_CHECK(shape.tp >= 1 && cfg.n_heads % shape.tp == 0 && cfg.o_groups % shape.tp == 0 &&
                 (cfg.moe_inter * cfg.n_shared_experts) % shape.tp == 0,
             "activation plan: tp={} does not split the {} heads, {} output groups and shared width {}", shape.tp,
             cfg.n_heads, cfg.o_groups, cfg.moe_inter * cfg.n_shared_experts);
  TREX_CHECK(shape.etp == 1 || (shape.etp == shape.tp && cfg.moe_inter % shape.etp == 0),
             "activation plan: etp={} must be 1 or tp={} and split the experts' width {}", shape.etp, shape.tp,
             cfg.moe_inter);
  const int64_t N = layout.B * layout.T, d = cfg.hidden, hc = cfg.hc_mult;
  const int64_t stream = req(N * hc * d, 2);
  ActivationPlan plan;
  plan.streams = (l1 - l0 + 1) * stream + (shape.mtp ? 2 * stream : 0);
  const bool last = l1 == cfg.n_layers;
  auto head = [&] {
    return req(N * d, 2) + req(N * 4, 4) + req(N, 4) + req(N * 4, 4) + req(N, 4) + req(N, 4) +
           (shape.head_grad ? req(N * d, 4) : 0);
  };
  if (last) plan.heads += head();
  if (shape.mtp) {
    plan.heads += head();
    plan.heads += req(N * d, 2) + req(N * d, 2) + req(N, 4) + req(N * hc * d, 2) + req(N * hc, 4);  // MTP input
  }
  const dsv4::ModelConfig ext = dsv4::with_mtp_block(cfg);
  std::vector<int64_t> layers;
  for (int64_t l = l0; l < l1; ++l) layers.push_back(l);
  if (shape.mtp) layers.push_back(cfg.n_layers);
  for (int64_t l : layers) {
    const bool hash = ext.mlp_types[size_t(l)] == dsv4::MlpType::HashMoE;
    const bool balance = shape.balance && (l == cfg.n_layers || !hash || shape.balance_hash_layers);
    const BlockPools p = block_pools(ext, l, layout, N, balance, shape.tp, shape.ep, shape.etp);
    BlockActivations b;
    switch (dsv4::recompute_of_layer(shape.recompute, shape.recompute_full_layers, l)) {
      case dsv4::Recompute::None:
        b.kept = p.keep + p.redo + p.picks;
        break;
      case dsv4::Recompute::Selective:
        b.kept = p.keep + p.picks, b.dropped = p.redo;
        break;
      case dsv4::Recompute::Full:
        b.kept = p.picks, b.dropped = p.keep + p.redo;
        break;
    }
    plan.block_scratch = std::max(plan.block_scratch, b.dropped);
    plan.blocks.push_back(b);
  }
  return plan;
}

Workspace plan_workspace(const dsv4::ModelConfig& cfg, const WorkspaceShape& sh) {
  Workspace w;
  const int64_t stream = sh.tokens * cfg.hc_mult * cfg.hidden, rows = sh.tokens * cfg.topk;
  w.grad_streams = 4 * stream * (3 * sh.chunks - (sh.embeds ? 1 : 0));
  w.moe_bwd = sh.chunks * 2 * rows * (4 * cfg.hidden + 4 * cfg.moe_inter / std::max<int64_t>(sh.etp, 1));
  if (sh.stages) {
    if (sh.act_in) w.boundary += 2 * (2 * stream) + 2 * stream + 4 * stream;   // bf16 receives, source, fp32 sink
    if (sh.grad_in) w.boundary += 2 * (4 * stream) + 4 * stream + 2 * stream;  // fp32 receives, source, bf16 sink
  }
  return w;
}

}  // namespace trex::dsv4gpu
