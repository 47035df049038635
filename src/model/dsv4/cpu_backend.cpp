#include "model/dsv4/cpu_backend.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "model/dsv4/balance.h"
#include "model/dsv4/cpu_backend_cache.h"
#include "model/dsv4/embedding.h"
#include "model/dsv4/loss.h"
#include "model/dsv4/norm.h"

namespace trex::dsv4 {

// The activations of one (block, site) in a pass, with the site's parameters.
template <class T>
struct CpuBackend<T>::SiteRef {
  MhcSiteActs<T>* acts = nullptr;
  T *col = nullptr, *normed = nullptr, *rstd = nullptr, *y = nullptr;  // collapse, norm output + rstd, sub-layer out
  const T *fn = nullptr, *base = nullptr, *scale = nullptr, *norm_w = nullptr;
  T *g_fn = nullptr, *g_base = nullptr, *g_scale = nullptr, *g_norm = nullptr;
};

// A decode step keeps nothing: every block runs on these buffers (both sites share one set).
template <class T>
struct CpuBackend<T>::StepBufs {
  std::vector<T> X[2], Xmid, col, normed, rstd, y, mix, mrstd, pre, post, comb, moe_t, head;
  std::vector<int32_t> moe_i;
  MhcSiteActs<T> site{};
  MoeActs<T> macts;
};

// The backward's gradient streams and what one block's ops hand each other (one block at a time).
template <class T>
struct CpuBackend<T>::GradBufs {
  std::vector<T> dA, dB, dMid, dMtpIn, dMtpOut;  // [N, n_hc, d]
  std::vector<T> dy, dnormed, dcol;             // [N, d]
  std::vector<T> dpost, dcomb, scratch;         // [N, n_hc], [N, n_hc, n_hc], [N, n_mix]
  std::vector<T> dlogits, head_scratch;         // [N, V], [N, d + n_hc]
  int64_t n_tok = -1;
};

namespace {

template <class T>
void sized(std::vector<T>& v, int64_t n) {
  if (int64_t(v.size()) != n) v.assign(size_t(n), T(0));
}

}  // namespace

template <class T>
CpuBackend<T>::CpuBackend(const ModelConfig& cfg, ParamTable<T>& params, std::vector<const CpuBlock<T>*> blocks,
                          const CpuBackendShape& shape)
    : cfg_(cfg), params_(params), blocks_(std::move(blocks)), shape_(shape) {
  TREX_CHECK(int64_t(blocks_.size()) == shape_.n_layers + (shape_.mtp ? 1 : 0),
             "CPU backend: {} blocks for {} layers{}", blocks_.size(), shape_.n_layers, shape_.mtp ? " + MTP" : "");
  slots_.push_back(std::make_unique<CpuSlot<T>>());
  step_ = std::make_unique<StepBufs>();
  grads_ = std::make_unique<GradBufs>();
  for (int64_t l = 0; l < shape_.n_layers; ++l) {
    const std::vector<double>& f = blocks_[size_t(l)]->attn->dims().inv_freq;
    inv_freq_.emplace_back(f.begin(), f.end());
  }
}

template <class T>
CpuBackend<T>::~CpuBackend() = default;

template <class T>
void CpuBackend<T>::set_slots(int64_t n) {
  TREX_CHECK(n >= 1, "CPU backend: {} activation slots", n);
  while (int64_t(slots_.size()) < n) slots_.push_back(std::make_unique<CpuSlot<T>>());
  slots_.resize(size_t(n));
}

template <class T>
const CpuSlot<T>& CpuBackend<T>::slot(int64_t i) const {
  TREX_CHECK(i >= 0 && i < n_slots(), "model: no activation slot {} ({} slots)", i, n_slots());
  return *slots_[size_t(i)];
}

template <class T>
CpuSlot<T>& CpuBackend<T>::slot_of(const Pass& p) {
  return const_cast<CpuSlot<T>&>(slot(p.slot));
}

template <class T>
size_t CpuBackend<T>::activation_bytes() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s->act.size() * sizeof(T);
  return n;
}

