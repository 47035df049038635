// Expert-parallel token exchange in DeepEP's shape: a dispatcher per EP group owns its buffers;
// `dispatch` sends every (token, slot) routed to a remote expert and returns the received rows grouped
// by local expert, the per-expert counts for the grouped GEMM, a handle and an in-flight event;
// `combine` takes the handle and returns the expert outputs to their tokens' ranks, one row per
// (token, slot). The backward of dispatch is combine of the gradients (then summed over slots by the
// caller) and the backward of combine is dispatch of the gradients, so the handle serves all four.
//
// Weighting by the gate and the sum over slots stay with the MoE layer, which needs the unweighted
// expert outputs for the gate gradient anyway.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace trex::parallel {

struct DispatchHandle {
  int64_t n_tokens = 0;
  int topk = 0;
  int64_t hidden = 0;
  int n_local_experts = 0;
  // Send side: slot (t*topk + j) of each row, in send order (by destination rank, then local expert).
  std::vector<int64_t> send_slots;
  std::vector<size_t> send_rows, send_offsets;  // per destination rank, in rows
  // Receive side: rows per source rank, and for each received row its position in the grouped buffer.
  std::vector<size_t> recv_rows, recv_offsets;
  std::vector<int64_t> recv_to_grouped;
  std::vector<int64_t> expert_counts;  // rows per local expert (grouped GEMM sizes)
  int64_t total_recv() const { return int64_t(recv_to_grouped.size()); }
};

class ExpertDispatcher {
 public:
  ExpertDispatcher(comm::Communicator& ep_group, int n_experts, int64_t hidden);

  // An asynchronous exchange. It owns both wire buffers until completion; wait() completes it and
  // scatters the received rows into the caller's buffer (row i of the wire goes to map[i]).
  class Pending {
   public:
    Pending() = default;
    Pending(comm::WorkPtr work, std::vector<float> send, std::vector<float> recv, std::vector<float>* out,
            const std::vector<int64_t>* map, int64_t hidden);
    void wait();
    bool done() const { return work_ == nullptr; }

   private:
    comm::WorkPtr work_;
    std::vector<float> send_, recv_;
    std::vector<float>* out_ = nullptr;
    const std::vector<int64_t>* map_ = nullptr;
    int64_t hidden_ = 0;
  };

  // Routing -> handle. Exchanges the per-rank counts (a small blocking all-to-all).
  DispatchHandle plan(const int32_t* topk_experts, int64_t n_tokens, int topk);

  // x: [n_tokens, hidden] (each token's row is sent once per slot routed remotely or locally).
  // recv_grouped: resized to [total_recv, hidden], grouped by local expert once the Pending completes.
  Pending dispatch(const DispatchHandle& h, const float* x, std::vector<float>* recv_grouped);
  // Same movement for per-slot rows: rows [n_tokens*topk, hidden] (the backward of combine).
  Pending dispatch_slots(const DispatchHandle& h, const float* slot_rows, std::vector<float>* recv_grouped);
  // expert_out: [total_recv, hidden] grouped by local expert -> out_slots: [n_tokens*topk, hidden].
  Pending combine(const DispatchHandle& h, const float* expert_out, std::vector<float>* out_slots);

  int rank() const { return comm_.rank(); }
  int ranks() const { return comm_.size(); }
  int experts_per_rank() const { return n_experts_ / comm_.size(); }

 private:
  Pending to_experts(const DispatchHandle& h, std::vector<float> send, std::vector<float>* recv_grouped);

  comm::Communicator& comm_;
  int n_experts_;
  int64_t hidden_;
};

}  // namespace trex::parallel
