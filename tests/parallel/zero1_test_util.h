// Shared by the ZeRO-1 tests: deterministic micro-batches for the toy and tiny DeepSeek-V4 models, the
// single-process reference step (grad accumulation as train/trainer.cpp does it), and a tiny config.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/batch.h"
#include "data/sampler.h"
#include "model/dsv4/config.h"
#include "optim/optimizer.h"
#include "train/trainable.h"

namespace trex::zero1_test {

// Micro-batch `index` of step `step`: one document per row, random tokens, labels aligned with the ids
// (data/batch.h), the first position of each row unlabelled (and every 5th label dropped, so masks matter).
inline data::Batch make_batch(int64_t vocab, int64_t rows, int64_t seq, int64_t step, int64_t index) {
  uint64_t s = 0x9E3779B97F4A7C15ull * uint64_t(step * 1000 + index + 1);
  data::Batch b;
  b.batch = rows, b.seq = seq;
  const size_t n = size_t(rows * seq);
  b.input_ids.resize(n), b.labels.resize(n), b.pos.resize(n), b.doc_start.resize(n);
  for (size_t i = 0; i < n; ++i) b.input_ids[i] = int32_t(data::splitmix64(s) % uint64_t(vocab));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t) {
      const size_t i = size_t(r * seq + t);
      b.pos[i] = int32_t(t);
      b.doc_start[i] = t == 0;
      b.labels[i] = (t > 0 && (i % 5) != 0) ? b.input_ids[i] : -1;
      b.n_targets += b.labels[i] >= 0;
    }
  return b;
}

inline dsv4::ModelConfig tiny_dsv4_config(int64_t vocab) {
  using json = nlohmann::json;
  json j = {{"vocab_size", vocab}, {"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
            {"num_key_value_heads", 1}, {"head_dim", 8}, {"qk_rope_head_dim", 4}, {"q_lora_rank", 8},
            {"o_groups", 2}, {"o_lora_rank", 4}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
            {"n_shared_experts", 1}, {"moe_intermediate_size", 8}, {"routed_scaling_factor", 1.5},
            {"scoring_func", "sqrtsoftplus"}, {"norm_topk_prob", true}, {"swiglu_limit", 10.0},
            {"index_n_heads", 2}, {"index_head_dim", 4}, {"index_topk", 2}, {"sliding_window", 4},
            {"compress_ratios", {0, 4, 0}}, {"num_hash_layers", 1}, {"hc_mult", 2}, {"hc_sinkhorn_iters", 10},
            {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000}, {"compress_rope_theta", 160000},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64},
                              {"beta_fast", 32}, {"beta_slow", 1}}},
            {"max_position_embeddings", 256}, {"num_nextn_predict_layers", 1}, {"tie_word_embeddings", false},
            {"bos_token_id", 0}, {"eos_token_id", 1}};
  return dsv4::parse_model_config(j, "zero1-tiny");
}

inline optim::OptimizerConfig optimizer_config(const char* kind, double clip, double adamw_eps = 1e-8) {
  optim::OptimizerConfig c;
  c.kind = kind;
  c.adamw.eps = adamw_eps;
  c.clip_grad_norm = clip;
  return c;
}

// The gradient half of one trainer step on one process over `micro` micro-batches (mean of the
// micro-batch losses, gradients scaled by 1 / micro), as train/trainer.cpp does it. Returns the loss.
template <typename MakeBatch>
double reference_grads(train::Trainable& m, int64_t micro, MakeBatch make) {
  m.zero_grads();
  double loss = 0;
  for (int64_t i = 0; i < micro; ++i) loss += m.forward_backward(make(i)).loss / double(micro);
  if (micro > 1) {
    const float scale = float(1.0 / double(micro));
    for (auto& p : m.params())
      if (p.trains())
        for (int64_t i = 0; i < p.numel(); ++i) p.grad[i] *= scale;
  }
  return loss;
}

// The update half: clip, step, router-bias update. Returns the gradient norm before clipping.
inline double reference_update(train::Trainable& m, optim::Optimizer& opt, double lr) {
  const double norm = opt.clip_gradients();
  opt.step(lr);
  m.after_optimizer_step();
  return norm;
}

template <typename MakeBatch>
double reference_step(train::Trainable& m, optim::Optimizer& opt, int64_t micro, double lr, MakeBatch make,
                      double* norm) {
  const double loss = reference_grads(m, micro, make);
  *norm = reference_update(m, opt, lr);
  return loss;
}

}  // namespace trex::zero1_test
