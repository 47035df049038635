#include "model/dsv4/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/dsv4/balance.h"
#include "model/dsv4/embedding.h"
#include "model/dsv4/loss.h"
#include "model/dsv4/norm.h"

namespace trex::dsv4 {

template <class T>
struct Model<T>::Block {
  std::string prefix;  // "layers.3." or "mtp.0."
  int64_t layer = 0;   // index into cfg_ext_
  bool hash = false;
  std::unique_ptr<AttentionLayerT<T>> attn;
  std::vector<AttentionParamSpec> aspecs;
  AttentionParamsT<T> ap, ag;
  T *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  T *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  T *attn_norm = nullptr, *ffn_norm = nullptr;
  T *g_hc_attn_fn = nullptr, *g_hc_attn_base = nullptr, *g_hc_attn_scale = nullptr;
  T *g_hc_ffn_fn = nullptr, *g_hc_ffn_base = nullptr, *g_hc_ffn_scale = nullptr;
  T *g_attn_norm = nullptr, *g_ffn_norm = nullptr;
  MoeShape moe;
  MoeWeights<T> mw;
  MoeGrads<T> mg;
  // Activations (slices of the model's arena, except what the attention and the MoE index arrays own).
  MhcSiteActs<T> sa, sf;
  T *col_a = nullptr, *a = nullptr, *a_rstd = nullptr, *y_a = nullptr, *X_mid = nullptr;
  T *col_f = nullptr, *u = nullptr, *u_rstd = nullptr, *y_f = nullptr, *moe_t = nullptr;
  std::vector<int32_t> moe_i;
  MoeActs<T> macts;
  AttentionSaved<T> asaved;
  std::vector<T> dscores;  // balance-loss gradient on the router scores [N, E] (empty when off)
  std::vector<int64_t> load;
};

namespace {

ModelConfig extended_config(const ModelConfig& cfg) {
  ModelConfig c = cfg;
  if (cfg.n_mtp > 0) {  // the MTP block: sliding attention (rope_main), score-routed MoE
    c.n_layers = cfg.n_layers + 1;
    c.attn_types.push_back(AttnType::Sliding);
    c.compress_ratio.push_back(0);
    c.mlp_types.push_back(MlpType::MoE);
  }
  return c;
}

}  // namespace

template <class T>
Model<T>::Model(const ModelConfig& cfg, const ModelOptions& opts)
    : cfg_(cfg), cfg_ext_(extended_config(cfg)), opts_(opts) {
  TREX_CHECK(cfg.score_func == "sqrtsoftplus" && cfg.norm_topk_prob,
             "model: only sqrtsoftplus routing with normalised top-k weights is implemented (config has {}, "
             "norm_topk_prob {})",
             cfg.score_func, cfg.norm_topk_prob);
  TREX_CHECK(cfg.n_mtp <= 1, "model: {} MTP modules configured; only 0 or 1 is supported", cfg.n_mtp);
  const int64_t d = cfg.hidden, hc = cfg.hc_mult;
  params_.declare("embed.weight", {cfg.vocab_size, d});
  params_.declare("head.weight", {cfg.vocab_size, d});
  params_.declare("norm.weight", {d});
  params_.declare("hc_head_fn", {hc, hc * d});
  params_.declare("hc_head_base", {hc});
  params_.declare("hc_head_scale", {1});
  for (int64_t l = 0; l < cfg.n_layers; ++l) declare_block(fmt::format("layers.{}.", l), cfg_ext_, l);
  const bool mtp = cfg.n_mtp > 0 && opts.use_mtp;
  if (mtp) {
    declare_block("mtp.0.", cfg_ext_, cfg.n_layers);
    for (const char* n : {"e_proj.weight", "h_proj.weight"}) params_.declare(std::string("mtp.0.") + n, {d, d});
    for (const char* n : {"enorm.weight", "hnorm.weight", "norm.weight"})
      params_.declare(std::string("mtp.0.") + n, {d});
    params_.declare("mtp.0.hc_head_fn", {hc, hc * d});
    params_.declare("mtp.0.hc_head_base", {hc});
    params_.declare("mtp.0.hc_head_scale", {1});
  }
  params_.allocate();
  for (auto& b : blocks_) bind_block(*b);
  if (mtp) mtp_ = blocks_.back().get();
}

template <class T>
Model<T>::~Model() = default;

template <class T>
const AttentionSaved<T>& Model<T>::attention_saved(int64_t l) const {
  TREX_CHECK(l >= 0 && l < n_blocks(), "model: no block {}", l);
  return blocks_[size_t(l)]->asaved;
}

template <class T>
const std::vector<int64_t>& Model<T>::expert_load(int64_t l) const {
  TREX_CHECK(l >= 0 && l < n_blocks(), "model: no block {}", l);
  return blocks_[size_t(l)]->load;
}

template <class T>
const int32_t* Model<T>::router_selection(int64_t l) const {
  TREX_CHECK(l >= 0 && l < n_blocks(), "model: no block {}", l);
  return blocks_[size_t(l)]->macts.sel;
}

template <class T>
void Model<T>::declare_block(const std::string& p, const ModelConfig& c, int64_t layer) {
  auto b = std::make_unique<Block>();
  b->prefix = p;
  b->layer = layer;
  b->hash = c.mlp_types[size_t(layer)] == MlpType::HashMoE;
  b->attn = std::make_unique<AttentionLayerT<T>>(c, layer);
  b->aspecs = attention_param_specs(c, layer);
  const int64_t d = c.hidden, hc = c.hc_mult, mix = (2 + hc) * hc, E = c.n_routed_experts, f = c.moe_inter;
  params_.declare(p + "attn_norm.weight", {d});
  params_.declare(p + "ffn_norm.weight", {d});
  for (const char* site : {"attn", "ffn"}) {
    params_.declare(fmt::format("{}hc_{}_fn", p, site), {mix, hc * d});
    params_.declare(fmt::format("{}hc_{}_base", p, site), {mix});
    params_.declare(fmt::format("{}hc_{}_scale", p, site), {3});
  }
  for (const auto& s : b->aspecs) params_.declare(p + s.name, s.shape, s.lm_grad);
  params_.declare(p + "ffn.gate.weight", {E, d});
  if (b->hash) {
    params_.tid2eid[p + "ffn.gate.tid2eid"].assign(size_t(c.vocab_size * c.topk), 0);
  } else {
    params_.bias[p + "ffn.gate.bias"].assign(size_t(E), 0.f);
  }
  const int64_t fs = f * c.n_shared_experts;
  if (fs > 0) {
    params_.declare(p + "ffn.shared_experts.w1.weight", {fs, d});
    params_.declare(p + "ffn.shared_experts.w3.weight", {fs, d});
    params_.declare(p + "ffn.shared_experts.w2.weight", {d, fs});
  }
  // Routed experts: all w1, then all w3, then all w2, each [E, ...] contiguous (no padding between experts
  // because f*d is a multiple of 16 in every real config; checked in bind_block).
  for (int w : {1, 3, 2})
    for (int64_t e = 0; e < E; ++e)
      params_.declare(fmt::format("{}ffn.experts.{}.w{}.weight", p, e, w), w == 2 ? Shape{d, f} : Shape{f, d});
  b->moe.d = d;
  b->moe.n_experts = E;
  b->moe.topk = c.topk;
  b->moe.inter = f;
  b->moe.shared_inter = fs;
  b->moe.routed_scale = c.routed_scale;
  b->moe.swiglu_limit = c.swiglu_limit;
  b->moe.hash = b->hash;
  blocks_.push_back(std::move(b));
}

template <class T>
void Model<T>::bind_block(Block& b) {
  auto V = [&](const std::string& n) { return params_.value(b.prefix + n); };
  auto G = [&](const std::string& n) { return params_.grad(b.prefix + n); };
  for (const auto& s : b.aspecs) {
    param_slot(b.ap, s.slot) = V(s.name);
    param_slot(b.ag, s.slot) = G(s.name);
  }
  b.hc_attn_fn = V("hc_attn_fn"), b.hc_attn_base = V("hc_attn_base"), b.hc_attn_scale = V("hc_attn_scale");
  b.hc_ffn_fn = V("hc_ffn_fn"), b.hc_ffn_base = V("hc_ffn_base"), b.hc_ffn_scale = V("hc_ffn_scale");
  b.g_hc_attn_fn = G("hc_attn_fn"), b.g_hc_attn_base = G("hc_attn_base"), b.g_hc_attn_scale = G("hc_attn_scale");
  b.g_hc_ffn_fn = G("hc_ffn_fn"), b.g_hc_ffn_base = G("hc_ffn_base"), b.g_hc_ffn_scale = G("hc_ffn_scale");
  b.attn_norm = V("attn_norm.weight"), b.ffn_norm = V("ffn_norm.weight");
  b.g_attn_norm = G("attn_norm.weight"), b.g_ffn_norm = G("ffn_norm.weight");
  const int64_t E = b.moe.n_experts;
  auto expert_base = [&](int w, bool grad) {
    T* first = grad ? G(fmt::format("ffn.experts.0.w{}.weight", w)) : V(fmt::format("ffn.experts.0.w{}.weight", w));
    for (int64_t e = 1; e < E; ++e) {
      const std::string n = fmt::format("ffn.experts.{}.w{}.weight", e, w);
      const T* pe = grad ? G(n) : V(n);
      TREX_CHECK(pe == first + e * b.moe.inter * b.moe.d,
                 "model: expert weights of {} are not contiguous (f*d = {} must be a multiple of {})", b.prefix,
                 b.moe.inter * b.moe.d, 64 / sizeof(T));
    }
    return first;
  };
  b.mw.gate = V("ffn.gate.weight");
  b.mg.gate = G("ffn.gate.weight");
  b.mw.w1 = expert_base(1, false), b.mw.w3 = expert_base(3, false), b.mw.w2 = expert_base(2, false);
  b.mg.w1 = expert_base(1, true), b.mg.w3 = expert_base(3, true), b.mg.w2 = expert_base(2, true);
  if (b.moe.shared_inter > 0) {
    b.mw.sw1 = V("ffn.shared_experts.w1.weight"), b.mw.sw3 = V("ffn.shared_experts.w3.weight");
    b.mw.sw2 = V("ffn.shared_experts.w2.weight");
    b.mg.sw1 = G("ffn.shared_experts.w1.weight"), b.mg.sw3 = G("ffn.shared_experts.w3.weight");
    b.mg.sw2 = G("ffn.shared_experts.w2.weight");
  }
  if (b.hash) {
    b.mw.tid2eid = params_.tid2eid[b.prefix + "ffn.gate.tid2eid"].data();
    b.mw.vocab = cfg_.vocab_size;
  } else {
    b.mw.bias = params_.bias[b.prefix + "ffn.gate.bias"].data();
  }
}

template <class T>
void Model<T>::load(const std::map<std::string, HostTensor>& state, bool allow_extra) {
  size_t used = 0;
  for (const auto& p : params_.entries()) {
    auto it = state.find(p.name);
    TREX_CHECK(it != state.end(), "model load: tensor '{}' {} is missing", p.name, shape_str(p.shape));
    const HostTensor& t = it->second;
    TREX_CHECK(t.shape() == p.shape, "model load: tensor '{}' has shape {}, the config implies {}", p.name,
               shape_str(t.shape()), shape_str(p.shape));
    T* dst = params_.arena_value(p);
    if (t.view.dtype == DType::F32) {
      const float* s = t.view.template as<float>();
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = T(s[i]);
    } else if (t.view.dtype == DType::F64) {
      const double* s = t.view.template as<double>();
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = T(s[i]);
    } else {
      fail("model load: tensor '{}' has dtype {}, expected F32 or F64", p.name, dtype_name(t.view.dtype));
    }
    ++used;
  }
  for (auto& [name, bias] : params_.bias) {
    auto it = state.find(name);
    TREX_CHECK(it != state.end(), "model load: router bias '{}' is missing", name);
    TREX_CHECK(it->second.numel() == int64_t(bias.size()) && it->second.view.dtype == DType::F32,
               "model load: '{}' must be F32 [{}], got {} {}", name, bias.size(),
               dtype_name(it->second.view.dtype), shape_str(it->second.shape()));
    std::memcpy(bias.data(), it->second.view.data, bias.size() * sizeof(float));
    ++used;
  }
  for (auto& [name, table] : params_.tid2eid) {
    auto it = state.find(name);
    TREX_CHECK(it != state.end(), "model load: hash table '{}' is missing", name);
    const HostTensor& t = it->second;
    TREX_CHECK(t.shape() == (Shape{cfg_.vocab_size, cfg_.topk}), "model load: '{}' has shape {}, expected [{}, {}]",
               name, shape_str(t.shape()), cfg_.vocab_size, cfg_.topk);
    for (size_t i = 0; i < table.size(); ++i) {
      int64_t v;
      if (t.view.dtype == DType::I64)
        v = t.view.template as<int64_t>()[i];
      else if (t.view.dtype == DType::I32)
        v = t.view.template as<int32_t>()[i];
      else
        fail("model load: '{}' must be I64 or I32, got {}", name, dtype_name(t.view.dtype));
      TREX_CHECK(v >= 0 && v < cfg_.n_routed_experts, "model load: '{}' entry {} = {} is not an expert id", name, i,
                 v);
      table[i] = int32_t(v);
    }
    ++used;
  }
  if (!allow_extra && used != state.size()) {
    std::vector<std::string> extra;
    for (const auto& [name, t] : state)
      if (!params_.has(name) && !params_.bias.count(name) && !params_.tid2eid.count(name)) extra.push_back(name);
    fail("model load: {} tensor(s) the model does not use, e.g. '{}'", extra.size(),
         extra.empty() ? std::string("?") : extra.front());
  }
}

// Activation table: every slice the forward keeps, carved from one arena. Pass `base` null to count.
template <class T>
void Model<T>::plan_activations(int64_t B, int64_t S) {
  if (B == B_ && S == S_ && !act_.empty()) return;
  const int64_t N = B * S, d = cfg_.hidden, hc = cfg_.hc_mult, M = (2 + hc) * hc, V = cfg_.vocab_size;
  auto carve = [&](T* base) {
    int64_t used = 0;
    auto take = [&](int64_t n) {
      T* p = base ? base + used : nullptr;
      used += (n + 15) / 16 * 16;
      return p;
    };
    X_.assign(size_t(cfg_.n_layers + 1), nullptr);
    for (auto& x : X_) x = take(N * hc * d);
    for (auto& bp : blocks_) {
      Block& b = *bp;
      for (MhcSiteActs<T>* s : {&b.sa, &b.sf}) {
        s->mix = take(N * M), s->rstd = take(N), s->pre = take(N * hc), s->post = take(N * hc);
        s->comb = take(N * hc * hc);
      }
      b.col_a = take(N * d), b.a = take(N * d), b.a_rstd = take(N), b.y_a = take(N * d);
      b.X_mid = take(N * hc * d);
      b.col_f = take(N * d), b.u = take(N * d), b.u_rstd = take(N), b.y_f = take(N * d);
      b.moe.n_tok = N;
      b.moe_t = take(moe_act_sizes(b.moe).t_elems);
    }
    T* head = take(head_act_elems(N, hc, d));
    if (base) head_acts_ = head_acts_bind(N, hc, d, head, (T*)nullptr);
    if (mtp_) {
      Xm_in_ = take(N * hc * d), Xm_out_ = take(N * hc * d);
      T* mi = take(mtp_input_act_elems(N, hc, d));
      T* mh = take(head_act_elems(N, hc, d));
      if (base) {
        mtp_in_acts_ = mtp_input_acts_bind(N, hc, d, mi);
        mtp_head_acts_ = head_acts_bind(N, hc, d, mh, (T*)nullptr);
      }
    }
    return used;
  };
  const int64_t total = carve(nullptr);
  act_.assign(size_t(total), T(0));
  carve(act_.data());
  for (auto& bp : blocks_) {
    Block& b = *bp;
    b.moe_i.assign(size_t(moe_act_sizes(b.moe).i32_elems), 0);
    b.macts = moe_acts_bind(b.moe, b.moe_t, b.moe_i.data());
    b.load.assign(size_t(b.moe.n_experts), 0);
  }
  logits_.assign(size_t(N * V), T(0));
  lse_.assign(size_t(N), T(0));
  head_acts_.logits = logits_.data();
  if (mtp_) {
    mtp_logits_.assign(size_t(N * V), T(0));
    mtp_lse_.assign(size_t(N), T(0));
    mtp_head_acts_.logits = mtp_logits_.data();
  }
  B_ = B, S_ = S;
}

template <class T>
void Model<T>::block_fwd(Block& b, const T* Xin, T* Xout, const int32_t* ids, const SeqLayout& layout) {
  const int64_t N = B_ * S_, d = cfg_.hidden;
  MhcShape ms{N, cfg_.hc_mult, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  mhc_site_fwd(ms, Xin, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, b.sa, b.col_a);
  norm_fwd(b.col_a, b.attn_norm, N, d, cfg_.rms_eps, b.a, b.a_rstd);
  b.attn->forward(b.ap, b.a, b.y_a, layout, b.asaved);
  mhc_expand_fwd(ms, Xin, b.y_a, b.sa.post, b.sa.comb, b.X_mid);
  mhc_site_fwd(ms, b.X_mid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, b.sf, b.col_f);
  norm_fwd(b.col_f, b.ffn_norm, N, d, cfg_.rms_eps, b.u, b.u_rstd);
  moe_fwd(b.moe, b.mw, b.u, ids, b.macts, b.y_f);
  mhc_expand_fwd(ms, b.X_mid, b.y_f, b.sf.post, b.sf.comb, Xout);
  moe_expert_load(b.macts.sel, N, b.moe.topk, b.moe.n_experts, b.load.data());
}

template <class T>
void Model<T>::block_bwd(Block& b, const T* Xin, const T* dXout, T* dXin, const SeqLayout& layout) {
  const int64_t N = B_ * S_, d = cfg_.hidden, hc = cfg_.hc_mult;
  MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  std::vector<T> dX_mid(size_t(N * hc * d), T(0)), dy(size_t(N * d), T(0)), dpost(size_t(N * hc)),
      dcomb(size_t(N * hc * hc)), dnormed(size_t(N * d), T(0)), dcol(size_t(N * d), T(0)),
      scratch(size_t(N * ms.n_mix()));
  mhc_expand_bwd(ms, b.X_mid, b.y_f, b.sf.post, b.sf.comb, dXout, dX_mid.data(), dy.data(), dpost.data(),
                 dcomb.data());
  moe_bwd(b.moe, b.mw, b.u, b.macts, dy.data(), b.dscores.empty() ? nullptr : b.dscores.data(), dnormed.data(),
          b.mg);
  norm_bwd(b.col_f, b.ffn_norm, b.u_rstd, dnormed.data(), N, d, dcol.data(), b.g_ffn_norm);
  mhc_site_bwd(ms, b.X_mid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, b.sf, dcol.data(), dpost.data(),
               dcomb.data(), dX_mid.data(), b.g_hc_ffn_fn, b.g_hc_ffn_base, b.g_hc_ffn_scale, scratch.data());
  std::fill(dXin, dXin + N * hc * d, T(0));
  std::fill(dy.begin(), dy.end(), T(0));
  mhc_expand_bwd(ms, Xin, b.y_a, b.sa.post, b.sa.comb, dX_mid.data(), dXin, dy.data(), dpost.data(), dcomb.data());
  std::fill(dnormed.begin(), dnormed.end(), T(0));
  b.attn->backward(b.ap, b.ag, layout, b.asaved, dy.data(), dnormed.data());
  std::fill(dcol.begin(), dcol.end(), T(0));
  norm_bwd(b.col_a, b.attn_norm, b.a_rstd, dnormed.data(), N, d, dcol.data(), b.g_attn_norm);
  mhc_site_bwd(ms, Xin, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, b.sa, dcol.data(), dpost.data(),
               dcomb.data(), dXin, b.g_hc_attn_fn, b.g_hc_attn_base, b.g_hc_attn_scale, scratch.data());
}

template <class T>
double Model<T>::forward(const int32_t* ids, const int32_t* labels, const SeqLayout& layout) {
  layout.validate();
  const int64_t B = layout.B, S = layout.T, N = B * S, d = cfg_.hidden, hc = cfg_.hc_mult, V = cfg_.vocab_size;
  plan_activations(B, S);
  layout_copy_ = layout;
  layout_ = &layout_copy_;
  ids_.assign(ids, ids + N);
  const int64_t* doc = layout.doc_start.data();
  targets_ = shifted_targets(labels, doc, B, S, 1, V);
  loss_ = LossParts{};

  embed_streams_fwd(ids_.data(), N, params_.value("embed.weight"), V, d, hc, X_[0]);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) block_fwd(*blocks_[size_t(l)], X_[size_t(l)], X_[size_t(l + 1)],
                                                        ids_.data(), layout_copy_);
  MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  HeadParams<T> hp{params_.value("hc_head_fn"), params_.value("hc_head_base"), params_.value("hc_head_scale"),
                   params_.value("norm.weight"), params_.value("head.weight")};
  head_fwd(ms, V, X_[size_t(cfg_.n_layers)], hp, head_acts_);
  loss_.lm = lm_loss_fwd(logits_.data(), targets_.data(), N, V, lse_.data(), &loss_.lm_targets);
  loss_.total = loss_.lm;

  if (mtp_) {
    next_ids_.assign(size_t(N), -1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s + 1 < S; ++s)
        if (doc[b * S + s + 1] == doc[b * S + s]) next_ids_[size_t(b * S + s)] = ids_[size_t(b * S + s + 1)];
    mtp_targets_ = shifted_targets(labels, doc, B, S, 2, V);
    MtpInputParams<T> mp{params_.value("mtp.0.enorm.weight"), params_.value("mtp.0.hnorm.weight"),
                         params_.value("mtp.0.e_proj.weight"), params_.value("mtp.0.h_proj.weight")};
    mtp_input_fwd(N, hc, d, cfg_.rms_eps, next_ids_.data(), params_.value("embed.weight"), V,
                  X_[size_t(cfg_.n_layers)], mp, mtp_in_acts_, Xm_in_);
    block_fwd(*mtp_, Xm_in_, Xm_out_, ids_.data(), layout_copy_);
    HeadParams<T> mh{params_.value("mtp.0.hc_head_fn"), params_.value("mtp.0.hc_head_base"),
                     params_.value("mtp.0.hc_head_scale"), params_.value("mtp.0.norm.weight"),
                     params_.value("head.weight")};
    head_fwd(ms, V, Xm_out_, mh, mtp_head_acts_);
    loss_.mtp = lm_loss_fwd(mtp_logits_.data(), mtp_targets_.data(), N, V, mtp_lse_.data(), &loss_.mtp_targets);
    loss_.total += opts_.mtp_weight * loss_.mtp;
  }

  for (auto& bp : blocks_) {
    Block& b = *bp;
    const bool on = opts_.balance_alpha != 0.0 && (!b.hash || opts_.balance_hash_layers);
    if (!on) {
      b.dscores.clear();
      continue;
    }
    b.dscores.assign(size_t(N * b.moe.n_experts), T(0));
    loss_.balance += balance_loss(b.macts.scores, b.macts.sel, B, S, b.moe.n_experts, b.moe.topk,
                                  opts_.balance_alpha, b.dscores.data());
  }
  loss_.total += loss_.balance;
  forward_done_ = true;
  return loss_.total;
}

template <class T>
void Model<T>::backward() {
  TREX_CHECK(forward_done_, "model: backward() called without a forward()");
  const int64_t N = B_ * S_, d = cfg_.hidden, hc = cfg_.hc_mult, V = cfg_.vocab_size, L = cfg_.n_layers;
  MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  std::vector<T> dX(size_t(N * hc * d), T(0)), dX_prev(size_t(N * hc * d), T(0));
  std::vector<T> dlogits(size_t(N * V));
  std::vector<T> scratch(size_t(N * (d + hc)));
  T* dembed = params_.grad("embed.weight");

  if (mtp_) {
    lm_loss_bwd(mtp_logits_.data(), mtp_lse_.data(), mtp_targets_.data(), N, V, loss_.mtp_targets,
                opts_.mtp_weight, dlogits.data());
    HeadParams<T> mh{params_.value("mtp.0.hc_head_fn"), params_.value("mtp.0.hc_head_base"),
                     params_.value("mtp.0.hc_head_scale"), params_.value("mtp.0.norm.weight"),
                     params_.value("head.weight")};
    HeadGrads<T> mg{params_.grad("mtp.0.hc_head_fn"), params_.grad("mtp.0.hc_head_base"),
                    params_.grad("mtp.0.hc_head_scale"), params_.grad("mtp.0.norm.weight"),
                    params_.grad("head.weight")};
    std::vector<T> dXm_out(size_t(N * hc * d), T(0)), dXm_in(size_t(N * hc * d), T(0));
    head_bwd(ms, V, Xm_out_, mh, mtp_head_acts_, dlogits.data(), dXm_out.data(), mg, scratch.data());
    block_bwd(*mtp_, Xm_in_, dXm_out.data(), dXm_in.data(), *layout_);
    MtpInputParams<T> mp{params_.value("mtp.0.enorm.weight"), params_.value("mtp.0.hnorm.weight"),
                         params_.value("mtp.0.e_proj.weight"), params_.value("mtp.0.h_proj.weight")};
    MtpInputGrads<T> mig{params_.grad("mtp.0.enorm.weight"), params_.grad("mtp.0.hnorm.weight"),
                         params_.grad("mtp.0.e_proj.weight"), params_.grad("mtp.0.h_proj.weight")};
    mtp_input_bwd(N, hc, d, next_ids_.data(), X_[size_t(L)], mp, mtp_in_acts_, dXm_in.data(), dX.data(), dembed,
                  mig);
  }
  lm_loss_bwd(logits_.data(), lse_.data(), targets_.data(), N, V, loss_.lm_targets, 1.0, dlogits.data());
  HeadParams<T> hp{params_.value("hc_head_fn"), params_.value("hc_head_base"), params_.value("hc_head_scale"),
                   params_.value("norm.weight"), params_.value("head.weight")};
  HeadGrads<T> hg{params_.grad("hc_head_fn"), params_.grad("hc_head_base"), params_.grad("hc_head_scale"),
                  params_.grad("norm.weight"), params_.grad("head.weight")};
  head_bwd(ms, V, X_[size_t(L)], hp, head_acts_, dlogits.data(), dX.data(), hg, scratch.data());
  for (int64_t l = L - 1; l >= 0; --l) {
    block_bwd(*blocks_[size_t(l)], X_[size_t(l)], dX.data(), dX_prev.data(), *layout_);
    std::swap(dX, dX_prev);
  }
  embed_streams_bwd(ids_.data(), N, d, hc, dX.data(), dembed);
}

template class Model<float>;
template class Model<double>;

}  // namespace trex::dsv4
