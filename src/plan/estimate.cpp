#include "plan/estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/cuda/activation_plan.h"

namespace trex::plan {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A ring collective over n ranks moving a full tensor of `bytes`: each rank sends (n-1)/n of it.
double ring_time(double bytes, int64_t n, double bw, double latency) {
  if (n <= 1 || bytes <= 0) return 0;
  return bytes * double(n - 1) / double(n) / bw + double(n - 1) * latency;
}
}  // namespace

Estimator::Estimator(ModelSpec model, HardwareProfile hw, ImplProfile impl, Workload w)
    : m_(std::move(model)), cfg_(model_config(m_)), hw_(std::move(hw)), impl_(std::move(impl)), w_(std::move(w)) {
  TREX_CHECK(w_.seq > 0 && w_.gbs > 0, "sequence length and global batch must be positive");
  math_ = std::make_unique<ModelMath>(m_, w_.seq, AttnCompute::Sparse);
  impl_math_ = std::make_unique<ModelMath>(m_, w_.seq, impl_.attn_compute);
}

void Estimator::set_impl(ImplProfile impl) {
  const bool same_attn = impl.attn_compute == impl_.attn_compute;
  impl_ = std::move(impl);
  if (!same_attn) impl_math_ = std::make_unique<ModelMath>(m_, w_.seq, impl_.attn_compute);
}

double Estimator::activation_elems(int64_t b, Recompute rc, int64_t tp, int64_t ep, int64_t etp) const {
  TREX_CHECK(tp >= 1, "planner: tp={} must be >= 1", tp);
  TREX_CHECK(etp >= 1, "planner: etp={} must be >= 1", etp);
  const double d = double(m_.hidden), hc = double(m_.hc_mult), qr = double(m_.q_lora_rank);
  // A TP rank's heads and output groups, its share of the shared expert's width (GpuModelOptions::tp).
  const double nh = double(m_.n_heads) / double(tp), c = double(m_.head_dim), g = double(m_.o_groups) / double(tp);
  const double dg = double(m_.o_lora_rank), E = double(m_.n_routed_experts), K = double(m_.topk);
  const double f = double(m_.moe_inter), nI = double(m_.index_n_heads), cI = double(m_.index_head_dim);
  const double fs = f * double(m_.n_shared_experts) / double(tp);
  const bool mtp = b == m_.n_layers;
  if (rc == Recompute::Full) return hc * d;  // only the block's input streams are kept
  const AttnKind kind = mtp ? AttnKind::Sliding : m_.attn[size_t(b)];
  // mHC sites: input streams, collapsed input, normalised input (both sites).
  double e = 2 * (hc * d + 2 * d);
  // Attention: c_Q before/after its norm, Q before norm, Q after norm+RoPE, output O and its rotated, group-major
  // copy (wo_a's input, kept for its weight gradient), KV before/after norm, grouped low-rank output, block output,
  // softmax statistics.
  e += 2 * qr + 4 * nh * c + 2 * c + g * dg + d + 2 * nh;
  if (kind == AttnKind::CSA) {
    // compressor values/gates (2c wide, fp32), indexer queries, head weights, indexer compressor (fp32),
    // top-k indices (int32), compressed entries.
    e += 8 * c + nI * cI + nI + 8 * cI + 2 * double(m_.index_topk) + c / 4;
  } else if (kind == AttnKind::HCA) {
    e += 4 * c + c / 128;
  }
  // MoE: fp32 router logits, normalised input, gate|up per routed copy and the experts' outputs (the GPU model
  // re-gathers the dispatched inputs and recomputes the SwiGLU in the backward), the shared expert's gate|up, the
  // combined output.
  e += 2 * E + 2 * d + K * d + 2 * K * f / double(etp) + 2 * fs;
  // Expert parallel: the received rows, regrouped expert-major, are kept for the experts' weight gradients.
  if (ep > 1) e += K * d;
  if (mtp) e += hc * d + 2 * d;  // h_proj / e_proj outputs
  // Selective recomputation rebuilds the cheap elementwise results: Q after norm+RoPE, the rotated output, c_Q
  // after its norm, KV after norm+RoPE, the sub-layer inputs and the mid stream.
  if (rc == Recompute::Selective) e -= 2 * nh * c + qr + c + 4 * d;
  return e;
}