template <class T>
MhcShape CpuBackend<T>::mhc_shape(int64_t n_tok) const {
  return MhcShape{n_tok, cfg_.hc_mult, cfg_.hidden, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
}

// The exchange the MoE layers use: the one set, or (every expert here) the MoE layer's own local one.
template <class T>
ExpertExchange<T>* CpuBackend<T>::expert_exchange() const {
  TREX_CHECK(ex_ || (shape_.expert_begin == 0 && shape_.expert_end == cfg_.n_routed_experts),
             "model: this model holds routed experts [{}, {}) of {}: set_expert_exchange() must name where the others "
             "are",
             shape_.expert_begin, shape_.expert_end, cfg_.n_routed_experts);
  return ex_;
}

// Activation table of one slot: every slice the forward keeps, carved from one arena. Pass `base` null to count.
template <class T>
void CpuBackend<T>::plan_slot(CpuSlot<T>& s, int64_t B, int64_t S) {
  if (B == s.B && S == s.S && !s.act.empty()) return;
  const int64_t N = B * S, d = cfg_.hidden, hc = cfg_.hc_mult, M = (2 + hc) * hc, V = cfg_.vocab_size;
  const int64_t Lm = shape_.n_layers;
  s.blocks.clear();
  s.blocks.resize(blocks_.size());
  auto moe_shape = [&](const CpuBlock<T>& b) {
    MoeShape ms = b.moe;
    ms.n_tok = N;
    return ms;
  };
  auto carve = [&](T* base) {
    int64_t used = 0;
    auto take = [&](int64_t n) {
      T* p = base ? base + used : nullptr;
      used += (n + 15) / 16 * 16;
      return p;
    };
    s.X.assign(size_t(Lm + 1), nullptr);
    for (auto& x : s.X) x = take(N * hc * d);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      CpuBlockActs<T>& a = s.blocks[i];
      for (MhcSiteActs<T>* st : {&a.sa, &a.sf}) {
        st->mix = take(N * M), st->rstd = take(N), st->pre = take(N * hc), st->post = take(N * hc);
        st->comb = take(N * hc * hc);
      }
      a.col_a = take(N * d), a.a = take(N * d), a.a_rstd = take(N), a.y_a = take(N * d);
      a.X_mid = take(N * hc * d);
      a.col_f = take(N * d), a.u = take(N * d), a.u_rstd = take(N), a.y_f = take(N * d);
      a.moe_t = take(moe_act_sizes(moe_shape(*blocks_[i])).t_elems);
    }
    if (shape_.head) {
      T* head = take(head_act_elems(N, hc, d));
      if (base) s.head_acts = head_acts_bind(N, hc, d, head, (T*)nullptr);
    }
    if (shape_.mtp) {
      s.Xm_in = take(N * hc * d), s.Xm_out = take(N * hc * d);
      T* mi = take(mtp_input_act_elems(N, hc, d));
      T* mh = take(head_act_elems(N, hc, d));
      if (base) {
        s.mtp_in_acts = mtp_input_acts_bind(N, hc, d, mi);
        s.mtp_head_acts = head_acts_bind(N, hc, d, mh, (T*)nullptr);
      }
    }
    return used;
  };
  const int64_t total = carve(nullptr);
  s.act.assign(size_t(total), T(0));
  carve(s.act.data());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const MoeShape ms = moe_shape(*blocks_[i]);
    CpuBlockActs<T>& a = s.blocks[i];
    a.moe_i.assign(size_t(moe_act_sizes(ms).i32_elems), 0);
    a.macts = moe_acts_bind(ms, a.moe_t, a.moe_i.data());
    a.load.assign(size_t(ms.n_experts), 0);
  }
  if (shape_.head) {
    s.logits.assign(size_t(N * V), T(0));
    s.lse.assign(size_t(N), T(0));
    s.head_acts.logits = s.logits.data();
  }
  if (shape_.mtp) {
    s.mtp_logits.assign(size_t(N * V), T(0));
    s.mtp_lse.assign(size_t(N), T(0));
    s.mtp_head_acts.logits = s.mtp_logits.data();
  }
  s.B = B, s.S = S;
}

