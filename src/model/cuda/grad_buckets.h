// The data-parallel bucket reductions and parameter gathers of the GPU model's dense buckets (region A,
// gpu_impl.h): the device memory of the one bucket protocol (comm/bucket_sync.h, which the CPU's
// parallel/grad_reducer.h runs too), with one mark per bucket, in the order backward completes them (the MTP
// module's, the head's, the layers' from the top, the embedding's). How each bucket is reduced:
//   - ZeRO-1 (fp32): in place in the gradient arena (this rank's slice of the sum lands where its slice is);
//   the
//     gradient consumers' stream waits for it (GpuModel::Impl::wait_grad_work);
//   - ZeRO-2 (GpuModelOptions::zero 2): a bucket's gradients are written during backward into a transient
//   fp32
//     buffer of the whole bucket (opened, zeroed, when its first writer is about to run); when backward
//     completes the bucket, the buffer is reduce-scattered over the DP group and this rank's slice is added
//     into the persistent gradient shard (so micro-batches accumulate there: every backward reduces), then
//     freed;
//   - bf16 reduction (GpuModelOptions::grad_reduce_bf16), under ZeRO-1 or 2: the bucket is rounded to bf16
//   once
//     and reduce-scattered in bf16, the slice cast (ZeRO-1) or added (ZeRO-2) back into fp32.
// Ordering of the transient ones: the reduce-scatter is queued after the compute stream's work (the
// communicators' rule); a private non-blocking stream waits for it, accumulates into the shard and frees the
// buffers, so compute never waits for a reduction except (a) when more than kGradBucketsInFlight layer
// buffers would be alive (the bound on the transient memory: the compute stream waits for the oldest one's
// landing before opening another) and (b) in wait_all(), which the gradient consumers (clipping norm,
// optimiser, accumulation) reach through GpuModel::Impl::wait_grad_work. Every rank of the DP group reduces
// the same buckets in the same order (a bucket with no gradient written, e.g. every tensor frozen, is reduced
// as zeros), so the collectives match. After the optimiser step each bucket's updated bf16 slice is
// all-gathered (start_gather); the forward waits for a bucket's right before it reads it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm/bucket_sync.h"
#include "model/cuda/gpu_model.h"

namespace trex::dsv4gpu {

// Layer-bucket buffers alive at once (opened and not yet landed in the shard): the one being written and the
// one being reduced. The embedding's and the head's (and the MTP module's) buckets come on top: the head's
// gradient is written from the training forward to the head's backward, the embedding's (with MTP) from the
// MTP input's backward to the very end.
constexpr int kGradBucketsInFlight = 2;

class GradBuckets final : private comm::BucketMemory {
 public:
  // m: the model whose buckets these are (dp_size > 1, with gradients); it outlives this.
  explicit GradBuckets(GpuModel::Impl& m);
  ~GradBuckets() override;
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // ZeRO-2: bucket b's open buffer (null when closed) and opening it (no-op when open).
  float* buffer(int b) const { return open_[size_t(b)]; }
  bool open(int b);  // true when it was closed (the caller rebinds the pointers of the bucket's tensors)
  bool any_open() const;
  // One reducing backward: begin() before it (the gathers still in flight waited for), ready(b) as it
  // completes bucket b (its reduction starts once every bucket before it in the backward's order has),
  // finish() after it.
  void begin();
  void ready(int b) { sync_->mark_ready(b); }
  void finish() { sync_->finish(); }
  // The compute stream waits for every reduction started so far to have landed.
  void wait_all();
  // Bucket b's updated bf16 slice all-gathered into the compute copy; the compute stream waits for it (no-op
  // without one in flight); every gather in flight.
  void start_gather(int b) { sync_->start_gather(b); }
  void wait_gather(int b) {
    if (sync_->gathering(b)) sync_->wait_gather(b);
  }
  void wait_gathers() { sync_->wait_gathers(); }
  // The most transient bytes a model's bucket reductions hold at once (fp32 buffers under ZeRO-2, bf16 copies
  // for the bf16 reduction): kGradBucketsInFlight of the largest layer bucket plus the root buckets
  // (embedding, head, MTP module). 0 when neither is on.
  static int64_t transient_bytes(const GpuModel::Impl& m);

 private:
  // comm::BucketMemory over the arena (ids: the model's bucket indices).
  comm::BucketTransfer reduce_args(int b, float scale) override;
  void reduce_posted(int b, comm::Work& w) override;
  void reduce_done(int b, comm::WorkPtr w) override;
  comm::BucketTransfer gather_args(int b) override;
  void gather_done(int b, comm::WorkPtr w) override;
  bool transient() const;  // ZeRO-2 or the bf16 reduction: through a buffer and the private stream
  // Frees the landed buffers' events beyond the bound: the compute stream waits for the oldest.
  void bound_in_flight(size_t keep);
  bool is_layer(int b) const;  // not the embedding's, the head's or the MTP module's

  GpuModel::Impl& m_;
  cudaStream_t stream_ = nullptr;  // private, non-blocking
  std::vector<float*> open_;
  std::vector<void*> half_;  // per bucket (bf16): its bf16 copy between reduce_args and reduce_posted
  std::deque<cudaEvent_t>
      inflight_;          // per reduced layer bucket: its landing (recorded on the private stream)
  bool pending_ = false;  // work queued on the private stream since the last wait_all
  std::unique_ptr<comm::BucketSync> sync_;
};

}  // namespace trex::dsv4gpu
