// The GPU model's arena: the parameter table's trained tensors (dsv4::param_table: official names and shapes),
// laid out so that each expert's w1 and w3 are adjacent ([2f, d], one GEMM gives gate|up) and the shared expert's
// w1|w3 likewise; random init on the device or a copy of the CPU table. The arena is two regions (bf16-read
// parameters in per-layer buckets, then the fp32-read ones) so that data parallelism can shard the optimiser by
// bucket slices (ZeRO-1, see gpu_impl.h); under expert parallelism a third region, this rank's routed experts
// only, comes first (region X: the other ranks' experts are not allocated here at all). The data-parallel plumbing
// lives here too (the optimiser step itself is train/cuda/gpu_optimizer_cuda.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "comm/nccl_communicator.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/dsv4/param_table.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/grad_buckets.h"
#include "model/cuda/weight_gather.h"

namespace trex::dsv4gpu {

void GpuModel::Impl::declare(const std::string& name, const Shape& shape, int64_t ordinal) {
  if (!declaring) return;  // another pipeline stage's parameter
  TREX_CHECK(!index.count(name), "GPU model: parameter '{}' declared twice", name);
  GpuParam p;
  p.name = name;
  p.ordinal = ordinal;
  p.full = shape;
  p.tp_axis = tp_size > 1 ? dsv4::tp_split_axis(name, tp_experts) : -1;
  p.shape = dsv4::tp_local_shape(shape, p.tp_axis, tp_size);  // this TP rank's slice
  p.numel = numel(p.shape);
  p.offset = total;
  total += p.numel;  // no padding: fused expert / shared weights must be adjacent (8-element alignment checked)
  TREX_CHECK(p.offset % 8 == 0, "GPU model: parameter '{}' starts at element {} (not 16-byte aligned for bf16)",
             name, p.offset);
  index[name] = params.size();
  params.push_back(p);
}

const GpuParam& GpuModel::Impl::info(const std::string& name) const {
  auto it = index.find(name);
  if (it == index.end()) {
    const size_t pos = name.find(".ffn.experts.");
    if (ep_size > 1 && pos != std::string::npos) {
      const int64_t e = std::atoll(name.c_str() + pos + 13);
      const int64_t per = e_end - e_begin;
      if (!local_expert(e) && e >= 0 && e < cfg.n_routed_experts)
        fail("GPU model (expert-parallel rank {} of {}): '{}' belongs to routed expert {}, held by expert-parallel "
             "rank {}; this rank holds experts [{}, {})", ep_rank, ep_size, name, e, e / per, e_begin, e_end);
    }
    fail("GPU model: no parameter '{}'", name);
  }
  return params[it->second];
}

namespace {
// p's official tensor as rows: outer x (extent x inner) elements, this TP rank's block of extent / T x inner
// elements in each row.
struct TpRows {
  int64_t rows = 1, width = 0, pitch = 0, first = 0;  // elements
};
TpRows tp_rows(const GpuParam& p, int tp_size, int tp_rank) {
  TREX_CHECK(p.tp_axis >= 0, "GPU model: '{}' is not split over the tensor-parallel ranks", p.name);
  TpRows r;
  int64_t inner = 1;
  for (size_t i = 0; i < p.full.size(); ++i) {
    if (int(i) < p.tp_axis) r.rows *= p.full[i];
    if (int(i) > p.tp_axis) inner *= p.full[i];
  }
  r.pitch = p.full[size_t(p.tp_axis)] * inner;
  r.width = r.pitch / tp_size;
  r.first = int64_t(tp_rank) * r.width;
  return r;
}
}  // namespace

void GpuModel::Impl::tp_slice(const GpuParam& p, const float* full, float* local, cudaMemcpyKind kind) const {
  const TpRows r = tp_rows(p, tp_size, tp_rank);
  TREX_CUDA(cudaMemcpy2D(local, size_t(r.width) * 4, full + r.first, size_t(r.pitch) * 4, size_t(r.width) * 4,
                         size_t(r.rows), kind));
}

void GpuModel::Impl::tp_place(const GpuParam& p, const float* local, float* full, cudaMemcpyKind kind) const {
  const TpRows r = tp_rows(p, tp_size, tp_rank);
  TREX_CUDA(cudaMemcpy2D(full + r.first, size_t(r.pitch) * 4, local, size_t(r.width) * 4, size_t(r.width) * 4,
                         size_t(r.rows), kind));
}

int GpuModel::tp_size() const { return impl_->tp_size; }
int GpuModel::tp_axis(const std::string& name) const { return impl_->info(name).tp_axis; }
Shape GpuModel::full_shape(const std::string& name) const { return impl_->info(name).full; }

void GpuModel::Impl::pad_to(int64_t multiple) { total = (total + multiple - 1) / multiple * multiple; }

namespace {
// Bucket boundaries (and region X's end) are multiples of lcm(this, 8 x DP size) elements, so the DP ranks' slices
// (and the expert-data-parallel replicas' slices of region X, EDP dividing DP) are equal and 16-byte aligned for
// any DP size: 512 for every DP size up to 64.
constexpr int64_t kBucketAlign = 512;

// Where a tensor sits inside its layer's part of the arena. Region A (bf16-read): the table's order, except that
// each routed expert's w1 and w3 are adjacent ([2f, d]: one GEMM gives gate|up) and all w2 follow. Region R
// (fp32-read): the mHC fn of both sites, then the attention's fp32 tensors (sink, ape), then the mHC base and
// scale of both sites. (Region R's order fixes the random init stream of the benchmark models; it is kept.)
int64_t arena_rank(const dsv4::ParamSpec& s) {
  if (s.dtype == DType::BF16) {
    if (s.expert < 0) return 0;
    const bool w2 = s.name.ends_with(".w2.weight");
    return w2 ? 2 * (int64_t(1) << 40) + s.expert : (int64_t(1) << 40) + 2 * s.expert + (s.name.ends_with(".w3.weight") ? 1 : 0);
  }
  const bool attn_site = s.name.find("hc_attn_") != std::string::npos;
  if (s.name.ends_with("_fn")) return attn_site ? 0 : 1;
  if (s.name.find("hc_") == std::string::npos) return 2;  // attention sink / compressor ape
  return 3 + (attn_site ? 0 : 2) + (s.name.ends_with("_scale") ? 1 : 0);
}

// The table's trained tensors of one part (or one layer) of one region, in arena order.
std::vector<dsv4::ParamSpec> arena_order(const std::vector<dsv4::ParamSpec>& table, dsv4::ParamPart part,
                                         int64_t layer, DType region) {
  std::vector<dsv4::ParamSpec> out;
  for (const dsv4::ParamSpec& s : table)
    if (s.trained() && s.part == part && s.layer == layer && s.dtype == region) out.push_back(s);
  std::stable_sort(out.begin(), out.end(),
                   [](const dsv4::ParamSpec& a, const dsv4::ParamSpec& b) { return arena_rank(a) < arena_rank(b); });
  return out;
}
}  // namespace

void GpuModel::Impl::declare_all() {
  const std::vector<dsv4::ParamSpec> table = dsv4::param_table(cfg);
  // Ordinals (each tensor's random init stream) follow the full model's declaration order whatever this rank
  // holds, so a pipeline stage or an expert-parallel rank draws the same values as the whole model.
  std::map<std::string, int64_t> ordinal;
  {
    auto count = [&](dsv4::ParamPart part, int64_t layer, DType region) {
      for (const dsv4::ParamSpec& s : arena_order(table, part, layer, region)) ordinal.emplace(s.name, int64_t(ordinal.size()));
    };
    count(dsv4::ParamPart::Embed, -1, DType::BF16);
    count(dsv4::ParamPart::Head, -1, DType::BF16);
    for (int64_t l = 0; l < cfg.n_layers; ++l) count(dsv4::ParamPart::Layer, l, DType::BF16);
    count(dsv4::ParamPart::Head, -1, DType::F32);
    for (int64_t l = 0; l < cfg.n_layers; ++l) count(dsv4::ParamPart::Layer, l, DType::F32);
    // The MTP module last: a model without it keeps every other tensor's ordinal.
    count(dsv4::ParamPart::Mtp, 0, DType::BF16);
    count(dsv4::ParamPart::Mtp, 0, DType::F32);
  }
  const int64_t bucket_align = std::lcm(kBucketAlign, 8 * int64_t(std::max(dp_size, 1)));
  auto close_bucket = [&](int64_t begin) {
    pad_to(bucket_align);
    buckets.push_back(Bucket{begin, total, 0});
    return int(buckets.size()) - 1;
  };
  // Under expert parallelism the routed experts leave the layer buckets for region X; the non-local ones are
  // not declared at all.
  const bool sharded = ep_size > 1;
  auto declare_part = [&](dsv4::ParamPart part, int64_t layer, DType region) {
    for (const dsv4::ParamSpec& s : arena_order(table, part, layer, region)) {
      if (sharded && s.expert >= 0) continue;
      if (region == DType::BF16)
        declare(s.name, s.shape, ordinal.at(s.name));
      else
        declare_fp32(s.name, s.shape, ordinal.at(s.name));
    }
  };
  auto in_stage = [&](int64_t l) { return l >= l0 && l < l1; };
  // Region X: this rank's routed experts, layer by layer (each expert's w1 | w3 adjacent, then the w2s).
  if (sharded) {
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      declaring = in_stage(l);
      for (const dsv4::ParamSpec& s : arena_order(table, dsv4::ParamPart::Layer, l, DType::BF16))
        if (s.expert >= 0 && local_expert(s.expert)) declare(s.name, s.shape, ordinal.at(s.name));
    }
    // The MTP block's routed experts are placed like a main layer's (each rank its E / ep, on the last stage).
    declaring = cfg.n_mtp > 0 && last_stage();
    for (const dsv4::ParamSpec& s : arena_order(table, dsv4::ParamPart::Mtp, 0, DType::BF16))
      if (s.expert >= 0 && local_expert(s.expert)) declare(s.name, s.shape, ordinal.at(s.name));
    declaring = true;
    pad_to(bucket_align);
  }
  region_x = total;
  // Region A, bucketed in the order backward finishes them (reverse): embed, head + final norm, layers.
  // A pipeline stage declares only its own parameters (the skipped ones leave empty buckets).
  int64_t begin = total;
  declaring = first_stage() || embed_copy();
  declare_part(dsv4::ParamPart::Embed, -1, DType::BF16);
  embed_bucket = close_bucket(begin);
  begin = total;
  declaring = last_stage();
  declare_part(dsv4::ParamPart::Head, -1, DType::BF16);
  head_bucket = close_bucket(begin);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    declaring = in_stage(l);
    begin = total;
    declare_part(dsv4::ParamPart::Layer, l, DType::BF16);
    layer_bucket.push_back(close_bucket(begin));
  }
  // The MTP module (held with the head; its bucket completes first in the backward), after everything else so
  // that a model without it keeps its layout and init stream.
  const bool with_mtp = cfg.n_mtp > 0;
  if (with_mtp) {
    declaring = last_stage();
    begin = total;
    declare_part(dsv4::ParamPart::Mtp, 0, DType::BF16);
    mtp_bucket = close_bucket(begin);
  }
  region_a = total;
  // Region R: read in fp32 by the kernels, replicated on every DP rank.
  declaring = last_stage();
  declare_part(dsv4::ParamPart::Head, -1, DType::F32);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    declaring = in_stage(l);
    declare_part(dsv4::ParamPart::Layer, l, DType::F32);
  }
  if (with_mtp) {
    declaring = last_stage();
    declare_part(dsv4::ParamPart::Mtp, 0, DType::F32);
  }
  declaring = true;
  pad_to(8);
}

