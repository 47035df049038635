#include "model/dsv4/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/dsv4/param_table.h"

namespace trex::dsv4 {

template <class T>
Model<T>::Model(const ModelConfig& cfg, const ModelOptions& opts, const ModelPartition& part)
    : Model(cfg, opts, part, true) {}

template <class T>
Model<T>::Model(const ModelConfig& cfg, const ModelOptions& opts, const ModelPartition& part, bool allocate)
    : cfg_(cfg), cfg_ext_(with_mtp_block(cfg)), opts_(opts), part_(part.resolved(cfg)) {
  TREX_CHECK(cfg.score_func == "sqrtsoftplus" && cfg.norm_topk_prob,
             "model: only sqrtsoftplus routing with normalised top-k weights is implemented (config has {}, "
             "norm_topk_prob {})",
             cfg.score_func, cfg.norm_topk_prob);
  TREX_CHECK(cfg.n_mtp <= 1, "model: {} MTP modules configured; only 0 or 1 is supported", cfg.n_mtp);
  // Every tensor this stage holds comes from the one parameter table, in its order (the arena layout and the
  // initialisers' random stream follow it). A block's tensors are contiguous there; the MTP module's own tensors
  // (e_proj onwards) follow its block and belong to no block.
  const bool with_mtp = cfg.n_mtp > 0 && opts.use_mtp;
  const bool mtp = with_mtp && part_.head;
  int64_t open = -1;  // the block whose tensors are being declared (-1: none)
  bool mtp_tail = false;
  auto close_block = [&] {
    if (open >= 0) block_entries_.back().second = params_.entries().size();
    open = -1;
  };
  for (const ParamSpec& spec : param_table(cfg)) {
    if (!partition_holds(part_, spec, with_mtp)) continue;
    const std::string prefix =
        spec.part == ParamPart::Mtp ? fmt::format("mtp.{}.", spec.layer) : fmt::format("layers.{}.", spec.layer);
    if (spec.part == ParamPart::Mtp && spec.name == prefix + "e_proj.weight") mtp_tail = true;
    const int64_t blk = spec.part == ParamPart::Layer                ? spec.layer
                        : spec.part == ParamPart::Mtp && !mtp_tail ? cfg.n_layers + spec.layer
                                                                   : -1;
    if (blk != open) {
      close_block();
      if (blk >= 0) {
        new_block(prefix, cfg_ext_, blk);
        block_entries_.emplace_back(params_.entries().size(), 0);
        open = blk;
      }
    }
    switch (spec.kind) {
      case ParamKind::Weight:
        params_.declare(spec.name, spec.shape, spec.lm_grad);
        break;
      case ParamKind::RouterBias:
        params_.bias[spec.name].assign(size_t(trex::numel(spec.shape)), 0.f);
        break;
      case ParamKind::HashTable:
        params_.tid2eid[spec.name].assign(size_t(trex::numel(spec.shape)), 0);
        break;
    }
  }
  close_block();
  if (!allocate) return;
  params_.allocate();
  for (auto& b : blocks_) bind_block(*b);
  mtp_ = mtp;
  const auto& entries = params_.entries();
  std::vector<char> in_block(entries.size(), 0);
  for (const auto& [first, last] : block_entries_) {
    block_params_.emplace_back();
    for (size_t i = first; i < last; ++i) block_params_.back().push_back(&entries[i]), in_block[i] = 1;
  }
  for (size_t i = 0; i < entries.size(); ++i)
    if (!in_block[i]) rest_params_.push_back(&entries[i]);
  const int64_t Lm = part_.layer_end - part_.layer_begin;
  backend_ = std::make_unique<CpuBackend<T>>(
      cfg_, params_, cpu_blocks(),
      CpuBackendShape{part_.embed, part_.head, mtp, Lm, part_.expert_begin, part_.expert_end});
  ProgramShape ps;
  ps.n_layers = Lm, ps.embed = part_.embed, ps.head = part_.head, ps.mtp = mtp, ps.vocab = cfg.vocab_size;
  for (const auto& b : blocks_) ps.balance.push_back(!b->hash || opts_.balance_hash_layers);
  program_ = std::make_unique<BlockProgram>(*backend_, std::move(ps));
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
  backend_->set_slots(n);
  program_->set_slots(n);
  if (cur_ >= n) cur_ = 0;
}

template <class T>
size_t Model<T>::activation_bytes() const {
  return backend_->activation_bytes();
}

template <class T>
std::vector<const CpuBlock<T>*> Model<T>::cpu_blocks() const {
  std::vector<const CpuBlock<T>*> out;
  for (const auto& b : blocks_) out.push_back(b.get());
  return out;
}

template <class T>
const LossParts& Model<T>::loss_parts(int64_t i) const {
  return program_->losses(i);
}

template <class T>
const std::string& Model<T>::block_prefix(int64_t l) const {
  TREX_CHECK(l >= 0 && l < n_blocks(), "model: no block {}", l);
  return blocks_[size_t(l)]->prefix;
}

template <class T>
const T* Model<T>::logits() const {
  const CpuSlot<T>& s = last_slot();
  TREX_CHECK(part_.head && !s.logits.empty(), "model: no logits (not the head stage, or no forward yet)");
  return s.logits.data();
}

template <class T>
const T* Model<T>::final_normed() const {
  const CpuSlot<T>& s = last_slot();
  TREX_CHECK(part_.head && !s.logits.empty(), "model: no final hidden state (not the head stage, or no forward yet)");
  return s.head_acts.normed;
}

template <class T>
const T* Model<T>::layer_input(int64_t l) const {
  const CpuSlot<T>& s = last_slot();
  TREX_CHECK(l >= 0 && l < int64_t(s.X.size()), "model: no layer input {} (forward run: {})", l, !s.X.empty());
  return s.X[size_t(l)];
}

template <class T>
Model<T>::~Model() = default;

template <class T>
const AttentionSaved<T>& Model<T>::attention_saved(int64_t l) const {
  const CpuSlot<T>& s = last_slot();
  TREX_CHECK(l >= 0 && l < int64_t(s.blocks.size()), "model: no block {} in the last forward", l);
  return s.blocks[size_t(l)].asaved;
}

template <class T>
const std::vector<int64_t>& Model<T>::expert_load(int64_t l) const {
  const CpuSlot<T>& s = last_slot();
  TREX_CHECK(l >= 0 && l < int64_t(s.blocks.size()), "model: no block {} in the last forward", l);
  return s.blocks[size_t(l)].load;
}

template <class T>
const int32_t* Model<T>::router_selection(int64_t l) const {
  const CpuSlot<T>& s = last_slot();
  TREX_CHECK(l >= 0 && l < int64_t(s.blocks.size()), "model: no block {} in the last forward", l);
  return s.blocks[size_t(l)].macts.sel;
}

// A block's non-parameter parts (its tensors are declared from the parameter table).
template <class T>
void Model<T>::new_block(const std::string& p, const ModelConfig& c, int64_t layer) {
  auto b = std::make_unique<CpuBlock<T>>();
  b->prefix = p;
  b->layer = layer;
  b->hash = c.mlp_types[size_t(layer)] == MlpType::HashMoE;
  b->attn = std::make_unique<AttentionLayerT<T>>(c, layer);
  b->aspecs = attention_param_specs(c, layer);
  b->moe.d = c.hidden;
  b->moe.n_experts = c.n_routed_experts;
  b->moe.topk = c.topk;
  b->moe.inter = c.moe_inter;
  b->moe.shared_inter = c.moe_inter * c.n_shared_experts;
  b->moe.routed_scale = c.routed_scale;
  b->moe.swiglu_limit = c.swiglu_limit;
  b->moe.hash = b->hash;
  blocks_.push_back(std::move(b));
}

template <class T>
void Model<T>::bind_block(CpuBlock<T>& b) {
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

template <class T>
void Model<T>::set_expert_exchange(ExpertExchange<T>* ex) {
  if (ex)
    TREX_CHECK(ex->expert_begin() == part_.expert_begin && ex->expert_end() == part_.expert_end,
               "model: the expert exchange holds experts [{}, {}), this model [{}, {})", ex->expert_begin(),
               ex->expert_end(), part_.expert_begin, part_.expert_end);
  backend_->set_expert_exchange(ex);
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
  TREX_CHECK(si >= 0 && si < n_slots(), "model: no activation slot {} ({} slots)", si, n_slots());
  layout.validate();
  TREX_CHECK(part_.embed || x_in, "model stage (layers [{}, {})): forward needs the incoming stream", part_.layer_begin,
             part_.layer_end);
  TREX_CHECK(part_.head || x_out, "model stage (layers [{}, {})): forward needs a buffer for the outgoing stream",
             part_.layer_begin, part_.layer_end);
  TREX_CHECK(!part_.head || labels, "model: the head stage's forward needs labels");
  cur_ = si;
  MicroBatch mb;
  mb.slot = si, mb.ids = ids, mb.labels = labels, mb.layout = &layout, mb.x_in = x_in, mb.x_out = x_out;
  mb.loss_scale = loss_scale, mb.mtp_weight = opts_.mtp_weight, mb.balance_alpha = opts_.balance_alpha;
  return loss_scale * program_->forward(mb).total;
}

template <class T>
void Model<T>::backward_stage(int64_t si, const T* dx_out, T* dx_in) {
  TREX_CHECK(si >= 0 && si < n_slots(), "model: no activation slot {} ({} slots)", si, n_slots());
  TREX_CHECK(part_.head || dx_out, "model stage (layers [{}, {})): backward needs the outgoing stream's gradient",
             part_.layer_begin, part_.layer_end);
  TREX_CHECK(part_.embed || dx_in, "model stage (layers [{}, {})): backward needs a buffer for the input gradient",
             part_.layer_begin, part_.layer_end);
  BlocksReady ready;
  if (hook_)
    ready = [this](int64_t b) {  // the head's tensors are among the rest, reported at -1
      if (b != kHeadReady) hook_(b, b >= 0 ? block_params_[size_t(b)] : rest_params_);
    };
  program_->backward(si, dx_out, dx_in, ready);
}

template class Model<float>;
template class Model<double>;

}  // namespace trex::dsv4