template <class T>
void CpuBackend<T>::begin_pass(const Pass& p) {
  const int64_t N = p.n_tok, d = cfg_.hidden, hc = cfg_.hc_mult;
  if (p.keeps_activations()) {
    CpuSlot<T>& s = slot_of(p);
    plan_slot(s, p.layout->B, p.layout->T);
    s.loss = LossParts{};
    return;
  }
  StepBufs& b = *step_;
  for (auto* v : {&b.X[0], &b.X[1], &b.Xmid}) v->resize(size_t(N * hc * d));
  for (auto* v : {&b.col, &b.normed, &b.y}) v->resize(size_t(N * d));
  b.rstd.resize(size_t(N)), b.mrstd.resize(size_t(N));
  b.mix.resize(size_t(N * (2 + hc) * hc)), b.pre.resize(size_t(N * hc)), b.post.resize(size_t(N * hc));
  b.comb.resize(size_t(N * hc * hc));
  b.site = MhcSiteActs<T>{b.mix.data(), b.mrstd.data(), b.pre.data(), b.post.data(), b.comb.data()};
}

template <class T>
T* CpuBackend<T>::stream(const Pass& p, Stream s) {
  const int64_t n = p.n_tok * cfg_.hc_mult * cfg_.hidden;
  if (!p.keeps_activations()) {
    StepBufs& b = *step_;
    if (s.kind == Stream::X) return b.X[s.index % 2].data();
    if (s.kind == Stream::Mid) return b.Xmid.data();
    fail("CPU backend: a decode step has no stream of kind {}", int(s.kind));
  }
  CpuSlot<T>& sl = slot_of(p);
  GradBufs& g = *grads_;
  auto grad = [&](std::vector<T>& v) {
    sized(v, n);
    return v.data();
  };
  switch (s.kind) {
    case Stream::X:
      return sl.X[size_t(s.index)];
    case Stream::Mid:
      return sl.blocks[size_t(s.index)].X_mid;
    case Stream::MtpIn:
      return sl.Xm_in;
    case Stream::MtpOut:
      return sl.Xm_out;
    case Stream::dA:
      return grad(g.dA);
    case Stream::dB:
      return grad(g.dB);
    case Stream::dMid:
      return grad(g.dMid);
    case Stream::dMtpIn:
      return grad(g.dMtpIn);
    case Stream::dMtpOut:
      return grad(g.dMtpOut);
  }
  fail("CPU backend: unknown stream kind {}", int(s.kind));
}

template <class T>
typename CpuBackend<T>::SiteRef CpuBackend<T>::site(const Pass& p, int64_t blk, Site s) {
  const CpuBlock<T>& b = *blocks_[size_t(blk)];
  SiteRef r;
  const bool attn = s == Site::Attn;
  r.fn = attn ? b.hc_attn_fn : b.hc_ffn_fn, r.base = attn ? b.hc_attn_base : b.hc_ffn_base;
  r.scale = attn ? b.hc_attn_scale : b.hc_ffn_scale, r.norm_w = attn ? b.attn_norm : b.ffn_norm;
  r.g_fn = attn ? b.g_hc_attn_fn : b.g_hc_ffn_fn, r.g_base = attn ? b.g_hc_attn_base : b.g_hc_ffn_base;
  r.g_scale = attn ? b.g_hc_attn_scale : b.g_hc_ffn_scale, r.g_norm = attn ? b.g_attn_norm : b.g_ffn_norm;
  if (!p.keeps_activations()) {
    StepBufs& st = *step_;
    r.acts = &st.site, r.col = st.col.data(), r.normed = st.normed.data(), r.rstd = st.rstd.data();
    r.y = st.y.data();
    return r;
  }
  CpuBlockActs<T>& a = slot_of(p).blocks[size_t(blk)];
  if (attn)
    r.acts = &a.sa, r.col = a.col_a, r.normed = a.a, r.rstd = a.a_rstd, r.y = a.y_a;
  else
    r.acts = &a.sf, r.col = a.col_f, r.normed = a.u, r.rstd = a.u_rstd, r.y = a.y_f;
  return r;
}

