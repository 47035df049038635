#include "model/dsv4/expert_exchange.h"

#include <algorithm>

#include "core/error.h"

namespace trex::dsv4 {

ExchangeRows plan_exchange_rows(const std::vector<int64_t>& expert_offset, const std::vector<int64_t>& recv_counts,
                                int ranks, int per_rank) {
  TREX_CHECK(ranks >= 1 && per_rank >= 1 && expert_offset.size() == size_t(ranks) * size_t(per_rank) + 1 &&
                 recv_counts.size() == size_t(ranks) * size_t(per_rank),
             "expert exchange plan: {} expert offsets and {} received counts for {} ranks x {} experts",
             expert_offset.size(), recv_counts.size(), ranks, per_rank);
  ExchangeRows x;
  x.send_rows.assign(size_t(ranks), 0), x.send_offsets.assign(size_t(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    x.send_offsets[size_t(r)] = size_t(expert_offset[size_t(r * per_rank)]);
    x.send_rows[size_t(r)] = size_t(expert_offset[size_t((r + 1) * per_rank)] - expert_offset[size_t(r * per_rank)]);
  }
  x.expert_counts.assign(size_t(per_rank), 0);
  for (int src = 0; src < ranks; ++src)
    for (int e = 0; e < per_rank; ++e) {
      const int64_t n = recv_counts[size_t(src * per_rank + e)];
      TREX_CHECK(n >= 0, "expert exchange plan: rank {} announces {} rows for local expert {}", src, n, e);
      x.expert_counts[size_t(e)] += n;
    }
  std::vector<int64_t> cursor(size_t(per_rank), 0);
  for (int e = 1; e < per_rank; ++e) cursor[size_t(e)] = cursor[size_t(e - 1)] + x.expert_counts[size_t(e - 1)];
  x.recv_rows.assign(size_t(ranks), 0), x.recv_offsets.assign(size_t(ranks), 0);
  size_t wire = 0;
  for (int src = 0; src < ranks; ++src) {
    x.recv_offsets[size_t(src)] = wire;
    for (int e = 0; e < per_rank; ++e) {
      const int64_t n = recv_counts[size_t(src * per_rank + e)];
      for (int64_t i = 0; i < n; ++i) x.recv_to_grouped.push_back(cursor[size_t(e)]++);
      x.recv_rows[size_t(src)] += size_t(n);
      wire += size_t(n);
    }
  }
  return x;
}

template <class T>
typename LocalExpertExchange<T>::Handle& LocalExpertExchange<T>::handle(const ExchangeKey& key, const char* what) {
  auto it = handles_.find(key);
  TREX_CHECK(it != handles_.end(), "expert exchange: {} for layer {} micro-batch {} without a plan()", what, key.layer,
             key.micro);
  return it->second;
}

template <class T>
const std::vector<int64_t>& LocalExpertExchange<T>::plan(const ExchangeKey& key, const int32_t* sel, int64_t n_tok,
                                                         int64_t topk, int64_t d) {
  Handle& h = handles_[key];
  h = Handle{};
  h.n_tok = n_tok, h.topk = topk, h.d = d;
  h.counts.assign(size_t(n_experts_), 0);
  for (int64_t r = 0; r < n_tok * topk; ++r) {
    TREX_CHECK(sel[r] >= 0 && sel[r] < n_experts_, "expert exchange: token {} slot {} names expert {}, outside [0, {})",
               r / topk, r % topk, sel[r], n_experts_);
    h.counts[size_t(sel[r])]++;
  }
  std::vector<int64_t> fill(size_t(n_experts_), 0);
  for (int64_t e = 1; e < n_experts_; ++e) fill[size_t(e)] = fill[size_t(e - 1)] + h.counts[size_t(e - 1)];
  h.order.assign(size_t(n_tok * topk), 0);
  for (int64_t r = 0; r < n_tok * topk; ++r) h.order[size_t(fill[size_t(sel[r])]++)] = int32_t(r);
  return h.counts;
}

template <class T>
void LocalExpertExchange<T>::dispatch(const ExchangeKey& key, const T* rows, bool per_slot) {
  Handle& h = handle(key, "dispatch");
  h.grouped.resize(h.order.size() * size_t(h.d));
  for (size_t i = 0; i < h.order.size(); ++i) {
    const int64_t src = per_slot ? h.order[i] : h.order[i] / h.topk;
    std::copy_n(rows + src * h.d, h.d, h.grouped.data() + int64_t(i) * h.d);
  }
}

template <class T>
const T* LocalExpertExchange<T>::dispatch_wait(const ExchangeKey& key) {
  return handle(key, "dispatch_wait").grouped.data();
}

template <class T>
void LocalExpertExchange<T>::combine(const ExchangeKey& key, const T* grouped) {
  handle(key, "combine").combine_src = grouped;  // nothing in flight: the copy happens in combine_wait
}

template <class T>
void LocalExpertExchange<T>::combine_wait(const ExchangeKey& key, T* out_slots) {
  Handle& h = handle(key, "combine_wait");
  TREX_CHECK(h.combine_src, "expert exchange: combine_wait for layer {} micro-batch {} without a combine()",
             key.layer, key.micro);
  for (size_t i = 0; i < h.order.size(); ++i)
    std::copy_n(h.combine_src + int64_t(i) * h.d, h.d, out_slots + int64_t(h.order[i]) * h.d);
  h.combine_src = nullptr;
}

template class LocalExpertExchange<float>;
template class LocalExpertExchange<double>;

}  // namespace trex::dsv4
