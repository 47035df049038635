#include "plan/comm_volume.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "comm/emulated_group.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/dsv4/param_table.h"

namespace trex::plan {

namespace {
// gpu_params_cuda.cpp's kBucketAlign: bucket boundaries are multiples of lcm(this, 8 x dp) elements.
constexpr int64_t kBucketAlign = 512;
constexpr double kCountOnlyBelow = double(comm::EmulatedGroup::kCountOnlyMovesBelow);
}  // namespace

BucketTable bucket_table(const dsv4::ModelConfig& cfg, bool ep_split, int64_t tp, int64_t etp) {
  TREX_CHECK(tp >= 1, "comm volume: tp={} must be >= 1", tp);
  TREX_CHECK(etp == 1 || etp == tp, "comm volume: etp={} must be 1 or tp={}", etp, tp);
  const dsv4::TpExperts split = dsv4::tp_experts_of(etp);
  BucketTable t;
  const size_t n_blocks = size_t(cfg.n_layers + (cfg.n_mtp > 0 ? 1 : 0));
  t.block.assign(n_blocks, 0), t.experts.assign(n_blocks, 0), t.fp32.assign(n_blocks, 0);
  for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) {
    if (!s.trained()) continue;  // router biases, hash tables: buffers, never reduced
    const int64_t n = numel(dsv4::tp_local_shape(s.shape, dsv4::tp_split_axis(s.name, split), int(tp)));
    const bool bf16 = s.dtype == DType::BF16;
    if (s.part == dsv4::ParamPart::Embed) {
      if (bf16) t.embed += n;
    } else if (s.part == dsv4::ParamPart::Head) {
      (bf16 ? t.head : t.head_fp32) += n;
    } else {
      const size_t b = s.part == dsv4::ParamPart::Mtp ? size_t(cfg.n_layers) : size_t(s.layer);
      TREX_CHECK(b < n_blocks, "comm volume: parameter '{}' of block {} beyond the model's {} blocks", s.name, b,
                 n_blocks);
      if (!bf16)
        t.fp32[b] += n;
      else if (s.expert >= 0)
        (ep_split ? t.experts[b] : t.block[b]) += n;
      else
        t.block[b] += n;
    }
  }
  return t;
}

int64_t padded_bucket(int64_t n, int64_t dp) {
  const int64_t a = std::lcm(kBucketAlign, 8 * std::max<int64_t>(dp, 1));
  return (n + a - 1) / a * a;
}

double RankComm::emulated_s() const {
  double s = 0;
  for (const auto& k : kinds) s += k.emulated_s;
  return s;
}
double RankComm::emulated_none_s() const {
  double s = 0;
  for (const auto& k : kinds) s += k.emulated_none_s;
  return s;
}
double RankComm::cluster_s() const {
  double s = 0;
  for (const auto& k : kinds) s += k.cluster_s;
  return s;
}
double RankComm::bytes(const std::string& op) const {
  double s = 0;
  for (const auto& k : kinds)
    if (k.op == op) s += k.bytes;
  return s;
}
int64_t RankComm::calls(const std::string& op) const {
  int64_t s = 0;
  for (const auto& k : kinds)
    if (k.op == op) s += k.calls;
  return s;
}