template <class T>
void CpuBackend<T>::embed_fwd(const Pass& p, Stream out) {
  embed_streams_fwd(p.ids, p.n_tok, params_.value("embed.weight"), cfg_.vocab_size, cfg_.hidden, cfg_.hc_mult,
                    stream(p, out));
}

template <class T>
void CpuBackend<T>::embed_bwd(const Pass& p, Stream d_out) {
  embed_streams_bwd(p.ids, p.n_tok, cfg_.hidden, cfg_.hc_mult, stream(p, d_out), params_.grad("embed.weight"));
}

template <class T>
void CpuBackend<T>::stream_in(const Pass& p, Stream s, const void* src) {
  const T* x = static_cast<const T*>(src);
  std::copy(x, x + p.n_tok * cfg_.hc_mult * cfg_.hidden, stream(p, s));
}

template <class T>
void CpuBackend<T>::stream_out(const Pass& p, Stream s, void* dst) {
  const T* x = stream(p, s);
  std::copy(x, x + p.n_tok * cfg_.hc_mult * cfg_.hidden, static_cast<T*>(dst));
}

template <class T>
void CpuBackend<T>::site_norm_fwd(const Pass& p, int64_t blk, Site s, Stream in) {
  const SiteRef r = site(p, blk, s);
  mhc_site_fwd(mhc_shape(p.n_tok), stream(p, in), r.fn, r.base, r.scale, *r.acts, r.col);
  norm_fwd(r.col, r.norm_w, p.n_tok, cfg_.hidden, cfg_.rms_eps, r.normed, r.rstd);
}

template <class T>
void CpuBackend<T>::site_norm_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_in) {
  const SiteRef r = site(p, blk, s);
  GradBufs& g = *grads_;
  std::fill(g.dcol.begin(), g.dcol.end(), T(0));
  norm_bwd(r.col, r.norm_w, r.rstd, g.dnormed.data(), p.n_tok, cfg_.hidden, g.dcol.data(), r.g_norm);
  mhc_site_bwd(mhc_shape(p.n_tok), stream(p, in), r.fn, r.base, r.scale, *r.acts, g.dcol.data(), g.dpost.data(),
               g.dcomb.data(), stream(p, d_in), r.g_fn, r.g_base, r.g_scale, g.scratch.data());
}

template <class T>
void CpuBackend<T>::expand_fwd(const Pass& p, int64_t blk, Site s, Stream in, Stream out) {
  const SiteRef r = site(p, blk, s);
  mhc_expand_fwd(mhc_shape(p.n_tok), stream(p, in), r.y, r.acts->post, r.acts->comb, stream(p, out));
}

template <class T>
void CpuBackend<T>::expand_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_out, Stream d_in) {
  const SiteRef r = site(p, blk, s);
  const MhcShape ms = mhc_shape(p.n_tok);
  const int64_t N = p.n_tok, d = cfg_.hidden, hc = cfg_.hc_mult;
  GradBufs& g = *grads_;
  if (g.n_tok != N) {  // the per-block gradients of this pass's size
    sized(g.dy, N * d), sized(g.dnormed, N * d), sized(g.dcol, N * d);
    sized(g.dpost, N * hc), sized(g.dcomb, N * hc * hc), sized(g.scratch, N * ms.n_mix());
    g.n_tok = N;
  }
  T* dX = stream(p, d_in);
  std::fill(dX, dX + N * hc * d, T(0));
  std::fill(g.dy.begin(), g.dy.end(), T(0));
  mhc_expand_bwd(ms, stream(p, in), r.y, r.acts->post, r.acts->comb, stream(p, d_out), dX, g.dy.data(),
                 g.dpost.data(), g.dcomb.data());
}

