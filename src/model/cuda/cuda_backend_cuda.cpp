// The CUDA backend of the block program (cuda_backend.h): each op is the kernel sequence of today's GPU step, in
// the same order, with the same pools and timing sections.
#include "model/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kernels/cuda/balance.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/hc_head.h"
#include "kernels/cuda/lm_head_ce.h"
#include "kernels/cuda/mhc_generic.h"
#include "kernels/cuda/mhc_norm.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/gpu_mtp.h"
#include "model/cuda/weight_gather.h"

namespace trex::dsv4gpu {

using dsv4::HeadKind;
using dsv4::Pass;
using dsv4::Site;
using dsv4::Stream;

namespace {

template <typename T>
DevMem upload(const T* v, size_t n) {
  DevMem m(n * sizeof(T));
  if (n) TREX_CUDA(cudaMemcpyAsync(m.as<T>(), v, n * sizeof(T), cudaMemcpyHostToDevice));
  return m;
}
template <typename T>
DevMem upload(const std::vector<T>& v) {
  return upload(v.data(), v.size());
}
// Into dst, reallocated only when too small: the batch layout of a step after the first reuses the last one's
// buffers (stream-ordered: the copy runs after the kernels queued before it that read the old contents).
// reserve: elements to make room for at least (a length that varies from pass to pass, up to a known bound).
template <typename T>
void upload_into(DevMem& dst, const T* v, size_t n, size_t reserve = 0) {
  if (dst.bytes() < n * sizeof(T)) dst = DevMem(std::max(n, reserve) * sizeof(T));
  if (n) TREX_CUDA(cudaMemcpyAsync(dst.as<T>(), v, n * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
void upload_into(DevMem& dst, const std::vector<T>& v, size_t reserve = 0) {
  upload_into(dst, v.data(), v.size(), reserve);
}

template <typename T>
std::vector<int32_t> to_i32(const std::vector<T>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

cuda::MhcDims mhc_dims(const dsv4::ModelConfig& c, int64_t N) {
  cuda::MhcDims m;
  m.n_tok = N, m.d = c.hidden, m.sinkhorn_iters = int(c.hc_sinkhorn_iters);
  m.hc_eps = float(c.hc_eps), m.rms_eps = float(c.rms_eps);
  return m;
}

// An mHC site's forward and its RMSNorm (the collapse kept in fp32). n_hc = 4: the 24-wide projection X fn^T as
// a tensor-core GEMM on a hi / lo bf16 split of fn (near-fp32 products: mhc.h), then the fused gates / Sinkhorn /
// collapse / norm kernel; otherwise the generic path.
void site_norm(const Ctx& c, int64_t hc, const cuda::MhcDims& md, const bf16* X, const float* fn, const float* base,
               const float* scale, const cuda::MhcActs& a, const bf16* norm_w, float eps, bf16* normed,
               float* rstd) {
  const int64_t N = md.n_tok, D = hc * md.d;
  if (!cuda::mhc_fast_streams(hc) || !cuda::mhc_site_norm_fwd_serves(md.d) || N == 0) {
    cuda::mhc_site_norm_fwd_any(hc, md, X, fn, base, scale, a, norm_w, eps, normed, rstd);
    return;
  }
  Pool tmp(c.scratch);
  bf16* fn2 = tmp.take<bf16>(2 * cuda::kMhcMix * D);  // [fn_hi; fn_lo]
  float* proj = tmp.take<float>(N * 2 * cuda::kMhcMix);
  cuda::mhc_split_bf16(fn, cuda::kMhcMix, D, D, fn2, fn2 + cuda::kMhcMix * D);
  c.lin.fwd(proj, X, fn2, N, D, 2 * cuda::kMhcMix, /*f32_out=*/true);
  cuda::mhc_site_norm_fwd_proj(md, X, proj, base, scale, a, norm_w, eps, normed, rstd);
}

// An mHC site's backward (dcol fp32, gate dots from mhc_collapse_norm_bwd). n_hc = 4: the fn gradient as a
// tensor-core GEMM, dfn += dmix^T X with dmix split hi / lo (bf16 pair, ~2^-17), instead of the kernel's own pass.
void site_bwd(const Ctx& c, int64_t hc, const cuda::MhcDims& md, const bf16* X, const float* fn, const float* base,
              const float* scale, const cuda::MhcActs& a, const float* dcol, const float* dpost, const float* dcomb,
              float* dX, float* dfn, float* dbase, float* dscale, float* scratch, const float* gate) {
  const int64_t N = md.n_tok, D = hc * md.d, K = cuda::kMhcMix;
  if (!cuda::mhc_fast_streams(hc) || !dfn || N == 0) {
    cuda::mhc_site_bwd_any(hc, md, X, fn, base, scale, a, dcol, dpost, dcomb, dX, dfn, dbase, dscale, scratch,
                           nullptr, gate);
    return;
  }
  cuda::mhc_site_bwd_any(hc, md, X, fn, base, scale, a, dcol, dpost, dcomb, dX, nullptr, dbase, dscale, scratch,
                         nullptr, gate);
  Pool tmp(c.scratch);
  bf16* dm = tmp.take<bf16>(N * 2 * K);  // [N, 48]: dmix_hi | dmix_lo
  float* prod = tmp.take<float>(2 * K * D);
  cuda::mhc_split_bf16(cuda::mhc_site_bwd_dmix(md, scratch), N, K, 2 * K, dm, dm + K);
  cuda::GemmShape gs{2 * K, D, N, true, false, cuda::GemmType::BF16, cuda::GemmType::F32, 1};
  c.gemm->run(gs, dm, X, prod, 1.f, 0.f);  // prod [48, D] = dm^T X
  cuda::mhc_add_split_rows(dfn, prod, K, D);
}

// One site's parameters, gradients and saved activations in a block.
struct SiteView {
  const float *fn, *base, *scale;
  float *g_fn, *g_base, *g_scale;
  const bf16* norm_w;
  float* g_norm;
  cuda::MhcActs* acts;
  bf16 *normed, *y;
  float* rstd;
};

SiteView site_view(GpuBlock& b, Site s) {
  if (s == Site::Attn)
    return SiteView{b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, b.g_hc_attn_fn, b.g_hc_attn_base,
                    b.g_hc_attn_scale, b.attn_norm, b.g_attn_norm, &b.sa, b.a, b.y_a, b.a_rstd};
  return SiteView{b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, b.g_hc_ffn_fn, b.g_hc_ffn_base, b.g_hc_ffn_scale,
                  b.ffn_norm, b.g_ffn_norm, &b.sf, b.u, b.y_f, b.u_rstd};
}

const char* head_prefix(HeadKind h) { return h == HeadKind::Mtp ? "mtp.0." : ""; }

}  // namespace

void upload_rope(RopeDev& r, const std::vector<double>& inv_freq, int64_t n_pos) {
  const dsv4::RopeTable<float> t = dsv4::make_rope_table<float>(inv_freq, n_pos);
  r.n_pairs = t.n_pairs, r.n_pos = n_pos;
  r.cos = upload(t.cos);
  r.sin = upload(t.sin);
}

// One block's backward temporaries (allocated by its first op, the ffn expand's backward, freed by its last, the
// attn site's backward). The expand backwards WRITE dX_mid / d_in and the bf16 dy (no zero fills, no casts).
struct CudaBackend::BlockGrads {
  Pool tmp;
  float *dX_mid = nullptr, *dpost = nullptr, *dcomb = nullptr;
  bf16* dyb = nullptr;
  float* dsub = nullptr;  // d(sub-layer input) [N, d] fp32, accumulated by the sub-layer's backward
  float* dcol = nullptr;  // fp32: the gate gradients dcol . X[i] cancel (mhc_norm.h)
  float *norm_part = nullptr, *gate = nullptr, *scratch = nullptr;
};

CudaBackend::CudaBackend(GpuModel::Impl& m) : m_(m), c_(m.ctx()) {}
CudaBackend::~CudaBackend() = default;

void CudaBackend::set_forward(const Injection* inject, HeadMode head) {
  const dsv4::ModelConfig& cfg = m_.cfg;
  if (inject) {
    TREX_CHECK(inject->csa_sel.empty() || int64_t(inject->csa_sel.size()) == cfg.n_layers,
               "GPU model: csa_sel injection has {} layers, the model {}", inject->csa_sel.size(), cfg.n_layers);
    TREX_CHECK(inject->router_sel.empty() || int64_t(inject->router_sel.size()) == cfg.n_layers,
               "GPU model: router_sel injection has {} layers, the model {}", inject->router_sel.size(), cfg.n_layers);
  }
  inject_ = inject;
  head_ = head;
}

GpuBlock& CudaBackend::block(int64_t blk) const {
  const int64_t n = m_.l1 - m_.l0;
  if (blk == n) {
    TREX_CHECK(m_.mtp_block, "CUDA backend: block {} is the MTP block, which this model does not hold", blk);
    return *m_.mtp_block;
  }
  TREX_CHECK(blk >= 0 && blk < n, "CUDA backend: no block {} ({} layers on this stage)", blk, n);
  return *m_.blocks[size_t(m_.l0 + blk)];
}

bf16* CudaBackend::value(Stream s) const {
  if (decoding_ && (s.kind == Stream::X || s.kind == Stream::Mid)) return s.kind == Stream::X ? dec_->X : dec_->Xmid;
  switch (s.kind) {
    case Stream::X:
      return m_.X[size_t(m_.l0 + s.index)];
    case Stream::Mid:
      return block(s.index).X_mid;
    case Stream::MtpIn:
      return m_.mtp_in;
    case Stream::MtpOut:
      return m_.mtp_out;
    default:
      fail("CUDA backend: stream kind {} is not a value stream", int(s.kind));
  }
}

float* CudaBackend::grad(Stream s) const {
  switch (s.kind) {
    case Stream::dA:
      return dA_;
    case Stream::dB:
      return dB_;
    case Stream::dMid:
      TREX_CHECK(bg_, "CUDA backend: dMid outside a block's backward");
      return bg_->dX_mid;
    case Stream::dMtpIn:
    case Stream::dMtpOut:
      TREX_CHECK(dMtp_[s.kind == Stream::dMtpOut], "CUDA backend: no MTP gradient streams (begin_backward)");
      return dMtp_[s.kind == Stream::dMtpOut];
    default:
      fail("CUDA backend: stream kind {} is not a gradient stream", int(s.kind));
  }
}

const char* CudaBackend::attn_section(const GpuBlock& b, bool fwd) const {
  switch (b.dims.type) {
    case dsv4::AttnType::Sliding:
      return fwd ? "fwd.attn.sliding" : "bwd.attn.sliding";
    case dsv4::AttnType::CSA:
      return fwd ? "fwd.attn.csa" : "bwd.attn.csa";
    default:
      return fwd ? "fwd.attn.hca" : "bwd.attn.hca";
  }
}

// The batch layout on the device (positions, windows, compress plans), the rotary tables, the streams.
void CudaBackend::begin_pass(const Pass& p) {
  decoding_ = false;
  if (p.cached) return begin_decode(p);
  GpuModel::Impl& m = m_;
  const dsv4::ModelConfig& cfg = m.cfg;
  const dsv4::SeqLayout& layout = *p.layout;
  const int64_t B = layout.B, S = layout.T, N = B * S, d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size;
  TREX_CHECK(p.n_tok == N, "CUDA backend: a pass of {} tokens over a layout of {}", p.n_tok, N);
  for (int64_t i = 0; i < N; ++i)
    TREX_CHECK(p.ids[i] >= 0 && p.ids[i] < V, "GPU model: token id {} at position {} outside [0, {})", p.ids[i], i,
               V);
  c_ = m.ctx();
  DevLayout& L = m.lay;
  L.B = B, L.S = S, L.N = N;
  upload_into(L.pos, to_i32(layout.pos));
  std::vector<int64_t> win(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t i = b * S + t;
      win[size_t(i)] = b * S + std::max(layout.doc_start[size_t(i)], t - cfg.window + 1);
    }
  upload_into(L.win_begin, win);
  upload_into(L.ids, p.ids, size_t(N));
  if (m.first_stage() && p.keeps_activations()) {  // the embedding backward's deterministic plan
    std::vector<int32_t> order, seg;
    cuda::embed_bwd_plan(p.ids, N, &order, &seg);
    // seg has one entry per distinct id (+ 1), which the tokens change: room for N + 1 at once.
    upload_into(L.embed_order, order), upload_into(L.embed_seg, seg, size_t(N) + 1);
    L.embed_groups = int64_t(seg.size()) - 1;
  }
  std::vector<int32_t> iota(static_cast<size_t>(N));
  std::iota(iota.begin(), iota.end(), 0);
  upload_into(L.token_iota, iota);
  // The stage's compress ratios are the same every pass: each one's plan buffers are reused.
  std::set<int64_t> planned;
  for (int64_t l = m.l0; l < m.l1; ++l) {
    const int64_t r = cfg.compress_ratio[size_t(l)];
    if (r == 0 || !planned.insert(r).second) continue;
    DevPlan& pl = L.plans[r];
    pl.host = dsv4::make_compress_plan(layout, r);
    std::vector<int32_t> epos(pl.host.entry_first.size());
    for (size_t e = 0; e < epos.size(); ++e) epos[e] = int32_t(layout.pos[size_t(pl.host.entry_first[e])]);
    // The entries vary with the documents (at most one per token): room for N at once.
    upload_into(pl.entry_first, to_i32(pl.host.entry_first), size_t(N));
    upload_into(pl.entry_doc, to_i32(pl.host.entry_doc_index), size_t(N));
    upload_into(pl.entry_pos, epos, size_t(N));
    upload_into(pl.vis_begin, pl.host.vis_begin);
    upload_into(pl.vis_end, pl.host.vis_end);
    pl.max_visible = 0;
    for (int64_t i = 0; i < N; ++i)
      pl.max_visible = std::max(pl.max_visible, pl.host.vis_end[size_t(i)] - pl.host.vis_begin[size_t(i)]);
  }
  const int64_t n_pos = layout.max_pos() + 1;
  if (n_pos != m.rope_pos) {
    upload_rope(m.rope_main, dsv4::rope_inv_freq(cfg.rope_main, cfg.rope_dim), n_pos);
    upload_rope(m.rope_compress, dsv4::rope_inv_freq(cfg.rope_compress, cfg.rope_dim), n_pos);
    m.rope_pos = n_pos;
  }

  m.acts.clear();
  for (HeadState* h : {&m.head, &m.mtp_head}) {  // their buffers lived in acts; the targets' one is reused
    DevMem targets = std::move(h->targets);
    *h = HeadState{};
    h->targets = std::move(targets);
  }
  m.X.assign(size_t(cfg.n_layers + 1), nullptr);
  for (int64_t l = m.l0; l < m.l1; ++l) m.X[size_t(l)] = m.acts.take<bf16>(N * hc * d);
  // The outgoing stream: where the caller placed it (the next stage reads it there), else in acts.
  m.X[size_t(m.l1)] = placed_out_ ? placed_out_ : m.acts.take<bf16>(N * hc * d);
  placed_out_ = nullptr;
  m.mtp_in = m.mtp_out = nullptr;
  if (m.mtp()) m.mtp_in = m.acts.take<bf16>(N * hc * d), m.mtp_out = m.acts.take<bf16>(N * hc * d);
  // Balance loss: per eligible layer, row losses [n_layers (+ MTP), B] summed on the host in losses().
  loss_.clear(), bal_.clear();
  lm_sum_ = mtp_sum_ = nullptr, bal_rows_ = nullptr;
  lm_sum_host_ = mtp_sum_host_ = 0.f;
  if (m.opts.balance_alpha != 0.0) bal_rows_ = bal_.zeros<double>((cfg.n_layers + 1) * B);
}

void CudaBackend::embed_fwd(const Pass& p, Stream out) {
  m_.wait_gather(m_.embed_bucket);  // data parallel: this step's parameters, all-gathered bucket by bucket
  // ZeRO-3: the first layer's weights gathered under the embedding.
  if (m_.wgather && !decoding_ && m_.l1 > m_.l0) m_.wgather->prefetch(m_.layer_bucket[size_t(m_.l0)]);
  cuda::embed_streams_fwd(value(out), c_.lay->ids.as<int32_t>(), m_.b16("embed.weight"), p.n_tok, m_.cfg.hidden,
                          m_.cfg.hc_mult);
  // Its backward reads no weight; with MTP the MTP input reads it again (and gathers it again).
  if (m_.wgather) m_.wgather->release(m_.embed_bucket);
  if (decoding_) mark(kPhaseEmbed);
}

void CudaBackend::embed_bwd(const Pass& p, Stream d_out) {
  const DevLayout& L = m_.lay;
  TREX_CHECK(L.embed_groups > 0 || p.n_tok == 0, "CUDA backend: embedding backward without its plan");
  cuda::embed_streams_bwd(m_.g32("embed.weight"), L.ids.as<int32_t>(), L.embed_order.as<int32_t>(),
                          L.embed_seg.as<int32_t>(), L.embed_groups, grad(d_out), m_.cfg.hidden, m_.cfg.hc_mult);
}

// The previous stage's output (kept: the first block's backward reads it), or the next stage's gradient.
void CudaBackend::stream_in(const Pass& p, Stream s, const void* src) {
  const size_t n = size_t(p.n_tok * m_.cfg.hc_mult * m_.cfg.hidden);
  if (s.kind == Stream::X)
    TREX_CUDA(cudaMemcpyAsync(value(s), src, n * sizeof(bf16), cudaMemcpyDeviceToDevice, nullptr));
  else
    TREX_CUDA(cudaMemcpyAsync(grad(s), src, n * sizeof(float), cudaMemcpyDeviceToDevice, nullptr));
}

void CudaBackend::stream_out(const Pass& p, Stream s, void* dst) {
  const size_t n = size_t(p.n_tok * m_.cfg.hc_mult * m_.cfg.hidden);
  const bool val = s.kind == Stream::X;
  const void* src = val ? static_cast<const void*>(value(s)) : static_cast<const void*>(grad(s));
  if (src == dst) return;  // placed in the caller's buffer
  TREX_CUDA(cudaMemcpyAsync(dst, src, n * (val ? sizeof(bf16) : sizeof(float)), cudaMemcpyDeviceToDevice, nullptr));
}

void CudaBackend::site_norm_fwd(const Pass& p, int64_t blk, Site s, Stream in) {
  if (decoding_) return decode_site_norm(blk, s, in);
  GpuBlock& b = block(blk);
  const int64_t N = p.n_tok, d = m_.cfg.hidden, hc = m_.cfg.hc_mult;
  if (s == Site::Attn) {  // the block's first op: its parameters, its saved activations
    m_.block_weights(blk, p.replay);  // a replay runs in the backward: its prefetch goes down the layers
    b.keep.clear(), b.redo.clear();
    if (!p.replay) b.picks.clear();  // a replay re-uses the forward's selections
    Pool& k = b.keep;
    // Selective recomputation rebuilds the normed inputs and the mid stream before the backward (redo_block).
    Pool& r = b.recompute == dsv4::Recompute::Selective ? b.redo : b.keep;
    for (cuda::MhcActs* a : {&b.sa, &b.sf}) {
      a->mix = k.take<float>(N * cuda::kMhcMix), a->rstd = k.take<float>(N), a->pre = k.take<float>(N * 4);
      a->post = k.take<float>(N * 4), a->comb = k.take<float>(N * 16);
    }
    // col_a / col_f stay null: the collapse is normalised in fp32 and never stored (mhc_norm.h).
    b.col_a = nullptr, b.a = r.take<bf16>(N * d), b.a_rstd = k.take<float>(N);
    b.y_a = k.take<bf16>(N * d), b.X_mid = r.take<bf16>(N * hc * d);
    b.col_f = nullptr, b.u = r.take<bf16>(N * d), b.u_rstd = k.take<float>(N);
    b.y_f = k.take<bf16>(N * d);
  }
  const SiteView v = site_view(b, s);
  m_.section("fwd.mhc+norm", true);
  site_norm(c_, hc, mhc_dims(m_.cfg, N), value(in), v.fn, v.base, v.scale, *v.acts, v.norm_w, float(m_.cfg.rms_eps),
            v.normed, v.rstd);
  m_.section("fwd.mhc+norm", false);
}

void CudaBackend::expand_fwd(const Pass& p, int64_t blk, Site s, Stream in, Stream out) {
  GpuBlock& b = block(blk);
  const SiteView v = site_view(b, s);
  m_.section("fwd.mhc+norm", true);
  cuda::mhc_expand_fwd_any(m_.cfg.hc_mult, mhc_dims(m_.cfg, p.n_tok), value(in), v.y, v.acts->post, v.acts->comb,
                           value(out));
  m_.section("fwd.mhc+norm", false);
  // The block's last forward op: selective recomputation drops what redo_block rebuilds.
  if (s == Site::Ffn && b.recompute == dsv4::Recompute::Selective) b.redo.clear();
  if (decoding_) mark(kPhaseMhc);
}

// A decode pass's site: the block's activation pointers are the pass's one reused set (the sub-layer input and
// output buffers serve both sites: each is consumed before the next site writes it). Decode steps are small (tens
// of tokens): one fused site + norm kernel, without the fn split and the mixing GEMM of the training path.
void CudaBackend::decode_site_norm(int64_t blk, Site s, Stream in) {
  GpuBlock& b = block(blk);
  DecodePass& dp = *dec_;
  if (s == Site::Attn) {
    b.keep.clear(), b.picks.clear();  // the previous pass's MoE selection
    b.sa = dp.sa, b.sf = dp.sf;
    b.col_a = b.col_f = nullptr;
    b.a = b.u = dp.an, b.y_a = b.y_f = dp.y, b.a_rstd = b.u_rstd = dp.rstd, b.X_mid = dp.Xmid;
  }
  const SiteView v = site_view(b, s);
  cuda::mhc_site_norm_fwd_any(m_.cfg.hc_mult, mhc_dims(m_.cfg, dp.st.n_tok), value(in), v.fn, v.base, v.scale,
                              *v.acts, v.norm_w, float(m_.cfg.rms_eps), v.normed, v.rstd);
  mark(kPhaseMhc);
}

void CudaBackend::release_block(const Pass& p, int64_t blk) {
  (void)p;
  GpuBlock& b = block(blk);
  m_.act_block_peak = std::max(m_.act_block_peak, b.keep.bytes() + b.redo.bytes());
  b.keep.clear(), b.redo.clear();  // stream-ordered: the next block's allocations reuse the memory
}

dsv4::Stream CudaBackend::block_input(int64_t blk) const {
  return blk == m_.l1 - m_.l0 ? Stream{Stream::MtpIn, 0} : Stream{Stream::X, blk};
}

// Selective recomputation, before the block's backward: the forward's kernels on its kept inputs rebuild, bit for
// bit, the attn site's normed input, the attention's cheap results, the mid stream and the ffn site's normed input
// (the sites' mixing rows are rewritten with the same values).
void CudaBackend::redo_block(const Pass& p, int64_t blk) {
  GpuBlock& b = block(blk);
  const int64_t N = p.n_tok, d = m_.cfg.hidden, hc = m_.cfg.hc_mult;
  const cuda::MhcDims md = mhc_dims(m_.cfg, N);
  const float eps = float(m_.cfg.rms_eps);
  const bf16* X = value(block_input(blk));
  m_.section("bwd.redo", true);
  b.redo.clear();
  b.a = b.redo.take<bf16>(N * d), b.X_mid = b.redo.take<bf16>(N * hc * d), b.u = b.redo.take<bf16>(N * d);
  const SiteView va = site_view(b, Site::Attn);
  site_norm(c_, hc, md, X, va.fn, va.base, va.scale, *va.acts, va.norm_w, eps, va.normed, va.rstd);
  dsv4gpu::attention_redo(c_, b);
  cuda::mhc_expand_fwd_any(hc, md, X, b.y_a, b.sa.post, b.sa.comb, b.X_mid);
  const SiteView vf = site_view(b, Site::Ffn);
  site_norm(c_, hc, md, b.X_mid, vf.fn, vf.base, vf.scale, *vf.acts, vf.norm_w, eps, vf.normed, vf.rstd);
  m_.section("bwd.redo", false);
}

void CudaBackend::attention_fwd(const Pass& p, int64_t blk) {
  GpuBlock& b = block(blk);
  const dsv4::ModelConfig& cfg = m_.cfg;
  const int64_t l = b.layer, N = p.n_tok;
  const int64_t* isel = nullptr;
  const bool main_layer = l < cfg.n_layers;
  if (inject_ && main_layer && b.dims.type == dsv4::AttnType::CSA && !inject_->csa_sel.empty() &&
      !inject_->csa_sel[size_t(l)].empty()) {
    TREX_CHECK(int64_t(inject_->csa_sel[size_t(l)].size()) == N * cfg.index_topk,
               "GPU model: injected CSA selection of layer {} has {} entries, expected {}", l,
               inject_->csa_sel[size_t(l)].size(), N * cfg.index_topk);
    isel = inject_->csa_sel[size_t(l)].data();
  }
  const char* an = attn_section(b, true);
  m_.section(an, true);
  dsv4gpu::attention_fwd(c_, b, p.replay ? nullptr : isel, p.replay);
  m_.section(an, false);
}

void CudaBackend::moe_fwd(const Pass& p, int64_t blk) {
  GpuBlock& b = block(blk);
  if (decoding_) {  // the router's own choice; the block's MoE temporaries are freed once its kernels are queued
    dsv4gpu::moe_fwd(c_, b, nullptr);
    b.keep.clear();
    mark(kPhaseMoe);
    return;
  }
  const dsv4::ModelConfig& cfg = m_.cfg;
  const int64_t l = b.layer, N = p.n_tok;
  const std::vector<int32_t>* sel = nullptr;
  if (inject_ && l < cfg.n_layers && !inject_->router_sel.empty()) sel = &inject_->router_sel[size_t(l)];
  if (inject_ && l == cfg.n_layers) sel = &inject_->mtp_router_sel;
  const int32_t* rsel = nullptr;
  if (sel && !sel->empty()) {
    TREX_CHECK(int64_t(sel->size()) == N * cfg.topk,
               "GPU model: injected router selection of {} has {} entries, expected {}", b.prefix, sel->size(),
               N * cfg.topk);
    rsel = sel->data();
  }
  c_.balanced_sel = nullptr;
  if (m_.opts.balanced_routing && !rsel) {
    const int64_t K = cfg.topk, E = cfg.n_routed_experts;
    if (balanced_n_ != N) {  // built once per token count (a pageable upload outside the steady state)
      std::vector<int32_t> t(size_t(N * K));
      for (int64_t i = 0; i < N * K; ++i) t[size_t(i)] = int32_t(i % E);
      balanced_sel_ = DevMem(t.size() * sizeof(int32_t));
      TREX_CUDA(cudaMemcpy(balanced_sel_.as<int32_t>(), t.data(), t.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      balanced_n_ = N;
    }
    c_.balanced_sel = balanced_sel_.as<int32_t>();
  }
  m_.section("fwd.moe", true);
  dsv4gpu::moe_fwd(c_, b, p.replay ? nullptr : rsel, p.replay);
  b.mo.dscores = nullptr;
  m_.section("fwd.moe", false);
}

void CudaBackend::balance_fwd(const Pass& p, int64_t blk, double alpha, double grad_scale) {
  GpuBlock& b = block(blk);
  const DevLayout& L = m_.lay;
  const int64_t E = m_.cfg.n_routed_experts;
  TREX_CHECK(p.replay || bal_rows_, "CUDA backend: the balance loss runs with GpuModelOptions::balance_alpha set "
             "(got alpha {} in a model built with 0)", alpha);
  m_.section("fwd.moe", true);
  b.mo.dscores = b.keep.take<float>(p.n_tok * E);
  // A replay recomputes only the gradient: its rows go to scratch, the forward's loss is already counted.
  Pool replay_rows(c_.scratch);
  double* rows = p.replay ? replay_rows.zeros<double>(L.B) : bal_rows_ + b.layer * L.B;
  double* scratch = (p.replay ? replay_rows : bal_).take<double>(cuda::balance_loss_scratch(L.B, L.S, E));
  cuda::balance_loss(b.mo.scores, b.mo.sel, L.B, L.S, E, m_.cfg.topk, alpha, rows, b.mo.dscores, scratch);
  if (grad_scale != 1.0) cuda::scale_f32(b.mo.dscores, float(grad_scale), p.n_tok * E);
  m_.section("fwd.moe", false);
}

// Head: hc_head collapse -> norm -> LM head + CE. A training forward (HeadMode::LossAndGrad) forms the CE
// gradient here while the logits are at hand (row blocks of full-vocabulary logits, lm_head_ce_fwd_grad):
// head.weight's gradient is accumulated now and d(normed) kept for the backward. Its scale is the backward's
// weight over the head's normaliser (Impl::head_normaliser: the labelled targets of the whole step or DP batch).
// A loss-only forward runs the vocabulary-chunked pass; the backward after it recomputes the logits.
void CudaBackend::head_loss_fwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets) {
  GpuModel::Impl& m = m_;
  const dsv4::ModelConfig& cfg = m.cfg;
  const bool mtp = h == HeadKind::Mtp;
  const int64_t N = p.n_tok, d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size;
  HeadState& hs = mtp ? m.mtp_head : m.head;
  hs.n_targets = 0;
  for (int64_t i = 0; i < N; ++i) hs.n_targets += targets[i] >= 0;
  upload_staged(hs.targets, mtp ? 1 : 0, targets, N);
  const int64_t G = m.head_normaliser(mtp, hs.n_targets);
  m.wait_gather(m.head_bucket);  // the MTP head shares head.weight
  if (mtp) m.wait_gather(m.mtp_bucket);
  const bool head_grad = head_ == HeadMode::LossAndGrad;
  const std::string pre = head_prefix(h);
  const bf16* X = value(in);
  m.section(mtp ? "fwd.mtp.head" : "fwd.head", true);
  hs.normed = m.acts.take<bf16>(N * d);
  hs.mix = m.acts.take<float>(N * 4), hs.rstd = m.acts.take<float>(N), hs.w = m.acts.take<float>(N * 4);
  hs.norm_rstd = m.acts.take<float>(N), hs.lse = m.acts.take<float>(N);
  hs.dnormed = head_grad ? m.acts.take<float>(N * d) : nullptr;
  cuda::hc_head_fwd_any(hc, nullptr, hs.mix, hs.rstd, hs.w, X, m.f32(pre + "hc_head_fn"), m.f32(pre + "hc_head_base"),
                        m.f32(pre + "hc_head_scale"), N, d, float(cfg.hc_eps), float(cfg.rms_eps));
  cuda::mhc_collapse_norm_fwd(hc, X, hs.w, m.b16(pre + "norm.weight"), N, d, float(cfg.rms_eps), hs.normed,
                              hs.norm_rstd);
  cuda::LmHeadCeShape s{N, d, V, std::min(m.opts.lm_chunk, V), m.opts.lm_rows, m.opts.lm_grad_rows};
  float* row_loss = loss_.take<float>(N);
  float* loss_sum = loss_.take<float>(1);
  (mtp ? mtp_sum_ : lm_sum_) = loss_sum;
  Pool tmp(c_.scratch);
  if (head_grad) {
    void* scratch = tmp.take<char>(int64_t(cuda::lm_head_ce_fwd_grad_scratch_bytes(s)));
    const double weight = mtp ? p.mtp_weight * p.loss_scale : p.loss_scale;
    const float scale = G > 0 ? float(weight / double(G)) : 0.f;
    cuda::lm_head_ce_fwd_grad(*m.gemm, s, hs.normed, m.b16("head.weight"), hs.targets.as<int32_t>(), scale, hs.lse,
                              row_loss, loss_sum, hs.dnormed, m.g32("head.weight"), scratch);
  } else {
    void* scratch = tmp.take<char>(int64_t(cuda::lm_head_ce_scratch_bytes(s)));
    cuda::lm_head_ce_fwd(*m.gemm, s, hs.normed, m.b16("head.weight"), hs.targets.as<int32_t>(), hs.lse, row_loss,
                         loss_sum, scratch);
  }
  m.section(mtp ? "fwd.mtp.head" : "fwd.head", false);
}

dsv4::LossParts CudaBackend::losses(const Pass& p) {
  (void)p;
  const dsv4::ModelConfig& cfg = m_.cfg;
  dsv4::LossParts lp;
  if (lm_sum_) {
    TREX_CUDA(cudaMemcpy(&lm_sum_host_, lm_sum_, sizeof(float), cudaMemcpyDeviceToHost));
    lp.lm = m_.global_targets > 0 ? double(lm_sum_host_) / double(m_.global_targets) : 0.0;
    lp.lm_targets = m_.head.n_targets;
  }
  if (mtp_sum_) {
    TREX_CUDA(cudaMemcpy(&mtp_sum_host_, mtp_sum_, sizeof(float), cudaMemcpyDeviceToHost));
    lp.mtp = m_.global_mtp_targets > 0 ? double(mtp_sum_host_) / double(m_.global_mtp_targets) : 0.0;
    lp.mtp_targets = m_.mtp_head.n_targets;
  }
  if (bal_rows_) {
    std::vector<double> rows(size_t((cfg.n_layers + 1) * m_.lay.B));
    TREX_CUDA(cudaMemcpy(rows.data(), bal_rows_, rows.size() * sizeof(double), cudaMemcpyDeviceToHost));
    for (double r : rows) lp.balance += r;
  }
  loss_.clear(), bal_.clear();
  lm_sum_ = mtp_sum_ = nullptr, bal_rows_ = nullptr;
  return lp;
}

void CudaBackend::upload_staged(DevMem& d, int part, const int32_t* src, int64_t n) {
  if (n > pinned_n_) {
    int32_t* p = nullptr;
    TREX_CUDA(cudaMallocHost(&p, size_t(3 * n) * sizeof(int32_t)));
    pinned_ = std::shared_ptr<int32_t>(p, [](int32_t* q) { cudaFreeHost(q); });
    pinned_n_ = n;
  }
  int32_t* h = pinned_.get() + part * pinned_n_;
  std::copy(src, src + n, h);
  if (d.bytes() < size_t(n) * sizeof(int32_t)) d = DevMem(size_t(n) * sizeof(int32_t));
  if (n) TREX_CUDA(cudaMemcpyAsync(d.as<int32_t>(), h, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice));
}

double CudaBackend::ce_sum(HeadKind h) const { return double(h == HeadKind::Mtp ? mtp_sum_host_ : lm_sum_host_); }

// ---- backward ----

void CudaBackend::begin_backward(float* dx_in) {
  const int64_t N = m_.lay.N, n = N * m_.cfg.hc_mult * m_.cfg.hidden;
  c_ = m_.ctx();
  gbufs_.clear();
  // The program's gradient stream alternates dA, dB down the layers from dA: after an even number of layers the
  // incoming stream's gradient is in dA. That one is the caller's buffer when it gave one.
  const bool in_a = (m_.l1 - m_.l0) % 2 == 0;
  dA_ = dx_in && in_a ? dx_in : gbufs_.take<float>(n);
  dB_ = dx_in && !in_a ? dx_in : gbufs_.take<float>(n);
  dMtp_[0] = dMtp_[1] = nullptr;
  if (m_.mtp()) dMtp_[0] = gbufs_.take<float>(n), dMtp_[1] = gbufs_.take<float>(n);
}

void CudaBackend::end_backward() {
  bg_.reset();
  gbufs_.clear();
  dA_ = dB_ = dMtp_[0] = dMtp_[1] = nullptr;
}

void CudaBackend::expand_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_out, Stream d_in) {
  GpuBlock& b = block(blk);
  const int64_t N = p.n_tok, d = m_.cfg.hidden, hc = m_.cfg.hc_mult;
  const cuda::MhcDims md = mhc_dims(m_.cfg, N);
  if (s == Site::Ffn) {  // the block's first backward op
    m_.block_weights(blk, true);  // ZeRO-3: gathered again (or still live), the layer below prefetched
    if (b.recompute == dsv4::Recompute::Selective) redo_block(p, blk);
    bg_ = std::make_unique<BlockGrads>();
    bg_->tmp.bind(c_.scratch);
    Pool& t = bg_->tmp;
    bg_->dX_mid = t.take<float>(N * hc * d);
    bg_->dpost = t.take<float>(N * 4);
    bg_->dcomb = t.take<float>(N * 16);
    bg_->dyb = t.take<bf16>(N * d);
    bg_->dsub = t.take<float>(N * d);
    bg_->dcol = t.take<float>(N * d);
    bg_->norm_part = t.take<float>(cuda::mhc_collapse_norm_dw_rows(N) * d);
    bg_->gate = cuda::mhc_fast_streams(hc) ? t.take<float>(N * hc) : nullptr;  // dcol . X[i]
    bg_->scratch = t.take<float>(cuda::mhc_site_bwd_scratch_any(hc, md));
  }
  TREX_CHECK(bg_, "CUDA backend: the attn expand's backward of block {} before its ffn expand's", blk);
  const SiteView v = site_view(b, s);
  m_.section("bwd.mhc+norm", true);
  cuda::mhc_expand_bwd_any(hc, md, value(in), v.y, v.acts->post, v.acts->comb, grad(d_out), grad(d_in), nullptr,
                           bg_->dpost, bg_->dcomb, nullptr, false, bg_->dyb);
  m_.section("bwd.mhc+norm", false);
}

void CudaBackend::moe_bwd(const Pass& p, int64_t blk) {
  GpuBlock& b = block(blk);
  m_.section("bwd.moe", true);
  TREX_CUDA(cudaMemsetAsync(bg_->dsub, 0, size_t(p.n_tok * m_.cfg.hidden) * sizeof(float), nullptr));
  dsv4gpu::moe_bwd(c_, b, bg_->dyb, bg_->dsub);
  m_.section("bwd.moe", false);
}

void CudaBackend::attention_bwd(const Pass& p, int64_t blk) {
  GpuBlock& b = block(blk);
  const char* an = attn_section(b, false);
  m_.section(an, true);
  TREX_CUDA(cudaMemsetAsync(bg_->dsub, 0, size_t(p.n_tok * m_.cfg.hidden) * sizeof(float), nullptr));
  dsv4gpu::attention_bwd(c_, b, bg_->dyb, bg_->dsub);
  m_.section(an, false);
}

void CudaBackend::site_norm_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_in) {
  GpuBlock& b = block(blk);
  const int64_t N = p.n_tok, d = m_.cfg.hidden, hc = m_.cfg.hc_mult;
  const SiteView v = site_view(b, s);
  const bf16* X = value(in);
  BlockGrads& g = *bg_;
  m_.section("bwd.mhc+norm", true);
  cuda::mhc_collapse_norm_bwd(hc, X, v.acts->pre, v.norm_w, v.rstd, g.dsub, N, d, g.dcol, v.g_norm,
                              v.g_norm ? g.norm_part : nullptr, g.gate);
  site_bwd(c_, hc, mhc_dims(m_.cfg, N), X, v.fn, v.base, v.scale, *v.acts, g.dcol, g.dpost, g.dcomb, grad(d_in),
           v.g_fn, v.g_base, v.g_scale, g.scratch, g.gate);
  m_.section("bwd.mhc+norm", false);
  if (s == Site::Attn) {  // the block's last backward op
    bg_.reset();
    if (b.recompute == dsv4::Recompute::Selective) {
      m_.act_block_peak = std::max(m_.act_block_peak, b.redo.bytes());
      b.redo.clear();
    }
  }
}

void CudaBackend::head_loss_bwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets, double weight,
                                Stream d_in, bool accumulate) {
  (void)targets;  // the forward's device copy (HeadState::targets)
  GpuModel::Impl& m = m_;
  const dsv4::ModelConfig& cfg = m.cfg;
  const bool mtp = h == HeadKind::Mtp;
  const int64_t N = p.n_tok, d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size;
  HeadState& hs = mtp ? m.mtp_head : m.head;
  const std::string pre = head_prefix(h);
  const bf16* X = value(in);
  float* dX = grad(d_in);
  const int64_t G = mtp ? m.global_mtp_targets : m.global_targets;
  m.wait_gather(m.head_bucket);  // ZeRO-3: kept from the forward (no-op), or gathered
  if (mtp) m.wait_gather(m.mtp_bucket);
  m.section(mtp ? "bwd.mtp.head" : "bwd.head", true);
  {
    Pool tmp(c_.scratch);
    // A training forward left d(normed) and head.weight's gradient (scaled by the weight Pass announced); after a
    // loss-only forward the logits are recomputed chunk by chunk. Consumed either way: a second backward
    // recomputes (and accumulates again).
    float* dnormed = hs.dnormed;
    hs.dnormed = nullptr;
    if (!dnormed) {
      cuda::LmHeadCeShape s{N, d, V, std::min(m.opts.lm_chunk, V)};
      void* scratch = tmp.take<char>(int64_t(cuda::lm_head_ce_scratch_bytes(s)));
      dnormed = tmp.zeros<float>(N * d);
      // Mean over the normaliser's targets (the whole DP batch): the reduce-scatter's sum is the global gradient.
      const float scale = G > 0 ? float(weight / double(G)) : 0.f;
      cuda::lm_head_ce_bwd(*m.gemm, s, hs.normed, m.b16("head.weight"), hs.targets.as<int32_t>(), hs.lse, scale,
                           dnormed, m.g32("head.weight"), scratch);
    }
    // fp32 from here on: the hc_head gate gradients dcol . X[i] cancel (mhc_norm.h).
    float* dcol = tmp.take<float>(N * d);
    float* g_norm = m.g32(pre + "norm.weight");
    float* dw_part = g_norm ? tmp.take<float>(cuda::mhc_collapse_norm_dw_rows(N) * d) : nullptr;
    float* gate = cuda::mhc_fast_streams(hc) ? tmp.take<float>(N * hc) : nullptr;  // dcol . X[i]
    cuda::mhc_collapse_norm_bwd(hc, X, hs.w, m.b16(pre + "norm.weight"), hs.norm_rstd, dnormed, N, d, dcol, g_norm,
                                dw_part, gate);
    float* hs_scratch = tmp.take<float>(cuda::hc_head_bwd_scratch_any(hc, N));
    // n_hc = 4: the fn gradient as a tensor-core GEMM on dmix split hi / lo (as site_bwd), not the kernel's pass.
    float* g_hfn = m.g32(pre + "hc_head_fn");
    const bool fn_gemm = cuda::mhc_fast_streams(hc) && g_hfn && N > 0;
    cuda::hc_head_bwd_any(hc, dX, fn_gemm ? nullptr : g_hfn, m.g32(pre + "hc_head_base"),
                          m.g32(pre + "hc_head_scale"), dcol, X, m.f32(pre + "hc_head_fn"),
                          m.f32(pre + "hc_head_base"), m.f32(pre + "hc_head_scale"), hs.mix, hs.rstd, hs.w, N, d,
                          hs_scratch, nullptr, gate, accumulate);
    if (fn_gemm) {
      const int64_t D = hc * d;
      bf16* dm = tmp.take<bf16>(N * 2 * hc);  // [N, 8]: dmix_hi | dmix_lo
      float* prod = tmp.take<float>(2 * hc * D);
      cuda::mhc_split_bf16(cuda::hc_head_bwd_dmix(N, hs_scratch), N, hc, 2 * hc, dm, dm + hc);
      cuda::GemmShape gs{2 * hc, D, N, true, false, cuda::GemmType::BF16, cuda::GemmType::F32, 1};
      m.gemm->run(gs, dm, X, prod, 1.f, 0.f);  // prod [8, D] = dm^T X
      cuda::mhc_add_split_rows(g_hfn, prod, hc, D);
    }
  }
  m.section(mtp ? "bwd.mtp.head" : "bwd.head", false);
}

// ---- the MTP input (gpu_mtp_cuda.cpp) ----

void CudaBackend::mtp_input_fwd(const Pass& p, const int32_t* next_ids, Stream main, Stream out) {
  m_.wait_gather(m_.mtp_bucket);  // the MTP module's parameters (its block and head follow)
  // embed.weight for Embed[token t+1]: the last pipeline stage's tied copy is all-gathered in its own bucket (no
  // embed_fwd here waited); ZeRO-3: gathered again, dropped after.
  m_.wait_gather(m_.embed_bucket);
  m_.section("fwd.mtp.input", true);
  upload_staged(m_.mtp_input.next_ids, 2, next_ids, p.n_tok);
  mtp_fwd(m_, c_, p.n_tok, next_ids, value(main), value(out));
  if (m_.wgather) m_.wgather->release(m_.embed_bucket);
  m_.section("fwd.mtp.input", false);
}

void CudaBackend::mtp_input_bwd(const Pass& p, const int32_t* next_ids, Stream main, Stream d_out, Stream d_main,
                                bool accumulate) {
  (void)next_ids;  // the forward's device copy
  m_.wait_gather(m_.mtp_bucket);  // ZeRO-3: kept from the forward (no-op), or gathered
  m_.section("bwd.mtp.input", true);
  mtp_bwd(m_, c_, p.n_tok, value(main), grad(d_out), grad(d_main), accumulate);
  m_.section("bwd.mtp.input", false);
}

}  // namespace trex::dsv4gpu