// Small tensors (4, 1, 3 elements) are padded to 8 so every tensor stays 16-byte aligned.
void GpuModel::Impl::declare_fp32(const std::string& name, const Shape& shape, int64_t ordinal) {
  if (!declaring) return;
  GpuParam p;
  p.name = name, p.full = shape, p.offset = total, p.ordinal = ordinal;
  p.tp_axis = tp_size > 1 ? dsv4::tp_split_axis(name, tp_experts) : -1;
  p.shape = dsv4::tp_local_shape(shape, p.tp_axis, tp_size);  // the attention sinks: this TP rank's heads
  p.numel = numel(p.shape);
  total += (p.numel + 7) / 8 * 8;
  TREX_CHECK(!index.count(name), "GPU model: parameter '{}' declared twice", name);
  index[name] = params.size();
  params.push_back(p);
}

float* GpuModel::Impl::master_at(const GpuParam& p) const {
  if (dp_size == 1) return master.as<float>() + p.offset;
  if (p.offset < region_x) {  // a local expert: whole unless sharded over its replicas
    TREX_CHECK(!experts_sharded(), "GPU model: the fp32 master of '{}' is sharded over the expert-data-parallel "
               "replicas (read its bf16 copy)", p.name);
    return master.as<float>() + p.offset;
  }
  TREX_CHECK(p.offset >= region_a,
             "GPU model: the fp32 master of '{}' is sharded over the data-parallel ranks (read its bf16 copy)", p.name);
  return master.as<float>() + shard_a + (p.offset - region_a);
}