RankComm rank_comm(const BucketTable& t, const RankCommInputs& in, const HardwareProfile& hw, double hbm_eff,
                   double comm_eff, double copy_s) {
  const Layout& l = in.layout;
  TREX_CHECK(l.dp >= 1 && l.ep >= 1 && l.etp >= 1, "comm volume: dp={} ep={} etp={} must be >= 1", l.dp, l.ep, l.etp);
  // The estimator's degrees: ZeRO shards over DP x CP; an expert's replicas are the DP x CP ranks over EP (the
  // experts are expert-parallel over the DP ranks of one TP rank; ETP splits them over the TP group, no replica).
  const int64_t dp = l.dp * l.cp, edp = std::max<int64_t>(1, dp / l.ep), M = in.micro_batches;
  const bool single_domain = in.devices <= hw.scaleup_domain;
  // A group whose ranks lie `span` ranks apart at most runs on NVLink when that stays inside the scale-up domain.
  auto bw = [&](int64_t span) {
    return (single_domain || span <= hw.scaleup_domain ? hw.scaleup_bw : hw.scaleout_bw) * comm_eff;
  };
  auto lat = [&](int64_t span) {
    return single_domain || span <= hw.scaleup_domain ? hw.scaleup_latency : hw.scaleout_latency;
  };
  const double copy_bw = hw.hbm_bw * hbm_eff / 2.0;  // a device copy reads and writes every byte
  RankComm out;
  // The emulated seconds from the copies; the links' from the bytes on the wire at `seconds_per_byte` and the
  // calls' hops at the span's latency.
  auto add_at = [&](CommKind k, double seconds_per_byte, int64_t span, int64_t hops_per_call) {
    if (k.calls == 0) return;
    k.emulated_s = k.moved / copy_bw + double(k.copies) * copy_s;
    k.emulated_none_s = k.moved_none / copy_bw + double(k.copies_none) * copy_s;
    k.cluster_s = k.wire * seconds_per_byte + double(k.calls * hops_per_call) * lat(span);
    out.kinds.push_back(std::move(k));
  };
  auto add = [&](CommKind k, int64_t span, int64_t hops_per_call) {
    add_at(std::move(k), 1.0 / bw(span), span, hops_per_call);
  };

  // ---- ZeRO over the DP group: the buckets of this stage.
  std::vector<int64_t> units;  // padded elements of each non-empty bucket this rank holds
  auto unit = [&](int64_t n) {
    if (n > 0) units.push_back(padded_bucket(n, dp));
  };
  if (in.first || in.mtp_embed_copy) unit(t.embed);
  if (in.last) unit(t.head);
  int64_t fp32 = in.last ? t.head_fp32 : 0, experts = 0;
  for (int64_t b : in.blocks) {
    TREX_CHECK(b >= 0 && size_t(b) < t.block.size(), "comm volume: block {} outside the table's {}", b,
               t.block.size());
    unit(t.block[size_t(b)]);
    fp32 += t.fp32[size_t(b)];
    experts += t.experts[size_t(b)] / l.ep;  // the table holds this TP rank's share of each expert already
  }
  const int64_t layer_units = int64_t(in.blocks.size());
  const int64_t root_units = int64_t(units.size()) - layer_units;
  double elems = 0;
  for (int64_t u : units) elems += double(u);
  if (dp > 1 && !units.empty()) {
    const int64_t hops = dp - 1;
    // Gradients: ZeRO-1 reduces in the step's last backward, ZeRO-2 / 3 in every backward (fp32).
    const int64_t reductions = l.zero >= 2 ? M : 1;
    CommKind rs{"ZeRO gradient reduce-scatter (DP buckets, fp32)", "reduce_scatter", "dp", dp};
    rs.calls = reductions * int64_t(units.size());
    rs.bytes = double(reductions) * elems * 4.0;
    rs.moved = rs.bytes / double(dp), rs.copies = rs.calls;  // only this rank's slice is copied
    rs.wire = rs.bytes * double(dp - 1) / double(dp);
    add(rs, dp * l.tp * l.pp, hops);
    // Weights: ZeRO-1 / 2 gather the updated bf16 slices once per step; ZeRO-3 gathers a layer's bucket for its
    // forward and its backward (a full recomputation's replay reuses the backward's gather: the buffer is live),
    // the embedding's and the head's (with the MTP module's) once per micro-batch.
    CommKind ag{l.zero == 3 ? "ZeRO-3 weight all-gather (per bucket use, bf16)"
                            : "ZeRO weight all-gather after the step (bf16)",
                "all_gather", "dp", dp};
    double chunk_elems = 0;
    if (l.zero == 3) {
      for (size_t i = 0; i < units.size(); ++i)
        chunk_elems += double(units[i]) / double(dp) * double(i < size_t(root_units) ? M : 2 * M);
      ag.calls = M * (root_units + 2 * layer_units);
    } else {
      chunk_elems = elems / double(dp);
      ag.calls = int64_t(units.size());
    }
    ag.bytes = chunk_elems * 2.0;
    ag.moved = ag.bytes, ag.copies = ag.calls;
    ag.wire = ag.bytes * double(dp - 1);
    add(ag, dp * l.tp * l.pp, hops);
    // Region R (fp32-read tensors, replicated): all-reduced in the step's last backward; nothing moves emulated.
    CommKind ar{"DP all-reduce of the fp32-read tensors (region R)", "all_reduce", "dp", dp};
    ar.calls = fp32 > 0 ? 1 : 0;
    ar.bytes = double(fp32) * 4.0;
    ar.wire = 2.0 * ar.bytes * double(dp - 1) / double(dp);
    add(ar, dp * l.tp * l.pp, 2 * hops);
  }
  // ---- Region X: this rank's routed experts over their expert-data-parallel replicas, once per step.
  if (l.ep > 1 && edp > 1 && experts > 0) {
    const double x = double(padded_bucket(experts, dp));
    CommKind rs{"expert gradient reduce-scatter over the replicas (fp32)", "reduce_scatter", "edp", edp};
    rs.calls = 1, rs.bytes = x * 4.0, rs.moved = rs.bytes / double(edp), rs.copies = 1;
    rs.wire = rs.bytes * double(edp - 1) / double(edp);
    add(rs, dp * l.tp * l.pp, edp - 1);
    CommKind ag{"expert weight all-gather over the replicas (bf16)", "all_gather", "edp", edp};
    ag.calls = 1, ag.bytes = x / double(edp) * 2.0, ag.moved = ag.bytes, ag.copies = 1;
    ag.wire = ag.bytes * double(edp - 1);
    add(ag, dp * l.tp * l.pp, edp - 1);
  }
  // Forward passes over the rank's blocks in one micro-batch: one each, two for a block replayed in full.
  int64_t fwd_block_passes = 0;
  for (int64_t b : in.blocks) fwd_block_passes += 1 + (l.recompute_at(b) == Recompute::Full ? 1 : 0);
  // ---- The expert exchange, per MoE block and micro-batch.
  if (l.ep > 1 && !in.blocks.empty()) {
    const double rows = in.tokens * double(in.topk) * double(in.hidden) * 2.0;  // bf16, every routed copy
    const double frac = double(l.ep - 1) / double(l.ep);
    const int64_t per = int64_t(in.blocks.size()) * M;
    CommKind a{"EP dispatch + combine, fwd + bwd + recompute replay (bf16)", "all_to_all_v", "ep", l.ep};
    a.calls = M * 2 * fwd_block_passes + per * 2;
    a.bytes = double(a.calls) * rows * frac;
    // The emulation copies every peer's block (its own included): ep copies per call.
    a.moved = double(a.calls) * rows, a.copies = a.calls * l.ep;
    a.wire = a.bytes;
    CommKind c{"EP expert-count exchange (int32, per forward pass)", "all_to_all_v", "ep", l.ep};
    c.calls = M * fwd_block_passes;
    const double counts = double(in.experts) * 4.0;
    c.bytes = double(c.calls) * counts * frac;
    c.moved = double(c.calls) * counts, c.copies = c.calls * l.ep;
    c.wire = c.bytes;
    if (counts < kCountOnlyBelow) c.moved_none = c.moved, c.copies_none = c.copies;
    if (rows < kCountOnlyBelow) a.moved_none = a.moved, a.copies_none = a.copies;
    // The exchange's bytes to peers inside the scale-up domain go over NVLink, the rest over the scale-out fabric;
    // the slower share bounds the call.
    const int64_t span = l.ep * l.tp;
    const int64_t peers_in = std::min<int64_t>(l.ep - 1, std::max<int64_t>(hw.scaleup_domain / l.tp, 1) - 1);
    const double f_in = single_domain ? 1.0 : double(peers_in) / double(l.ep - 1);
    const double per_byte = std::max(f_in / (hw.scaleup_bw * comm_eff),
                                     f_in < 1.0 ? (1.0 - f_in) / (hw.scaleout_bw * comm_eff) : 0.0);
    add_at(std::move(a), per_byte, span, l.ep - 1);
    add_at(std::move(c), per_byte, span, l.ep - 1);
  }
  // ---- The pipeline boundary: per micro-batch and virtual chunk, activations in bf16 forward, gradients in fp32
  // backward. EmulatedGroup copies every send into its sink and every recv out of its source.
  if (in.n_virtual > 1) {
    const double elems_b = in.tokens * double(in.hc) * double(in.hidden);
    CommKind s{"PP send (activations bf16 fwd, gradients fp32 bwd)", "send", "pp", 2};
    CommKind r{"PP recv (activations bf16 fwd, gradients fp32 bwd)", "recv", "pp", 2};
    for (int64_t v : in.chunks) {
      if (v > 0) r.calls += M, r.bytes += double(M) * elems_b * 2.0, s.calls += M, s.bytes += double(M) * elems_b * 4.0;
      if (v < in.n_virtual - 1)
        s.calls += M, s.bytes += double(M) * elems_b * 2.0, r.calls += M, r.bytes += double(M) * elems_b * 4.0;
    }
    for (CommKind* k : {&s, &r}) {
      k->moved = k->moved_none = k->bytes, k->copies = k->copies_none = k->calls;
      k->wire = k->op == "send" ? k->bytes : 0.0;  // a receive's bytes are its peer's send
    }
    const int64_t span = l.tp * l.cp * l.dp * 2;  // neighbouring stages: a DP x TP block apart
    add(s, span, 1);
    add(r, span, 0);
  }
  // ---- TP all-reduces (fp32): forward (again in a full recomputation's replay) the attention's and the shared
  // expert's outputs, [tokens, d] each; backward the compressed query's, K=V's and the shared expert's input
  // gradients. EmulatedGroup moves nothing for an all-reduce.
  if (l.tp > 1 && !in.blocks.empty()) {
    const double d = double(in.hidden);
    const int64_t per = int64_t(in.blocks.size()) * M;
    CommKind k{"TP all-reduce (fp32: attention / shared expert out fwd, q / kv / shared in bwd)", "all_reduce", "tp", l.tp};
    k.calls = M * 2 * fwd_block_passes + per * 3;
    k.bytes = in.tokens * 4.0 * (double(M * fwd_block_passes) * 2 * d +
                                 double(per) * (d + double(in.q_lora_rank) + double(in.head_dim)));
    k.wire = 2.0 * k.bytes * double(l.tp - 1) / double(l.tp);
    add(k, l.tp, 2 * (l.tp - 1));
    // Expert tensor parallel: the routed experts' partial outputs and input gradients join the all-reduces above;
    // the gate weights' gradients (dout . the partial expert outputs) are one more per block's backward.
    if (l.etp > 1) {
      CommKind g{"ETP all-reduce of the gate weights' gradients (fp32, bwd)", "all_reduce", "tp", l.tp};
      g.calls = per;
      g.bytes = in.tokens * 4.0 * double(per) * double(in.topk);
      g.wire = 2.0 * g.bytes * double(l.tp - 1) / double(l.tp);
      add(g, l.tp, 2 * (l.tp - 1));
    }
  }
  return out;
}

