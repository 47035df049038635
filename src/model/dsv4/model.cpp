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
  MoeShape moe;  // n_tok is set from the slot at every use
  MoeWeights<T> mw;
  MoeGrads<T> mg;
  size_t entry_begin = 0, entry_end = 0;     // the block's tensors: params_.entries()[begin, end)
  std::vector<const ParamInfo*> hook_params;  // the same, for the gradient-ready hook
};

template <class T>
struct Model<T>::BlockActs {
  int64_t n_tok = 0;
  // Slices of the slot's arena, except what the attention and the MoE index arrays own.
  MhcSiteActs<T> sa, sf;
  T *col_a = nullptr, *a = nullptr, *a_rstd = nullptr, *y_a = nullptr, *X_mid = nullptr;
  T *col_f = nullptr, *u = nullptr, *u_rstd = nullptr, *y_f = nullptr, *moe_t = nullptr;
  std::vector<int32_t> moe_i;
  MoeActs<T> macts;
  AttentionSaved<T> asaved;
  std::vector<T> dscores;  // balance-loss gradient on the router scores [N, E], x loss scale (empty when off)
  std::vector<int64_t> load;
};

template <class T>
struct Model<T>::Slot {
  std::vector<T> act;  // one arena, carved by plan_activations from its size table
  int64_t B = 0, S = 0;
  std::vector<T*> X;  // local main layers + 1 stream tensors; X[0] is the stage input
  std::vector<BlockActs> blocks;
  HeadActs<T> head_acts{};
  std::vector<T> logits, lse;
  std::vector<int32_t> ids, targets, mtp_targets, next_ids;
  T* Xm_in = nullptr;
  T* Xm_out = nullptr;
  MtpInputActs<T> mtp_in_acts{};
  HeadActs<T> mtp_head_acts{};
  std::vector<T> mtp_logits, mtp_lse;
  SeqLayout layout;
  LossParts loss;
  double loss_scale = 1.0, mtp_weight = 0.0;  // as the forward used them (the backward must match)
  bool forward_done = false;
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
Model<T>::Model(const ModelConfig& cfg, const ModelOptions& opts, const ModelPartition& part)
    : Model(cfg, opts, part, true) {}

template <class T>
Model<T>::Model(const ModelConfig& cfg, const ModelOptions& opts, const ModelPartition& part, bool allocate)
    : cfg_(cfg), cfg_ext_(extended_config(cfg)), opts_(opts), part_(part.resolved(cfg)) {
  TREX_CHECK(cfg.score_func == "sqrtsoftplus" && cfg.norm_topk_prob,
             "model: only sqrtsoftplus routing with normalised top-k weights is implemented (config has {}, "
             "norm_topk_prob {})",
             cfg.score_func, cfg.norm_topk_prob);
  TREX_CHECK(cfg.n_mtp <= 1, "model: {} MTP modules configured; only 0 or 1 is supported", cfg.n_mtp);
  const int64_t d = cfg.hidden, hc = cfg.hc_mult;
  const bool mtp = cfg.n_mtp > 0 && opts.use_mtp && part_.head;
  // The MTP input embeds token t+1 with the shared embedding: the head stage holds a copy (stage_shared_params).
  if (part_.embed || mtp) params_.declare("embed.weight", {cfg.vocab_size, d});
  if (part_.head) {
    params_.declare("head.weight", {cfg.vocab_size, d});
    params_.declare("norm.weight", {d});
    params_.declare("hc_head_fn", {hc, hc * d});
    params_.declare("hc_head_base", {hc});
    params_.declare("hc_head_scale", {1});
  }
  auto block = [&](const std::string& prefix, int64_t layer) {
    const size_t first = params_.entries().size();
    declare_block(prefix, cfg_ext_, layer);
    blocks_.back()->entry_begin = first;
    blocks_.back()->entry_end = params_.entries().size();
  };
  for (int64_t l = part_.layer_begin; l < part_.layer_end; ++l) block(fmt::format("layers.{}.", l), l);
  if (mtp) {
    block("mtp.0.", cfg.n_layers);
    for (const char* n : {"e_proj.weight", "h_proj.weight"}) params_.declare(std::string("mtp.0.") + n, {d, d});
    for (const char* n : {"enorm.weight", "hnorm.weight", "norm.weight"})
      params_.declare(std::string("mtp.0.") + n, {d});
    params_.declare("mtp.0.hc_head_fn", {hc, hc * d});
    params_.declare("mtp.0.hc_head_base", {hc});
    params_.declare("mtp.0.hc_head_scale", {1});
  }
  if (!allocate) return;
  params_.allocate();
  for (auto& b : blocks_) bind_block(*b);
  if (mtp) mtp_ = blocks_.back().get();
  const auto& entries = params_.entries();
  std::vector<char> in_block(entries.size(), 0);
  for (auto& b : blocks_)
    for (size_t i = b->entry_begin; i < b->entry_end; ++i) b->hook_params.push_back(&entries[i]), in_block[i] = 1;
  for (size_t i = 0; i < entries.size(); ++i)
    if (!in_block[i]) rest_params_.push_back(&entries[i]);
  slots_.push_back(std::make_unique<Slot>());
}

template <class T>
ParamTable<T> Model<T>::declared_params(const ModelConfig& cfg, const ModelOptions& opts, const ModelPartition& part) {
  Model<T> m(cfg, opts, part, false);
  return m.params_;
}

template <class T>
std::vector<std::string> Model<T>::stage_shared_params() const {
  const bool mtp = cfg_.n_mtp > 0 && opts_.use_mtp;
  // The embed stage's table and the head stage's copy for the MTP input, when they are different stages.
  if (mtp && part_.embed != part_.head) return {"embed.weight"};
  return {};
}

template <class T>
void Model<T>::set_slots(int64_t n) {
  TREX_CHECK(n >= 1, "model: {} activation slots", n);
  while (int64_t(slots_.size()) < n) slots_.push_back(std::make_unique<Slot>());
  slots_.resize(size_t(n));
  if (cur_ >= n) cur_ = 0;
}

template <class T>
typename Model<T>::Slot& Model<T>::slot(int64_t i) const {
  TREX_CHECK(i >= 0 && i < n_slots(), "model: no activation slot {} ({} slots)", i, n_slots());
  return *slots_[size_t(i)];
}

template <class T>
size_t Model<T>::activation_bytes() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s->act.size() * sizeof(T);
  return n;
}

