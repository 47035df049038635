#include "parallel/expert_dispatch.h"

#include "model/dsv4/expert_exchange.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace trex::parallel {

using comm::WorkPtr;

ExpertDispatcher::ExpertDispatcher(comm::Communicator& ep_group, int n_experts, int64_t hidden)
    : comm_(ep_group), n_experts_(n_experts), hidden_(hidden) {
  TREX_CHECK(n_experts % ep_group.size() == 0, "{} experts cannot be split over {} expert-parallel ranks",
             n_experts, ep_group.size());
}

ExpertDispatcher::Pending::Pending(WorkPtr work, std::vector<float> send, std::vector<float> recv,
                                   std::vector<float>* out, const std::vector<int64_t>* map, int64_t hidden)
    : work_(std::move(work)), send_(std::move(send)), recv_(std::move(recv)), out_(out), map_(map),
      hidden_(hidden) {}

void ExpertDispatcher::Pending::wait() {
  if (!work_) return;
  work_->wait();
  work_.reset();
  const size_t row_bytes = size_t(hidden_) * sizeof(float);
  for (size_t i = 0; i < map_->size(); ++i)
    std::memcpy(out_->data() + (*map_)[i] * hidden_, recv_.data() + i * hidden_, row_bytes);
  send_ = {};
  recv_ = {};
}

DispatchHandle ExpertDispatcher::plan(const int32_t* topk_experts, int64_t n_tokens, int topk) {
  const int ranks = comm_.size();
  const int per_rank = n_experts_ / ranks;
  DispatchHandle h;
  h.n_tokens = n_tokens;
  h.topk = topk;
  h.hidden = hidden_;
  h.n_local_experts = per_rank;

  // Count rows per (destination rank, its local expert) and order the slots by that key.
  std::vector<int64_t> per_expert(size_t(n_experts_), 0);
  for (int64_t s = 0; s < n_tokens * topk; ++s) {
    int e = topk_experts[s];
    TREX_CHECK(e >= 0 && e < n_experts_, "routing: token {} slot {} names expert {}, outside [0, {})", s / topk,
               s % topk, e, n_experts_);
    ++per_expert[size_t(e)];
  }
  std::vector<int64_t> expert_offset(size_t(n_experts_) + 1, 0);
  for (int e = 0; e < n_experts_; ++e) expert_offset[size_t(e) + 1] = expert_offset[size_t(e)] + per_expert[size_t(e)];
  h.send_slots.assign(size_t(n_tokens * topk), 0);
  std::vector<int64_t> cursor(expert_offset.begin(), expert_offset.end() - 1);
  for (int64_t s = 0; s < n_tokens * topk; ++s) h.send_slots[size_t(cursor[size_t(topk_experts[s])]++)] = s;
  // Exchange the per-expert counts: rank r learns how many rows each source sends to each of its experts.
  std::vector<int64_t> recv_counts(size_t(ranks * per_rank), 0);
  {
    std::vector<size_t> bytes(size_t(ranks), size_t(per_rank) * sizeof(int64_t));
    std::vector<size_t> offs(static_cast<size_t>(ranks), 0);
    for (int r = 0; r < ranks; ++r) offs[size_t(r)] = size_t(r) * size_t(per_rank) * sizeof(int64_t);
    comm_.all_to_all_v(per_expert.data(), bytes, offs, recv_counts.data(), bytes, offs)->wait();
  }
  dsv4::ExchangeRows x = dsv4::plan_exchange_rows(expert_offset, recv_counts, ranks, per_rank);
  h.send_rows = std::move(x.send_rows), h.send_offsets = std::move(x.send_offsets);
  h.recv_rows = std::move(x.recv_rows), h.recv_offsets = std::move(x.recv_offsets);
  h.recv_to_grouped = std::move(x.recv_to_grouped), h.expert_counts = std::move(x.expert_counts);
  return h;
}

namespace {
std::vector<size_t> to_bytes(const std::vector<size_t>& rows, int64_t hidden) {
  std::vector<size_t> b(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) b[i] = rows[i] * size_t(hidden) * sizeof(float);
  return b;
}
}  // namespace

ExpertDispatcher::Pending ExpertDispatcher::dispatch(const DispatchHandle& h, const float* x,
                                                     std::vector<float>* recv_grouped) {
  // Gather the rows in send order (a token routed to k experts is sent k times, once per slot).
  std::vector<float> send(h.send_slots.size() * size_t(hidden_));
  for (size_t i = 0; i < h.send_slots.size(); ++i)
    std::memcpy(send.data() + i * hidden_, x + (h.send_slots[i] / h.topk) * hidden_, size_t(hidden_) * sizeof(float));
  return to_experts(h, std::move(send), recv_grouped);
}

ExpertDispatcher::Pending ExpertDispatcher::dispatch_slots(const DispatchHandle& h, const float* slot_rows,
                                                           std::vector<float>* recv_grouped) {
  std::vector<float> send(h.send_slots.size() * size_t(hidden_));
  for (size_t i = 0; i < h.send_slots.size(); ++i)
    std::memcpy(send.data() + i * hidden_, slot_rows + h.send_slots[i] * hidden_, size_t(hidden_) * sizeof(float));
  return to_experts(h, std::move(send), recv_grouped);
}

ExpertDispatcher::Pending ExpertDispatcher::to_experts(const DispatchHandle& h, std::vector<float> send,
                                                       std::vector<float>* recv_grouped) {
  std::vector<size_t> sb = to_bytes(h.send_rows, hidden_), so = to_bytes(h.send_offsets, hidden_);
  std::vector<size_t> rb = to_bytes(h.recv_rows, hidden_), ro = to_bytes(h.recv_offsets, hidden_);
  std::vector<float> recv(size_t(h.total_recv()) * size_t(hidden_));
  recv_grouped->assign(recv.size(), 0.0f);
  WorkPtr work = comm_.all_to_all_v(send.data(), sb, so, recv.data(), rb, ro);
  return Pending(std::move(work), std::move(send), std::move(recv), recv_grouped, &h.recv_to_grouped, hidden_);
}

ExpertDispatcher::Pending ExpertDispatcher::combine(const DispatchHandle& h, const float* expert_out,
                                                    std::vector<float>* out_slots) {
  // The reverse path: wire row i goes back to the rank it came from, then to its slot.
  std::vector<float> send(size_t(h.total_recv()) * size_t(hidden_));
  for (size_t i = 0; i < h.recv_to_grouped.size(); ++i)
    std::memcpy(send.data() + i * hidden_, expert_out + h.recv_to_grouped[i] * hidden_,
                size_t(hidden_) * sizeof(float));
  std::vector<size_t> sb = to_bytes(h.recv_rows, hidden_), so = to_bytes(h.recv_offsets, hidden_);
  std::vector<size_t> rb = to_bytes(h.send_rows, hidden_), ro = to_bytes(h.send_offsets, hidden_);
  std::vector<float> recv(h.send_slots.size() * size_t(hidden_));
  out_slots->assign(size_t(h.n_tokens * h.topk) * size_t(hidden_), 0.0f);
  WorkPtr work = comm_.all_to_all_v(send.data(), sb, so, recv.data(), rb, ro);
  return Pending(std::move(work), std::move(send), std::move(recv), out_slots, &h.send_slots, hidden_);
}

}  // namespace trex::parallel