std::string comm_table(const RankComm& c) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string t = fmt::format("    {:<84} {:>5} {:>9} {:>7} {:>8} {:>8} {:>8}\n", "kind", "group", "GiB/step",
                              "calls", "emu s", "none s", "links s");
  for (const CommKind& k : c.kinds)
    t += fmt::format("    {:<84} {:>5} {:>9.2f} {:>7} {:>8.3f} {:>8.3f} {:>8.3f}\n", k.kind,
                     fmt::format("{}{}", k.dim, k.group), k.bytes / kGiB, k.calls, k.emulated_s, k.emulated_none_s,
                     k.cluster_s);
  t += fmt::format("    {:<84} {:>5} {:>9} {:>7} {:>8.3f} {:>8.3f} {:>8.3f}\n", "total", "", "", "", c.emulated_s(),
                   c.emulated_none_s(), c.cluster_s());
  return t;
}

nlohmann::json comm_to_json(const RankComm& c) {
  nlohmann::json j = nlohmann::json::array();
  for (const CommKind& k : c.kinds)
    j.push_back({{"kind", k.kind},        {"op", k.op},          {"group", k.dim},     {"size", k.group},
                 {"bytes", k.bytes},      {"calls", k.calls},    {"moved", k.moved},   {"copies", k.copies},
                 {"wire", k.wire},        {"emulated_s", k.emulated_s}, {"emulated_none_s", k.emulated_none_s},
                 {"cluster_s", k.cluster_s}});
  return j;
}

}  // namespace trex::plan