template <class T>
void CpuBackend<T>::attention_fwd(const Pass& p, int64_t blk) {
  const CpuBlock<T>& b = *blocks_[size_t(blk)];
  CpuBlockActs<T>& a = slot_of(p).blocks[size_t(blk)];
  b.attn->forward(b.ap, a.a, a.y_a, *p.layout, a.asaved);
}

template <class T>
void CpuBackend<T>::attention_bwd(const Pass& p, int64_t blk) {
  const CpuBlock<T>& b = *blocks_[size_t(blk)];
  CpuBlockActs<T>& a = slot_of(p).blocks[size_t(blk)];
  GradBufs& g = *grads_;
  std::fill(g.dnormed.begin(), g.dnormed.end(), T(0));
  b.attn->backward(b.ap, b.ag, *p.layout, a.asaved, g.dy.data(), g.dnormed.data());
}

template <class T>
void CpuBackend<T>::release_block(const Pass& p, int64_t blk) {
  (void)p;
  fail("CPU backend: activation recomputation is not implemented on the CPU (block {}); the CPU model keeps every "
       "activation (recompute: none)", blk);
}

template <class T>
void CpuBackend<T>::attention_cached(const Pass& p, int64_t blk) {
  if constexpr (std::is_same_v<T, float>) {
    TREX_CHECK(p.cached && blk < shape_.n_layers, "CPU backend: cached attention needs a decode step of a main layer");
    const CpuBlock<T>& b = *blocks_[size_t(blk)];
    const CachedTokens& tk = *p.cached;
    std::vector<LayerCache*> caches(size_t(tk.n_seqs));
    for (int64_t i = 0; i < tk.n_seqs; ++i)
      caches[size_t(i)] = &static_cast<CpuSequenceCaches*>(tk.caches[i])->layers[size_t(blk)];
    StepBufs& st = *step_;
    cached_attention_fwd(b.attn->dims(), b.ap, inv_freq_[size_t(blk)], tk, p.n_tok, caches, st.normed.data(),
                         st.y.data());
  } else {
    (void)p, (void)blk;
    fail("CPU backend: cached decoding runs in fp32 only");
  }
}

template <class T>
void CpuBackend<T>::moe_fwd(const Pass& p, int64_t blk) {
  const CpuBlock<T>& b = *blocks_[size_t(blk)];
  MoeShape ms = b.moe;
  ms.n_tok = p.n_tok;
  if (!p.keeps_activations()) {  // a decode step: every expert here, nothing kept for a backward
    TREX_CHECK(shape_.expert_begin == 0 && shape_.expert_end == cfg_.n_routed_experts && !ex_,
               "CPU backend: decoding needs every routed expert in this process");
    StepBufs& st = *step_;
    const MoeActSizes sz = moe_act_sizes(ms);
    st.moe_t.resize(size_t(sz.t_elems));
    st.moe_i.resize(size_t(sz.i32_elems));
    st.macts = moe_acts_bind(ms, st.moe_t.data(), st.moe_i.data());
    dsv4::moe_fwd(ms, b.mw, st.normed.data(), p.ids, st.macts, st.y.data());
    return;
  }
  CpuBlockActs<T>& a = slot_of(p).blocks[size_t(blk)];
  dsv4::moe_fwd(ms, b.mw, a.u, p.ids, a.macts, a.y_f, expert_exchange(), ExchangeKey{b.layer, p.slot});
  moe_expert_load(a.macts.sel, ms.n_tok, ms.topk, ms.n_experts, a.load.data());
  a.dscores.clear();
}