void GpuModel::Impl::scatter_master(const float* full) {
  if (zero3()) {  // the bf16 of this rank's pieces only (grad_index's layout)
    weights_changed();
    if (region_x > 0) cuda::cast_f32_to_bf16(compute.as<bf16>(), full, region_x);
    for (const Bucket& b : buckets) {
      const int64_t n = b.slice(dp_size), own = b.begin + dp_rank * n;
      if (n > 0) cuda::cast_f32_to_bf16(weight_at(own), full + own, n);
    }
    cuda::cast_f32_to_bf16(weight_at(region_a), full + region_a, total - region_a);
  } else {
    cuda::cast_f32_to_bf16(compute.as<bf16>(), full, total);
  }
  if (dp_size == 1) {
    if (full != master.as<float>())
      TREX_CUDA(cudaMemcpyAsync(master.as<float>(), full, size_t(total) * 4, cudaMemcpyDeviceToDevice, nullptr));
    return;
  }
  if (region_x > 0)  // this rank's slice of the local experts (all of them without replicas)
    TREX_CUDA(cudaMemcpyAsync(master.as<float>(), full + x_own, size_t(x_shard) * 4, cudaMemcpyDeviceToDevice, nullptr));
  for (const Bucket& b : buckets) {
    const int64_t n = b.slice(dp_size);
    TREX_CUDA(cudaMemcpyAsync(master.as<float>() + b.shard_off, full + b.begin + dp_rank * n, size_t(n) * 4,
                              cudaMemcpyDeviceToDevice, nullptr));
  }
  TREX_CUDA(cudaMemcpyAsync(master.as<float>() + shard_a, full + region_a, size_t(total - region_a) * 4,
                            cudaMemcpyDeviceToDevice, nullptr));
}

