#include "parallel/grad_reducer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace trex::parallel {

int64_t ShardPlan::total_elems() const {
  int64_t s = 0;
  for (int64_t e : owned_elems) s += e;
  return s;
}

int64_t ShardPlan::padding_elems() const {
  int64_t moved = 0;
  for (const auto& b : buckets) moved += b.part_elems * ranks;
  return moved - total_elems();
}

ShardPlan plan_shards(const std::vector<int64_t>& numels, int ranks, int64_t bucket_elems) {
  TREX_CHECK(ranks >= 1, "ZeRO-1 layout: {} ranks", ranks);
  TREX_CHECK(bucket_elems >= 1, "ZeRO-1 layout: bucket size {} elements (must be >= 1)", bucket_elems);
  ShardPlan plan;
  plan.ranks = ranks;
  plan.owned_elems.assign(size_t(ranks), 0);
  const int64_t cap = std::max<int64_t>(1, (bucket_elems + ranks - 1) / ranks);
  const int64_t slack = cap / 4;
  std::vector<int64_t> part(size_t(ranks), 0);
  BucketPlan cur;
  auto close = [&] {
    cur.part_elems = *std::max_element(part.begin(), part.end());
    plan.buckets.push_back(std::move(cur));
    cur = BucketPlan{};
    std::fill(part.begin(), part.end(), 0);
  };
  for (size_t t = 0; t < numels.size(); ++t) {
    TREX_CHECK(numels[t] >= 0, "ZeRO-1 layout: tensor {} has {} elements", t, numels[t]);
    // The least-loaded owner overall: owners never differ by more than the largest tensor.
    const int j =
        int(std::min_element(plan.owned_elems.begin(), plan.owned_elems.end()) - plan.owned_elems.begin());
    cur.slots.push_back({int(t), j, part[size_t(j)], numels[t]});
    part[size_t(j)] += numels[t];
    plan.owned_elems[size_t(j)] += numels[t];
    const auto [lo, hi] = std::minmax_element(part.begin(), part.end());
    int64_t sum = 0;
    for (int64_t p : part) sum += p;
    if ((*lo >= cap && *hi - *lo <= slack) || sum >= 4 * bucket_elems) close();
  }
  if (!cur.slots.empty()) close();
  return plan;
}

GradReducer::GradReducer(comm::Communicator& group, std::vector<optim::ParamRef> tensors,
                         int64_t bucket_elems)
    : tensors_(std::move(tensors)) {
  std::vector<int64_t> numels;
  for (const auto& p : tensors_) {
    TREX_CHECK(p.trains() && p.grad != nullptr && p.value != nullptr,
               "ZeRO-1: tensor {} is not a trainable parameter with a gradient buffer", p.name);
    numels.push_back(p.numel());
  }
  plan_ = plan_shards(numels, group.size(), bucket_elems);
  bucket_of_.assign(tensors_.size(), -1);
  slot_of_.assign(tensors_.size(), -1);
  ready_.assign(tensors_.size(), 0);
  buf_.resize(plan_.buckets.size());
  std::vector<comm::SyncBucket> sync;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const auto& bp = plan_.buckets[b];
    for (size_t s = 0; s < bp.slots.size(); ++s) {
      bucket_of_[size_t(bp.slots[s].tensor)] = int(b);
      slot_of_[size_t(bp.slots[s].tensor)] = int(s);
    }
    // Zeroed once: padding is never written by packing, so it only ever carries zeros.
    buf_[b].full.assign(size_t(bp.part_elems) * size_t(plan_.ranks), 0.0f);
    buf_[b].shard.assign(size_t(bp.part_elems), 0.0f);
    buf_[b].send.assign(size_t(bp.part_elems), 0.0f);
    sync.push_back({bp.part_elems, int(bp.slots.size())});
  }
  for (size_t t = 0; t < tensors_.size(); ++t) TREX_ASSERT(bucket_of_[t] >= 0);
  sync_ = std::make_unique<comm::BucketSync>(group, static_cast<comm::BucketMemory&>(*this), std::move(sync));
}

int GradReducer::owner_of(int tensor) const {
  const auto& bp = plan_.buckets[size_t(bucket_of_[size_t(tensor)])];
  return bp.slots[size_t(slot_of_[size_t(tensor)])].owner;
}

void GradReducer::begin(float scale) {
  sync_->begin(scale);
  std::fill(ready_.begin(), ready_.end(), 0);
}

comm::BucketTransfer GradReducer::reduce_args(int b, float scale) {
  const auto& bp = plan_.buckets[size_t(b)];
  Buffers& B = buf_[size_t(b)];
  const int64_t P = bp.part_elems;
  for (const auto& s : bp.slots) {
    float* dst = B.full.data() + int64_t(s.owner) * P + s.offset;
    const float* g = tensors_[size_t(s.tensor)].grad;
    for (int64_t i = 0; i < s.numel; ++i) dst[i] = g[i] * scale;
  }
  return {B.full.data(), B.shard.data(), size_t(P), comm::ElemType::F32};
}

void GradReducer::mark_ready(int t) {
  if (!armed()) return;  // hooks fire on every micro-batch; only the step's last backward counts
  TREX_CHECK(t >= 0 && size_t(t) < tensors_.size(), "ZeRO-1: tensor index {} out of range", t);
  TREX_CHECK(!ready_[size_t(t)], "ZeRO-1: gradient of {} reported ready twice in one step",
             tensors_[size_t(t)].name);
  ready_[size_t(t)] = 1;
  sync_->mark_ready(bucket_of_[size_t(t)]);
}

void GradReducer::finish() {
  sync_->finish();
}

std::vector<optim::ParamRef> GradReducer::owned(int b) const {
  std::vector<optim::ParamRef> out;
  const int me = rank();
  for (const auto& s : plan_.buckets[size_t(b)].slots) {
    if (s.owner != me) continue;
    optim::ParamRef p = tensors_[size_t(s.tensor)];
    p.grad = const_cast<float*>(buf_[size_t(b)].shard.data()) + s.offset;
    out.push_back(std::move(p));
  }
  return out;
}

const float* GradReducer::reduced_grad(int t) const {
  const auto& s = plan_.buckets[size_t(bucket_of_[size_t(t)])].slots[size_t(slot_of_[size_t(t)])];
  return s.owner == rank() ? buf_[size_t(bucket_of_[size_t(t)])].shard.data() + s.offset : nullptr;
}

comm::BucketTransfer GradReducer::gather_args(int b) {
  const auto& bp = plan_.buckets[size_t(b)];
  Buffers& B = buf_[size_t(b)];
  const int me = rank();
  for (const auto& s : bp.slots)
    if (s.owner == me)
      std::memcpy(B.send.data() + s.offset, tensors_[size_t(s.tensor)].value,
                  size_t(s.numel) * sizeof(float));
  return {B.send.data(), B.full.data(), size_t(bp.part_elems), comm::ElemType::F32};
}

void GradReducer::gather_done(int b, comm::WorkPtr w) {
  w->wait();
  const auto& bp = plan_.buckets[size_t(b)];
  const Buffers& B = buf_[size_t(b)];
  const int me = rank();
  for (const auto& s : bp.slots)
    if (s.owner != me)
      std::memcpy(tensors_[size_t(s.tensor)].value,
                  B.full.data() + int64_t(s.owner) * bp.part_elems + s.offset,
                  size_t(s.numel) * sizeof(float));
}

}  // namespace trex::parallel
