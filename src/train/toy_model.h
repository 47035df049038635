// A tiny language model with a hand-derived gradient, used to test the trainer (optimisers, clipping,
// checkpoints, resume, spike handling) independently of DeepSeek-V4:
//   h = embed[x];  z = W h;  a = tanh(z) * g + h;  logits = head a;  loss = mean CE over labelled tokens.
// Parameter names follow the DeepSeek-V4 conventions so the optimiser groups come out the same way
// (embed/head/norm -> AdamW, the matrix -> Muon). Deterministic: fixed-order loops, no threading.
#pragma once
#include <cstdint>
#include <vector>

#include "train/trainable.h"

namespace trex::train {

class ToyLM : public Trainable {
 public:
  ToyLM(int64_t vocab, int64_t hidden, uint64_t seed, double init_std = 0.02);
  std::vector<optim::ParamRef> params() override;
  void zero_grads() override;
  StepStats forward_backward(const data::Batch& batch) override;
  double flops_per_token(int64_t seq_len) const override;
  std::string describe() const override;

  int64_t vocab() const { return V_; }
  int64_t hidden() const { return d_; }
  // Loss only (no gradient), for tests.
  double loss(const data::Batch& batch) const;

 private:
  double run(const data::Batch& batch, bool backward);
  int64_t V_, d_;
  std::vector<float> embed_, w_, g_, head_;
  std::vector<float> dembed_, dw_, dg_, dhead_;
};

}  // namespace trex::train