template <class T>
const LossParts& Model<T>::loss_parts(int64_t i) const {
  return slot(i).loss;
}

template <class T>
const std::string& Model<T>::block_prefix(int64_t l) const {
  TREX_CHECK(l >= 0 && l < n_blocks(), "model: no block {}", l);
  return blocks_[size_t(l)]->prefix;
}

template <class T>
const T* Model<T>::logits() const {
  const Slot& s = slot(cur_);
  TREX_CHECK(part_.head && !s.logits.empty(), "model: no logits (not the head stage, or no forward yet)");
  return s.logits.data();
}

template <class T>
const T* Model<T>::final_normed() const {
  const Slot& s = slot(cur_);
  TREX_CHECK(part_.head && !s.logits.empty(), "model: no final hidden state (not the head stage, or no forward yet)");
  return s.head_acts.normed;
}

template <class T>
const T* Model<T>::layer_input(int64_t l) const {
  const Slot& s = slot(cur_);
  TREX_CHECK(l >= 0 && l < int64_t(s.X.size()), "model: no layer input {} (forward run: {})", l, !s.X.empty());
  return s.X[size_t(l)];
}

template <class T>
Model<T>::~Model() = default;

template <class T>
const AttentionSaved<T>& Model<T>::attention_saved(int64_t l) const {
  const Slot& s = slot(cur_);
  TREX_CHECK(l >= 0 && l < int64_t(s.blocks.size()), "model: no block {} in the last forward", l);
  return s.blocks[size_t(l)].asaved;
}

