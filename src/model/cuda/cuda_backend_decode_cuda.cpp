// The CUDA backend's decode ops (cuda_backend.h, "Decoding"): a cached pass's plan, the attention sub-layer against
// the slots' caches, the logits of the asked rows, the slots as per-sequence caches.
#include <algorithm>
#include <cmath>
#include <set>

#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/indexer.h"
#include "kernels/cuda/mhc_generic.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/speculative_rows.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/cuda_backend.h"

namespace trex::dsv4gpu {

using dsv4::Pass;
using dsv4::Stream;

void CudaBackend::set_decode(const DecodeOptions& o) {
  TREX_CHECK(m_.first_stage() && m_.last_stage(),
             "CUDA backend: decoding runs the whole model (this one holds layers [{}, {}))", m_.l0, m_.l1);
  TREX_CHECK(!o.lm_head || o.lm_vocab > 0, "CUDA backend: a shared LM head needs its vocabulary size");
  std::vector<dsv4::AttentionDims> dims;
  for (int64_t l = m_.l0; l < m_.l1; ++l) {
    const dsv4::AttentionDims& D = m_.blocks[size_t(l)]->dims;
    // The per-warp decode kernel serves head dims 256 / 512 only; the tensor-core path falls back to the generic
    // sparse attention for the others (the fixtures' 16 / 32 / 48).
    TREX_CHECK(!o.reference_attention || cuda::sparse_attention_fast_head_dim(D.head_dim),
               "CUDA backend: the reference decode attention needs head dim 256 or 512 (model has {})", D.head_dim);
    dims.push_back(D);
  }
  dec_opts_ = o;
  caches_ = std::make_unique<DecodeCaches>(dims, o.slots, o.max_context);
  next_slot_ = 0;
  const dsv4::ModelConfig& cfg = m_.cfg;
  upload_rope(dec_rope_main_, dsv4::rope_inv_freq(cfg.rope_main, cfg.rope_dim), o.max_context);
  upload_rope(dec_rope_compress_, dsv4::rope_inv_freq(cfg.rope_compress, cfg.rope_dim), o.max_context);
}

DecodeCaches& CudaBackend::decode_caches() {
  TREX_CHECK(caches_, "CUDA backend: no decode caches (set_decode)");
  return *caches_;
}

const bf16* CudaBackend::decode_streams() const {
  TREX_CHECK(dec_, "CUDA backend: no decode pass has run");
  return dec_->X;
}

std::unique_ptr<dsv4::SequenceCaches> CudaBackend::new_caches() const {
  TREX_CHECK(caches_, "CUDA backend: no decode caches (set_decode)");
  TREX_CHECK(next_slot_ < caches_->slots(), "CUDA backend: all {} decode slots are handed out", caches_->slots());
  auto s = std::make_unique<DecodeSlot>();
  s->owner = caches_.get(), s->slot = next_slot_++;
  return s;
}

// The pass's token plan from the program's CachedTokens (the caller validated them): per token its position and
// item, per item its slot, old length and first row, per compress ratio the entries the step completes; one
// upload. Then the step activations every block reuses.
void CudaBackend::begin_decode(const Pass& p) {
  TREX_CHECK(caches_, "CUDA backend: a decode pass before set_decode");
  const dsv4::CachedTokens& tk = *p.cached;
  const dsv4::ModelConfig& cfg = m_.cfg;
  const int64_t N = p.n_tok, I = tk.n_seqs, d = cfg.hidden, hc = cfg.hc_mult;
  TREX_CHECK(N >= 1 && I >= 1 && tk.seq_begin[I] == N, "CUDA backend: a decode pass of {} tokens in {} sequences",
             N, I);
  std::set<int64_t> ratios;
  for (int64_t l = m_.l0; l < m_.l1; ++l)
    if (cfg.compress_ratio[size_t(l)] > 0) ratios.insert(cfg.compress_ratio[size_t(l)]);
  const size_t n = static_cast<size_t>(N), ni = static_cast<size_t>(I);
  std::vector<int32_t> pos(n), item(n), slot(ni), first(ni), begin(ni + 1);
  std::map<int64_t, std::pair<std::vector<int32_t>, std::vector<int32_t>>> ent;  // ratio -> (item, idx)
  std::map<int64_t, int64_t> max_visible;
  for (int64_t it = 0; it < I; ++it) {
    const auto* s = dynamic_cast<const DecodeSlot*>(tk.caches[it]);
    TREX_CHECK(s && s->owner == caches_.get(), "CUDA backend: sequence {} of a decode pass has another model's caches",
               it);
    const int64_t b = tk.seq_begin[it], e = tk.seq_begin[it + 1], len = tk.pos[b];
    slot[size_t(it)] = int32_t(s->slot), first[size_t(it)] = int32_t(len), begin[size_t(it)] = int32_t(b);
    for (int64_t i = b; i < e; ++i) pos[size_t(i)] = int32_t(tk.pos[i]), item[size_t(i)] = int32_t(it);
    for (int64_t m : ratios) {
      auto& [items, idx] = ent[m];
      for (int64_t k = len / m; k < (len + e - b) / m; ++k) items.push_back(int32_t(it)), idx.push_back(int32_t(k));
      max_visible[m] = std::max(max_visible[m], (len + e - b) / m);
    }
  }
  begin[size_t(I)] = int32_t(N);
  std::vector<int32_t> host;
  auto put = [&](const int32_t* v, size_t n) {
    const size_t at = host.size();
    host.insert(host.end(), v, v + n);
    return at;
  };
  const size_t o_ids = p.ids ? put(p.ids, size_t(N)) : 0;
  const size_t o_pos = put(pos.data(), pos.size()), o_item = put(item.data(), item.size());
  const size_t o_slot = put(slot.data(), slot.size()), o_first = put(first.data(), first.size());
  const size_t o_begin = put(begin.data(), begin.size());
  std::map<int64_t, std::pair<size_t, size_t>> o_ent;
  for (const auto& [r, e] : ent) o_ent[r] = {put(e.first.data(), e.first.size()), put(e.second.data(), e.second.size())};

  dec_ = std::make_unique<DecodePass>();  // the previous pass's buffers are freed stream-ordered
  DecodePass& dp = *dec_;
  int32_t* dev = dp.mem.take<int32_t>(int64_t(host.size()));
  TREX_CUDA(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, nullptr));
  cuda::DecodeStep& st = dp.st;
  st.n_tok = N, st.n_items = I;
  st.tok_pos = dev + o_pos, st.tok_item = dev + o_item, st.item_slot = dev + o_slot;
  st.item_first = dev + o_first, st.item_begin = dev + o_begin;
  dp.pos = dev + o_pos;
  dp.first = std::move(first);
  for (const auto& [r, o] : o_ent)
    dp.entries[r] = DecodePass::Entries{dev + o.first, dev + o.second, int64_t(ent[r].first.size()), max_visible[r]};
  // What the MoE reads of the pass: N and the token ids (hash routing; a pass without host ids, the MTP module's,
  // is score-routed).
  dp.lay.N = N, dp.lay.B = 1, dp.lay.S = N;
  if (p.ids) {
    dp.lay.ids = DevMem(size_t(N) * sizeof(int32_t));
    TREX_CUDA(cudaMemcpyAsync(dp.lay.ids.as<int32_t>(), dev + o_ids, size_t(N) * sizeof(int32_t),
                              cudaMemcpyDeviceToDevice, nullptr));
  }
  c_ = m_.ctx();
  if (!m_.opts.timing) c_.section = nullptr;  // no per-part section strings on the host in every step
  c_.lay = &dp.lay;
  c_.rope_main = &dec_rope_main_, c_.rope_compress = &dec_rope_compress_;
  c_.grouped_experts = dec_opts_.grouped_experts;