std::vector<std::vector<int64_t>> Estimator::partition(int64_t pp, int64_t vpp) const {
  auto key = std::make_pair(pp, vpp);
  auto it = partitions_.find(key);
  if (it != partitions_.end()) return it->second;
  const int64_t n = math_->n_blocks(w_.mtp), k = pp * vpp;
  TREX_ASSERT(k >= 1 && k <= n);
  std::vector<double> cost(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) cost[size_t(b)] = math_->block_flops(b).total();
  const double head = math_->head_flops() * (w_.mtp && m_.n_mtp > 0 ? 2.0 : 1.0);
  std::vector<double> prefix(size_t(n + 1), 0);
  for (int64_t b = 0; b < n; ++b) prefix[size_t(b + 1)] = prefix[size_t(b)] + cost[size_t(b)];
  // best[j][i]: min over splits of the first i blocks into j chunks of the max chunk cost.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(k + 1), std::vector<double>(size_t(n + 1), inf));
  std::vector<std::vector<int64_t>> cut(size_t(k + 1), std::vector<int64_t>(size_t(n + 1), 0));
  best[0][0] = 0;
  for (int64_t j = 1; j <= k; ++j)
    for (int64_t i = j; i <= n - (k - j); ++i)
      for (int64_t s = j - 1; s < i; ++s) {
        double chunk = prefix[size_t(i)] - prefix[size_t(s)] + (j == k ? head : 0.0);
        double v = std::max(best[size_t(j - 1)][size_t(s)], chunk);
        if (v < best[size_t(j)][size_t(i)]) best[size_t(j)][size_t(i)] = v, cut[size_t(j)][size_t(i)] = s;
      }
  std::vector<std::vector<int64_t>> chunks(static_cast<size_t>(k));
  int64_t i = n;
  for (int64_t j = k; j >= 1; --j) {
    int64_t s = cut[size_t(j)][size_t(i)];
    for (int64_t b = s; b < i; ++b) chunks[size_t(j - 1)].push_back(b);
    i = s;
  }
  partitions_[key] = chunks;
  return chunks;
}

const BucketTable& Estimator::buckets(bool ep_split, int64_t tp, int64_t etp) const {
  auto key = std::make_tuple(ep_split, tp, etp);
  auto it = buckets_.find(key);
  if (it != buckets_.end()) return it->second;
  dsv4::ModelConfig cfg = model_config(m_);
  cfg.n_mtp = 1;  // the table keeps the MTP module's bucket; a stage counts it only when it holds that block
  return buckets_.emplace(key, bucket_table(cfg, ep_split, tp, etp)).first->second;
}

void Estimator::set_partition(int64_t pp, int64_t vpp, std::vector<std::vector<int64_t>> chunks) {
  const int64_t n = math_->n_blocks(w_.mtp);
  TREX_CHECK(int64_t(chunks.size()) == pp * vpp, "planner: {} chunks given for pp={} x vpp={}", chunks.size(), pp,
             vpp);
  int64_t next = 0;
  for (const auto& c : chunks)
    for (int64_t b : c) {
      TREX_CHECK(b == next, "planner: the given chunks must cover blocks 0..{} in order (block {} where {} was due)",
                 n - 1, b, next);
      ++next;
    }
  TREX_CHECK(next == n, "planner: the given chunks cover {} of the {} blocks", next, n);
  partitions_[{pp, vpp}] = std::move(chunks);
}

