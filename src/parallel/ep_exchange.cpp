#include "parallel/ep_exchange.h"

#include <algorithm>

#include "core/error.h"

namespace trex::parallel {

EpExchange::EpExchange(comm::Communicator& ep_group, int64_t n_experts, int64_t hidden)
    : dispatcher_(ep_group, int(n_experts), hidden), hidden_(hidden),
      begin_(int64_t(ep_group.rank()) * (n_experts / ep_group.size())) {}

EpExchange::~EpExchange() {
  // A handle with a transfer in flight owns buffers MPI is still writing: complete it before they are freed.
  for (auto& [key, st] : states_)
    if (!st->pending.done()) st->pending.wait();
}

EpExchange::State& EpExchange::state(const dsv4::ExchangeKey& key, const char* what) {
  auto it = states_.find(key);
  TREX_CHECK(it != states_.end(), "EP exchange (rank {} of {}): {} for layer {} micro-batch {} without a plan()",
             dispatcher_.rank(), dispatcher_.ranks(), what, key.layer, key.micro);
  return *it->second;
}

const std::vector<int64_t>& EpExchange::plan(const dsv4::ExchangeKey& key, const int32_t* sel, int64_t n_tok,
                                             int64_t topk, int64_t d) {
  TREX_CHECK(d == hidden_, "EP exchange (rank {}): layer {} has rows of width {}, the exchange was built for {}",
             dispatcher_.rank(), key.layer, d, hidden_);
  auto& slot = states_[key];
  if (slot && !slot->pending.done()) slot->pending.wait();  // re-planned while a transfer was in flight
  slot = std::make_unique<State>();
  slot->h = dispatcher_.plan(sel, n_tok, int(topk));
  return slot->h.expert_counts;
}

void EpExchange::dispatch(const dsv4::ExchangeKey& key, const float* rows, bool per_slot) {
  State& st = state(key, "dispatch");
  TREX_CHECK(st.pending.done(), "EP exchange (rank {}): dispatch for layer {} micro-batch {} while a transfer is "
             "in flight", dispatcher_.rank(), key.layer, key.micro);
  st.pending = per_slot ? dispatcher_.dispatch_slots(st.h, rows, &st.grouped)
                        : dispatcher_.dispatch(st.h, rows, &st.grouped);
  st.op = State::Op::Dispatch;
}

const float* EpExchange::dispatch_wait(const dsv4::ExchangeKey& key) {
  State& st = state(key, "dispatch_wait");
  TREX_CHECK(st.op == State::Op::Dispatch, "EP exchange (rank {}): dispatch_wait for layer {} micro-batch {} "
             "without a dispatch()", dispatcher_.rank(), key.layer, key.micro);
  st.pending.wait();
  st.op = State::Op::None;
  return st.grouped.data();
}

void EpExchange::combine(const dsv4::ExchangeKey& key, const float* grouped) {
  State& st = state(key, "combine");
  TREX_CHECK(st.pending.done(), "EP exchange (rank {}): combine for layer {} micro-batch {} while a transfer is "
             "in flight", dispatcher_.rank(), key.layer, key.micro);
  st.pending = dispatcher_.combine(st.h, grouped, &st.slots);  // copies `grouped` into its send buffer now
  st.op = State::Op::Combine;
}

void EpExchange::combine_wait(const dsv4::ExchangeKey& key, float* out_slots) {
  State& st = state(key, "combine_wait");
  TREX_CHECK(st.op == State::Op::Combine, "EP exchange (rank {}): combine_wait for layer {} micro-batch {} "
             "without a combine()", dispatcher_.rank(), key.layer, key.micro);
  st.pending.wait();
  st.op = State::Op::None;
  std::copy(st.slots.begin(), st.slots.end(), out_slots);
  st.slots = {};
}

void EpExchange::release(const dsv4::ExchangeKey& key) {
  auto it = states_.find(key);
  if (it == states_.end()) return;
  if (!it->second->pending.done()) it->second->pending.wait();
  states_.erase(it);
}

}  // namespace trex::parallel