  Pool& k = dp.mem;
  dp.X = k.take<bf16>(N * hc * d), dp.Xmid = k.take<bf16>(N * hc * d);
  dp.an = k.take<bf16>(N * d), dp.y = k.take<bf16>(N * d), dp.rstd = k.take<float>(N);
  for (cuda::MhcActs* a : {&dp.sa, &dp.sf}) {
    a->mix = k.take<float>(N * cuda::kMhcMix), a->rstd = k.take<float>(N), a->pre = k.take<float>(N * 4);
    a->post = k.take<float>(N * 4), a->comb = k.take<float>(N * 16);
  }
  decoding_ = true;
}

// Query path and the shared K=V row as in the training forward; the compressors' completed entries, then the
// rows later entries still need; CSA's indexer top-k over the cached keys; the core attention (window rows of this
// step from the step's kv, older window rows and the compressed entries as selected rows of the layer's key
// array); the window ring takes the newest rows; inverse RoPE and the grouped output projection.
void CudaBackend::attention_cached(const Pass& p, int64_t blk) {
  (void)p;
  GpuBlock& b = block(blk);
  DecodePass& dp = *dec_;
  DecodeLayerCache& C = caches_->layer(blk);
  const cuda::DecodeStep& st = dp.st;
  const dsv4::AttentionDims& D = b.dims;
  const AttnW& w = b.aw;
  const Linear& lin = c_.lin;
  const int64_t N = st.n_tok, d = D.d, H = D.n_heads, hd = D.head_dim, r = D.rope_dim, dc = D.d_c;
  const int64_t G = D.o_groups, hg = H / G, gd = G * D.o_rank;
  const float eps = float(D.eps);
  const bool compressed = D.type != dsv4::AttnType::Sliding, csa = D.type == dsv4::AttnType::CSA;
  const RopeDev& rope = compressed ? dec_rope_compress_ : dec_rope_main_;
  const int32_t* pos = dp.pos;
  const bf16* a = b.a;
  Pool tmp;
  auto rargs = [&](int64_t rows, int64_t heads, int64_t c, int sign) {
    cuda::RopeArgs ra;
    ra.rows = rows, ra.heads = heads, ra.c = c, ra.rope_dim = r, ra.pos = pos;
    ra.cos = rope.cos.as<float>(), ra.sin = rope.sin.as<float>(), ra.sign = sign;
    return ra;
  };

  bf16* qa = tmp.take<bf16>(N * dc);
  bf16* cq = tmp.take<bf16>(N * dc);
  float* rstd = tmp.take<float>(N * H);
  lin.fwd(qa, a, w.wq_a, N, d, dc);
  cuda::rmsnorm_fwd(cq, rstd, qa, w.q_norm, N, dc, eps);
  bf16* q_pre = tmp.take<bf16>(N * H * hd);
  bf16* q = tmp.take<bf16>(N * H * hd);
  lin.fwd(q_pre, cq, w.wq_b, N, dc, H * hd);
  cuda::rmsnorm_fwd(q, rstd, q_pre, nullptr, N * H, hd, eps);
  cuda::rope_apply(q, rargs(N, H, hd, +1));
  bf16* kvp = tmp.take<bf16>(N * hd);
  bf16* kv = tmp.take<bf16>(N * hd);
  lin.fwd(kvp, a, w.wkv, N, d, hd);
  cuda::rmsnorm_fwd(kv, rstd, kvp, w.kv_norm, N, hd, eps);
  cuda::rope_apply(kv, rargs(N, 1, hd, +1));

  auto compress = [&](const bf16* wkv, const bf16* wgate, const float* ape, const bf16* norm, int64_t c, bool overlap,
                      int64_t rows, DevMem& ring_kv, DevMem& ring_gate, bf16* entries) {
    const int64_t width = (overlap ? 2 : 1) * c;
    bf16* skv = tmp.take<bf16>(N * width);
    bf16* sgate = tmp.take<bf16>(N * width);
    lin.fwd(skv, a, wkv, N, d, width);
    lin.fwd(sgate, a, wgate, N, d, width);
    const DecodePass::Entries& e = dp.entries.at(D.ratio);
    cuda::DecodeCompress dcmp;
    dcmp.n_entries = e.n;
    dcmp.entry_item = e.item, dcmp.entry_idx = e.idx;
    dcmp.ratio = D.ratio, dcmp.c = c, dcmp.overlap = overlap, dcmp.rows = rows;
    dcmp.step_kv = skv, dcmp.step_gate = sgate;
    dcmp.ring_kv = ring_kv.as<bf16>(), dcmp.ring_gate = ring_gate.as<bf16>();
    dcmp.ape = ape, dcmp.norm = norm, dcmp.eps = eps, dcmp.rope_dim = r;
    dcmp.cos = rope.cos.as<float>(), dcmp.sin = rope.sin.as<float>();
    dcmp.cap = C.cap, dcmp.entries = entries;
    cuda::decode_compress_entries(st, dcmp);
    cuda::decode_store_rows(st, ring_kv.as<bf16>(), skv, rows, width);
    cuda::decode_store_rows(st, ring_gate.as<bf16>(), sgate, rows, width);
  };
  int64_t* sel = nullptr;
  if (compressed) {
    compress(w.cmp_wkv, w.cmp_wgate, w.cmp_ape, w.cmp_norm, hd, csa, C.rows, C.ckv, C.cgate, C.cmp);
    if (csa) {
      const int64_t nI = D.index_heads, cI = D.index_head_dim, k = D.index_topk;
      compress(w.idx_wkv, w.idx_wgate, w.idx_ape, w.idx_norm, cI, true, 2 * D.ratio, C.ikv, C.igate,
               C.ikeys.as<bf16>());
      bf16* iq = tmp.take<bf16>(N * nI * cI);
      lin.fwd(iq, cq, w.idx_wq_b, N, dc, nI * cI);
      cuda::rope_apply(iq, rargs(N, nI, cI, +1));
      float* iw = tmp.take<float>(N * nI);
      lin.fwd(iw, a, w.idx_wp, N, d, nI, true);
      int64_t* vb = tmp.take<int64_t>(N);
      int64_t* ve = tmp.take<int64_t>(N);
      cuda::decode_visible_ranges(st, D.ratio, C.cap, vb, ve);
      // In the block's picks (kept until its next pass, like the router's choice): decode_csa_selection reads it.
      sel = b.picks.take<int64_t>(N * k);
      dp.csa_sel[blk] = sel;
      cuda::IndexerTopkArgs ia;
      ia.n_tok = N, ia.n_heads = nI, ia.head_dim = cI, ia.k_sel = k;
      ia.max_visible = std::max<int64_t>(dp.entries.at(D.ratio).max_visible, 1);
      ia.w_scale = float(1.0 / std::sqrt(double(nI)));
      ia.vis_begin = vb, ia.vis_end = ve;
      cuda::indexer_topk(sel, iq, iw, C.ikeys.as<bf16>(), ia);
    }
  }
  mark(kPhaseAttnProj);

  bf16* o = tmp.take<bf16>(N * H * hd);
  if (dec_opts_.reference_attention) {
    cuda::DecodeAttention da;
    da.heads = H, da.c = hd, da.scale = float(1.0 / std::sqrt(double(hd)));
    da.q = q, da.kv = kv, da.win = C.win, da.window = D.window;
    if (compressed) da.cmp = C.cmp, da.cap = C.cap, da.ratio = D.ratio;
    if (csa) da.sel = sel, da.k_sel = D.index_topk;
    da.sink = w.sink, da.o = o;
    cuda::decode_attention(st, da);
  } else {
    // Column counts are this step's maxima (a prompt chunk on an empty slot has no history columns; CSA's indexer
    // leaves at most max_visible valid).
    cuda::DecodeKeySets ks;
    ks.window = D.window, ks.ring_base = caches_->slots() * C.cap;
    for (int32_t f : dp.first) ks.n_hist = std::max<int64_t>(ks.n_hist, std::min<int64_t>(f, D.window - 1));
    if (compressed) {
      const int64_t vis = dp.entries.at(D.ratio).max_visible;
      ks.n_cmp = csa ? std::min<int64_t>(D.index_topk, vis) : vis;
      ks.cap = C.cap, ks.ratio = D.ratio;
      if (csa) ks.sel = sel, ks.k_sel = D.index_topk;
    }
    const int64_t cols = ks.n_hist + ks.n_cmp;
    ks.win_begin = tmp.take<int64_t>(N);
    if (cols > 0) ks.cols = tmp.take<int64_t>(N * cols);
    cuda::decode_key_sets(st, ks);
    cuda::SparseKeySets keys;
    keys.win_begin = ks.win_begin;
    if (cols > 0) keys.cmp_sel = ks.cols, keys.k_sel = cols;
    float* lse = tmp.take<float>(N * H);
    if (cuda::sparse_attention_fast_head_dim(hd))
      cuda::sparse_attention_fwd(q, kv, C.keys.as<bf16>(), w.sink, N, H, hd, keys, o, lse);
    else  // the golden fixtures' small head dims, as in the training forward
      cuda::sparse_attention_generic_fwd(q, kv, C.keys.as<bf16>(), w.sink, N, H, hd, keys, o, lse);
  }
  cuda::decode_store_rows(st, C.win, kv, D.window, hd);
  mark(kPhaseAttnCore);

  cuda::rope_apply(o, rargs(N, H, hd, -1));
  bf16* og = q_pre;  // free again: [N, H*hd]
  cuda::permute_groups(og, o, N, G, hg * hd, true);
  bf16* rg = tmp.take<bf16>(N * gd);
  cuda::GemmShape gs{N, D.o_rank, hg * hd, false, true, cuda::GemmType::BF16, cuda::GemmType::BF16, G};
  c_.gemm->run(gs, og, w.wo_a, rg);
  bf16* rr = tmp.take<bf16>(N * gd);
  cuda::permute_groups(rr, rg, N, G, D.o_rank, false);
  lin.fwd(b.y_a, rr, w.wo_b, N, gd, d);
  mark(kPhaseAttnOut);
}