template <class T>
void CpuBackend<T>::moe_bwd(const Pass& p, int64_t blk) {
  const CpuBlock<T>& b = *blocks_[size_t(blk)];
  MoeShape ms = b.moe;
  ms.n_tok = p.n_tok;
  CpuBlockActs<T>& a = slot_of(p).blocks[size_t(blk)];
  GradBufs& g = *grads_;
  MoeGrads<T> mg = b.mg;
  std::fill(g.dnormed.begin(), g.dnormed.end(), T(0));
  dsv4::moe_bwd(ms, b.mw, a.u, a.macts, g.dy.data(), a.dscores.empty() ? nullptr : a.dscores.data(),
                g.dnormed.data(), mg, expert_exchange(), ExchangeKey{b.layer, p.slot});
}

template <class T>
void CpuBackend<T>::balance_fwd(const Pass& p, int64_t blk, double alpha, double grad_scale) {
  const CpuBlock<T>& b = *blocks_[size_t(blk)];
  CpuSlot<T>& s = slot_of(p);
  CpuBlockActs<T>& a = s.blocks[size_t(blk)];
  a.dscores.assign(size_t(p.n_tok * b.moe.n_experts), T(0));
  s.loss.balance += balance_loss(a.macts.scores, a.macts.sel, p.layout->B, p.layout->T, b.moe.n_experts,
                                 b.moe.topk, alpha, a.dscores.data());
  if (grad_scale != 1.0)
    for (auto& g : a.dscores) g = T(double(g) * grad_scale);
}

template <class T>
HeadParams<T> CpuBackend<T>::head_params(HeadKind h) {
  const std::string p = h == HeadKind::Mtp ? "mtp.0." : "";
  return HeadParams<T>{params_.value(p + "hc_head_fn"), params_.value(p + "hc_head_base"),
                       params_.value(p + "hc_head_scale"), params_.value(p + "norm.weight"),
                       params_.value("head.weight")};
}

template <class T>
HeadGrads<T> CpuBackend<T>::head_grads(HeadKind h) {
  const std::string p = h == HeadKind::Mtp ? "mtp.0." : "";
  return HeadGrads<T>{params_.grad(p + "hc_head_fn"), params_.grad(p + "hc_head_base"),
                      params_.grad(p + "hc_head_scale"), params_.grad(p + "norm.weight"), params_.grad("head.weight")};
}

template <class T>
void CpuBackend<T>::head_loss_fwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets) {
  CpuSlot<T>& s = slot_of(p);
  const bool mtp = h == HeadKind::Mtp;
  const int64_t N = p.n_tok, V = cfg_.vocab_size;
  head_fwd(mhc_shape(N), V, stream(p, in), head_params(h), mtp ? s.mtp_head_acts : s.head_acts);
  if (mtp)
    s.loss.mtp = lm_loss_fwd(s.mtp_logits.data(), targets, N, V, s.mtp_lse.data(), &s.loss.mtp_targets);
  else
    s.loss.lm = lm_loss_fwd(s.logits.data(), targets, N, V, s.lse.data(), &s.loss.lm_targets);
}

template <class T>
void CpuBackend<T>::head_loss_bwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets, double weight,
                                  Stream d_in, bool accumulate) {
  CpuSlot<T>& s = slot_of(p);
  GradBufs& g = *grads_;
  const bool mtp = h == HeadKind::Mtp;
  const int64_t N = p.n_tok, V = cfg_.vocab_size, d = cfg_.hidden, hc = cfg_.hc_mult;
  sized(g.dlogits, N * V), sized(g.head_scratch, N * (d + hc));
  lm_loss_bwd(mtp ? s.mtp_logits.data() : s.logits.data(), mtp ? s.mtp_lse.data() : s.lse.data(), targets, N, V,
              mtp ? s.loss.mtp_targets : s.loss.lm_targets, weight, g.dlogits.data());
  T* dX = stream(p, d_in);
  if (!accumulate) std::fill(dX, dX + N * hc * d, T(0));
  HeadGrads<T> hg = head_grads(h);
  head_bwd(mhc_shape(N), V, stream(p, in), head_params(h), mtp ? s.mtp_head_acts : s.head_acts, g.dlogits.data(),
           dX, hg, g.head_scratch.data());
}

