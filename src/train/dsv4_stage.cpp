#include "train/dsv4_stage.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/moe.h"
#include "optim/param_groups.h"

namespace trex::train {

Dsv4Stage::Dsv4Stage(const dsv4::ModelConfig& cfg, const dsv4::ModelPartition& part, const Dsv4TrainOptions& opts,
                     uint64_t seed, int64_t n_slots)
    : opts_(opts), model_(cfg, opts.model, part) {
  TREX_CHECK(n_slots >= 1, "{}: {} activation slots", where(), n_slots);
  init_dsv4_weights(model_.params(), cfg, opts.model, opts.init_std, seed);
  model_.set_slots(n_slots);
  owner_.assign(size_t(n_slots), -1);
  load_sum_.assign(size_t(model_.n_blocks()), std::vector<int64_t>(size_t(cfg.n_routed_experts), 0));
}

std::string Dsv4Stage::where() const {
  const auto& p = model_.partition();
  return fmt::format("dsv4 stage (layers [{}, {}){}{})", p.layer_begin, p.layer_end, p.embed ? ", embed" : "",
                     p.head ? ", head" : "");
}

void Dsv4Stage::load_pretrained(const std::filesystem::path& dir) {
  model_.load(dsv4::load_state_dict(dir, model_.config()), /*allow_extra=*/true);
}

void Dsv4Stage::set_step_batches(const std::vector<data::Batch>& batches) {
  TREX_CHECK(!batches.empty(), "{}: a step needs at least one micro-batch", where());
  for (size_t s = 0; s < owner_.size(); ++s)
    TREX_CHECK(owner_[s] < 0, "{}: new step while micro-batch {} is still in flight (slot {})", where(), owner_[s], s);
  const int64_t B = batches[0].batch, S = batches[0].seq;
  layouts_.clear();
  for (size_t m = 0; m < batches.size(); ++m) {
    const data::Batch& b = batches[m];
    TREX_CHECK(b.batch == B && b.seq == S, "{}: micro-batch {} is [{}, {}], micro-batch 0 is [{}, {}]", where(), m,
               b.batch, b.seq, B, S);
    TREX_CHECK(int64_t(b.input_ids.size()) == B * S && int64_t(b.labels.size()) == B * S &&
                   int64_t(b.pos.size()) == B * S && int64_t(b.doc_start.size()) == B * S,
               "{}: micro-batch {} has arrays of the wrong size for [{}, {}]", where(), m, B, S);
    layouts_.push_back(batch_layout(b));
  }
  batches_ = batches;
  loss_scale_ = 1.0 / double(batches.size());
  loss_sum_ = lm_sum_ = mtp_sum_ = balance_sum_ = 0;
  n_forward_ = n_targets_ = 0;
}

int64_t Dsv4Stage::boundary_elems() const {
  TREX_CHECK(!batches_.empty(), "{}: boundary_elems() before set_step_batches()", where());
  return model_.stream_elems(batches_[0].batch * batches_[0].seq);
}

double Dsv4Stage::forward(int64_t m, const void* x_in, void* x_out) {
  TREX_CHECK(m >= 0 && m < int64_t(batches_.size()), "{}: micro-batch {} of a step of {}", where(), m,
             batches_.size());
  const int64_t slot = slot_of(m);
  TREX_CHECK(owner_[size_t(slot)] < 0, "{}: micro-batch {} needs activation slot {}, still held by micro-batch {} ({} "
             "slots; the schedule keeps more in flight)", where(), m, slot, owner_[size_t(slot)], owner_.size());
  const data::Batch& b = batches_[size_t(m)];
  const double loss =
      model_.forward_stage(slot, b.input_ids.data(), b.labels.data(), layouts_[size_t(m)], static_cast<const float*>(x_in), static_cast<float*>(x_out),
                           loss_scale_);
  owner_[size_t(slot)] = m;
  for (int64_t l = 0; l < model_.n_blocks(); ++l) {
    const auto& load = model_.expert_load(l);
    auto& sum = load_sum_[size_t(l)];
    for (size_t e = 0; e < load.size() && e < sum.size(); ++e) sum[e] += load[e];
  }
  const dsv4::LossParts& p = model_.loss_parts(slot);
  loss_sum_ += loss;
  lm_sum_ += p.lm, mtp_sum_ += p.mtp, balance_sum_ += p.balance;
  n_targets_ += p.lm_targets;
  ++n_forward_;
  return loss;
}

void Dsv4Stage::backward(int64_t m, const void* dx_out, void* dx_in) {
  const int64_t slot = m >= 0 ? slot_of(m) : 0;
  TREX_CHECK(m >= 0 && owner_[size_t(slot)] == m, "{}: backward of micro-batch {} that is not in flight", where(), m);
  model_.backward_stage(slot, static_cast<const float*>(dx_out), static_cast<float*>(dx_in));
  owner_[size_t(slot)] = -1;
}

std::vector<optim::ParamRef> Dsv4Stage::params() {
  return dsv4_param_refs(model_.params());
}

void Dsv4Stage::zero_grads() {
  model_.params().zero_grads();
  for (auto& l : load_sum_) std::fill(l.begin(), l.end(), 0);
}

StepStats Dsv4Stage::step_stats() const {
  StepStats s;
  const double n = n_forward_ > 0 ? double(n_forward_) : 1.0;
  s.loss = loss_sum_;
  s.n_targets = n_targets_;
  s.parts = {{"lm", lm_sum_ / n}, {"mtp", mtp_sum_ / n}, {"balance", balance_sum_ / n}};
  return s;
}

void Dsv4Stage::after_optimizer_step() {
  if (opts_.bias_update_speed == 0) return;
  auto& bias = model_.params().bias;
  for (int64_t l = 0; l < model_.n_blocks(); ++l) {
    auto it = bias.find(model_.block_prefix(l) + "ffn.gate.bias");
    if (it == bias.end()) continue;  // hash layer
    dsv4::router_bias_update(it->second.data(), load_sum_[size_t(l)].data(), int64_t(it->second.size()),
                             opts_.bias_update_speed);
  }
}

}  // namespace trex::train