void GpuModel::Impl::stream_wait(comm::Work& w) {
  cudaEvent_t a, b;
  TREX_CUDA(cudaEventCreate(&a));
  TREX_CUDA(cudaEventCreate(&b));
  TREX_CUDA(cudaEventRecord(a, nullptr));
  comm::stream_wait(w, nullptr);
  TREX_CUDA(cudaEventRecord(b, nullptr));
  stalls.emplace_back(a, b);
}

void GpuModel::Impl::reduce_bucket(int bi) {
  if (!gbuckets || buckets[size_t(bi)].slice(dp_size) == 0) return;  // one GPU, or another pipeline stage's bucket
  gbuckets->ready(bi);
}

void GpuModel::Impl::reduce_expert_grads() {
  if (!edp || edp->size() == 1 || region_x == 0 || experts_reduced) return;
  experts_reduced = true;
  float* g = grads.as<float>();
  // In place, as the buckets: this replica's slice of the sum lands where its own slice is.
  grad_work.push_back(edp->reduce_scatter(g, g + x_own, size_t(x_shard), comm::ElemType::F32, comm::ReduceOp::Sum));
}

void GpuModel::Impl::wait_gather(int bi) {
  if (wgather) {  // ZeRO-3: the bucket's whole weights gathered (prefetched, or now) and waited for
    wgather->need(bi);
    return;
  }
  if (gbuckets) gbuckets->wait_gather(bi);
}

// One block's parameter and gradient pointers: main layer l ("layers.l.") or, l == cfg.n_layers, the MTP block
// ("mtp.0.": sliding attention, score routing, as dsv4::with_mtp_block makes it).
std::unique_ptr<GpuBlock> GpuModel::Impl::bind_block(int64_t l) {
  const int64_t d = cfg.hidden, E = cfg.n_routed_experts, f = expert_width(), K = cfg.topk;
  const dsv4::ModelConfig ext = dsv4::with_mtp_block(cfg);
  auto b = std::make_unique<GpuBlock>();
  b->layer = l;
  b->recompute = dsv4::recompute_of_layer(opts.recompute, opts.recompute_full_layers, l);
  b->prefix = l < cfg.n_layers ? fmt::format("layers.{}.", l) : std::string("mtp.0.");
  b->dims = dsv4::AttentionDims::from_config(ext, l);
  // Tensor parallel: this rank's heads and output groups (consecutive groups of consecutive heads: rank t holds
  // heads [t H/T, (t+1) H/T), the groups [t G/T, (t+1) G/T) they form), as its wq_b / wo_a / wo_b / sink slices.
  b->dims.n_heads /= tp_size, b->dims.o_groups /= tp_size;
  b->hash = ext.mlp_types[size_t(l)] == dsv4::MlpType::HashMoE;
  const std::string& p = b->prefix;
  auto F = [&](const std::string& n) { return f32(p + n); };
  AttnW& a = b->aw;
  a.sink = F("attn.attn_sink");
  if (b->dims.type != dsv4::AttnType::Sliding) a.cmp_ape = F("attn.compressor.ape");
  if (b->dims.type == dsv4::AttnType::CSA) a.idx_ape = F("attn.indexer.compressor.ape");
  MoeW& m = b->mw;
  const std::string e0 = fmt::format("ffn.experts.{}.", e_begin);
  for (int64_t e = e_begin; e < e_end; ++e) {
    const int64_t j = e - e_begin;
    TREX_CHECK(info(p + fmt::format("ffn.experts.{}.w1.weight", e)).offset == info(p + e0 + "w1.weight").offset + j * 2 * f * d &&
                   info(p + fmt::format("ffn.experts.{}.w2.weight", e)).offset == info(p + e0 + "w2.weight").offset + j * d * f,
               "GPU model: expert weights of {} are not laid out contiguously", p);
  }
  if (b->hash) {
    DevMem& t = tid2eid[p + "ffn.gate.tid2eid"];
    t = DevMem(size_t(cfg.vocab_size * K) * sizeof(int32_t));
    TREX_CUDA(cudaMemsetAsync(t.as<int32_t>(), 0, size_t(cfg.vocab_size * K) * sizeof(int32_t), nullptr));
    m.tid2eid = t.as<int32_t>();
  } else {
    DevMem& t = bias[p + "ffn.gate.bias"];
    t = DevMem(size_t(E) * sizeof(float));
    TREX_CUDA(cudaMemsetAsync(t.as<float>(), 0, size_t(E) * sizeof(float), nullptr));
    m.bias = t.as<float>();
  }
  b->hc_attn_fn = F("hc_attn_fn"), b->hc_attn_base = F("hc_attn_base"), b->hc_attn_scale = F("hc_attn_scale");
  b->hc_ffn_fn = F("hc_ffn_fn"), b->hc_ffn_base = F("hc_ffn_base"), b->hc_ffn_scale = F("hc_ffn_scale");
  bind_block_weights(*b);
  bind_block_grads(*b);
  return b;
}

