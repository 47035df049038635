// The GPU model's step: batch layout upload, embedding, blocks (mHC site / norm / attention / expand, mHC site /
// norm / MoE / expand), hc_head, final norm, fused LM head + CE; the hand-written backward in reverse order.
#include <cmath>
#include <numeric>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/hc_head.h"
#include "kernels/cuda/balance.h"
#include "kernels/cuda/mhc_generic.h"
#include "kernels/cuda/mhc_norm.h"
#include "kernels/cuda/lm_head_ce.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/dsv4/loss.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

namespace {

template <typename T>
DevMem upload(const std::vector<T>& v) {
  DevMem m(v.size() * sizeof(T));
  if (!v.empty()) TREX_CUDA(cudaMemcpyAsync(m.as<T>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return m;
}

template <typename T>
std::vector<int32_t> to_i32(const std::vector<T>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

void make_rope(RopeDev& r, const std::vector<double>& inv_freq, int64_t n_pos) {
  const dsv4::RopeTable<float> t = dsv4::make_rope_table<float>(inv_freq, n_pos);
  r.n_pairs = t.n_pairs, r.n_pos = n_pos;
  r.cos = upload(t.cos);
  r.sin = upload(t.sin);
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
void site_norm_fwd(const Ctx& c, int64_t hc, const cuda::MhcDims& md, const bf16* X, const float* fn,
                   const float* base, const float* scale, const cuda::MhcActs& a, const bf16* norm_w, float eps,
                   bf16* normed, float* rstd) {
  const int64_t N = md.n_tok, D = hc * md.d;
  if (!cuda::mhc_fast_streams(hc) || !cuda::mhc_site_norm_fwd_serves(md.d) || N == 0) {
    cuda::mhc_site_norm_fwd_any(hc, md, X, fn, base, scale, a, norm_w, eps, normed, rstd);
    return;
  }
  Pool tmp;
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
  Pool tmp;
  bf16* dm = tmp.take<bf16>(N * 2 * K);  // [N, 48]: dmix_hi | dmix_lo
  float* prod = tmp.take<float>(2 * K * D);
  cuda::mhc_split_bf16(cuda::mhc_site_bwd_dmix(md, scratch), N, K, 2 * K, dm, dm + K);
  cuda::GemmShape gs{2 * K, D, N, true, false, cuda::GemmType::BF16, cuda::GemmType::F32, 1};
  c.gemm->run(gs, dm, X, prod, 1.f, 0.f);  // prod [48, D] = dm^T X
  cuda::mhc_add_split_rows(dfn, prod, K, D);
}

}  // namespace

void rmsnorm_bwd_full(const Ctx& c, bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                      const float* rstd, int64_t n, int64_t d) {
  (void)c;
  if (n == 0) return;
  if (!dw) {
    cuda::rmsnorm_bwd(dx, nullptr, dy, x, w, rstd, n, d);
    return;
  }
  const int64_t rows = cuda::rmsnorm_dw_partial_rows(n);
  DevMem part(size_t(rows * d) * sizeof(float));
  cuda::rmsnorm_bwd(dx, part.as<float>(), dy, x, w, rstd, n, d);
  cuda::rmsnorm_dw_reduce(dw, part.as<float>(), rows, d);
}

GpuModel::Impl::~Impl() {
  for (auto& s : open_sections) cudaEventDestroy(s.start), cudaEventDestroy(s.stop);
  for (auto& s : done_sections) cudaEventDestroy(s.start), cudaEventDestroy(s.stop);
}

void GpuModel::Impl::section(const char* name, bool begin) {
  if (!opts.timing) return;
  if (begin) {
    Section s{name, nullptr, nullptr};
    TREX_CUDA(cudaEventCreate(&s.start));
    TREX_CUDA(cudaEventCreate(&s.stop));
    TREX_CUDA(cudaEventRecord(s.start, nullptr));
    open_sections.push_back(s);
  } else {
    TREX_CHECK(!open_sections.empty() && open_sections.back().name == name, "GPU model: unbalanced section {}", name);
    Section s = open_sections.back();
    open_sections.pop_back();
    TREX_CUDA(cudaEventRecord(s.stop, nullptr));
    done_sections.push_back(s);
  }
}

Ctx GpuModel::Impl::ctx() {
  Ctx c;
  c.cfg = &cfg;
  c.gemm = &gemm;
  c.lin = Linear{&gemm};
  c.lay = &lay;
  c.rope_main = &rope_main;
  c.rope_compress = &rope_compress;
  c.section = [this](const char* n, bool b) { section(n, b); };
  c.ep = opts.ep;
  c.grouped_experts = opts.moe_grouped_gemm;
  return c;
}

// Expert parallelism: which routed experts this rank holds (gpu_impl.h, region X), checked before any
// allocation; the expert-data-parallel group when DP is larger than EP.
static void configure_experts(GpuModel::Impl& m, const dsv4::ModelConfig& cfg, const GpuModelOptions& opts) {
  const int64_t E = cfg.n_routed_experts;
  if (opts.ep && opts.ep->size() > 1) {
    m.ep_size = opts.ep->size(), m.ep_rank = opts.ep->rank();
    TREX_CHECK(device_memory_comm(*opts.ep),
               "GPU model rank {}: the expert-parallel group must be a device-memory communicator (nccl or threads), "
               "got '{}'", m.ep_rank, opts.ep->backend());
    TREX_CHECK(E % m.ep_size == 0, "GPU model: {} expert-parallel ranks do not divide the {} routed experts",
               m.ep_size, E);
  }
  m.e_begin = m.ep_rank * (E / m.ep_size), m.e_end = m.e_begin + E / m.ep_size;
  if (m.ep_size > 1 && m.dp_size > 1) {
    TREX_CHECK(m.dp_size % m.ep_size == 0,
               "GPU model: expert parallelism folds into data parallelism: {} EP ranks must divide the {} DP ranks",
               m.ep_size, m.dp_size);
    // The DP ranks holding the same experts (same EP rank): sum their expert gradients.
    if (m.dp_size > m.ep_size) m.edp = m.dp->split(m.ep_rank, m.dp_rank);
  }
}

GpuModel::GpuModel(const dsv4::ModelConfig& cfg, const GpuModelOptions& opts)
    : impl_(std::make_unique<Impl>(cfg, opts)) {
  cfg.validate();
  TREX_CHECK(cfg.n_mtp == 0, "GPU model: the MTP module is not implemented on the GPU (config has {} MTP layers)",
             cfg.n_mtp);
  // hc_mult 4: the fast mHC / hc_head kernels; 1..3 (the parity fixtures): the generic ones (mhc_generic.h, *_any).
  TREX_CHECK(cfg.hc_mult >= 1 && cfg.hc_mult <= cuda::kMhcGenericMaxStreams,
             "GPU model: hc_mult {} unsupported (the mHC kernels serve 1..{})", cfg.hc_mult,
             cuda::kMhcGenericMaxStreams);
  TREX_CHECK(cfg.score_func == "sqrtsoftplus" && cfg.norm_topk_prob,
             "GPU model: only sqrtsoftplus routing with normalised top-k weights is implemented");
  // Keep freed stream-ordered memory in the pool (no release at synchronisation points).
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t threshold = UINT64_MAX;
  TREX_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  Impl& m = *impl_;
  if (opts.dp && opts.dp->size() > 1) {
    m.dp = opts.dp, m.dp_size = opts.dp->size(), m.dp_rank = opts.dp->rank();
    TREX_CHECK(device_memory_comm(*m.dp),
               "GPU model rank {}: the data-parallel group must be a device-memory communicator (nccl or threads), "
               "got '{}'", m.dp_rank, m.dp->backend());
    TREX_CHECK(64 % m.dp_size == 0, "GPU model: data-parallel size {} must divide 64 (bucket slicing)", m.dp_size);
  }
  configure_experts(m, cfg, opts);
  m.l0 = opts.layer_begin, m.l1 = opts.layer_end < 0 ? cfg.n_layers : opts.layer_end;
  TREX_CHECK(m.l0 >= 0 && m.l0 < m.l1 && m.l1 <= cfg.n_layers,
             "GPU model: stage layers [{}, {}) outside the model's {} layers (or empty)", m.l0, m.l1, cfg.n_layers);
  const bool partial = !m.first_stage() || !m.last_stage();
  TREX_CHECK(!partial || (m.dp_size == 1 && !opts.ep),
             "GPU model: a pipeline stage (layers [{}, {})) cannot be combined with data / expert parallelism yet",
             m.l0, m.l1);
  TREX_CHECK(opts.stage_slots >= 1, "GPU model: stage_slots {} must be >= 1", opts.stage_slots);
  m.slots.resize(size_t(opts.stage_slots));
  for (auto& sl : m.slots) sl.blocks.resize(size_t(cfg.n_layers));
  m.declare_all();
  m.shard_a = m.region_x + (m.region_a - m.region_x) / m.dp_size;
  int64_t off = m.region_x;
  for (auto& b : m.buckets) b.shard_off = off, off += b.slice(m.dp_size);
  const size_t n = size_t(m.total), ns = size_t(m.shard_elems());  // ns == n on one GPU
  m.master = DevMem(ns * 4), m.compute = DevMem(n * 2);
  TREX_CUDA(cudaMemsetAsync(m.master.as<float>(), 0, ns * 4, nullptr));
  TREX_CUDA(cudaMemsetAsync(m.compute.as<bf16>(), 0, n * 2, nullptr));
  if (opts.gradients) {
    m.grads = DevMem(n * 4);
    TREX_CUDA(cudaMemsetAsync(m.grads.as<float>(), 0, n * 4, nullptr));
  }
  m.bind_all();
}

GpuModel::~GpuModel() = default;

double GpuModel::forward(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                         const Injection* inject, HeadMode head) {
  TREX_CHECK(impl_->first_stage() && impl_->last_stage(),
             "GPU model: forward() needs the whole model; a pipeline stage (layers [{}, {})) runs forward_stage",
             impl_->l0, impl_->l1);
  impl_->step_mode = false;
  return forward_impl(ids, labels, layout, inject, nullptr, head);
}

double GpuModel::forward_impl(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                              const Injection* inject, const void* x_in, HeadMode head) {
  Impl& m = *impl_;
  if (head == HeadMode::LossAndGrad) m.require_gradients("a training forward (HeadMode::LossAndGrad)");
  const dsv4::ModelConfig& cfg = m.cfg;
  layout.validate();
  const int64_t B = layout.B, S = layout.T, N = B * S, d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size;
  for (int64_t i = 0; i < N; ++i)
    TREX_CHECK(ids[i] >= 0 && ids[i] < V, "GPU model: token id {} at position {} outside [0, {})", ids[i], i, V);

  // Layout on the device (positions, windows, compress plans, targets).
  DevLayout& L = m.lay;
  L.B = B, L.S = S, L.N = N;
  L.pos = upload(to_i32(layout.pos));
  std::vector<int64_t> win(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t i = b * S + t;
      win[size_t(i)] = b * S + std::max(layout.doc_start[size_t(i)], t - cfg.window + 1);
    }
  L.win_begin = upload(win);
  L.ids = upload(std::vector<int32_t>(ids, ids + N));
  const std::vector<int32_t> targets = dsv4::shifted_targets(labels, layout.doc_start.data(), B, S, 1, V);
  L.n_targets = 0;
  for (int32_t t : targets) L.n_targets += t >= 0;
  L.targets = upload(targets);
  std::vector<int32_t> iota(static_cast<size_t>(N));
  std::iota(iota.begin(), iota.end(), 0);
  L.token_iota = upload(iota);
  L.plans.clear();
  for (int64_t l = m.l0; l < m.l1; ++l) {
    const int64_t r = cfg.compress_ratio[size_t(l)];
    if (r == 0 || L.plans.count(r)) continue;
    DevPlan& p = L.plans[r];
    p.host = dsv4::make_compress_plan(layout, r);
    std::vector<int32_t> epos(p.host.entry_first.size());
    for (size_t e = 0; e < epos.size(); ++e) epos[e] = int32_t(layout.pos[size_t(p.host.entry_first[e])]);
    p.entry_first = upload(to_i32(p.host.entry_first));
    p.entry_doc = upload(to_i32(p.host.entry_doc_index));
    p.entry_pos = upload(epos);
    p.vis_begin = upload(p.host.vis_begin);
    p.vis_end = upload(p.host.vis_end);
    p.max_visible = 0;
    for (int64_t i = 0; i < N; ++i)
      p.max_visible = std::max(p.max_visible, p.host.vis_end[size_t(i)] - p.host.vis_begin[size_t(i)]);
  }
  const int64_t n_pos = layout.max_pos() + 1;
  if (n_pos != m.rope_pos) {
    make_rope(m.rope_main, dsv4::rope_inv_freq(cfg.rope_main, cfg.rope_dim), n_pos);
    make_rope(m.rope_compress, dsv4::rope_inv_freq(cfg.rope_compress, cfg.rope_dim), n_pos);
    m.rope_pos = n_pos;
  }
  if (inject) {
    TREX_CHECK(inject->csa_sel.empty() || int64_t(inject->csa_sel.size()) == cfg.n_layers,
               "GPU model: csa_sel injection has {} layers, the model {}", inject->csa_sel.size(), cfg.n_layers);
    TREX_CHECK(inject->router_sel.empty() || int64_t(inject->router_sel.size()) == cfg.n_layers,
               "GPU model: router_sel injection has {} layers, the model {}", inject->router_sel.size(), cfg.n_layers);
  }

  const Ctx c = m.ctx();
  m.acts.clear();
  m.head_dnormed = nullptr;  // lived in acts
  m.X.assign(size_t(cfg.n_layers + 1), nullptr);
  for (int64_t l = m.l0; l <= m.l1; ++l) m.X[size_t(l)] = m.acts.take<bf16>(N * hc * d);
  if (m.first_stage()) {
    m.wait_gather(m.embed_bucket);  // data parallel: this step's parameters, all-gathered bucket by bucket
    cuda::embed_streams_fwd(m.X[0], L.ids.as<int32_t>(), m.b16("embed.weight"), N, d, hc);
  } else {  // the previous stage's output (kept: the first block's backward reads it)
    TREX_CHECK(x_in, "GPU model stage [{}, {}): forward needs the incoming stream x_in", m.l0, m.l1);
    TREX_CUDA(cudaMemcpyAsync(m.X[size_t(m.l0)], x_in, size_t(N * hc * d) * sizeof(bf16), cudaMemcpyDeviceToDevice,
                              nullptr));
  }
  const cuda::MhcDims md = mhc_dims(cfg, N);
  // Balance loss: per eligible layer, row losses [n_layers, B] summed on the host with the head's loss.
  const bool balance = m.opts.balance_alpha != 0.0;
  TREX_CHECK(!balance || (!m.step_mode && m.dp_size == 1 && !m.opts.ep),
             "GPU model: the balance loss (balance_alpha {}) runs on one GPU in whole-model steps only (not with data "
             "/ expert parallelism or pipeline stages)",
             m.opts.balance_alpha);
  Pool bal;
  double* bal_rows = nullptr;
  if (balance) {
    bal_rows = bal.zeros<double>(cfg.n_layers * L.B);
  }
  for (int64_t l = m.l0; l < m.l1; ++l) {
    GpuBlock& b = *m.blocks[size_t(l)];
    m.wait_gather(m.layer_bucket[size_t(l)]);
    b.keep.clear();
    Pool& k = b.keep;
    for (cuda::MhcActs* s : {&b.sa, &b.sf}) {
      s->mix = k.take<float>(N * cuda::kMhcMix), s->rstd = k.take<float>(N), s->pre = k.take<float>(N * 4);
      s->post = k.take<float>(N * 4), s->comb = k.take<float>(N * 16);
    }
    // col_a / col_f stay null: the collapse is normalised in fp32 and never stored (mhc_norm.h).
    b.col_a = nullptr, b.a = k.take<bf16>(N * d), b.a_rstd = k.take<float>(N);
    b.y_a = k.take<bf16>(N * d), b.X_mid = k.take<bf16>(N * hc * d);
    b.col_f = nullptr, b.u = k.take<bf16>(N * d), b.u_rstd = k.take<float>(N);
    b.y_f = k.take<bf16>(N * d);
    const bf16* Xin = m.X[size_t(l)];
    m.section("fwd.mhc+norm", true);
    site_norm_fwd(c, hc, md, Xin, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, b.sa, b.attn_norm,
                  float(cfg.rms_eps), b.a, b.a_rstd);
    m.section("fwd.mhc+norm", false);
    const bool csa = b.dims.type == dsv4::AttnType::CSA;
    const int64_t* isel = nullptr;
    if (inject && csa && !inject->csa_sel.empty() && !inject->csa_sel[size_t(l)].empty()) {
      TREX_CHECK(int64_t(inject->csa_sel[size_t(l)].size()) == N * cfg.index_topk,
                 "GPU model: injected CSA selection of layer {} has {} entries, expected {}", l,
                 inject->csa_sel[size_t(l)].size(), N * cfg.index_topk);
      isel = inject->csa_sel[size_t(l)].data();
    }
    const char* an = b.dims.type == dsv4::AttnType::Sliding ? "fwd.attn.sliding" : csa ? "fwd.attn.csa" : "fwd.attn.hca";
    m.section(an, true);
    attention_fwd(c, b, isel);
    m.section(an, false);
    m.section("fwd.mhc+norm", true);
    cuda::mhc_expand_fwd_any(hc, md, Xin, b.y_a, b.sa.post, b.sa.comb, b.X_mid);
    site_norm_fwd(c, hc, md, b.X_mid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, b.sf, b.ffn_norm,
                  float(cfg.rms_eps), b.u, b.u_rstd);
    m.section("fwd.mhc+norm", false);
    const int32_t* rsel = nullptr;
    if (inject && !inject->router_sel.empty() && !inject->router_sel[size_t(l)].empty()) {
      TREX_CHECK(int64_t(inject->router_sel[size_t(l)].size()) == N * cfg.topk,
                 "GPU model: injected router selection of layer {} has {} entries, expected {}", l,
                 inject->router_sel[size_t(l)].size(), N * cfg.topk);
      rsel = inject->router_sel[size_t(l)].data();
    }
    m.section("fwd.moe", true);
    moe_fwd(c, b, rsel);
    b.mo.dscores = nullptr;
    if (balance && (!b.hash || m.opts.balance_hash_layers)) {
      const int64_t E = cfg.n_routed_experts;
      b.mo.dscores = k.take<float>(N * E);
      double* scratch = bal.take<double>(cuda::balance_loss_scratch(L.B, L.S, E));
      cuda::balance_loss(b.mo.scores, b.mo.sel, L.B, L.S, E, cfg.topk, m.opts.balance_alpha, bal_rows + l * L.B,
                         b.mo.dscores, scratch);
    }
    m.section("fwd.moe", false);
    m.section("fwd.mhc+norm", true);
    cuda::mhc_expand_fwd_any(hc, md, b.X_mid, b.y_f, b.sf.post, b.sf.comb, m.X[size_t(l + 1)]);
    m.section("fwd.mhc+norm", false);
  }

  if (!m.last_stage()) {  // the stream X[l1] goes to the next stage
    m.forward_done = true;
    return 0.0;
  }
  // Head: hc_head collapse -> norm -> LM head + CE. A training forward (HeadMode::LossAndGrad) forms the CE
  // gradient here while the logits are at hand (row blocks of full-vocabulary logits, lm_head_ce_fwd_grad):
  // head.weight's gradient is accumulated now and d(normed) kept for backward(). Its scale is 1 / the labelled
  // targets of the whole step (begin_step) or DP batch, so with a DP group the count is all-reduced first. A
  // loss-only forward runs the vocabulary-chunked pass; a backward() after it recomputes the logits.
  const bool head_grad = head == HeadMode::LossAndGrad;
  if (!m.step_mode) {
    m.global_targets = L.n_targets;
    if (m.dp_size > 1) {  // the loss normaliser over the whole DP batch
      double h1 = double(L.n_targets);
      DevMem d1(sizeof(h1));
      TREX_CUDA(cudaMemcpy(d1.as<double>(), &h1, sizeof(h1), cudaMemcpyHostToDevice));
      m.dp->all_reduce(d1.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
      TREX_CUDA(cudaMemcpy(&h1, d1.as<double>(), sizeof(h1), cudaMemcpyDeviceToHost));
      m.global_targets = int64_t(std::llround(h1));
    }
  }
  m.wait_gather(m.head_bucket);
  m.section("fwd.head", true);
  m.head_col = nullptr, m.head_normed = m.acts.take<bf16>(N * d);  // the collapse stays fp32 (mhc_norm.h)
  m.head_mix = m.acts.take<float>(N * 4), m.head_rstd = m.acts.take<float>(N), m.head_w = m.acts.take<float>(N * 4);
  m.norm_rstd = m.acts.take<float>(N), m.lse = m.acts.take<float>(N);
  m.head_dnormed = head_grad ? m.acts.take<float>(N * d) : nullptr;
  cuda::hc_head_fwd_any(hc, nullptr, m.head_mix, m.head_rstd, m.head_w, m.X[size_t(cfg.n_layers)],
                        m.f32("hc_head_fn"), m.f32("hc_head_base"), m.f32("hc_head_scale"), N, d,
                        float(cfg.hc_eps), float(cfg.rms_eps));
  cuda::mhc_collapse_norm_fwd(hc, m.X[size_t(cfg.n_layers)], m.head_w, m.b16("norm.weight"), N, d,
                              float(cfg.rms_eps), m.head_normed, m.norm_rstd);
  cuda::LmHeadCeShape hs{N, d, V, std::min(m.opts.lm_chunk, V), m.opts.lm_rows, m.opts.lm_grad_rows};
  Pool tmp;
  float* row_loss = tmp.take<float>(N);
  float* loss_sum = tmp.take<float>(1);
  if (head_grad) {
    void* scratch = tmp.take<char>(int64_t(cuda::lm_head_ce_fwd_grad_scratch_bytes(hs)));
    const float scale = m.global_targets > 0 ? float(1.0 / double(m.global_targets)) : 0.f;
    cuda::lm_head_ce_fwd_grad(m.gemm, hs, m.head_normed, m.b16("head.weight"), L.targets.as<int32_t>(), scale,
                              m.lse, row_loss, loss_sum, m.head_dnormed, m.g32("head.weight"), scratch);
  } else {
    void* scratch = tmp.take<char>(int64_t(cuda::lm_head_ce_scratch_bytes(hs)));
    cuda::lm_head_ce_fwd(m.gemm, hs, m.head_normed, m.b16("head.weight"), L.targets.as<int32_t>(), m.lse, row_loss,
                         loss_sum, scratch);
  }
  float h_loss = 0.f;
  TREX_CUDA(cudaMemcpy(&h_loss, loss_sum, sizeof(float), cudaMemcpyDeviceToHost));
  m.section("fwd.head", false);
  m.forward_done = true;
  if (m.step_mode)  // this micro-batch's share of the step's mean loss
    return m.global_targets > 0 ? double(h_loss) / double(m.global_targets) : 0.0;
  double balance_loss = 0;
  if (balance) {
    std::vector<double> rows(size_t(cfg.n_layers * L.B));
    TREX_CUDA(cudaMemcpy(rows.data(), bal_rows, rows.size() * sizeof(double), cudaMemcpyDeviceToHost));
    for (double r : rows) balance_loss += r;
  }
  double total_loss = h_loss;
  if (m.dp_size > 1) {  // the loss over the whole DP batch
    DevMem d1(sizeof(total_loss));
    TREX_CUDA(cudaMemcpy(d1.as<double>(), &total_loss, sizeof(total_loss), cudaMemcpyHostToDevice));
    m.dp->all_reduce(d1.as<double>(), 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
    TREX_CUDA(cudaMemcpy(&total_loss, d1.as<double>(), sizeof(total_loss), cudaMemcpyDeviceToHost));
  }
  return (m.global_targets > 0 ? total_loss / double(m.global_targets) : 0.0) + balance_loss;
}

void GpuModel::backward() {
  TREX_CHECK(impl_->first_stage() && impl_->last_stage(),
             "GPU model: backward() needs the whole model; a pipeline stage (layers [{}, {})) runs backward_stage",
             impl_->l0, impl_->l1);
  backward_impl(nullptr);
}

void GpuModel::backward_impl(const float* dx_out) {
  Impl& m = *impl_;
  TREX_CHECK(m.forward_done, "GPU model: backward() called without a forward()");
  m.require_gradients("backward()");
  m.grads_zero = false;  // gradients accumulate from here on (zero_grads() must clear them again)
  const dsv4::ModelConfig& cfg = m.cfg;
  const int64_t N = m.lay.N, d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size;
  const Ctx c = m.ctx();
  const cuda::MhcDims md = mhc_dims(cfg, N);
  Pool bufs;
  float* dX = bufs.take<float>(N * hc * d);  // written by hc_head's backward (accumulate = false) or the copy below
  float* dX_prev = bufs.take<float>(N * hc * d);
  if (!m.last_stage()) {  // the next stage's gradient of X[l1]
    TREX_CHECK(dx_out, "GPU model stage [{}, {}): backward needs the gradient dx_out of its output", m.l0, m.l1);
    TREX_CUDA(cudaMemcpyAsync(dX, dx_out, size_t(N * hc * d) * sizeof(float), cudaMemcpyDeviceToDevice, nullptr));
  } else {  // the last stage: the head's backward from the loss
    m.section("bwd.head", true);
    {
      Pool tmp;
      // A training forward left d(normed) and head.weight's gradient; after a loss-only forward the logits are
      // recomputed chunk by chunk. Consumed either way: a second backward() recomputes (and accumulates again).
      float* dnormed = m.head_dnormed;
      m.head_dnormed = nullptr;
      if (!dnormed) {
        cuda::LmHeadCeShape hs{N, d, V, std::min(m.opts.lm_chunk, V)};
        void* scratch = tmp.take<char>(int64_t(cuda::lm_head_ce_scratch_bytes(hs)));
        dnormed = tmp.zeros<float>(N * d);
        // Mean over the targets of the whole (DP) batch: the reduce-scatter's sum is then the global gradient.
        const float scale = m.global_targets > 0 ? float(1.0 / double(m.global_targets)) : 0.f;
        cuda::lm_head_ce_bwd(m.gemm, hs, m.head_normed, m.b16("head.weight"), m.lay.targets.as<int32_t>(), m.lse,
                             scale, dnormed, m.g32("head.weight"), scratch);
      }
      // fp32 from here on: the hc_head gate gradients dcol . X[i] cancel (mhc_norm.h).
      float* dcol = tmp.take<float>(N * d);
      float* g_norm = m.g32("norm.weight");
      float* dw_part = g_norm ? tmp.take<float>(cuda::mhc_collapse_norm_dw_rows(N) * d) : nullptr;
      float* gate = cuda::mhc_fast_streams(hc) ? tmp.take<float>(N * hc) : nullptr;  // dcol . X[i]
      cuda::mhc_collapse_norm_bwd(hc, m.X[size_t(cfg.n_layers)], m.head_w, m.b16("norm.weight"), m.norm_rstd,
                                  dnormed, N, d, dcol, g_norm, dw_part, gate);
      float* hs_scratch = tmp.take<float>(cuda::hc_head_bwd_scratch_any(hc, N));
      // n_hc = 4: the fn gradient as a tensor-core GEMM on dmix split hi / lo (as site_bwd), not the kernel's pass.
      float* g_hfn = m.g32("hc_head_fn");
      const bool fn_gemm = cuda::mhc_fast_streams(hc) && g_hfn && N > 0;
      cuda::hc_head_bwd_any(hc, dX, fn_gemm ? nullptr : g_hfn, m.g32("hc_head_base"), m.g32("hc_head_scale"), dcol,
                            m.X[size_t(cfg.n_layers)], m.f32("hc_head_fn"), m.f32("hc_head_base"),
                            m.f32("hc_head_scale"), m.head_mix, m.head_rstd, m.head_w, N, d, hs_scratch, nullptr,
                            gate, /*accumulate=*/false);
      if (fn_gemm) {
        const int64_t D = hc * d;
        bf16* dm = tmp.take<bf16>(N * 2 * hc);  // [N, 8]: dmix_hi | dmix_lo
        float* prod = tmp.take<float>(2 * hc * D);
        cuda::mhc_split_bf16(cuda::hc_head_bwd_dmix(N, hs_scratch), N, hc, 2 * hc, dm, dm + hc);
        cuda::GemmShape gs{2 * hc, D, N, true, false, cuda::GemmType::BF16, cuda::GemmType::F32, 1};
        m.gemm.run(gs, dm, m.X[size_t(cfg.n_layers)], prod, 1.f, 0.f);  // prod [8, D] = dm^T X
        cuda::mhc_add_split_rows(g_hfn, prod, hc, D);
      }
    }
    m.section("bwd.head", false);
    m.reduce_bucket(m.head_bucket);
  }

  for (int64_t l = m.l1 - 1; l >= m.l0; --l) {
    GpuBlock& b = *m.blocks[size_t(l)];
    const bf16* Xin = m.X[size_t(l)];
    Pool tmp;
    // The expand backwards WRITE dX_mid / dX_prev and the bf16 dy (accumulate = false): no zero fills, no casts.
    float* dX_mid = tmp.take<float>(N * hc * d);
    float* dpost = tmp.take<float>(N * 4);
    float* dcomb = tmp.take<float>(N * 16);
    bf16* dyb = tmp.take<bf16>(N * d);
    float* dsub = tmp.take<float>(N * d);
    float* dcol = tmp.take<float>(N * d);  // fp32: the gate gradients dcol . X[i] cancel (mhc_norm.h)
    float* norm_part = tmp.take<float>(cuda::mhc_collapse_norm_dw_rows(N) * d);
    float* gate = cuda::mhc_fast_streams(hc) ? tmp.take<float>(N * hc) : nullptr;  // dcol . X[i]
    float* scratch = tmp.take<float>(cuda::mhc_site_bwd_scratch_any(hc, md));
    m.section("bwd.mhc+norm", true);
    cuda::mhc_expand_bwd_any(hc, md, b.X_mid, b.y_f, b.sf.post, b.sf.comb, dX, dX_mid, nullptr, dpost, dcomb,
                             nullptr, false, dyb);
    m.section("bwd.mhc+norm", false);
    m.section("bwd.moe", true);
    TREX_CUDA(cudaMemsetAsync(dsub, 0, size_t(N * d) * sizeof(float), nullptr));
    moe_bwd(c, b, dyb, dsub);
    m.section("bwd.moe", false);
    m.section("bwd.mhc+norm", true);
    cuda::mhc_collapse_norm_bwd(hc, b.X_mid, b.sf.pre, b.ffn_norm, b.u_rstd, dsub, N, d, dcol, b.g_ffn_norm,
                                b.g_ffn_norm ? norm_part : nullptr, gate);
    site_bwd(c, hc, md, b.X_mid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, b.sf, dcol, dpost, dcomb, dX_mid,
             b.g_hc_ffn_fn, b.g_hc_ffn_base, b.g_hc_ffn_scale, scratch, gate);
    cuda::mhc_expand_bwd_any(hc, md, Xin, b.y_a, b.sa.post, b.sa.comb, dX_mid, dX_prev, nullptr, dpost, dcomb,
                             nullptr, false, dyb);
    m.section("bwd.mhc+norm", false);
    const char* an = b.dims.type == dsv4::AttnType::Sliding ? "bwd.attn.sliding"
                     : b.dims.type == dsv4::AttnType::CSA  ? "bwd.attn.csa"
                                                           : "bwd.attn.hca";
    m.section(an, true);
    TREX_CUDA(cudaMemsetAsync(dsub, 0, size_t(N * d) * sizeof(float), nullptr));
    attention_bwd(c, b, dyb, dsub);
    m.section(an, false);
    m.section("bwd.mhc+norm", true);
    cuda::mhc_collapse_norm_bwd(hc, Xin, b.sa.pre, b.attn_norm, b.a_rstd, dsub, N, d, dcol, b.g_attn_norm,
                                b.g_attn_norm ? norm_part : nullptr, gate);
    site_bwd(c, hc, md, Xin, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, b.sa, dcol, dpost, dcomb, dX_prev,
             b.g_hc_attn_fn, b.g_hc_attn_base, b.g_hc_attn_scale, scratch, gate);
    m.section("bwd.mhc+norm", false);
    m.reduce_bucket(m.layer_bucket[size_t(l)]);  // overlaps the backward of the layers below
    std::swap(dX, dX_prev);
  }
  if (!m.first_stage()) {  // dX is the gradient of x_in: kept (with its pool) for the send to the previous stage
    m.grad_out = std::move(bufs);
    m.dx_in = dX;
    TREX_CUDA(cudaGetLastError());
    return;
  }
  cuda::embed_streams_bwd(m.g32("embed.weight"), m.lay.ids.as<int32_t>(), dX, N, d, hc);
  TREX_CUDA(cudaGetLastError());
  m.reduce_bucket(m.embed_bucket);
  if (m.dp_size > 1)  // region R (fp32-read, replicated): summed on every rank
    m.grad_work.push_back(m.dp->all_reduce(m.grads.as<float>() + m.region_a, size_t(m.total - m.region_a),
                                           comm::ElemType::F32, comm::ReduceOp::Sum));
}

// ---- Pipeline stage steps: the live batch state above belongs to one micro-batch at a time; the others are
// parked in slots and swapped in for their forward / backward.

void GpuModel::Impl::swap_slot(int s) {
  Slot& z = slots[size_t(s)];
  std::swap(lay, z.lay);
  std::swap(acts, z.acts), std::swap(grad_out, z.grad_out);
  std::swap(X, z.X);
  std::swap(head_col, z.head_col), std::swap(head_normed, z.head_normed), std::swap(head_mix, z.head_mix);
  std::swap(head_rstd, z.head_rstd), std::swap(head_w, z.head_w), std::swap(norm_rstd, z.norm_rstd);
  std::swap(lse, z.lse), std::swap(dx_in, z.dx_in), std::swap(forward_done, z.forward_done);
  std::swap(head_dnormed, z.head_dnormed);
  for (int64_t l = l0; l < l1; ++l) swap_saved(*blocks[size_t(l)], z.blocks[size_t(l)]);
}

namespace {
// Swaps a slot in for one call and back out at the end (also on an exception).
struct SlotScope {
  GpuModel::Impl& m;
  int s;
  SlotScope(GpuModel::Impl& m_, int s_) : m(m_), s(s_) { m.swap_slot(s); }
  ~SlotScope() { m.swap_slot(s); }
};

int slot_of(const GpuModel::Impl& m, int64_t micro) {
  TREX_CHECK(micro >= 0, "GPU model: micro-batch {} must be >= 0", micro);
  return int(micro % int64_t(m.slots.size()));
}
}  // namespace

void GpuModel::begin_step(int64_t step_targets) {
  TREX_CHECK(step_targets >= 0, "GPU model: step targets {} must be >= 0", step_targets);
  impl_->step_mode = true;
  impl_->global_targets = step_targets;
}

double GpuModel::forward_stage(int64_t micro, const int32_t* ids, const int32_t* labels,
                               const dsv4::SeqLayout& layout, const void* x_in) {
  Impl& m = *impl_;
  TREX_CHECK(m.step_mode, "GPU model: forward_stage before begin_step");
  SlotScope scope(m, slot_of(m, micro));
  TREX_CHECK(!m.forward_done, "GPU model stage [{}, {}): micro-batch {} reuses slot {} whose backward has not run "
             "(more micro-batches in flight than stage_slots = {})", m.l0, m.l1, micro, slot_of(m, micro),
             m.slots.size());
  return forward_impl(ids, labels, layout, nullptr, x_in, HeadMode::LossAndGrad);
}

const void* GpuModel::stage_output(int64_t micro) const {
  const Impl& m = *impl_;
  const Impl::Slot& z = m.slots[size_t(slot_of(m, micro))];
  TREX_CHECK(!m.last_stage() && z.forward_done && !z.X.empty() && z.X[size_t(m.l1)],
             "GPU model stage [{}, {}): no stage output for micro-batch {}", m.l0, m.l1, micro);
  return z.X[size_t(m.l1)];
}

void GpuModel::backward_stage(int64_t micro, const float* dx_out) {
  Impl& m = *impl_;
  SlotScope scope(m, slot_of(m, micro));
  TREX_CHECK(m.forward_done, "GPU model stage [{}, {}): backward of micro-batch {} without its forward", m.l0, m.l1,
             micro);
  m.grad_out.clear();
  m.dx_in = nullptr;
  backward_impl(dx_out);
  m.forward_done = false;
  m.acts.clear();  // the slot's activations are no longer needed
  for (int64_t l = m.l0; l < m.l1; ++l) m.blocks[size_t(l)]->keep.clear();
}

const float* GpuModel::stage_input_grad(int64_t micro) const {
  const Impl& m = *impl_;
  const Impl::Slot& z = m.slots[size_t(slot_of(m, micro))];
  TREX_CHECK(!m.first_stage() && z.dx_in, "GPU model stage [{}, {}): no input gradient for micro-batch {}", m.l0,
             m.l1, micro);
  return z.dx_in;
}

int64_t GpuModel::layer_begin() const { return impl_->l0; }
int64_t GpuModel::layer_end() const { return impl_->l1; }
int64_t GpuModel::stream_elems(const dsv4::SeqLayout& layout) const {
  return layout.B * layout.T * impl_->cfg.hc_mult * impl_->cfg.hidden;
}

std::vector<float> GpuModel::final_normed() const {
  const Impl& m = *impl_;
  std::vector<bf16> v(size_t(m.lay.N * m.cfg.hidden));
  TREX_CUDA(cudaMemcpy(v.data(), m.head_normed, v.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = __bfloat162float(v[i]);
  return f;
}

std::vector<int64_t> GpuModel::csa_selection(int64_t l) const {
  const Impl& m = *impl_;
  TREX_CHECK(l >= 0 && l < m.cfg.n_layers && m.blocks[size_t(l)] &&
                 m.blocks[size_t(l)]->dims.type == dsv4::AttnType::CSA,
             "GPU model: layer {} is not a CSA layer", l);
  std::vector<int64_t> v(size_t(m.lay.N * m.cfg.index_topk));
  TREX_CUDA(cudaMemcpy(v.data(), m.blocks[size_t(l)]->at.sel, v.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<int32_t> GpuModel::router_selection(int64_t l) const {
  const Impl& m = *impl_;
  TREX_CHECK(l >= 0 && l < m.cfg.n_layers && m.blocks[size_t(l)], "GPU model: no layer {} (on this stage)", l);
  std::vector<int32_t> v(size_t(m.lay.N * m.cfg.topk));
  TREX_CUDA(cudaMemcpy(v.data(), m.blocks[size_t(l)]->mo.sel, v.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return v;
}

std::map<std::string, double> GpuModel::section_ms() {
  Impl& m = *impl_;
  TREX_CUDA(cudaDeviceSynchronize());
  for (auto& s : m.done_sections) {
    float ms = 0.f;
    TREX_CUDA(cudaEventElapsedTime(&ms, s.start, s.stop));
    m.section_totals[s.name] += ms;
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.stop);
  }
  m.done_sections.clear();
  return m.section_totals;
}

void GpuModel::reset_sections() {
  section_ms();
  impl_->section_totals.clear();
  exposed_comm_ms();
  impl_->exposed_ms = 0;
}

}  // namespace trex::dsv4gpu
