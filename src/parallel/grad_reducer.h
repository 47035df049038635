// ZeRO-1 gradient reduction and parameter gathering for one data-parallel group.
//
// Whole tensors are assigned to owner ranks (Muon needs whole matrices, design §5; optimiser state is
// then addressable by parameter name on exactly one rank). Tensors are packed into buckets in the order
// their gradients become ready (backward order); a bucket is laid out [rank 0's part | rank 1's part |
// ...] with every part padded to the same length, so one equal-count reduce_scatter (the NCCL shape)
// hands each owner the summed gradients of its tensors, and one all_gather with the same layout hands
// every rank the owners' updated values.
//
// Step protocol (comm/bucket_sync.h, the one the GPU model's buckets run too): begin(scale) arms the reducer;
// mark_ready(t) as backward produces tensor t's final gradient starts each bucket's reduce_scatter as soon
// as all of its tensors are ready (buckets start in bucket order on every rank, whatever order the marks
// come in, so collectives match across ranks); finish() starts what is left and waits. Then owned(b) are
// the owner's tensors with their reduced gradients, and start_gather(b) / wait_gather(b) all-gather the
// updated values back into the model. This class is the protocol's host memory: packing into the bucket
// buffers, unpacking after the gather.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bucket_sync.h"
#include "comm/communicator.h"
#include "optim/param.h"

namespace trex::parallel {

struct BucketSlot {
  int tensor = 0;      // index into the tensor list the plan was made for
  int owner = 0;       // rank in the group that owns (optimises) the tensor
  int64_t offset = 0;  // element offset inside the owner's part of the bucket
  int64_t numel = 0;
};

struct BucketPlan {
  int64_t part_elems = 0;         // every rank's part has this many elements (padded)
  std::vector<BucketSlot> slots;  // in ready order
};

struct ShardPlan {
  int ranks = 1;
  std::vector<BucketPlan> buckets;
  std::vector<int64_t> owned_elems;  // per rank, over all buckets
  int64_t total_elems() const;       // sum of tensor sizes
  int64_t padding_elems() const;     // elements moved that belong to no tensor
};

// Ownership and buckets for tensors of the given sizes, listed in the order their gradients become
// ready. Each tensor goes to the rank with the least owned elements so far (lowest rank on ties), so
// owners stay balanced within the largest tensor. A bucket closes once every part holds at least
// bucket_elems / ranks elements and the parts are within a quarter of that of each other (little
// padding), or once it has grown to 4 x bucket_elems; the last bucket takes what remains.
ShardPlan plan_shards(const std::vector<int64_t>& numels, int ranks, int64_t bucket_elems);

class GradReducer final : private comm::BucketMemory {
 public:
  // tensors: trainable, with gradient buffers, in ready order. The group must outlive the reducer.
  GradReducer(comm::Communicator& group, std::vector<optim::ParamRef> tensors, int64_t bucket_elems);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  const ShardPlan& plan() const { return plan_; }
  const std::vector<optim::ParamRef>& tensors() const { return tensors_; }
  int n_buckets() const { return int(plan_.buckets.size()); }
  int rank() const { return sync_->rank(); }
  int owner_of(int tensor) const;
  int bucket_of(int tensor) const { return bucket_of_[size_t(tensor)]; }

  // Arms the reducer for one step: each packed gradient is multiplied by `scale` (fold 1/dp and
  // 1/grad_accum in here).
  void begin(float scale);
  bool armed() const { return sync_->armed(); }
  // Tensor t's gradient is final for this step; starts every full bucket whose predecessors started.
  void mark_ready(int tensor);
  // Starts the buckets not started yet (tensors never marked, e.g. no hook), waits for all; disarms.
  void finish();
  int buckets_started() const { return sync_->buckets_started(); }

  // This rank's tensors in bucket b, their grad pointing at the reduced gradient (valid after finish()
  // until the next begin()).
  std::vector<optim::ParamRef> owned(int bucket) const;
  // Tensor t's reduced gradient when this rank owns it (same validity as owned()), else null.
  const float* reduced_grad(int tensor) const;
  // All-gather of bucket b's values: start packs the owned values and launches it; wait completes it
  // and copies the other owners' values into the model's tensors.
  void start_gather(int bucket) { sync_->start_gather(bucket); }
  void wait_gather(int bucket) { sync_->wait_gather(bucket); }

 private:
  // comm::BucketMemory: the packed host buffers of each bucket.
  comm::BucketTransfer reduce_args(int bucket, float scale) override;
  void reduce_done(int bucket, comm::WorkPtr w) override { w->wait(); }
  comm::BucketTransfer gather_args(int bucket) override;
  void gather_done(int bucket, comm::WorkPtr w) override;
  struct Buffers {
    std::vector<float> full;   // ranks x part: packed gradients, then the gathered values
    std::vector<float> shard;  // part: this rank's reduced gradients
    std::vector<float> send;   // part: this rank's updated values
  };
  std::vector<optim::ParamRef> tensors_;
  ShardPlan plan_;
  std::vector<int> bucket_of_, slot_of_;
  std::vector<uint8_t> ready_;
  std::vector<Buffers> buf_;
  std::unique_ptr<comm::BucketSync> sync_;  // one mark per tensor, buckets in ready order
};

}  // namespace trex::parallel