Estimate Estimator::estimate(Layout l, int64_t devices) const {
  Estimate est;
  est.reason = check_layout(m_, hw_, w_, devices, l);
  est.layout = l;
  if (!est.reason.empty()) return est;
  est.valid = true;

  const ImplProfile& ip = impl_;
  const double d = double(m_.hidden), hc = double(m_.hc_mult), K = double(m_.topk);
  const double E = double(m_.n_routed_experts), V = double(m_.vocab);
  const int64_t mb = micro_batches(l, w_);
  est.micro_batches = mb;
  // Expert data-parallel degree: the replicas of an expert that shard its state and reduce its gradients. T-Rex's
  // experts are expert-parallel over the DP ranks of one TP rank: the TP ranks hold their DP rank's experts whole
  // (etp 1) or split over the TP group (etp = tp, each its share of every expert), so TP adds no replica.
  const int64_t edp = std::max<int64_t>(1, l.cp * l.dp / l.ep);
  const int64_t dense_dp = l.dp * l.cp;                      // ZeRO shards dense state over DP x CP
  const double tokens_mb = double(l.mbs * w_.seq);
  // No sequence parallelism in T-Rex: every TP rank runs all the micro-batch's tokens; the TP-split work (the
  // split projections, the attention core over its heads) is divided by tp below, the rest runs on every TP rank.
  const double tokens_rank = tokens_mb / double(l.cp);
  const double tp = double(l.tp);
  const bool fp8 = w_.precision == Precision::FP8;
  const double peak_mm = fp8 ? hw_.peak_fp8 : hw_.peak_bf16;
  const bool with_mtp = w_.mtp && m_.n_mtp > 0;
  const bool single_domain = devices <= hw_.scaleup_domain;
  auto bw_for_span = [&](int64_t span) {
    return (span <= hw_.devices_per_node || single_domain || span <= hw_.scaleup_domain ? hw_.scaleup_bw
                                                                                        : hw_.scaleout_bw) *
           ip.eff_comm;
  };
  auto lat_for_span = [&](int64_t span) {
    return span <= hw_.scaleup_domain ? hw_.scaleup_latency : hw_.scaleout_latency;
  };

  const auto chunks = partition(l.pp, l.vpp);
  std::vector<std::vector<int64_t>> stages(static_cast<size_t>(l.pp));
  for (size_t c = 0; c < chunks.size(); ++c)
    for (int64_t b : chunks[c]) stages[c % size_t(l.pp)].push_back(b);
  for (const auto& s : stages) est.stage_blocks.push_back(int64_t(s.size()));

  // ---------------------------------------------------------------- time per micro-batch, per stage
  // An expert's rows per rank: every rank of its EP group sends it its tokens' share (under ETP each TP rank its
  // copy of the same tokens, to its share of the expert's width).
  const double tokens_per_expert = tokens_rank * K * double(l.ep) / E;
  const double eff_expert = ip.eff_expert * tokens_per_expert / (tokens_per_expert + ip.expert_half_tokens);
  const double bw_tp = hw_.scaleup_bw * ip.eff_comm;
  const int64_t ep_span = l.ep * l.etp * (l.etp == 1 ? 1 : 1);
  // All-to-all: bytes to peers inside the scale-up domain go at scale-up speed, the rest over scale-out.
  double a2a_bw_time_per_byte = 0;
  if (l.ep > 1) {
    const int64_t peers = l.ep - 1;
    const int64_t in_domain =
        single_domain ? peers : std::min<int64_t>(peers, std::max<int64_t>(hw_.scaleup_domain / l.etp, 1) - 1);
    const double f_in = double(in_domain) / double(peers), f_out = 1.0 - f_in;
    a2a_bw_time_per_byte =
        std::max(f_in / (hw_.scaleup_bw * ip.eff_comm), f_out > 0 ? f_out / (hw_.scaleout_bw * ip.eff_comm) : 0.0);
  }
  const double lat_ep = lat_for_span(ep_span);
  struct StageTime {
    double compute = 0, recompute = 0, tp = 0, ep = 0, cp = 0;
  };
  std::vector<StageTime> st(static_cast<size_t>(l.pp));
  const double elem_bytes = 2.0;
  for (int64_t s = 0; s < l.pp; ++s) {
    StageTime& t = st[size_t(s)];
    for (int64_t b : stages[size_t(s)]) {
      const BlockFlops& fl = impl_math_->block_flops(b);
      const double dense = fl.dense_mm - fl.dense_mm_split + fl.dense_mm_split / tp;
      const double mm = dense * tokens_rank / (peak_mm * ip.eff_dense) +
                        fl.expert_mm / double(l.etp) * tokens_rank / (peak_mm * eff_expert);
      const double attn = (fl.attn_core / tp + fl.indexer) * tokens_rank / (hw_.peak_bf16 * ip.eff_attn);
      const double elementwise = activation_elems(b, Recompute::None, l.tp, 1, l.etp) * elem_bytes * tokens_rank *
                                 ip.elementwise_factor / (hw_.hbm_bw * ip.eff_hbm);
      const double fwd = mm + attn + elementwise + ip.block_overhead_s;
      const double bwd = 2 * (mm + attn + elementwise) + ip.block_overhead_s;
      double rc = 0;
      const Recompute rcb = l.recompute_at(b);
      if (rcb == Recompute::Full) rc = fwd;
      if (rcb == Recompute::Selective) rc = 0.5 * elementwise;
      t.compute += fwd + bwd + rc;
      t.recompute += rc;
      const int64_t passes = 2 + (rcb == Recompute::Full ? 1 : 0);  // forward comm repeats on recompute
      if (l.tp > 1) {
        // T-Rex's TP all-reduces, in fp32 (an all-reduce: two ring passes): forward (again on a full
        // recomputation) the attention's and the shared expert's partial outputs, [tokens, d] each; backward the
        // compressed query's, the shared K=V's and the shared expert's input gradients ([tokens, q_lora_rank],
        // [tokens, head_dim], [tokens, d]; the compressed entries' are a ratio smaller and left out).
        const double fwd = tokens_rank * 2 * d * 4.0;
        const double bwd = tokens_rank * (d + double(m_.q_lora_rank) + double(m_.head_dim)) * 4.0;
        t.tp += 2.0 * (double(passes - 1) * ring_time(fwd, l.tp, bw_tp, hw_.scaleup_latency) +
                       ring_time(bwd, l.tp, bw_tp, hw_.scaleup_latency));
      }
      if (l.etp > 1) {
        // Expert TP: the routed experts' partial outputs and input gradients join the shared expert's all-reduces
        // above; the gate weights' gradients ([tokens, topk] fp32) are one more all-reduce in the backward.
        t.tp += 2.0 * ring_time(tokens_rank * K * 4.0, l.tp, bw_tp, hw_.scaleup_latency);
      }
      if (l.ep > 1) {
        const double dispatch = tokens_rank * K * d * (fp8 ? 1.0 : 2.0), combine = tokens_rank * K * d * 2.0;
        const double one = (dispatch + combine) * double(l.ep - 1) / double(l.ep) * a2a_bw_time_per_byte +
                           2 * double(l.ep - 1) * lat_ep;
        t.ep += double(passes) * one;
      }
      if (l.cp > 1) {
        const double bytes = tokens_mb * double(m_.head_dim) * elem_bytes;
        t.cp += double(passes) * ring_time(bytes, l.cp, bw_for_span(l.tp * l.cp), lat_for_span(l.tp * l.cp));
      }
    }
    if (s == l.pp - 1) {  // LM head(s): whole on every TP rank (T-Rex does not split the vocabulary)
      const double head = math_->head_flops() * (with_mtp ? 2.0 : 1.0) * tokens_rank / (peak_mm * ip.eff_dense);
      const double loss = tokens_rank * V * 4.0 * 3.0 / (hw_.hbm_bw * ip.eff_hbm);
      t.compute += 3 * head + loss;
      if (l.recompute == Recompute::Full) t.compute += head, t.recompute += head;
    }
  }
  // Exposed communication after overlap. EP all-to-all hides behind another micro-batch's compute in the
  // steady state of 1F1B, about half in warm-up/cool-down.
  const double warm = l.pp > 1 ? std::min(1.0, double(l.pp - 1) / double(mb)) : 0.0;
  const double ovl_ep = l.overlap ? ip.ep_overlap * (1.0 - 0.5 * warm) : 0.0;
  const double ovl_tp = l.overlap ? ip.tp_overlap : 0.0;
  double t_mb = 0;
  int64_t slow = 0;
  std::vector<double> stage_mb(static_cast<size_t>(l.pp));
  for (int64_t s = 0; s < l.pp; ++s) {
    const StageTime& t = st[size_t(s)];
    const double hidden_ep = std::min(ovl_ep * t.ep, 0.9 * t.compute);
    const double exposed = t.tp * (1 - ovl_tp) + (t.ep - hidden_ep) + t.cp * (1 - ovl_tp);
    stage_mb[size_t(s)] = t.compute + exposed;
    est.stage_compute.push_back(double(mb) * stage_mb[size_t(s)]);
    if (stage_mb[size_t(s)] > t_mb) t_mb = stage_mb[size_t(s)], slow = s;
  }
  const StageTime& ts = st[size_t(slow)];
  const double hidden_ep = std::min(ovl_ep * ts.ep, 0.9 * ts.compute);
  // Pipeline point-to-point: the 4 residual streams cross each virtual-stage boundary, whole on each TP rank.
  double pp_mb = 0;
  if (l.pp > 1) {
    const double bytes = tokens_rank * hc * d * elem_bytes;
    const double bw = single_domain ? hw_.scaleup_bw * ip.eff_comm : bw_for_span(l.tp * l.cp * l.dp * 2);
    pp_mb = 2.0 * double(l.vpp) * (bytes / bw + lat_for_span(devices));
  }
  const double ovl_pp = l.overlap ? ip.pp_overlap : 0.0;
  TimeBreakdown& T = est.time;
  T.compute = double(mb) * ts.compute;
  T.recompute = double(mb) * ts.recompute;
  T.tp = double(mb) * (ts.tp + ts.cp * 0) * (1 - ovl_tp);
  T.cp = double(mb) * ts.cp * (1 - ovl_tp);
  T.ep = double(mb) * (ts.ep - hidden_ep);
  T.pp = double(mb) * pp_mb * (1 - ovl_pp);
  const double t_mb_full = t_mb + pp_mb * (1 - ovl_pp);
  T.bubble = double(l.pp - 1) / double(l.vpp) * t_mb_full;

  // ---------------------------------------------------------------- memory per rank, per stage
  const ParamCounts pc = math_->params();
  const double router_grads_off = w_.frozen_router ? 1.0 : 0.0;
  MemoryBreakdown worst;
  double worst_dense_params = 0, worst_expert_params = 0;
  std::vector<double> stage_dense(static_cast<size_t>(l.pp)), stage_experts(static_cast<size_t>(l.pp));
  for (int64_t s = 0; s < l.pp; ++s) {
    double dense = 0, experts = 0, frozen = 0, saved = 0, max_block = 0, quad = 0;
    for (int64_t b : stages[size_t(s)]) {
      const BlockParams& p = math_->block_params(b);
      dense += p.sharded / tp + p.replicated;
      experts += p.experts / double(l.ep * l.etp);
      frozen += p.router * router_grads_off;
      saved += activation_elems(b, l.recompute_at(b), l.tp, l.ep, l.etp);
      max_block = std::max(max_block, activation_elems(b, Recompute::None, l.tp, l.ep, l.etp));
      quad += ip.act_quadratic_bytes * double(m_.n_heads) / double(l.tp) * double(l.mbs) * double(w_.seq) *
              double(w_.seq) / double(l.cp);
    }
    // The embedding and the head are whole on every TP rank (T-Rex splits neither).
    if (s == 0) dense += pc.embed;
    if (s == l.pp - 1) dense += pc.head + pc.final_misc;
    if (s == l.pp - 1 && with_mtp && l.pp > 1) dense += pc.embed;  // MTP's copy of the embedding
    const double params = dense + experts;
    stage_dense[size_t(s)] = dense, stage_experts[size_t(s)] = experts;
    MemoryBreakdown mem;
    mem.stage = s;
    mem.weights = params * ip.weight_bytes;
    mem.grads = (params - frozen) * ip.grad_bytes;
    // Optimizer state: Muon keeps one moment for matrices; embedding, head and vectors stay on AdamW.
    double state_dense = dense * (ip.master_bytes + ip.adam_bytes);
    double state_experts = experts * (ip.master_bytes + ip.adam_bytes);
    if (w_.optimizer == Optimizer::Muon) {
      double adamw_part = (s == 0 ? pc.embed : 0) + (s == l.pp - 1 ? pc.head : 0);
      state_dense = adamw_part * (ip.master_bytes + ip.adam_bytes) + (dense - adamw_part) * (ip.master_bytes + ip.muon_bytes);
      state_experts = experts * (ip.master_bytes + ip.muon_bytes);
    }
    state_dense -= frozen * (ip.master_bytes + ip.adam_bytes);
    double opt = 0;
    if (l.zero == 0) {
      opt = state_dense + state_experts;
    } else {
      opt = state_dense / double(dense_dp) + state_experts / double(edp);
    }
    // ZeRO-2 and ZeRO-3 reduce the dense gradients as the GPU trainer does (model/cuda/grad_buckets.h; ZeRO-3's
    // gradients are ZeRO-2's): transient fp32 bucket buffers, alive together, of two of the largest layer bucket
    // (one written, one being reduced; without expert parallelism the layer's experts are in its bucket) and of
    // every root bucket the stage holds (GradBuckets::transient_bytes): the embedding's, the head's (written from
    // the training forward on) and the MTP module's (its block's dense part, and on a later stage than the first
    // its copy of the embedding).
    double grad_buffers = 0;
    if (l.zero >= 2) {
      const bool experts_in_layer_bucket = l.ep == 1;
      double biggest = 0, mtp_root = 0;
      for (int64_t b : stages[size_t(s)]) {
        const BlockParams& p = math_->block_params(b);
        const double bucket =
            p.sharded / tp + p.replicated + (experts_in_layer_bucket ? p.experts / double(l.etp) : 0.0);
        if (b == m_.n_layers) {
          mtp_root = bucket + (l.pp > 1 ? pc.embed : 0.0);
        } else {
          biggest = std::max(biggest, bucket);
        }
      }
      const double root = (s == 0 ? pc.embed : 0) + (s == l.pp - 1 ? pc.head : 0) + mtp_root;
      grad_buffers = (2 * biggest + root) * ip.grad_bytes;
    }
    if (l.zero == 2) {
      // The dense gradients persist as this rank's 1/DP slice, and so do the experts' without expert parallelism
      // (they sit in their layer's bucket); with it they stay whole (their replicas reduce-scatter in place).
      const double expert_grads = l.ep == 1 ? experts / double(dense_dp) : experts;
      mem.grads = (dense - frozen) * ip.grad_bytes / double(dense_dp) + expert_grads * ip.grad_bytes + grad_buffers;
    }
    if (l.zero == 3) {  // FSDP: parameters and gradients sharded too, plus gathered working copies
      const double n = double(dense_dp);
      // Under expert parallelism the routed experts are owned per EP rank and stay whole (the GPU trainer's
      // ZeRO-3, model/cuda/weight_gather.h, gathers the dense buckets only); without it they shard and gather
      // with their layer, as FSDP does.
      const bool ep_owned = l.ep > 1;
      double biggest = 0;
      for (int64_t b : stages[size_t(s)]) {
        const BlockParams& p = math_->block_params(b);
        const double experts_in_bucket = ep_owned ? 0.0 : p.experts / double(l.etp);
        biggest = std::max(biggest, p.sharded / double(l.tp) + p.replicated + experts_in_bucket);
      }
      // The stage's root units stay gathered through forward and backward: the embedding on the first stage,
      // the head on the last (with MTP on a later stage, also its copy of the embedding).
      const double root = (s == 0 ? pc.embed : 0.0) + (s == l.pp - 1 ? pc.head : 0.0) +
                          (s == l.pp - 1 && with_mtp && l.pp > 1 ? pc.embed : 0.0);
      const double held = ep_owned ? dense / n + experts : params / n;
      mem.weights = held * ip.weight_bytes + (2 * biggest + root) * ip.weight_bytes;
      mem.grads = (ep_owned ? (dense - frozen) / n + experts : (params - frozen) / n) * ip.grad_bytes + grad_buffers;
    }
    if (l.offload == Offload::Swap) {
      mem.host_gib = opt / kGiB;
      double biggest = 0;
      for (int64_t b : stages[size_t(s)])
        biggest = std::max(biggest, (math_->block_params(b).sharded / tp + math_->block_params(b).replicated) /
                                            double(dense_dp) +
                                        math_->block_params(b).experts / double(l.ep * l.etp * edp));
      mem.swap_buffers = 2 * biggest * (ip.master_bytes + ip.adam_bytes) / kGiB;
      opt = 0;
    }
    if (w_.optimizer == Optimizer::Muon) {  // Newton-Schulz workspace: a few fp32 copies of the largest matrix
      // (whole under TP: a split matrix is gathered whole for its Newton-Schulz), and under TP the gathered
      // batch and its staging (GpuOptimizer's kTpMuonBatchElems fp32 each, or the largest matrix if bigger).
      const double largest = std::max(double(m_.n_heads) * double(m_.head_dim) * double(m_.q_lora_rank),
                                      double(m_.moe_inter) * d);
      opt += 3 * largest * 4;
      if (l.tp > 1) opt += 2 * std::max(largest, double(int64_t(1) << 25)) * 4;
    }
    mem.optimizer = opt / kGiB;
    mem.weights /= kGiB;
    mem.grads /= kGiB;
    // Activations held by this stage: micro-batches in flight (1F1B / interleaved warm-up depth).
    double inflight = 0;
    if (l.vpp == 1) {
      inflight = double(std::min<int64_t>(l.pp - s, mb));
    } else {
      inflight = std::min(double(2 * (l.pp - s - 1) + (l.vpp - 1) * l.pp + 1) / double(l.vpp), double(mb));
    }
    mem.inflight = inflight;
    const double per_mb = (saved * elem_bytes * tokens_rank) * ip.act_scale + quad;
    // Recomputation rebuilds one block's full activations during its backward. The GPU trainer builds one model
    // per virtual stage (vpp chunks), each with its own activation arena whose recomputation region keeps its
    // high-water mark for the whole step (model/cuda/activation_arena.h): vpp such buffers, not one.
    double working = 0;
    if (l.recompute != Recompute::None)
      working = double(l.vpp) * max_block * elem_bytes * tokens_rank * ip.act_scale;
    mem.activations = (inflight * per_mb + working) / kGiB;
    if (s == l.pp - 1) mem.logits = tokens_rank * V * ip.logits_bytes / kGiB;  // the whole vocabulary per TP rank
    double comm = 0;
    if (l.ep > 1) comm += 2 * tokens_rank * K * d * 2.0 * 2;  // dispatch and combine receive buffers, fwd + bwd
    if (l.zero == 1 || l.zero == 0) comm += 2 * std::min(params, 40e6) * ip.grad_bytes;  // grad buckets
    mem.comm_buffers = comm / kGiB;
    // Workspace, as the GPU model takes it from the pool (and `trex bench train --emulate-rank` counts it before
    // allocating): the gradient streams and MoE backward temporaries of each of the rank's vpp chunks, and with
    // stages the boundary's buffers (dsv4gpu::plan_workspace).
    dsv4gpu::WorkspaceShape ws;
    ws.tokens = int64_t(std::llround(tokens_rank)), ws.chunks = l.vpp, ws.embeds = s == 0, ws.stages = l.pp > 1;
    ws.act_in = s > 0 || l.vpp > 1, ws.grad_in = s < l.pp - 1 || l.vpp > 1;
    ws.etp = l.etp;
    const double work = double(dsv4gpu::plan_workspace(cfg_, ws).total());
    mem.workspace = work / kGiB;
    mem.fixed = ip.fixed_gib;
    mem.total = mem.weights + mem.grads + mem.optimizer + mem.activations + mem.logits + mem.comm_buffers +
                mem.workspace + mem.swap_buffers + mem.fixed;
    mem.capacity = hw_.hbm_gib - hw_.reserved_gib;
    est.stage_mem.push_back(mem);
    if (s == 0 || mem.total > worst.total) {
      worst = mem;
      worst_dense_params = dense;
      worst_expert_params = experts;
    }
  }
  worst.capacity = hw_.hbm_gib - hw_.reserved_gib;
  est.mem = worst;

  // ---------------------------------------------------------------- per-step communication by kind, per stage
  {
    const BucketTable& bt = buckets(l.ep > 1, l.tp, l.etp);
    for (int64_t s = 0; s < l.pp; ++s) {
      RankCommInputs in;
      in.layout = l;
      in.blocks = stages[size_t(s)];
      for (size_t c = 0; c < chunks.size(); ++c)
        if (int64_t(c % size_t(l.pp)) == s) in.chunks.push_back(int64_t(c));
      in.n_virtual = int64_t(chunks.size());
      in.first = s == 0, in.last = s == l.pp - 1, in.mtp_embed_copy = with_mtp && l.pp > 1 && s == l.pp - 1;
      in.micro_batches = mb, in.tokens = tokens_rank;
      in.hidden = m_.hidden, in.hc = m_.hc_mult, in.topk = m_.topk, in.experts = m_.n_routed_experts;
      in.q_lora_rank = m_.q_lora_rank, in.head_dim = m_.head_dim, in.devices = devices;
      est.stage_comm.push_back(rank_comm(bt, in, hw_, ip.eff_hbm, ip.eff_comm, ip.emulated_copy_s));
    }
  }
  // ---------------------------------------------------------------- per-step: DP, optimizer, overhead
  {
    const double dense = worst_dense_params, experts = worst_expert_params;
    const int64_t span = l.tp * l.cp * l.dp;
    const double bw = bw_for_span(span), lat = lat_for_span(span);
    double dp = 0;
    if (l.zero == 0) {
      dp = 2 * ring_time(dense * ip.grad_bytes, dense_dp, bw, lat) + 2 * ring_time(experts * ip.grad_bytes, edp, bw, lat);
    } else {
      // ZeRO-1/2/3: the DP kinds of the comm table (the buckets' reduce-scatters and gathers, the experts' replicas,
      // region R) on the links; the stages reduce at once, so the slowest stage's.
      for (const RankComm& rc : est.stage_comm) {
        double s = 0;
        for (const CommKind& k : rc.kinds)
          if (k.dim == "dp" || k.dim == "edp") s += k.cluster_s;
        dp = std::max(dp, s);
      }
    }
    if (w_.optimizer == Optimizer::Muon) dp += ring_time(dense * 2.0, dense_dp, bw, lat);  // whole matrices for NS
    T.dp = dp * (1 - (l.overlap ? ip.dp_overlap : 0.0));
    if (l.zero == 3 && dense_dp > 1) {
      // ZeRO-3 gathers a layer per forward and backward pass over it (again for a block replayed in full).
      double most = 0;
      for (const auto& st_blocks : stages) {
        double passes = 0;
        for (int64_t b : st_blocks) passes += 2.0 + (l.recompute_at(b) == Recompute::Full ? 1.0 : 0.0);
        most = std::max(most, passes);
      }
      T.dp += ip.dp_block_overhead_s * most * double(mb);
    }
    // Optimizer step on the local shard of a stage holding `dense` + `experts` parameters: read grads, master,
    // moments; write master, moments, bf16 weights.
    auto optimizer_time = [&](double dn, double ex) {
      const double shard = l.zero == 0 ? dn + ex : dn / double(dense_dp) + ex / double(edp);
      const double state = ip.master_bytes + (w_.optimizer == Optimizer::Muon ? ip.muon_bytes : ip.adam_bytes);
      double opt = shard * (ip.grad_bytes + 2 * state + ip.weight_bytes) / (hw_.hbm_bw * ip.eff_hbm);
      if (w_.optimizer == Optimizer::Muon) {
        // Newton-Schulz, 10 iterations of ~(4 m^2 n + 2 m^3) on m x n (m <= n) matrices: per parameter
        // 10 (4 m + 2 m^2 / n). Experts are f x d; dense matrices are taken as q_lora_rank x hidden.
        auto per_param = [](double m, double n) { return 10 * (4 * m + 2 * m * m / n); };
        const double f = double(m_.moe_inter), qr = double(m_.q_lora_rank);
        const double ns = (dn / double(dense_dp)) * per_param(std::min(qr, d), std::max(qr, d)) +
                          (ex / double(edp)) * per_param(std::min(f, d), std::max(f, d));
        opt += ns / (hw_.peak_bf16 * ip.eff_dense);
      }
      if (l.offload == Offload::Swap) {
        const double bytes = 2 * shard * (ip.master_bytes + ip.adam_bytes);
        opt += bytes / hw_.host_bw * (1 - ip.swap_overlap);
      }
      return opt;
    };
    const double opt = optimizer_time(dense, experts);
    T.optimizer = opt;
    T.overhead = ip.step_overhead_s;
    for (int64_t s = 0; s < l.pp; ++s) {
      const StageTime& t = st[size_t(s)];
      const double o = optimizer_time(stage_dense[size_t(s)], stage_experts[size_t(s)]);
      est.stage_optimizer.push_back(o);
      const RankComm& rc = est.stage_comm[size_t(s)];
      est.stage_alone.push_back(double(mb) * t.compute + rc.emulated_s() + o + T.overhead);
      est.stage_alone_none.push_back(double(mb) * t.compute + rc.emulated_none_s() + o + T.overhead);
    }
  }
  T.step = T.compute + T.tp + T.cp + T.ep + T.pp + T.bubble + T.dp + T.optimizer + T.overhead;

  est.tokens_per_step = double(w_.gbs * w_.seq) * w_.fill;
  est.tokens_per_s = est.tokens_per_step / T.step;
  est.tokens_per_s_per_device = est.tokens_per_s / double(devices);
  est.flops_per_token = math_->train_flops_per_token(with_mtp);
  est.six_n_per_token = math_->six_n_flops_per_token();
  est.model_tflops_per_device = est.tokens_per_s_per_device * est.flops_per_token / 1e12;
  est.mfu = est.tokens_per_s_per_device * est.flops_per_token / hw_.peak_bf16;
  est.mfu_6n = est.tokens_per_s_per_device * est.six_n_per_token / hw_.peak_bf16;

  est.fits = est.mem.total <= est.mem.capacity && (l.offload == Offload::None || est.mem.host_gib <= hw_.host_gib);
  if (!est.fits) {
    est.reason = est.mem.total > est.mem.capacity
                     ? fmt::format("needs {:.1f} GiB on stage {} but {} offers {:.1f} GiB", est.mem.total,
                                   est.mem.stage, hw_.name, est.mem.capacity)
                     : fmt::format("needs {:.1f} GiB of host memory per rank for the swapped optimizer, {} has {:.1f}",
                                   est.mem.host_gib, hw_.name, hw_.host_gib);
  }
  return est;
}

}  // namespace trex::plan
