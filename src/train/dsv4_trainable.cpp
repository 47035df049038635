#include "train/dsv4_trainable.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "data/sampler.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/param_table.h"
#include "optim/param_groups.h"

namespace trex::train {

Dsv4Trainable::Dsv4Trainable(const dsv4::ModelConfig& cfg, const Dsv4TrainOptions& opts, uint64_t seed)
    : cfg_(cfg), opts_(opts), model_(std::make_unique<dsv4::Model<float>>(cfg, opts.model)) {
  init_weights(seed);
  load_sum_.assign(size_t(model_->n_blocks()), std::vector<int64_t>(size_t(cfg.n_routed_experts), 0));
}

static double normal(uint64_t& s) {
  double u1 = (double(data::splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
  double u2 = (double(data::splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Design §5 (transformers/NeMo convention): N(0, std) for matrices incl. mHC fn, norms 1, mHC base 0 and
// scale 1, attention sinks 0, compressor ape 0, router bias 0; tid2eid a fixed random table of K distinct
// experts per token (the official hash is unpublished).
void Dsv4Trainable::init_weights(uint64_t seed) {
  init_dsv4_weights(model_->params(), cfg_, opts_.model, opts_.init_std, seed);
}

void init_dsv4_weights(dsv4::ParamTable<float>& table, const dsv4::ModelConfig& cfg, const dsv4::ModelOptions& mopts,
                       double init_std, uint64_t seed) {
  // The whole model's tensors in the parameter table's order (the random stream), each by its table init.
  const bool with_mtp = cfg.n_mtp > 0 && mopts.use_mtp;
  std::set<std::string> hash_tables;  // in name order, as the stream has always drawn them
  uint64_t s = seed;
  for (const dsv4::ParamSpec& e : dsv4::param_table(cfg)) {
    if (e.part == dsv4::ParamPart::Mtp && !with_mtp) continue;
    if (e.kind == dsv4::ParamKind::HashTable) hash_tables.insert(e.name);
    if (!e.trained()) continue;
    const int64_t n = numel(e.shape);
    float* v = table.has(e.name) ? table.value(e.name) : nullptr;
    if (e.init == dsv4::ParamInit::One || e.init == dsv4::ParamInit::Zero) {
      if (v) std::fill(v, v + n, e.init == dsv4::ParamInit::One ? 1.0f : 0.0f);
      continue;
    }
    // splitmix64 is a counter (state += golden ratio per draw): value i of this tensor draws from the state
    // s + 2 i golden, so the values are filled in parallel, bit-identical to one sequential stream, and a
    // tensor this table lacks is skipped by advancing the state.
    const uint64_t s0 = s;
    if (v) {
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 18))
      for (int64_t i = 0; i < n; ++i) {
        uint64_t si = s0 + uint64_t(2 * i) * 0x9E3779B97F4A7C15ull;
        v[i] = float(init_std * normal(si));
      }
    }
    s = s0 + uint64_t(2 * n) * 0x9E3779B97F4A7C15ull;
  }
  for (auto& [name, b] : table.bias) std::fill(b.begin(), b.end(), 0.0f);
  const int64_t K = cfg.topk, E = cfg.n_routed_experts;
  TREX_CHECK(K <= E, "config: topk {} > n_routed_experts {}", K, E);
  std::vector<int32_t> scratch(size_t(cfg.vocab_size * K));
  for (const std::string& name : hash_tables) {
    auto it = table.tid2eid.find(name);
    std::vector<int32_t>& t = it != table.tid2eid.end() ? it->second : scratch;  // rejection sampling: replay it
    for (int64_t tok = 0; tok < cfg.vocab_size; ++tok)
      for (int64_t k = 0; k < K; ++k) {
        int32_t e;
        bool dup;
        do {
          e = int32_t(data::splitmix64(s) % uint64_t(E));
          dup = false;
          for (int64_t j = 0; j < k; ++j) dup |= t[size_t(tok * K + j)] == e;
        } while (dup);
        t[size_t(tok * K + k)] = e;
      }
  }
}

dsv4::SeqLayout batch_layout(const data::Batch& b) {
  dsv4::SeqLayout layout;
  layout.B = b.batch, layout.T = b.seq;
  layout.pos.resize(size_t(b.batch * b.seq));
  layout.doc_start.resize(size_t(b.batch * b.seq));
  for (int64_t r = 0; r < b.batch; ++r) {
    int64_t start = 0;
    for (int64_t t = 0; t < b.seq; ++t) {
      const size_t i = size_t(r * b.seq + t);
      if (b.doc_start[i] || t == 0) start = t;
      layout.pos[i] = b.pos[i];
      layout.doc_start[i] = start;
    }
  }
  return layout;
}

void Dsv4Trainable::load_pretrained(const std::filesystem::path& dir) {
  dsv4::StateDict sd = dsv4::load_state_dict(dir, cfg_);
  model_->load(sd);
}

std::vector<optim::ParamRef> dsv4_param_refs(dsv4::ParamTable<float>& table) {
  std::vector<optim::ParamRef> out;
  for (const auto& e : table.entries())
    out.push_back({e.name, e.shape, table.arena_value(e), table.arena_grad(e), optim::dsv4_param_group(e.name, e.shape)});
  for (auto& [name, b] : table.bias)
    out.push_back({name, {int64_t(b.size())}, b.data(), nullptr, optim::ParamGroup::Buffer});
  return out;
}

std::vector<optim::ParamRef> Dsv4Trainable::params() {
  return dsv4_param_refs(model_->params());
}

void Dsv4Trainable::zero_grads() {
  model_->params().zero_grads();
  for (auto& l : load_sum_) std::fill(l.begin(), l.end(), 0);
}

StepStats Dsv4Trainable::forward_backward(const data::Batch& b) {
  const dsv4::SeqLayout layout = batch_layout(b);
  StepStats s;
  s.loss = model_->forward(b.input_ids.data(), b.labels.data(), layout);  // labels in the model's convention
  model_->backward();
  const auto& parts = model_->loss_parts();
  s.n_targets = parts.lm_targets;
  s.parts = {{"lm", parts.lm}, {"mtp", parts.mtp}, {"balance", parts.balance}};
  for (int64_t l = 0; l < model_->n_blocks(); ++l) {
    const auto& load = model_->expert_load(l);
    for (size_t e = 0; e < load.size() && e < load_sum_[size_t(l)].size(); ++e) load_sum_[size_t(l)][e] += load[e];
  }
  return s;
}

void Dsv4Trainable::set_controls(const StepControls& c) { model_->set_mtp_weight(c.mtp_weight); }

void Dsv4Trainable::after_optimizer_step() {
  if (opts_.bias_update_speed == 0) return;
  auto& bias = model_->params().bias;
  for (int64_t l = 0; l < model_->n_blocks(); ++l) {
    const std::string name = (l < cfg_.n_layers ? fmt::format("layers.{}.", l) : std::string("mtp.0.")) + "ffn.gate.bias";
    auto it = bias.find(name);
    if (it == bias.end()) continue;  // hash layer
    dsv4::router_bias_update(it->second.data(), load_sum_[size_t(l)].data(), int64_t(it->second.size()),
                             opts_.bias_update_speed);
  }
}

double dsv4_flops_per_token(const dsv4::ModelConfig& c, int64_t seq) {
  return dsv4_stage_flops_per_token(c, seq, 0, c.n_layers, true);
}

double dsv4_stage_flops_per_token(const dsv4::ModelConfig& c, int64_t seq, int64_t layer_begin, int64_t layer_end,
                                  bool head) {
  TREX_CHECK(0 <= layer_begin && layer_begin <= layer_end && layer_end <= c.n_layers,
             "FLOPs of layers [{}, {}) outside the model's {} layers", layer_begin, layer_end, c.n_layers);
  const double d = double(c.hidden), nh = double(c.n_heads), hd = double(c.head_dim), qr = double(c.q_lora_rank);
  const double g = double(c.o_groups), dg = double(c.o_lora_rank), E = double(c.n_routed_experts), K = double(c.topk);
  const double f = double(c.moe_inter), ns = double(c.n_shared_experts), hc = double(c.hc_mult), V = double(c.vocab_size);
  const double nI = double(c.index_n_heads), cI = double(c.index_head_dim), ksel = double(c.index_topk);
  const int64_t win = c.window;
  const double attn = d * qr + qr * nh * hd + d * hd + nh * hd * dg + g * dg * d;
  const double mhc = 2 * (2 + hc) * hc * hc * d;
  const double moe = E * d + (K + ns) * 3 * f * d;
  double wbar = 0;
  for (int64_t t = 0; t < seq; ++t) wbar += double(std::min<int64_t>(t + 1, win));
  wbar /= double(seq);
  double p_mm = 0, keys = 0, idx = 0;
  auto layer = [&](int64_t r) {
    p_mm += attn + mhc + moe;
    if (r == 0) {
      keys += wbar;
    } else if (r <= 8) {
      p_mm += 2 * d * 2 * hd + 2 * d * 2 * cI + qr * nI * cI + d * nI;
      double sel = 0, vis = 0;
      for (int64_t t = 0; t < seq; ++t) {
        sel += std::min(ksel, double((t + 1) / r));
        vis += double((t + 1) / r);
      }
      keys += wbar + sel / double(seq);
      idx += nI * (2 * cI + 2) * vis / double(seq);
    } else {
      p_mm += 2 * d * hd;
      double vis = 0;
      for (int64_t t = 0; t < seq; ++t) vis += double((t + 1) / r);
      keys += wbar + vis / double(seq);
    }
  };
  for (int64_t l = layer_begin; l < layer_end; ++l) layer(c.compress_ratio[size_t(l)]);
  if (head) p_mm += hc * hc * d + V * d;  // hc_head and the LM head
  return 3 * (2 * p_mm + 4 * nh * hd * keys + idx);
}

double Dsv4Trainable::flops_per_token(int64_t seq_len) const { return dsv4_flops_per_token(cfg_, seq_len); }

std::string Dsv4Trainable::describe() const {
  return fmt::format("DeepSeek-V4 (hidden {}, {} layers, {} experts top-{}, vocab {}, {} parameters)", cfg_.hidden,
                     cfg_.n_layers, cfg_.n_routed_experts, cfg_.topk, cfg_.vocab_size, model_->params().n_params());
}

}  // namespace trex::train
