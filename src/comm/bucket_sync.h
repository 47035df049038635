// The ZeRO bucket protocol of one data-parallel group, written once over comm::Communicator for any memory:
// the CPU's packed host buckets (parallel/grad_reducer.h) and the GPU model's in-arena device buckets
// (model/cuda/grad_buckets.h) both run it.
//
// A step arms the protocol (begin); backward marks gradients ready (mark_ready, one mark per tensor or one
// per bucket, as the plan says); a bucket's reduce-scatter starts once all of its marks are in, buckets
// starting in the plan's start order on every rank whatever order the marks come in, so the collectives match
// across ranks; finish() starts the rest and hands each reduction to the memory, which makes the gradients'
// readers wait for it. After the optimiser, start_gather(b) all-gathers bucket b's updated values and
// wait_gather(b) completes it.
//
// What differs between the two memories is where the bytes are and how completion is ordered, so that is the
// memory's part (BucketMemory): the arguments of each collective (host: a packed buffer; device: the arena in
// place, or a transient fp32 / bf16 copy), what must follow a posted reduction at once (device: a side stream
// that accumulates it), and what completion means (host: wait, unpack; device: the compute stream waits). A
// bucket whose part is empty (another pipeline stage's, on the GPU) is skipped: never started, no collective.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace trex::comm {

// One collective's buffers: `count` elements per rank of type `type` (the reduce-scatter sends size() x count
// and receives count; the all-gather sends count and receives size() x count).
struct BucketTransfer {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ElemType type = ElemType::F32;
};

class BucketMemory {
 public:
  virtual ~BucketMemory() = default;
  // Bucket b is complete: its gradients made ready to send (host: packed and multiplied by `scale`), and the
  // reduce-scatter's buffers.
  virtual BucketTransfer reduce_args(int b, float scale) = 0;
  // Right after bucket b's reduce-scatter was posted: what must be ordered behind it at once.
  virtual void reduce_posted(int b, Work& w) {
    (void)b;
    (void)w;
  }
  // finish(): bucket b's reduction handed over; the readers of its reduced gradients wait for w (host: now).
  virtual void reduce_done(int b, WorkPtr w) = 0;
  // Bucket b's all-gather: the owned updated values made ready to send, and the buffers.
  virtual BucketTransfer gather_args(int b) = 0;
  // Bucket b's all-gather completes: its readers wait for w, and the other owners' values reach the model.
  virtual void gather_done(int b, WorkPtr w) = 0;
};

struct SyncBucket {
  int64_t part_elems = 0;  // every rank's part of the bucket, in elements (0: skipped)
  int marks = 1;           // mark_ready calls that complete it in one step
};

class BucketSync {
 public:
  // buckets: by id; start_order: the ids in the order their reductions start (empty: id order). Every rank of
  // the group must pass the same plan. The group and the memory must outlive this.
  BucketSync(Communicator& group, BucketMemory& memory, std::vector<SyncBucket> buckets,
             std::vector<int> start_order = {});
  BucketSync(const BucketSync&) = delete;
  BucketSync& operator=(const BucketSync&) = delete;

  int n_buckets() const { return int(buckets_.size()); }
  const SyncBucket& bucket(int b) const { return buckets_[size_t(b)]; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // Arms the protocol for one step; `scale` reaches reduce_args (fold 1/dp and 1/grad_accum in there).
  void begin(float scale = 1.0f);
  bool armed() const { return armed_; }
  // One of bucket b's marks; starts every complete bucket whose predecessors in the start order started.
  // Ignored when not armed (hooks fire on every micro-batch; only an armed backward reduces).
  void mark_ready(int b);
  // Starts the buckets not started yet (marks that never came), hands every reduction to the memory; disarms.
  void finish();
  int buckets_started() const { return next_; }

  // The all-gather of bucket b's updated values (a skipped bucket: nothing); wait_gather completes it.
  void start_gather(int b);
  bool gathering(int b) const { return gather_[size_t(b)] != nullptr; }
  void wait_gather(int b);
  void wait_gathers();  // every all-gather still in flight

 private:
  void start(int b);
  Communicator& comm_;
  BucketMemory& mem_;
  std::vector<SyncBucket> buckets_;
  std::vector<int> order_;    // the non-empty buckets' ids in start order
  std::vector<int> pending_;  // marks still missing this step
  std::vector<WorkPtr> reduce_, gather_;
  int next_ = 0;    // into order_: the next bucket to start
  int landed_ = 0;  // into order_: the started buckets before it tested complete
  bool armed_ = false;
  float scale_ = 1.0f;
};

}  // namespace trex::comm
