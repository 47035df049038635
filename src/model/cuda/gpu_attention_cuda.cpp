// Attention sub-layer of the GPU model (design §2.4–§2.8), the same dataflow as trex::dsv4::AttentionLayerT:
// low-rank Q with q_norm and per-head RMS norm, shared K=V with kv_norm, partial RoPE, compressed entries (CSA:
// overlapped compressor + lightning-indexer top-k; HCA: all visible entries), sparse attention with sinks, inverse
// RoPE on the output, grouped low-rank output projection (one strided-batched GEMM over the groups).
#include <cmath>
#include <string>

#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/compressor.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/indexer.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/tensor_ops.h"
#include "comm/nccl_communicator.h"
#include "model/cuda/gpu_internal.h"

namespace trex::dsv4gpu {

namespace {

// Timing sub-sections of one attention sub-layer: "<dir>.attn.<kind>/<part>", nested inside the caller's
// "<dir>.attn.<kind>" section (SectionParts).
std::string parts_prefix(const char* dir, dsv4::AttnType type) {
  return std::string(dir) + (type == dsv4::AttnType::Sliding ? ".attn.sliding/"
                             : type == dsv4::AttnType::CSA   ? ".attn.csa/"
                                                             : ".attn.hca/");
}

cuda::RopeArgs rope_args(const RopeDev& r, int64_t rows, int64_t heads, int64_t c, int64_t rope_dim,
                         const int32_t* pos, int sign) {
  cuda::RopeArgs a;
  a.rows = rows, a.heads = heads, a.c = c, a.rope_dim = rope_dim, a.pos = pos;
  a.cos = r.cos.as<float>(), a.sin = r.sin.as<float>(), a.sign = sign;
  return a;
}

cuda::CompressArgs compress_args(const DevPlan& p, int64_t c, bool overlap) {
  cuda::CompressArgs a;
  a.n_entries = p.host.n_entries, a.ratio = p.host.ratio, a.c = c, a.overlap = overlap;
  a.entry_first = p.entry_first.as<int32_t>(), a.entry_doc_index = p.entry_doc.as<int32_t>();
  return a;
}

// Compressed entries [E, c]: projections, gated pooling, weighted RMSNorm, RoPE at the window's first position.
// indexer: the lightning indexer's compressor (names its timing parts idx.cmp.*).
void compress_fwd(const Ctx& c, SectionParts& parts, bool indexer, Pool& pool, const DevPlan& plan, const RopeDev& rope,
                  const bf16* a, const bf16* wkv, const bf16* wgate, const float* ape, const bf16* norm,
                  int64_t width_c, bool overlap, int64_t rope_dim, bf16** kv_out, bf16** gate_out, bf16** pooled_out, float** rstd_out, bf16* out) {
  const int64_t N = c.lay->N, d = c.cfg->hidden, E = plan.host.n_entries, w = overlap ? 2 : 1;
  bf16* kv = pool.take<bf16>(N * w * width_c);
  bf16* gate = pool.take<bf16>(N * w * width_c);
  parts.next(indexer ? "idx.cmp.gemm" : "cmp.gemm");
  c.lin.fwd(kv, a, wkv, N, d, w * width_c);
  c.lin.fwd(gate, a, wgate, N, d, w * width_c);
  bf16* pooled = pool.take<bf16>(E * width_c);
  float* rstd = pool.take<float>(E);
  parts.next(indexer ? "idx.cmp.pool" : "cmp.pool");
  cuda::compress_pool_fwd(pooled, kv, gate, ape, compress_args(plan, width_c, overlap));
  parts.next(indexer ? "idx.cmp.norm+rope" : "cmp.norm+rope");
  const cuda::RopeArgs ra = rope_args(rope, E, 1, width_c, rope_dim, plan.entry_pos.as<int32_t>(), +1);
  cuda::rmsnorm_rope_fwd(out, rstd, pooled, norm, float(c.cfg->rms_eps), ra);
  if (kv_out) *kv_out = kv, *gate_out = gate, *pooled_out = pooled, *rstd_out = rstd;
}

cuda::SparseKeySets key_sets(const Ctx& c, const GpuBlock& b) {
  cuda::SparseKeySets k;
  k.win_begin = c.lay->win_begin.as<int64_t>();
  k.max_win = c.cfg->window;  // win_begin = max(doc start, t - window + 1)
  if (b.dims.type == dsv4::AttnType::HCA) {
    const DevPlan& p = c.lay->plans.at(b.dims.ratio);
    k.cmp_begin = p.vis_begin.as<int64_t>();
    k.cmp_end = p.vis_end.as<int64_t>();
  } else if (b.dims.type == dsv4::AttnType::CSA) {
    k.cmp_sel = b.at.sel;
    k.k_sel = b.dims.index_topk;
  }
  return k;
}

// Tensor parallel: sums x (fp32, n) over the TP group in place (the compute stream waits for it). Every rank gets
// the same bits (one reduction, delivered to all), so what is computed from x downstream stays identical.
void tp_sum(const Ctx& c, float* x, int64_t n) {
  comm::WorkPtr w = c.tp->all_reduce(x, size_t(n), comm::ElemType::F32, comm::ReduceOp::Sum);
  comm::stream_wait(*w, nullptr);
}

}  // namespace

void attention_fwd(const Ctx& c, GpuBlock& b, const int64_t* injected_sel, bool replay) {
  const dsv4::AttentionDims& D = b.dims;
  const int64_t N = c.lay->N, d = D.d, H = D.n_heads, hd = D.head_dim, r = D.rope_dim, dc = D.d_c;
  const int64_t G = D.o_groups, hg = H / G, gd = G * D.o_rank;
  const float eps = float(D.eps);
  const RopeDev& rope = D.type == dsv4::AttnType::Sliding ? *c.rope_main : *c.rope_compress;
  const int32_t* pos = c.lay->pos.as<int32_t>();
  Pool& keep = b.keep;
  // What selective recomputation rebuilds before the backward (attention_redo) goes to redo.
  Pool& redo = b.recompute == dsv4::Recompute::Selective ? b.redo : b.keep;
  AttnActs& s = b.at;
  const AttnW& w = b.aw;
  const bf16* a = b.a;
  SectionParts parts(c, parts_prefix("fwd", D.type));

  s.qa = keep.take<bf16>(N * dc), s.qa_rstd = keep.take<float>(N), s.cq = redo.take<bf16>(N * dc);
  parts.next("q.gemm");
  c.lin.fwd(s.qa, a, w.wq_a, N, d, dc);
  parts.next("q.norm");
  cuda::rmsnorm_fwd(s.cq, s.qa_rstd, s.qa, w.q_norm, N, dc, eps);
  s.q_pre = keep.take<bf16>(N * H * hd), s.q = redo.take<bf16>(N * H * hd), s.q_rstd = keep.take<float>(N * H);
  parts.next("q.gemm");
  c.lin.fwd(s.q_pre, s.cq, w.wq_b, N, dc, H * hd);
  parts.next("q.headnorm+rope");
  cuda::rmsnorm_rope_fwd(s.q, s.q_rstd, s.q_pre, nullptr, eps, rope_args(rope, N, H, hd, r, pos, +1));
  s.kvp = keep.take<bf16>(N * hd), s.kv = redo.take<bf16>(N * hd), s.kv_rstd = keep.take<float>(N);
  parts.next("kv.gemm");
  c.lin.fwd(s.kvp, a, w.wkv, N, d, hd);
  parts.next("kv.norm+rope");
  cuda::rmsnorm_rope_fwd(s.kv, s.kv_rstd, s.kvp, w.kv_norm, eps, rope_args(rope, N, 1, hd, r, pos, +1));

  const int64_t E = D.type == dsv4::AttnType::Sliding ? 0 : c.lay->plans.at(D.ratio).host.n_entries;
  if (D.type != dsv4::AttnType::Sliding) {
    const DevPlan& plan = c.lay->plans.at(D.ratio);
    const bool csa = D.type == dsv4::AttnType::CSA;
    s.cmp = keep.take<bf16>(E * hd);
    compress_fwd(c, parts, false, keep, plan, rope, a, w.cmp_wkv, w.cmp_wgate, w.cmp_ape, w.cmp_norm, hd, csa, r,
                 &s.ckv, &s.cgate, &s.pooled, &s.c_rstd, s.cmp);
    if (csa && replay) {
      TREX_CHECK(s.sel, "GPU attention replay of layer {}: no saved CSA selection", b.layer);
    } else if (csa) {  // the selection lives in picks: a replay (full recomputation) reads it again
      const int64_t k = D.index_topk;
      s.sel = b.picks.take<int64_t>(N * k);
      if (injected_sel) {
        parts.next("idx.injected");
        TREX_CUDA(cudaMemcpyAsync(s.sel, injected_sel, size_t(N * k) * sizeof(int64_t), cudaMemcpyHostToDevice));
      } else {
        // Lightning indexer (no gradient: its inputs are detached and the KL signal is off).
        const int64_t nI = D.index_heads, cI = D.index_head_dim;
        Pool tmp(c.scratch);
        bf16* keys = tmp.take<bf16>(E * cI);
        compress_fwd(c, parts, true, tmp, plan, rope, a, w.idx_wkv, w.idx_wgate, w.idx_ape, w.idx_norm, cI, true,
                     r, nullptr, nullptr, nullptr, nullptr, keys);
        bf16* iq = tmp.take<bf16>(N * nI * cI);
        parts.next("idx.q.gemm");
        c.lin.fwd(iq, s.cq, w.idx_wq_b, N, dc, nI * cI);
        parts.next("idx.q.rope");
        cuda::rope_apply(iq, rope_args(rope, N, nI, cI, r, pos, +1));
        float* iw = tmp.take<float>(N * nI);
        parts.next("idx.q.gemm");
        c.lin.fwd(iw, a, w.idx_wp, N, d, nI, true);
        cuda::IndexerTopkArgs ia;
        ia.n_tok = N, ia.n_heads = nI, ia.head_dim = cI, ia.k_sel = k, ia.max_visible = plan.max_visible;
        ia.w_scale = float(1.0 / std::sqrt(double(nI)));
        ia.vis_begin = plan.vis_begin.as<int64_t>(), ia.vis_end = plan.vis_end.as<int64_t>();
        parts.next("idx.topk");
        cuda::indexer_topk(s.sel, iq, iw, keys, ia);
        parts.done();  // before tmp's buffers are freed (their frees are stream-ordered, not timed)
      }
    }
  }
  (void)E;
  s.o = keep.take<bf16>(N * H * hd), s.lse = keep.take<float>(N * H);
  parts.next("core");
  // Head dims the fast kernels do not serve (e.g. the parity fixtures' 16 / 32 / 48) take the generic fallback.
  if (cuda::sparse_attention_fast_head_dim(hd))
    cuda::sparse_attention_fwd(s.q, s.kv, s.cmp, w.sink, N, H, hd, key_sets(c, b), s.o, s.lse);
  else
    cuda::sparse_attention_generic_fwd(s.q, s.kv, s.cmp, w.sink, N, H, hd, key_sets(c, b), s.o, s.lse);

  // Inverse RoPE, grouped output projection: [N, G, hg*c] -> [G, N, hg*c] x wo_a[g]^T -> [G, N, d_g] -> [N, gd].
  // og is kept for the backward's wo_a weight gradient (one q-sized activation more per layer instead of
  // recomputing it there).
  Pool tmp(c.scratch);
  bf16* og = redo.take<bf16>(N * H * hd);
  s.og = og;
  parts.next("out.rope+permute");
  cuda::rope_permute_groups(og, s.o, G, rope_args(rope, N, H, hd, r, pos, -1), true);
  bf16* rg = tmp.take<bf16>(N * gd);
  cuda::GemmShape gs{N, D.o_rank, hg * hd, false, true, cuda::GemmType::BF16, cuda::GemmType::BF16, G};
  parts.next("out.gemm");
  c.gemm->run(gs, og, w.wo_a, rg);
  s.r = keep.take<bf16>(N * gd);
  parts.next("out.permute");
  cuda::permute_groups(s.r, rg, N, G, D.o_rank, false);
  parts.next("out.gemm");
  if (c.tp) {  // row-parallel wo_b: this rank's groups' partial output, summed over TP in fp32, rounded once
    float* y = tmp.take<float>(N * d);
    c.lin.fwd(y, s.r, w.wo_b, N, gd, d, true);
    parts.next("out.tp_all_reduce");
    tp_sum(c, y, N * d);
    cuda::cast_f32_to_bf16(b.y_a, y, N * d);
  } else {
    c.lin.fwd(b.y_a, s.r, w.wo_b, N, gd, d);
  }
  parts.done();
}

void attention_redo(const Ctx& c, GpuBlock& b) {
  const dsv4::AttentionDims& D = b.dims;
  const int64_t N = c.lay->N, H = D.n_heads, hd = D.head_dim, r = D.rope_dim, dc = D.d_c, G = D.o_groups;
  const float eps = float(D.eps);
  const RopeDev& rope = D.type == dsv4::AttnType::Sliding ? *c.rope_main : *c.rope_compress;
  const int32_t* pos = c.lay->pos.as<int32_t>();
  AttnActs& s = b.at;
  const AttnW& w = b.aw;
  SectionParts parts(c, parts_prefix("bwd", D.type));
  parts.next("redo");
  // The forward's kernels on the forward's inputs: the same values (the rstd rows are rewritten with themselves).
  s.cq = b.redo.take<bf16>(N * dc);
  cuda::rmsnorm_fwd(s.cq, s.qa_rstd, s.qa, w.q_norm, N, dc, eps);
  s.q = b.redo.take<bf16>(N * H * hd);
  cuda::rmsnorm_rope_fwd(s.q, s.q_rstd, s.q_pre, nullptr, eps, rope_args(rope, N, H, hd, r, pos, +1));
  s.kv = b.redo.take<bf16>(N * hd);
  cuda::rmsnorm_rope_fwd(s.kv, s.kv_rstd, s.kvp, w.kv_norm, eps, rope_args(rope, N, 1, hd, r, pos, +1));
  s.og = b.redo.take<bf16>(N * H * hd);
  cuda::rope_permute_groups(s.og, s.o, G, rope_args(rope, N, H, hd, r, pos, -1), true);
  parts.done();
}

void attention_bwd(const Ctx& c, GpuBlock& b, const bf16* dout, float* da) {
  const dsv4::AttentionDims& D = b.dims;
  const int64_t N = c.lay->N, d = D.d, H = D.n_heads, hd = D.head_dim, r = D.rope_dim, dc = D.d_c;
  const int64_t G = D.o_groups, hg = H / G, gd = G * D.o_rank;
  const RopeDev& rope = D.type == dsv4::AttnType::Sliding ? *c.rope_main : *c.rope_compress;
  const int32_t* pos = c.lay->pos.as<int32_t>();
  const AttnActs& s = b.at;
  const AttnW& w = b.aw;
  const bf16* a = b.a;
  Pool tmp(c.scratch);
  SectionParts parts(c, parts_prefix("bwd", D.type));

  // Output projections.
  parts.next("out.gemm");
  c.lin.dw(w.g_wo_b, dout, s.r, N, gd, d);
  bf16* dr = tmp.take<bf16>(N * gd);
  c.lin.dx(dr, dout, w.wo_b, N, gd, d);
  bf16* drg = tmp.take<bf16>(N * gd);
  parts.next("out.permute");
  cuda::permute_groups(drg, dr, N, G, D.o_rank, true);
  bf16* orot = tmp.take<bf16>(N * H * hd);
  // og: the forward's wo_a input (overwritten below by dO: the backward is its last use).
  bf16* og = s.og;
  TREX_CHECK(og, "GPU attention backward of layer {}: no saved forward (wo_a input)", b.layer);
  {
    parts.next("out.gemm");
    cuda::GemmShape s1{D.o_rank, hg * hd, N, true, false, cuda::GemmType::BF16, cuda::GemmType::F32, G};
    c.gemm->run(s1, drg, og, w.g_wo_a, 1.f, 1.f);
    cuda::GemmShape s2{N, hg * hd, D.o_rank, false, false, cuda::GemmType::BF16, cuda::GemmType::BF16, G};
    c.gemm->run(s2, drg, w.wo_a, og);  // og now holds dO in group-major order
  }
  bf16* dO = orot;
  parts.next("out.rope+permute");
  cuda::rope_permute_groups(dO, og, G, rope_args(rope, N, H, hd, r, pos, +1), false);

  // Core attention.
  const int64_t E = D.type == dsv4::AttnType::Sliding ? 0 : c.lay->plans.at(D.ratio).host.n_entries;
  bf16* dq = og;
  parts.next("core.memset");
  float* dkv = tmp.zeros<float>(N * hd);
  float* dcmp = E ? tmp.zeros<float>(E * hd) : nullptr;
  parts.next("core");
  // GpuModelOptions::deterministic: dK + dV per key slot into the scratch, summed per key row in a fixed order;
  // else fp32 atomics (the fast path).
  const cuda::SparseKeySets keys = key_sets(c, b);
  if (cuda::sparse_attention_fast_head_dim(hd)) {
    const auto order = c.deterministic ? cuda::SparseAttnBwdOrder::Deterministic : cuda::SparseAttnBwdOrder::Atomic;
    float* scratch = tmp.take<float>(cuda::sparse_attention_bwd_scratch(N, E, H, hd, keys, cuda::SparseAttnKernel::Auto,
                                                                        cuda::kSparseAttnPartialBudget, order));
    cuda::sparse_attention_bwd(s.q, s.kv, s.cmp, w.sink, N, E, H, hd, keys, s.o, s.lse, dO, dq, dkv, dcmp, w.g_sink,
                               scratch, nullptr, cuda::SparseAttnKernel::Auto, cuda::kSparseAttnPartialBudget, order);
  } else {  // generic fallback (see the forward)
    float* scratch = tmp.take<float>(cuda::sparse_attention_generic_bwd_scratch(N, E, H, hd, keys));
    cuda::sparse_attention_generic_bwd(s.q, s.kv, s.cmp, w.sink, N, E, H, hd, keys, s.o, s.lse, dO, dq, dkv, dcmp,
                                       w.g_sink, scratch);
  }

  // Tensor parallel: this rank's heads gave their part of the shared K=V's and the compressed entries' gradients;
  // the sums over TP make them (and everything computed from them: the replicated kv / compressor weights'
  // gradients, the input gradient) identical on every TP rank.
  if (c.tp) {
    parts.next("core.tp_all_reduce");
    tp_sum(c, dkv, N * hd);
    if (E) tp_sum(c, dcmp, E * hd);
  }

  // Query path: RoPE^T, per-head norm, wq_b, q_norm, wq_a.
  bf16* dq_pre = dO;
  parts.next("q.headnorm+rope");
  cuda::rope_rmsnorm_bwd(dq_pre, dq, s.q_pre, s.q_rstd, rope_args(rope, N, H, hd, r, pos, -1));
  parts.next("q.gemm");
  c.lin.dw(w.g_wq_b, dq_pre, s.cq, N, dc, H * hd);
  bf16* dcq = tmp.take<bf16>(N * dc);
  if (c.tp) {  // column-parallel wq_b: the compressed query's gradient is summed over TP in fp32, rounded once
    float* dcq32 = tmp.take<float>(N * dc);
    c.lin.dx(dcq32, dq_pre, w.wq_b, N, dc, H * hd, true);
    parts.next("q.tp_all_reduce");
    tp_sum(c, dcq32, N * dc);
    cuda::cast_f32_to_bf16(dcq, dcq32, N * dc);
  } else {
    c.lin.dx(dcq, dq_pre, w.wq_b, N, dc, H * hd);
  }
  bf16* dqa = tmp.take<bf16>(N * dc);
  parts.next("q.norm");
  rmsnorm_bwd_full(c, dqa, w.g_q_norm, dcq, s.qa, w.q_norm, s.qa_rstd, N, dc);
  parts.next("q.gemm");
  c.lin.dw(w.g_wq_a, dqa, a, N, d, dc);
  c.lin.dx(da, dqa, w.wq_a, N, d, dc, true, 1.f);

  // K=V path.
  parts.next("kv.rope+cast+norm");
  cuda::rope_apply(dkv, rope_args(rope, N, 1, hd, r, pos, -1));
  bf16* dkv_b = tmp.take<bf16>(N * hd);
  cuda::cast_f32_to_bf16(dkv_b, dkv, N * hd);
  bf16* dkvp = tmp.take<bf16>(N * hd);
  rmsnorm_bwd_full(c, dkvp, w.g_kv_norm, dkv_b, s.kvp, w.kv_norm, s.kv_rstd, N, hd);
  parts.next("kv.gemm");
  c.lin.dw(w.g_wkv, dkvp, a, N, d, hd);
  c.lin.dx(da, dkvp, w.wkv, N, d, hd, true, 1.f);

  // Compressor.
  if (E > 0) {
    const DevPlan& plan = c.lay->plans.at(D.ratio);
    const bool overlap = D.type == dsv4::AttnType::CSA;
    const int64_t width = (overlap ? 2 : 1) * hd;
    parts.next("cmp.rope+cast+norm");
    cuda::rope_apply(dcmp, rope_args(rope, E, 1, hd, r, plan.entry_pos.as<int32_t>(), -1));
    bf16* dcmp_b = tmp.take<bf16>(E * hd);
    cuda::cast_f32_to_bf16(dcmp_b, dcmp, E * hd);
    bf16* dpooled = tmp.take<bf16>(E * hd);
    rmsnorm_bwd_full(c, dpooled, w.g_cmp_norm, dcmp_b, s.pooled, w.cmp_norm, s.c_rstd, E, hd);
    parts.next("cmp.memset");
    bf16* dckv = tmp.zeros<bf16>(N * width);
    bf16* dcgate = tmp.zeros<bf16>(N * width);
    parts.next("cmp.pool");
    const cuda::CompressArgs ca = compress_args(plan, hd, overlap);
    const int64_t ape_elems = int64_t(cuda::compress_pool_bwd_scratch_bytes(ca) / sizeof(float));
    float* ape_scratch = w.g_cmp_ape ? tmp.take<float>(ape_elems) : nullptr;
    cuda::compress_pool_bwd(dckv, dcgate, w.g_cmp_ape, dpooled, s.ckv, s.cgate, w.cmp_ape, ca, nullptr, ape_scratch);
    parts.next("cmp.gemm");
    c.lin.dw(w.g_cmp_wkv, dckv, a, N, d, width);
    c.lin.dx(da, dckv, w.cmp_wkv, N, d, width, true, 1.f);
    c.lin.dw(w.g_cmp_wgate, dcgate, a, N, d, width);
    c.lin.dx(da, dcgate, w.cmp_wgate, N, d, width, true, 1.f);
  }
  parts.done();
}

}  // namespace trex::dsv4gpu