// The bf16 weight pointers of a block (under ZeRO-3 a bucket tensor's are null while its bucket is not gathered:
// WeightGather binds them again when it places or drops the buffer).
void GpuModel::Impl::bind_block_weights(GpuBlock& blk) {
  const std::string& p = blk.prefix;
  auto B = [&](const std::string& n) { return b16(p + n); };
  AttnW& a = blk.aw;
  a.wq_a = B("attn.wq_a.weight"), a.q_norm = B("attn.q_norm.weight"), a.wq_b = B("attn.wq_b.weight");
  a.wkv = B("attn.wkv.weight"), a.kv_norm = B("attn.kv_norm.weight"), a.wo_a = B("attn.wo_a.weight");
  a.wo_b = B("attn.wo_b.weight");
  if (blk.dims.type != dsv4::AttnType::Sliding)
    a.cmp_wkv = B("attn.compressor.wkv.weight"), a.cmp_wgate = B("attn.compressor.wgate.weight"),
    a.cmp_norm = B("attn.compressor.norm.weight");
  if (blk.dims.type == dsv4::AttnType::CSA) {
    a.idx_wq_b = B("attn.indexer.wq_b.weight"), a.idx_wp = B("attn.indexer.weights_proj.weight");
    a.idx_wkv = B("attn.indexer.compressor.wkv.weight"), a.idx_wgate = B("attn.indexer.compressor.wgate.weight");
    a.idx_norm = B("attn.indexer.compressor.norm.weight");
  }
  MoeW& m = blk.mw;
  m.gate = B("ffn.gate.weight");
  // The first local expert's weights (expert 0 unless expert-parallel); the kernels index local experts.
  const std::string e0 = fmt::format("ffn.experts.{}.", e_begin);
  m.w13 = B(e0 + "w1.weight");
  m.w2 = B(e0 + "w2.weight");
  if (cfg.n_shared_experts > 0) {
    m.sw13 = B("ffn.shared_experts.w1.weight");
    m.sw2 = B("ffn.shared_experts.w2.weight");
  }
  blk.attn_norm = B("attn_norm.weight"), blk.ffn_norm = B("ffn_norm.weight");
}

void GpuModel::Impl::bind_bucket_weights(int bi) {
  for (int64_t l = l0; l < l1; ++l)
    if (layer_bucket[size_t(l)] == bi && blocks.size() > size_t(l) && blocks[size_t(l)])
      bind_block_weights(*blocks[size_t(l)]);
  if (mtp_block && bi == mtp_bucket) bind_block_weights(*mtp_block);
}

bf16* GpuModel::Impl::weight_at(int64_t off) const {
  return compute.as<bf16>() + (zero3() ? grad_index(off) : off);
}

bf16* GpuModel::Impl::b16(const std::string& n) const {
  const GpuParam& p = info(n);
  if (!zero3() || p.offset < region_x || p.offset >= region_a) return weight_at(p.offset);
  const int bi = bucket_of(p.offset);
  bf16* buf = wgather ? wgather->buffer(bi) : nullptr;
  return buf ? buf + (p.offset - buckets[size_t(bi)].begin) : nullptr;
}

void GpuModel::Impl::block_weights(int64_t blk, bool backward) {
  const int64_t n_main = l1 - l0;
  wait_gather(blk == n_main ? mtp_bucket : layer_bucket[size_t(l0 + blk)]);
  if (!wgather || blk == n_main) return;
  // The next block of the walk, gathered under this one's kernels (queued after this call).
  if (!backward && blk + 1 < n_main)
    wgather->prefetch(layer_bucket[size_t(l0 + blk + 1)]);
  else if (!backward && last_stage())
    wgather->prefetch(head_bucket);
  else if (backward && blk > 0)
    wgather->prefetch(layer_bucket[size_t(l0 + blk - 1)]);
}

void GpuModel::Impl::weights_changed() {
  if (wgather) wgather->release_all();
}

