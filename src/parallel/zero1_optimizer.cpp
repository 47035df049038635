#include "parallel/zero1_optimizer.h"

#include <cmath>

#include "core/error.h"
#include "optim/update_rules.h"

namespace trex::parallel {

bool is_expert_param(std::string_view name) { return name.find(".ffn.experts.") != std::string_view::npos; }

Zero1Optimizer::Zero1Optimizer(std::vector<optim::ParamRef> params, const optim::OptimizerConfig& cfg, Mesh& mesh,
                               Zero1Options opts)
    : Zero1Optimizer(std::move(params), cfg, *mesh.dp_group, *mesh.edp_group, mesh.pp_group.get(), opts) {}

Zero1Optimizer::Zero1Optimizer(std::vector<optim::ParamRef> params, const optim::OptimizerConfig& cfg,
                               comm::Communicator& dp_group, comm::Communicator& edp_group,
                               comm::Communicator* pp_group, Zero1Options opts)
    : params_(std::move(params)), cfg_(cfg), dp_(dp_group), pp_(pp_group) {
  // Gradients become ready in backward order: the reverse of the model's table.
  std::vector<optim::ParamRef> lists[2];
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    const optim::ParamRef& p = *it;
    TREX_CHECK(!index_.count(p.name), "ZeRO-1: parameter {} appears twice in the table", p.name);
    if (!p.trains()) {
      index_[p.name] = {-1, -1};
      continue;
    }
    TREX_CHECK(p.grad != nullptr, "parameter {} trains but has no gradient buffer", p.name);
    const int g = is_expert_param(p.name) ? 1 : 0;
    index_[p.name] = {g, int(lists[g].size())};
    lists[g].push_back(p);
  }
  reducer_[0] = std::make_unique<GradReducer>(dp_group, std::move(lists[0]), opts.bucket_elems);
  reducer_[1] = std::make_unique<GradReducer>(edp_group, std::move(lists[1]), opts.bucket_elems);
  for (int g = 0; g < 2; ++g)
    for (int b = 0; b < reducer_[g]->n_buckets(); ++b)
      parts_.push_back({g, b, std::make_unique<optim::Optimizer>(reducer_[g]->owned(b), cfg_)});
}

void Zero1Optimizer::begin_grad_sync(double grad_scale) {
  // Experts too are divided by the DP size: their gradients already hold every EP rank's tokens.
  const float scale = float(grad_scale / double(dp_.size()));
  reducer_[0]->begin(scale);
  reducer_[1]->begin(scale);
}

void Zero1Optimizer::on_grads_ready(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    auto it = index_.find(n);
    TREX_CHECK(it != index_.end(), "ZeRO-1: gradient-ready hook named '{}', which is not in the parameter table", n);
    if (it->second.first >= 0) reducer_[it->second.first]->mark_ready(it->second.second);
  }
}

void Zero1Optimizer::finish_grad_sync() {
  reducer_[0]->finish();
  reducer_[1]->finish();
}

double Zero1Optimizer::grad_norm() {
  // Each tensor is owned by exactly one rank of the DP group (experts: one per EDP group, and the EDP
  // groups of a stage partition its DP group), so the owners' sums over DP (then PP) cover it once.
  double ss = 0;
  for (const auto& part : parts_)
    for (const auto& p : part.opt->params()) ss += optim::sum_squares(p.grad, p.numel());
  dp_.all_reduce_sum(&ss, 1);
  if (pp_ != nullptr && pp_->size() > 1) pp_->all_reduce_sum(&ss, 1);
  return std::sqrt(ss);
}

double Zero1Optimizer::clip_gradients() {
  const double norm = grad_norm();
  if (cfg_.clip_grad_norm > 0 && norm > cfg_.clip_grad_norm && std::isfinite(norm)) {
    const float scale = float(cfg_.clip_grad_norm / (norm + 1e-6));  // as optim::Optimizer::clip_gradients
    for (const auto& part : parts_)
      for (const auto& p : part.opt->params())
        for (int64_t i = 0; i < p.numel(); ++i) p.grad[i] *= scale;
  }
  return norm;
}

void Zero1Optimizer::step(double lr) {
  ++step_;
  // Update bucket k, start its gather, and only then finish bucket k-1's: the gather of one bucket is in
  // flight while the next one is being updated.
  for (size_t k = 0; k < parts_.size(); ++k) {
    parts_[k].opt->step(lr);
    reducer_[parts_[k].group]->start_gather(parts_[k].bucket);
    if (k > 0) reducer_[parts_[k - 1].group]->wait_gather(parts_[k - 1].bucket);
  }
  if (!parts_.empty()) reducer_[parts_.back().group]->wait_gather(parts_.back().bucket);
}

void Zero1Optimizer::set_steps_done(int64_t s) {
  step_ = s;
  for (auto& part : parts_) part.opt->set_steps_done(s);
}

std::vector<optim::StateTensor> Zero1Optimizer::state_tensors() {
  std::vector<optim::StateTensor> out;
  for (auto& part : parts_)
    for (auto& st : part.opt->state_tensors()) out.push_back(std::move(st));
  return out;
}

int Zero1Optimizer::owner_of(const std::string& name) const {
  auto it = index_.find(name);
  TREX_CHECK(it != index_.end(), "ZeRO-1: no parameter named '{}'", name);
  if (it->second.first < 0) return -1;
  return reducer_[it->second.first]->owner_of(it->second.second);
}

bool Zero1Optimizer::owns(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end() || it->second.first < 0) return false;
  return reducer_[it->second.first]->owner_of(it->second.second) == reducer_[it->second.first]->rank();
}

const float* Zero1Optimizer::reduced_grad(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end() || it->second.first < 0) return nullptr;
  return reducer_[it->second.first]->reduced_grad(it->second.second);
}

void all_reduce_expert_loads(comm::Communicator& dp_group, std::vector<std::vector<int64_t>>& loads) {
  std::vector<int64_t> flat;
  for (const auto& l : loads) flat.insert(flat.end(), l.begin(), l.end());
  if (flat.empty()) return;
  dp_group.all_reduce(flat.data(), flat.size(), comm::ElemType::I64, comm::ReduceOp::Sum)->wait();
  size_t i = 0;
  for (auto& l : loads)
    for (auto& x : l) x = flat[i++];
}

}  // namespace trex::parallel