template <class T>
void CpuBackend<T>::head_logits(const Pass& p, Stream in, const int64_t* rows, int64_t n_rows, float* logits) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t d = cfg_.hidden, hc = cfg_.hc_mult;
    const T* X = stream(p, in);
    std::vector<T> Xh(size_t(n_rows * hc * d));
    for (int64_t k = 0; k < n_rows; ++k) std::copy_n(X + rows[k] * hc * d, hc * d, Xh.data() + k * hc * d);
    std::vector<T>& buf = step_->head;
    buf.resize(size_t(head_act_elems(n_rows, hc, d)));
    HeadActs<T> ha = head_acts_bind(n_rows, hc, d, buf.data(), logits);
    head_fwd(mhc_shape(n_rows), cfg_.vocab_size, Xh.data(), head_params(HeadKind::Main), ha);
  } else {
    (void)p, (void)in, (void)rows, (void)n_rows, (void)logits;
    fail("CPU backend: decode logits are fp32 only");
  }
}

template <class T>
void CpuBackend<T>::mtp_input_fwd(const Pass& p, const int32_t* next_ids, Stream main, Stream out) {
  CpuSlot<T>& s = slot_of(p);
  MtpInputParams<T> mp{params_.value("mtp.0.enorm.weight"), params_.value("mtp.0.hnorm.weight"),
                       params_.value("mtp.0.e_proj.weight"), params_.value("mtp.0.h_proj.weight")};
  dsv4::mtp_input_fwd(p.n_tok, cfg_.hc_mult, cfg_.hidden, cfg_.rms_eps, next_ids, params_.value("embed.weight"),
                      cfg_.vocab_size, stream(p, main), mp, s.mtp_in_acts, stream(p, out));
}

template <class T>
void CpuBackend<T>::mtp_input_bwd(const Pass& p, const int32_t* next_ids, Stream main, Stream d_out, Stream d_main,
                                  bool accumulate) {
  CpuSlot<T>& s = slot_of(p);
  const int64_t N = p.n_tok, d = cfg_.hidden, hc = cfg_.hc_mult;
  MtpInputParams<T> mp{params_.value("mtp.0.enorm.weight"), params_.value("mtp.0.hnorm.weight"),
                       params_.value("mtp.0.e_proj.weight"), params_.value("mtp.0.h_proj.weight")};
  MtpInputGrads<T> mig{params_.grad("mtp.0.enorm.weight"), params_.grad("mtp.0.hnorm.weight"),
                       params_.grad("mtp.0.e_proj.weight"), params_.grad("mtp.0.h_proj.weight")};
  T* dX = stream(p, d_main);
  if (!accumulate) std::fill(dX, dX + N * hc * d, T(0));
  dsv4::mtp_input_bwd(N, hc, d, next_ids, stream(p, main), mp, s.mtp_in_acts, stream(p, d_out), dX,
                      params_.grad("embed.weight"), mig);
}

template <class T>
LossParts CpuBackend<T>::losses(const Pass& p) {
  return slot_of(p).loss;
}

template <class T>
std::unique_ptr<SequenceCaches> CpuBackend<T>::new_caches() const {
  if constexpr (std::is_same_v<T, float>) {
    auto c = std::make_unique<CpuSequenceCaches>();
    for (int64_t l = 0; l < shape_.n_layers; ++l)
      c->layers.push_back(new_layer_cache(blocks_[size_t(l)]->attn->dims(), blocks_[size_t(l)]->ap));
    return c;
  } else {
    fail("CPU backend: cached decoding runs in fp32 only");
  }
}

template class CpuBackend<float>;
template class CpuBackend<double>;

}  // namespace trex::dsv4