// The gradient pointers of a block (null without a gradient arena, and under ZeRO-2 for a bucket tensor whose
// bucket is closed: open_bucket binds them again once its buffer exists).
void GpuModel::Impl::bind_block_grads(GpuBlock& blk) {
  const std::string& p = blk.prefix;
  auto G = [&](const std::string& n) { return g32(p + n); };
  AttnW& a = blk.aw;
  a.g_wq_a = G("attn.wq_a.weight"), a.g_q_norm = G("attn.q_norm.weight"), a.g_wq_b = G("attn.wq_b.weight");
  a.g_wkv = G("attn.wkv.weight"), a.g_kv_norm = G("attn.kv_norm.weight"), a.g_wo_a = G("attn.wo_a.weight");
  a.g_wo_b = G("attn.wo_b.weight"), a.g_sink = G("attn.attn_sink");
  if (blk.dims.type != dsv4::AttnType::Sliding) {
    a.g_cmp_wkv = G("attn.compressor.wkv.weight"), a.g_cmp_wgate = G("attn.compressor.wgate.weight");
    a.g_cmp_norm = G("attn.compressor.norm.weight"), a.g_cmp_ape = G("attn.compressor.ape");
  }
  MoeW& m = blk.mw;
  m.g_gate = G("ffn.gate.weight");
  const std::string e0 = fmt::format("ffn.experts.{}.", e_begin);
  m.g_w13 = G(e0 + "w1.weight"), m.g_w2 = G(e0 + "w2.weight");
  if (cfg.n_shared_experts > 0) m.g_sw13 = G("ffn.shared_experts.w1.weight"), m.g_sw2 = G("ffn.shared_experts.w2.weight");
  blk.g_hc_attn_fn = G("hc_attn_fn"), blk.g_hc_attn_base = G("hc_attn_base"), blk.g_hc_attn_scale = G("hc_attn_scale");
  blk.g_hc_ffn_fn = G("hc_ffn_fn"), blk.g_hc_ffn_base = G("hc_ffn_base"), blk.g_hc_ffn_scale = G("hc_ffn_scale");
  blk.g_attn_norm = G("attn_norm.weight"), blk.g_ffn_norm = G("ffn_norm.weight");
}

int GpuModel::Impl::bucket_of(int64_t off) const {
  if (off < region_x || off >= region_a) return -1;
  // Buckets are in arena order: the last one starting at or before off.
  const auto it = std::upper_bound(buckets.begin(), buckets.end(), off,
                                   [](int64_t o, const Bucket& b) { return o < b.begin; });
  return int(it - buckets.begin()) - 1;
}

int64_t GpuModel::Impl::grad_index(int64_t off) const {
  if (!zero2() || off < region_x) return off;
  if (off >= region_a) return region_x + (region_a - region_x) / dp_size + (off - region_a);
  const int bi = bucket_of(off);
  const Bucket& b = buckets[size_t(bi)];
  const int64_t n = b.slice(dp_size), own0 = b.begin + dp_rank * n;
  TREX_CHECK(off >= own0 && off <= own0 + n, "GPU model (ZeRO-2, DP rank {}): arena element {} of bucket {} is "
             "outside this rank's gradient slice [{}, {})", dp_rank, off, bi, own0, own0 + n);
  return region_x + (b.shard_off - x_shard) + (off - own0);
}

float* GpuModel::Impl::grad_at(int64_t off) const {
  float* g = grads.as<float>();
  if (!g) return nullptr;
  if (!zero2() || off < region_x || off >= region_a) return g + grad_index(off);
  const int bi = bucket_of(off);
  float* buf = gbuckets ? gbuckets->buffer(bi) : nullptr;
  return buf ? buf + (off - buckets[size_t(bi)].begin) : nullptr;
}

float* GpuModel::Impl::g32(const std::string& n) const { return grad_at(info(n).offset); }

void GpuModel::Impl::open_bucket(int bi) {
  if (!zero2() || !gbuckets->open(bi)) return;
  // The blocks whose bound pointers lie in this bucket (head, embedding and MTP input tensors are looked up
  // by name when used).
  for (int64_t l = l0; l < l1; ++l)
    if (layer_bucket[size_t(l)] == bi) bind_block_grads(*blocks[size_t(l)]);
  if (mtp_block && bi == mtp_bucket) bind_block_grads(*mtp_block);
}

void GpuModel::Impl::bind_all() {
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    blocks.push_back(l < l0 || l >= l1 ? nullptr : bind_block(l));  // null: another pipeline stage's layer
  if (cfg.n_mtp > 0 && last_stage()) mtp_block = bind_block(cfg.n_layers);
}

void GpuModel::Impl::refresh_compute() {
  TREX_CHECK(dp_size == 1, "GPU model: refresh_compute needs the full master (one GPU)");
  scatter_master(master.as<float>());
}

