// Where the routed experts of a MoE layer live, as the model sees it (design §2.9, issue 10 part 3).
// The MoE layer routes on the token's rank, hands the (token, slot) rows to an exchange, runs its shared
// expert while they are in flight, runs the FFN of the experts it holds on the grouped rows it is handed,
// and gives the UNWEIGHTED expert outputs back; the gate weighting and the sum over slots happen on the
// token's rank again. The backward uses the same handle: the backward of combine is a dispatch of the
// per-slot output gradients, the backward of dispatch is a combine of the input gradients.
//
// LocalExpertExchange holds every expert in the process (the single-process model, the decoder, the
// tests). The expert-parallel implementation (parallel/ep_exchange.h) moves rows over the EP group; the
// model never includes comm/ or parallel/ headers, it only holds this interface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace trex::dsv4 {

// The row plan of an expert-parallel exchange, the same for every backend (the CPU's parallel::ExpertDispatcher
// and the GPU MoE's exchange): from this rank's send order (rows sorted by global expert; expert_offset [E + 1]
// its prefix sums) and the counts the peers announced (recv_counts [ranks * per_rank]: rows from source rank s for
// local expert e at s * per_rank + e), which rows go to and come from each peer and where each received row sits
// once the rows are grouped by local expert (wire order: by source rank, then expert, then the source's order).
struct ExchangeRows {
  std::vector<size_t> send_rows, send_offsets;  // per destination rank, in rows
  std::vector<size_t> recv_rows, recv_offsets;  // per source rank, in rows of the wire buffer
  std::vector<int64_t> recv_to_grouped;         // wire row i -> its row in the expert-grouped buffer
  std::vector<int64_t> expert_counts;           // rows per local expert (grouped GEMM sizes)
};
ExchangeRows plan_exchange_rows(const std::vector<int64_t>& expert_offset, const std::vector<int64_t>& recv_counts,
                                int ranks, int per_rank);

// One handle per (MoE layer, micro-batch): a pipeline keeps several micro-batches' handles alive at once.
struct ExchangeKey {
  int64_t layer = 0;
  int64_t micro = 0;
  bool operator<(const ExchangeKey& o) const { return layer != o.layer ? layer < o.layer : micro < o.micro; }
};

template <class T>
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // The experts this process holds: [expert_begin, expert_end) of the layer's global expert ids.
  virtual int64_t expert_begin() const = 0;
  virtual int64_t expert_end() const = 0;

  // Routing -> the handle kept under `key` (replacing an older one) until release(key). sel [n_tok, topk]
  // holds global expert ids. Returns the rows each local expert will receive (its grouped-GEMM size).
  // May block on a small exchange of counts.
  virtual const std::vector<int64_t>& plan(const ExchangeKey& key, const int32_t* sel, int64_t n_tok, int64_t topk,
                                           int64_t d) = 0;
  // Starts moving rows to the experts' holders and returns at once. per_slot = false: token rows [n_tok, d],
  // each sent once per slot (the forward); per_slot = true: slot rows [n_tok*topk, d] (the backward of combine).
  virtual void dispatch(const ExchangeKey& key, const T* rows, bool per_slot) = 0;
  // Completes the dispatch: the received rows, grouped by local expert in plan() order, [sum(counts), d].
  // Valid until the next call for this key.
  virtual const T* dispatch_wait(const ExchangeKey& key) = 0;
  // Starts returning grouped rows [sum(counts), d] to their (token, slot) and returns at once.
  virtual void combine(const ExchangeKey& key, const T* grouped) = 0;
  // Completes the combine: out_slots [n_tok*topk, d] (row t*topk + k) is written.
  virtual void combine_wait(const ExchangeKey& key, T* out_slots) = 0;
  // Frees the handle (after the layer's backward).
  virtual void release(const ExchangeKey& key) = 0;
};

// Every expert local: dispatch gathers rows into expert order, combine scatters them back. No copies of the
// handle outlive release().
template <class T>
class LocalExpertExchange final : public ExpertExchange<T> {
 public:
  explicit LocalExpertExchange(int64_t n_experts) : n_experts_(n_experts) {}
  int64_t expert_begin() const override { return 0; }
  int64_t expert_end() const override { return n_experts_; }
  const std::vector<int64_t>& plan(const ExchangeKey& key, const int32_t* sel, int64_t n_tok, int64_t topk,
                                   int64_t d) override;
  void dispatch(const ExchangeKey& key, const T* rows, bool per_slot) override;
  const T* dispatch_wait(const ExchangeKey& key) override;
  void combine(const ExchangeKey& key, const T* grouped) override;
  void combine_wait(const ExchangeKey& key, T* out_slots) override;
  void release(const ExchangeKey& key) override { handles_.erase(key); }

 private:
  struct Handle {
    int64_t n_tok = 0, topk = 0, d = 0;
    std::vector<int64_t> counts;  // rows per expert
    std::vector<int32_t> order;   // grouped row i = slot order[i] (stable: token order within an expert)
    std::vector<T> grouped;       // the last dispatch's rows
    const T* combine_src = nullptr;
  };
  Handle& handle(const ExchangeKey& key, const char* what);
  int64_t n_experts_;
  std::map<ExchangeKey, Handle> handles_;
};

}  // namespace trex::dsv4