template <class T>
const std::vector<int64_t>& Model<T>::expert_load(int64_t l) const {
  const Slot& s = slot(cur_);
  TREX_CHECK(l >= 0 && l < int64_t(s.blocks.size()), "model: no block {} in the last forward", l);
  return s.blocks[size_t(l)].load;
}

template <class T>
const int32_t* Model<T>::router_selection(int64_t l) const {
  const Slot& s = slot(cur_);
  TREX_CHECK(l >= 0 && l < int64_t(s.blocks.size()), "model: no block {} in the last forward", l);
  return s.blocks[size_t(l)].macts.sel;
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
  // Routed experts held here ([expert_begin, expert_end): all of them without expert parallelism; official names
  // keep the global expert id): all w1, then all w3, then all w2, each contiguous (no padding between experts
  // because f*d is a multiple of 16 in every real config; checked in bind_block).
  for (int w : {1, 3, 2})
    for (int64_t e = part_.expert_begin; e < part_.expert_end; ++e)
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
  const int64_t e0 = part_.expert_begin, e1 = part_.expert_end;  // MoeWeights point at the first local expert
  auto expert_base = [&](int w, bool grad) {
    const std::string n0 = fmt::format("ffn.experts.{}.w{}.weight", e0, w);
    T* first = grad ? G(n0) : V(n0);
    for (int64_t e = e0 + 1; e < e1; ++e) {
      const std::string n = fmt::format("ffn.experts.{}.w{}.weight", e, w);
      const T* pe = grad ? G(n) : V(n);
      TREX_CHECK(pe == first + (e - e0) * b.moe.inter * b.moe.d,
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

// Activation table of one slot: every slice the forward keeps, carved from one arena. Pass `base` null to count.
template <class T>
void Model<T>::plan_activations(Slot& s, int64_t B, int64_t S) {
  if (B == s.B && S == s.S && !s.act.empty()) return;
  const int64_t N = B * S, d = cfg_.hidden, hc = cfg_.hc_mult, M = (2 + hc) * hc, V = cfg_.vocab_size;
  const int64_t Lm = part_.layer_end - part_.layer_begin;
  s.blocks.clear();
  s.blocks.resize(blocks_.size());
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
      Block& b = *blocks_[i];
      BlockActs& a = s.blocks[i];
      for (MhcSiteActs<T>* st : {&a.sa, &a.sf}) {
        st->mix = take(N * M), st->rstd = take(N), st->pre = take(N * hc), st->post = take(N * hc);
        st->comb = take(N * hc * hc);
      }
      a.col_a = take(N * d), a.a = take(N * d), a.a_rstd = take(N), a.y_a = take(N * d);
      a.X_mid = take(N * hc * d);
      a.col_f = take(N * d), a.u = take(N * d), a.u_rstd = take(N), a.y_f = take(N * d);
      a.n_tok = N;
      b.moe.n_tok = N;
      a.moe_t = take(moe_act_sizes(b.moe).t_elems);
    }
    if (part_.head) {
      T* head = take(head_act_elems(N, hc, d));
      if (base) s.head_acts = head_acts_bind(N, hc, d, head, (T*)nullptr);
    }
    if (mtp_) {
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
    Block& b = *blocks_[i];
    BlockActs& a = s.blocks[i];
    a.moe_i.assign(size_t(moe_act_sizes(b.moe).i32_elems), 0);
    a.macts = moe_acts_bind(b.moe, a.moe_t, a.moe_i.data());
    a.load.assign(size_t(b.moe.n_experts), 0);
  }
  if (part_.head) {
    s.logits.assign(size_t(N * V), T(0));
    s.lse.assign(size_t(N), T(0));
    s.head_acts.logits = s.logits.data();
  }
  if (mtp_) {
    s.mtp_logits.assign(size_t(N * V), T(0));
    s.mtp_lse.assign(size_t(N), T(0));
    s.mtp_head_acts.logits = s.mtp_logits.data();
  }
  s.B = B, s.S = S;
}

template <class T>
void Model<T>::set_expert_exchange(ExpertExchange<T>* ex) {
  if (ex)
    TREX_CHECK(ex->expert_begin() == part_.expert_begin && ex->expert_end() == part_.expert_end,
               "model: the expert exchange holds experts [{}, {}), this model [{}, {})", ex->expert_begin(),
               ex->expert_end(), part_.expert_begin, part_.expert_end);
  ex_ = ex;
}

// The exchange the MoE layers use: the one set, or (every expert here) the MoE layer's own local one.
template <class T>
ExpertExchange<T>* Model<T>::expert_exchange() const {
  TREX_CHECK(ex_ || (part_.expert_begin == 0 && part_.expert_end == cfg_.n_routed_experts),
             "model: this model holds routed experts [{}, {}) of {}: set_expert_exchange() must name where the others "
             "are",
             part_.expert_begin, part_.expert_end, cfg_.n_routed_experts);
  return ex_;
}

// One exchange handle per (block, activation slot): the slot is the micro-batch in flight.
template <class T>
ExchangeKey Model<T>::exchange_key(const Block& b, const BlockActs& a) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const auto& bl = slots_[i]->blocks;
    if (!bl.empty() && &a >= bl.data() && &a < bl.data() + bl.size()) return ExchangeKey{b.layer, int64_t(i)};
  }
  fail("model: block {} activations belong to no slot", b.prefix);
}

template <class T>
void Model<T>::block_fwd(Block& b, BlockActs& a, const T* Xin, T* Xout, const int32_t* ids, const SeqLayout& layout) {
  const int64_t N = a.n_tok, d = cfg_.hidden;
  b.moe.n_tok = N;
  MhcShape ms{N, cfg_.hc_mult, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  mhc_site_fwd(ms, Xin, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, a.sa, a.col_a);
  norm_fwd(a.col_a, b.attn_norm, N, d, cfg_.rms_eps, a.a, a.a_rstd);
  b.attn->forward(b.ap, a.a, a.y_a, layout, a.asaved);
  mhc_expand_fwd(ms, Xin, a.y_a, a.sa.post, a.sa.comb, a.X_mid);
  mhc_site_fwd(ms, a.X_mid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, a.sf, a.col_f);
  norm_fwd(a.col_f, b.ffn_norm, N, d, cfg_.rms_eps, a.u, a.u_rstd);
  moe_fwd(b.moe, b.mw, a.u, ids, a.macts, a.y_f, expert_exchange(), exchange_key(b, a));
  mhc_expand_fwd(ms, a.X_mid, a.y_f, a.sf.post, a.sf.comb, Xout);
  moe_expert_load(a.macts.sel, N, b.moe.topk, b.moe.n_experts, a.load.data());
}

template <class T>
void Model<T>::block_bwd(Block& b, BlockActs& a, const T* Xin, const T* dXout, T* dXin, const SeqLayout& layout) {
  const int64_t N = a.n_tok, d = cfg_.hidden, hc = cfg_.hc_mult;
  b.moe.n_tok = N;
  MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  std::vector<T> dX_mid(size_t(N * hc * d), T(0)), dy(size_t(N * d), T(0)), dpost(size_t(N * hc)),
      dcomb(size_t(N * hc * hc)), dnormed(size_t(N * d), T(0)), dcol(size_t(N * d), T(0)),
      scratch(size_t(N * ms.n_mix()));
  mhc_expand_bwd(ms, a.X_mid, a.y_f, a.sf.post, a.sf.comb, dXout, dX_mid.data(), dy.data(), dpost.data(),
                 dcomb.data());
  moe_bwd(b.moe, b.mw, a.u, a.macts, dy.data(), a.dscores.empty() ? nullptr : a.dscores.data(), dnormed.data(),
          b.mg, expert_exchange(), exchange_key(b, a));
  norm_bwd(a.col_f, b.ffn_norm, a.u_rstd, dnormed.data(), N, d, dcol.data(), b.g_ffn_norm);
  mhc_site_bwd(ms, a.X_mid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, a.sf, dcol.data(), dpost.data(),
               dcomb.data(), dX_mid.data(), b.g_hc_ffn_fn, b.g_hc_ffn_base, b.g_hc_ffn_scale, scratch.data());
  std::fill(dXin, dXin + N * hc * d, T(0));
  std::fill(dy.begin(), dy.end(), T(0));
  mhc_expand_bwd(ms, Xin, a.y_a, a.sa.post, a.sa.comb, dX_mid.data(), dXin, dy.data(), dpost.data(), dcomb.data());
  std::fill(dnormed.begin(), dnormed.end(), T(0));
  b.attn->backward(b.ap, b.ag, layout, a.asaved, dy.data(), dnormed.data());
  std::fill(dcol.begin(), dcol.end(), T(0));
  norm_bwd(a.col_a, b.attn_norm, a.a_rstd, dnormed.data(), N, d, dcol.data(), b.g_attn_norm);
  mhc_site_bwd(ms, Xin, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, a.sa, dcol.data(), dpost.data(),
               dcomb.data(), dXin, b.g_hc_attn_fn, b.g_hc_attn_base, b.g_hc_attn_scale, scratch.data());
}

template <class T>
double Model<T>::forward(const int32_t* ids, const int32_t* labels, const SeqLayout& layout) {
  TREX_CHECK(part_.embed && part_.head,
             "model: forward() runs the whole model; the stage holding layers [{}, {}) runs forward_stage()",
             part_.layer_begin, part_.layer_end);
  return forward_stage(0, ids, labels, layout, nullptr, nullptr, 1.0);
}

template <class T>
void Model<T>::backward() {
  TREX_CHECK(part_.embed && part_.head, "model: backward() runs the whole model; a stage runs backward_stage()");
  backward_stage(cur_, nullptr, nullptr);
}

template <class T>
double Model<T>::forward_stage(int64_t si, const int32_t* ids, const int32_t* labels, const SeqLayout& layout,
                               const T* x_in, T* x_out, double loss_scale) {
  Slot& s = slot(si);
  layout.validate();
  const int64_t B = layout.B, S = layout.T, N = B * S, d = cfg_.hidden, hc = cfg_.hc_mult, V = cfg_.vocab_size;
  const int64_t Lm = part_.layer_end - part_.layer_begin;
  TREX_CHECK(part_.embed || x_in, "model stage (layers [{}, {})): forward needs the incoming stream", part_.layer_begin,
             part_.layer_end);
  TREX_CHECK(part_.head || x_out, "model stage (layers [{}, {})): forward needs a buffer for the outgoing stream",
             part_.layer_begin, part_.layer_end);
  TREX_CHECK(!part_.head || labels, "model: the head stage's forward needs labels");
  plan_activations(s, B, S);
  cur_ = si;
  s.layout = layout;
  s.ids.assign(ids, ids + N);
  s.loss = LossParts{};
  s.loss_scale = loss_scale;
  s.mtp_weight = opts_.mtp_weight;
  const int64_t* doc = s.layout.doc_start.data();

  if (part_.embed)
    embed_streams_fwd(s.ids.data(), N, params_.value("embed.weight"), V, d, hc, s.X[0]);
  else
    std::copy(x_in, x_in + N * hc * d, s.X[0]);
  for (int64_t l = 0; l < Lm; ++l)
    block_fwd(*blocks_[size_t(l)], s.blocks[size_t(l)], s.X[size_t(l)], s.X[size_t(l + 1)], s.ids.data(), s.layout);
  if (part_.head) {
    s.targets = shifted_targets(labels, doc, B, S, 1, V);
    MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
    HeadParams<T> hp{params_.value("hc_head_fn"), params_.value("hc_head_base"), params_.value("hc_head_scale"),
                     params_.value("norm.weight"), params_.value("head.weight")};
    head_fwd(ms, V, s.X[size_t(Lm)], hp, s.head_acts);
    s.loss.lm = lm_loss_fwd(s.logits.data(), s.targets.data(), N, V, s.lse.data(), &s.loss.lm_targets);
    s.loss.total = s.loss.lm;
    if (mtp_) {
      s.next_ids.assign(size_t(N), -1);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t + 1 < S; ++t)
          if (doc[b * S + t + 1] == doc[b * S + t]) s.next_ids[size_t(b * S + t)] = s.ids[size_t(b * S + t + 1)];
      s.mtp_targets = shifted_targets(labels, doc, B, S, 2, V);
      MtpInputParams<T> mp{params_.value("mtp.0.enorm.weight"), params_.value("mtp.0.hnorm.weight"),
                           params_.value("mtp.0.e_proj.weight"), params_.value("mtp.0.h_proj.weight")};
      mtp_input_fwd(N, hc, d, cfg_.rms_eps, s.next_ids.data(), params_.value("embed.weight"), V, s.X[size_t(Lm)], mp,
                    s.mtp_in_acts, s.Xm_in);
      block_fwd(*mtp_, s.blocks.back(), s.Xm_in, s.Xm_out, s.ids.data(), s.layout);
      HeadParams<T> mh{params_.value("mtp.0.hc_head_fn"), params_.value("mtp.0.hc_head_base"),
                       params_.value("mtp.0.hc_head_scale"), params_.value("mtp.0.norm.weight"),
                       params_.value("head.weight")};
      head_fwd(ms, V, s.Xm_out, mh, s.mtp_head_acts);
      s.loss.mtp = lm_loss_fwd(s.mtp_logits.data(), s.mtp_targets.data(), N, V, s.mtp_lse.data(), &s.loss.mtp_targets);
      s.loss.total += s.mtp_weight * s.loss.mtp;
    }
  } else {
    std::copy(s.X[size_t(Lm)], s.X[size_t(Lm)] + N * hc * d, x_out);
  }

  // Balance loss: per layer, so each stage adds its own layers' terms.
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = *blocks_[i];
    BlockActs& a = s.blocks[i];
    const bool on = opts_.balance_alpha != 0.0 && (!b.hash || opts_.balance_hash_layers);
    if (!on) {
      a.dscores.clear();
      continue;
    }
    a.dscores.assign(size_t(N * b.moe.n_experts), T(0));
    s.loss.balance += balance_loss(a.macts.scores, a.macts.sel, B, S, b.moe.n_experts, b.moe.topk,
                                   opts_.balance_alpha, a.dscores.data());
    if (loss_scale != 1.0)
      for (auto& g : a.dscores) g = T(double(g) * loss_scale);
  }
  s.loss.total += s.loss.balance;
  s.forward_done = true;
  return loss_scale * s.loss.total;
}

