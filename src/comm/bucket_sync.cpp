#include "comm/bucket_sync.h"

#include <algorithm>

#include "core/error.h"

namespace trex::comm {

BucketSync::BucketSync(Communicator& group, BucketMemory& memory, std::vector<SyncBucket> buckets,
                       std::vector<int> start_order)
    : comm_(group), mem_(memory), buckets_(std::move(buckets)) {
  const int n = n_buckets();
  if (start_order.empty())
    for (int b = 0; b < n; ++b) start_order.push_back(b);
  TREX_CHECK(int(start_order.size()) == n, "bucket sync: a start order of {} buckets for a plan of {}",
             start_order.size(), n);
  std::vector<uint8_t> seen(size_t(n), 0);
  for (int b : start_order) {
    TREX_CHECK(b >= 0 && b < n && !seen[size_t(b)],
               "bucket sync: start order names bucket {} twice or out of [0, {})", b, n);
    seen[size_t(b)] = 1;
    const SyncBucket& s = buckets_[size_t(b)];
    TREX_CHECK(s.part_elems >= 0 && s.marks >= 0, "bucket sync: bucket {} has part {} and {} marks", b,
               s.part_elems, s.marks);
    if (s.part_elems > 0) order_.push_back(b);
  }
  pending_.assign(size_t(n), 0);
  reduce_.resize(size_t(n));
  gather_.resize(size_t(n));
}

void BucketSync::begin(float scale) {
  TREX_CHECK(!armed_, "bucket sync: gradient sync begun twice without finish()");
  for (int b = 0; b < n_buckets(); ++b) {
    TREX_CHECK(!reduce_[size_t(b)] && !gather_[size_t(b)],
               "bucket sync: gradient sync begun while bucket {} is still in flight", b);
    pending_[size_t(b)] = buckets_[size_t(b)].marks;
  }
  next_ = landed_ = 0;
  scale_ = scale;
  armed_ = true;
}

void BucketSync::start(int b) {
  const BucketTransfer t = mem_.reduce_args(b, scale_);
  TREX_CHECK(int64_t(t.count) == buckets_[size_t(b)].part_elems,
             "bucket sync: bucket {}'s reduce-scatter moves {} elements per rank, the plan says {}", b,
             t.count, buckets_[size_t(b)].part_elems);
  WorkPtr w = comm_.reduce_scatter(t.send, t.recv, t.count, t.type, ReduceOp::Sum);
  mem_.reduce_posted(b, *w);
  reduce_[size_t(b)] = std::move(w);
}

void BucketSync::mark_ready(int b) {
  if (!armed_) return;
  TREX_CHECK(b >= 0 && b < n_buckets(), "bucket sync: bucket {} out of [0, {})", b, n_buckets());
  TREX_CHECK(pending_[size_t(b)] > 0, "bucket sync: bucket {} marked ready more often than its {} marks", b,
             buckets_[size_t(b)].marks);
  --pending_[size_t(b)];
  while (next_ < int(order_.size()) && pending_[size_t(order_[size_t(next_)])] == 0)
    start(order_[size_t(next_++)]);
  // Drive the reductions in flight (MPI progresses non-blocking collectives inside its calls): the oldest
  // incomplete one, so a mark costs one test rather than one per bucket started.
  while (landed_ < next_ && reduce_[size_t(order_[size_t(landed_)])]->test()) ++landed_;
}

void BucketSync::finish() {
  TREX_CHECK(armed_, "bucket sync: finish() without begin()");
  while (next_ < int(order_.size())) start(order_[size_t(next_++)]);
  for (int b : order_) mem_.reduce_done(b, std::move(reduce_[size_t(b)]));
  for (auto& w : reduce_) w.reset();
  armed_ = false;
}

void BucketSync::start_gather(int b) {
  TREX_CHECK(!armed_, "bucket sync: parameter gather while a gradient sync is open");
  TREX_CHECK(b >= 0 && b < n_buckets(), "bucket sync: bucket {} out of [0, {})", b, n_buckets());
  TREX_CHECK(!gather_[size_t(b)], "bucket sync: bucket {} gathered while its last gather is still in flight",
             b);
  if (buckets_[size_t(b)].part_elems == 0) return;
  const BucketTransfer t = mem_.gather_args(b);
  TREX_CHECK(int64_t(t.count) == buckets_[size_t(b)].part_elems,
             "bucket sync: bucket {}'s all-gather moves {} elements per rank, the plan says {}", b, t.count,
             buckets_[size_t(b)].part_elems);
  gather_[size_t(b)] = comm_.all_gather(t.send, t.recv, t.count, t.type);
}

void BucketSync::wait_gather(int b) {
  TREX_CHECK(b >= 0 && b < n_buckets() && gather_[size_t(b)],
             "bucket sync: bucket {} waited without a gather in flight", b);
  mem_.gather_done(b, std::move(gather_[size_t(b)]));
  gather_[size_t(b)].reset();
}

void BucketSync::wait_gathers() {
  for (int b = 0; b < n_buckets(); ++b)
    if (gather_[size_t(b)]) wait_gather(b);
}

}  // namespace trex::comm