// Weights: uniform with the std of N(0, 1/fan_in) (the last dim is the input width); RMSNorm weights 1; sinks 0;
// mHC / hc_head mixing weights small so the Sinkhorn inputs stay moderate; ape small.
void GpuModel::init_random(uint64_t seed) {
  Impl& m = *impl_;
  // Every rank draws the full model (same seed, same values), then keeps its shard. One GPU: straight into the
  // master. Under DP each tensor is drawn into a scratch of the largest tensor and its own pieces placed
  // (place_local: master shard and bf16 copy; the padding stays the constructor's zeros): never a fp32 copy of the
  // whole arena, which at V4-Pro's pp=2 stage (18e9 elements, 70 GiB) would not fit beside the model.
  const bool sharded = m.dp_size > 1;
  int64_t largest = 0;
  if (sharded)
    for (const GpuParam& p : m.params) largest = std::max(largest, p.numel);
  DevMem scratch(size_t(largest) * 4);
  for (const GpuParam& p : m.params) {
    float* w = sharded ? scratch.as<float>() : m.master.as<float>() + p.offset;
    const std::string& n = p.name;
    const bool is_norm = n.find("norm.weight") != std::string::npos;
    if (is_norm) {
      std::vector<float> ones(size_t(p.numel), 1.f);
      TREX_CUDA(cudaMemcpy(w, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
      if (sharded) m.place_local(p, w, m.master.as<float>(), true);
      continue;
    }
    const bool tiny = n.find("hc_") != std::string::npos || n.find("attn_sink") != std::string::npos ||
                      n.find(".ape") != std::string::npos;
    const double fan_in = double(p.full.back());  // the official tensor's (a TP slice of wo_b has fewer columns)
    const float scale = tiny ? 0.01f : float(std::sqrt(3.0 / fan_in));
    // The stream of the parameter's ordinal in the full model: a pipeline stage draws the same values, and a
    // tensor-parallel rank draws the whole tensor and keeps its slice.
    const uint64_t stream = seed * 1000003ull + uint64_t(p.ordinal + 1);
    if (p.tp_axis >= 0) {
      DevMem whole(size_t(numel(p.full)) * 4);
      cuda::fill_uniform_f32(whole.as<float>(), numel(p.full), stream, scale);
      m.tp_slice(p, whole.as<float>(), w, cudaMemcpyDeviceToDevice);
    } else {
      cuda::fill_uniform_f32(w, p.numel, stream, scale);
    }
    if (sharded) m.place_local(p, w, m.master.as<float>(), true);
  }
  std::mt19937_64 g(seed);
  const int64_t E = m.cfg.n_routed_experts, K = m.cfg.topk, V = m.cfg.vocab_size;
  // Every hash layer's table in name order (the map's), drawn also for another pipeline stage's layers so the
  // stream matches the full model.
  std::set<std::string> hash_tables;
  for (int64_t l = 0; l < m.cfg.n_layers; ++l)
    if (m.cfg.mlp_types[size_t(l)] == dsv4::MlpType::HashMoE)
      hash_tables.insert(fmt::format("layers.{}.ffn.gate.tid2eid", l));
  for (const std::string& name : hash_tables) {
    std::vector<int32_t> table(size_t(V * K));
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
      for (int64_t j = 0; j < K; ++j) {  // K distinct experts per token
        const int64_t r = j + int64_t(g() % uint64_t(E - j));
        std::swap(perm[size_t(j)], perm[size_t(r)]);
        table[size_t(v * K + j)] = perm[size_t(j)];
      }
    }
    auto it = m.tid2eid.find(name);
    if (it != m.tid2eid.end())
      TREX_CUDA(cudaMemcpy(it->second.as<int32_t>(), table.data(), table.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
  }
  if (!sharded) m.scatter_master(m.master.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
}

void GpuModel::load_from(const dsv4::ParamTable<float>& cpu) {
  Impl& m = *impl_;
  std::vector<float> host(size_t(m.total), 0.f);
  for (const GpuParam& p : m.params) {
    TREX_CHECK(cpu.has(p.name), "GPU model load: the CPU table has no '{}'", p.name);
    const dsv4::ParamInfo& ci = cpu.info(p.name);
    TREX_CHECK(ci.shape == p.full, "GPU model load: '{}' is {} on the CPU, {} here", p.name, shape_str(ci.shape),
               shape_str(p.full));
    const float* src = cpu.arena_value(ci);
    if (p.tp_axis >= 0)  // this tensor-parallel rank's slice
      m.tp_slice(p, src, host.data() + p.offset, cudaMemcpyHostToHost);
    else
      std::copy(src, src + p.numel, host.begin() + p.offset);
  }
  DevMem full(host.size() * sizeof(float));
  TREX_CUDA(cudaMemcpy(full.as<float>(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  m.scatter_master(full.as<float>());
  for (auto& [name, t] : m.bias) {
    auto it = cpu.bias.find(name);
    TREX_CHECK(it != cpu.bias.end(), "GPU model load: no router bias '{}'", name);
    TREX_CUDA(cudaMemcpy(t.as<float>(), it->second.data(), it->second.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  for (auto& [name, t] : m.tid2eid) {
    auto it = cpu.tid2eid.find(name);
    TREX_CHECK(it != cpu.tid2eid.end(), "GPU model load: no hash table '{}'", name);
    TREX_CUDA(cudaMemcpy(t.as<int32_t>(), it->second.data(), it->second.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice));
  }
  TREX_CUDA(cudaDeviceSynchronize());
}

std::vector<float> GpuModel::value(const std::string& name) const {
  const GpuParam& p = impl_->info(name);
  std::vector<float> v(size_t(p.numel));
  const bool sharded = impl_->dp_size > 1 && p.offset < impl_->region_a &&
                       (p.offset >= impl_->region_x || impl_->experts_sharded());
  if (sharded && impl_->zero3() && p.offset >= impl_->region_x) {
    // No rank holds the whole bf16 copy: the bf16 of the gathered master (what a gather of the slices gives).
    v = gather_shard(name);
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
    return v;
  }
  if (sharded) {  // the fp32 master is sharded: the bf16 copy
    std::vector<bf16> b(v.size());
    TREX_CUDA(cudaDeviceSynchronize());
    TREX_CUDA(cudaMemcpy(b.data(), impl_->b16(name), b.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < v.size(); ++i) v[i] = __bfloat162float(b[i]);
    return v;
  }
  TREX_CUDA(cudaMemcpy(v.data(), impl_->f32(name), v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<float> GpuModel::grad(const std::string& name) const {
  impl_->require_gradients("grad()");
  const GpuParam& p = impl_->info(name);
  std::vector<float> v(size_t(p.numel));
  const float* g = impl_->g32(name);
  TREX_CHECK(g, "GPU model grad('{}'): under ZeRO-2 a bucket tensor's gradient exists only as the ranks' reduced "
             "slices (GpuModel::dp_grad_norm, the optimiser)", name);
  TREX_CUDA(cudaMemcpy(v.data(), g, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<std::string> GpuModel::param_names() const {
  std::vector<std::string> n;
  for (const auto& p : impl_->params) n.push_back(p.name);
  return n;
}

int64_t GpuModel::n_params() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.numel;
  return n;
}

void GpuModel::set_grad(const std::string& name, const std::vector<float>& g) {
  impl_->require_gradients("set_grad()");
  const GpuParam& p = impl_->info(name);
  TREX_CHECK(int64_t(g.size()) == p.numel, "GPU model set_grad: '{}' has {} elements, got {}", name, p.numel,
             g.size());
  float* dst = impl_->g32(name);
  TREX_CHECK(dst, "GPU model set_grad('{}'): under ZeRO-2 a bucket tensor has no whole gradient to write", name);
  TREX_CUDA(cudaMemcpy(dst, g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice));
  impl_->grads_zero = false;
  impl_->experts_reduced = false;
}

// ---- gradients ----

void GpuModel::Impl::require_gradients(const char* what) const {
  TREX_CHECK(opts.gradients, "GPU model: {} needs gradients, but this model was built for inference only "
             "(GpuModelOptions::gradients false)", what);
}

void GpuModel::Impl::wait_grad_work() {
  for (auto& w : grad_work) stream_wait(*w);
  grad_work.clear();
  if (gbuckets) gbuckets->wait_all();
}

void GpuModel::zero_grads() {
  impl_->require_gradients("zero_grads()");
  // A HeadMode::LossAndGrad forward already accumulated head.weight's gradient: zeroing before its backward would
  // silently drop it.
  bool pending = impl_->head.dnormed || impl_->mtp_head.dnormed;
  for (const auto& z : impl_->slots) pending = pending || z.head.dnormed || z.mtp_head.dnormed;
  TREX_CHECK(!pending, "GPU model: zero_grads() between a training forward (HeadMode::LossAndGrad / forward_stage) "
             "and its backward would drop the LM head's gradient, which that forward computed; call zero_grads() "
             "before the forward");
  impl_->experts_reduced = false;
  if (impl_->grads_zero) return;  // nothing wrote them since the last memset
  TREX_CUDA(cudaMemsetAsync(impl_->grads.as<float>(), 0, impl_->grads.bytes(), nullptr));
  impl_->grads_zero = true;
}

double GpuModel::exposed_comm_ms() {
  Impl& m = *impl_;
  TREX_CUDA(cudaDeviceSynchronize());
  for (auto& [a, b] : m.stalls) {
    float ms = 0.f;
    TREX_CUDA(cudaEventElapsedTime(&ms, a, b));
    m.exposed_ms += ms;
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  m.stalls.clear();
  return m.exposed_ms;
}

}  // namespace trex::dsv4gpu