template <class T>
void Model<T>::backward_stage(int64_t si, const T* dx_out, T* dx_in) {
  Slot& s = slot(si);
  TREX_CHECK(s.forward_done, "model: backward of activation slot {} called without a forward()", si);
  TREX_CHECK(part_.head || dx_out, "model stage (layers [{}, {})): backward needs the outgoing stream's gradient",
             part_.layer_begin, part_.layer_end);
  TREX_CHECK(part_.embed || dx_in, "model stage (layers [{}, {})): backward needs a buffer for the input gradient",
             part_.layer_begin, part_.layer_end);
  const int64_t N = s.B * s.S, d = cfg_.hidden, hc = cfg_.hc_mult, V = cfg_.vocab_size;
  const int64_t Lm = part_.layer_end - part_.layer_begin;
  MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  std::vector<T> dX(size_t(N * hc * d), T(0)), dX_prev(size_t(N * hc * d), T(0));

  if (part_.head) {
    std::vector<T> dlogits(size_t(N * V));
    std::vector<T> scratch(size_t(N * (d + hc)));
    if (mtp_) {
      lm_loss_bwd(s.mtp_logits.data(), s.mtp_lse.data(), s.mtp_targets.data(), N, V, s.loss.mtp_targets,
                  s.mtp_weight * s.loss_scale, dlogits.data());
      HeadParams<T> mh{params_.value("mtp.0.hc_head_fn"), params_.value("mtp.0.hc_head_base"),
                       params_.value("mtp.0.hc_head_scale"), params_.value("mtp.0.norm.weight"),
                       params_.value("head.weight")};
      HeadGrads<T> mg{params_.grad("mtp.0.hc_head_fn"), params_.grad("mtp.0.hc_head_base"),
                      params_.grad("mtp.0.hc_head_scale"), params_.grad("mtp.0.norm.weight"),
                      params_.grad("head.weight")};
      std::vector<T> dXm_out(size_t(N * hc * d), T(0)), dXm_in(size_t(N * hc * d), T(0));
      head_bwd(ms, V, s.Xm_out, mh, s.mtp_head_acts, dlogits.data(), dXm_out.data(), mg, scratch.data());
      block_bwd(*mtp_, s.blocks.back(), s.Xm_in, dXm_out.data(), dXm_in.data(), s.layout);
      if (hook_) hook_(n_blocks() - 1, mtp_->hook_params);
      MtpInputParams<T> mp{params_.value("mtp.0.enorm.weight"), params_.value("mtp.0.hnorm.weight"),
                           params_.value("mtp.0.e_proj.weight"), params_.value("mtp.0.h_proj.weight")};
      MtpInputGrads<T> mig{params_.grad("mtp.0.enorm.weight"), params_.grad("mtp.0.hnorm.weight"),
                           params_.grad("mtp.0.e_proj.weight"), params_.grad("mtp.0.h_proj.weight")};
      mtp_input_bwd(N, hc, d, s.next_ids.data(), s.X[size_t(Lm)], mp, s.mtp_in_acts, dXm_in.data(), dX.data(),
                    params_.grad("embed.weight"), mig);
    }
    lm_loss_bwd(s.logits.data(), s.lse.data(), s.targets.data(), N, V, s.loss.lm_targets, s.loss_scale,
                dlogits.data());
    HeadParams<T> hp{params_.value("hc_head_fn"), params_.value("hc_head_base"), params_.value("hc_head_scale"),
                     params_.value("norm.weight"), params_.value("head.weight")};
    HeadGrads<T> hg{params_.grad("hc_head_fn"), params_.grad("hc_head_base"), params_.grad("hc_head_scale"),
                    params_.grad("norm.weight"), params_.grad("head.weight")};
    head_bwd(ms, V, s.X[size_t(Lm)], hp, s.head_acts, dlogits.data(), dX.data(), hg, scratch.data());
  } else {
    std::copy(dx_out, dx_out + N * hc * d, dX.begin());
  }
  for (int64_t l = Lm - 1; l >= 0; --l) {
    block_bwd(*blocks_[size_t(l)], s.blocks[size_t(l)], s.X[size_t(l)], dX.data(), dX_prev.data(), s.layout);
    std::swap(dX, dX_prev);
    if (hook_) hook_(l, blocks_[size_t(l)]->hook_params);
  }
  if (part_.embed)
    embed_streams_bwd(s.ids.data(), N, d, hc, dX.data(), params_.grad("embed.weight"));
  else
    std::copy(dX.begin(), dX.end(), dx_in);
  if (hook_) hook_(-1, rest_params_);
}

template class Model<float>;
template class Model<double>;

}  // namespace trex::dsv4
