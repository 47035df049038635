// Expert parallelism for the CPU model: the ExpertExchange the MoE layers call (model/dsv4/expert_exchange.h),
// implemented over the ExpertDispatcher (expert_dispatch.h) of one EP group. Rank r of the group holds experts
// [r * E/ep, (r+1) * E/ep) (the Mesh's first_local_expert / n_local_experts). Each (layer, micro-batch) key keeps
// its own DispatchHandle and buffers from plan() to release(), so micro-batches of a pipeline can overlap.
//
// Every collective is issued in the same order on every rank of the group: all ranks run the same layers and
// micro-batches in the same order, which the model's schedule guarantees.
#pragma once
#include <map>
#include <memory>

#include "comm/communicator.h"
#include "model/dsv4/expert_exchange.h"
#include "parallel/expert_dispatch.h"

namespace trex::parallel {

class EpExchange final : public dsv4::ExpertExchange<float> {
 public:
  // ep_group: the ranks sharing tokens (Mesh::ep_group); n_experts: routed experts per layer; hidden: row width.
  EpExchange(comm::Communicator& ep_group, int64_t n_experts, int64_t hidden);
  ~EpExchange() override;

  int64_t expert_begin() const override { return begin_; }
  int64_t expert_end() const override { return begin_ + dispatcher_.experts_per_rank(); }
  const std::vector<int64_t>& plan(const dsv4::ExchangeKey& key, const int32_t* sel, int64_t n_tok, int64_t topk,
                                   int64_t d) override;
  void dispatch(const dsv4::ExchangeKey& key, const float* rows, bool per_slot) override;
  const float* dispatch_wait(const dsv4::ExchangeKey& key) override;
  void combine(const dsv4::ExchangeKey& key, const float* grouped) override;
  void combine_wait(const dsv4::ExchangeKey& key, float* out_slots) override;
  void release(const dsv4::ExchangeKey& key) override;
  size_t handles() const { return states_.size(); }  // live (layer, micro-batch) handles

 private:
  struct State {
    DispatchHandle h;
    std::vector<float> grouped, slots;  // receive buffers of the dispatch / the combine
    ExpertDispatcher::Pending pending;
    enum class Op { None, Dispatch, Combine } op = Op::None;
  };
  State& state(const dsv4::ExchangeKey& key, const char* what);

  ExpertDispatcher dispatcher_;
  int64_t hidden_, begin_;
  std::map<dsv4::ExchangeKey, std::unique_ptr<State>> states_;
};

}  // namespace trex::parallel