// hc_head collapse -> norm -> fp32 logits with the LM head, for the asked rows of the pass's final streams: each
// item's last token gathered on the device (the plain decode step), other rows through one pinned upload.
void CudaBackend::head_logits(const Pass& p, Stream in, const int64_t* rows, int64_t n_rows, float* logits) {
  const dsv4::ModelConfig& cfg = m_.cfg;
  const dsv4::CachedTokens& tk = *p.cached;
  DecodePass& dp = *dec_;
  const int64_t hc = cfg.hc_mult, d = cfg.hidden, H = n_rows;
  const int64_t V = dec_opts_.lm_head ? dec_opts_.lm_vocab : cfg.vocab_size;
  const bf16* W = dec_opts_.lm_head ? dec_opts_.lm_head : m_.b16("head.weight");
  if (H == 0) return;
  const bf16* X = value(in);
  Pool& k = dp.mem;
  bf16* Xh = k.take<bf16>(H * hc * d);
  bool last = H == tk.n_seqs;
  for (int64_t i = 0; last && i < H; ++i) last = rows[i] == tk.seq_begin[i + 1] - 1;
  if (last) {
    cuda::decode_last_rows(dp.st, X, hc * d, Xh);
  } else {
    const std::vector<int32_t> r32(rows, rows + H);
    upload_staged(dec_rows_, 0, r32.data(), H);
    cuda::copy_rows_bf16(Xh, nullptr, X, nullptr, dec_rows_.as<int32_t>(), H, hc * d);
  }
  bf16* hcol = k.take<bf16>(H * d);
  bf16* hn = k.take<bf16>(H * d);
  float* hmix = k.take<float>(H * 4);
  float* hrstd = k.take<float>(H);
  float* hw = k.take<float>(H * 4);
  cuda::hc_head_fwd_any(hc, hcol, hmix, hrstd, hw, Xh, m_.f32("hc_head_fn"), m_.f32("hc_head_base"),
                        m_.f32("hc_head_scale"), H, d, float(cfg.hc_eps), float(cfg.rms_eps));
  cuda::rmsnorm_fwd(hn, hrstd, hcol, m_.b16("norm.weight"), H, d, float(cfg.rms_eps));
  c_.lin.fwd(logits, hn, W, H, d, V, true);
  mark(kPhaseHead);
}

std::vector<int32_t> CudaBackend::decode_router_selection(int64_t blk) const {
  TREX_CHECK(dec_, "CUDA backend: no decode pass has run");
  const GpuBlock& b = block(blk);
  TREX_CHECK(b.mo.sel, "CUDA backend: block {} has no router selection of the last decode pass", blk);
  std::vector<int32_t> v(size_t(dec_->st.n_tok * m_.cfg.topk));
  TREX_CUDA(cudaMemcpy(v.data(), b.mo.sel, v.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<int64_t> CudaBackend::decode_csa_selection(int64_t blk) const {
  TREX_CHECK(dec_, "CUDA backend: no decode pass has run");
  const auto it = dec_->csa_sel.find(blk);
  TREX_CHECK(it != dec_->csa_sel.end(), "CUDA backend: block {} is not a CSA layer of the last decode pass", blk);
  std::vector<int64_t> v(size_t(dec_->st.n_tok * m_.cfg.index_topk));
  TREX_CUDA(cudaMemcpy(v.data(), it->second, v.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace trex::dsv4gpu
