// The data-parallel bucket reductions of the GPU model's dense gradients (region A's buckets, gpu_impl.h) beyond
// ZeRO-1's in-place fp32 reduce-scatter:
//   - ZeRO-2 (GpuModelOptions::zero 2): a bucket's gradients are written during backward into a transient fp32
//     buffer of the whole bucket (opened, zeroed, when its first writer is about to run); when backward completes
//     the bucket, the buffer is reduce-scattered over the DP group and this rank's slice is added into the
//     persistent gradient shard (so micro-batches accumulate there: every backward reduces), then freed;
//   - bf16 reduction (GpuModelOptions::grad_reduce_bf16), under ZeRO-1 or 2: the bucket is rounded to bf16 once
//     and reduce-scattered in bf16, the slice cast (ZeRO-1) or added (ZeRO-2) back into fp32.
// Ordering: the reduce-scatter is queued after the compute stream's work (the communicators' rule); a private
// non-blocking stream waits for it, accumulates into the shard and frees the buffers, so compute never waits for
// a reduction except (a) when more than kGradBucketsInFlight layer buffers would be alive (the bound on the
// transient memory: the compute stream waits for the oldest one's landing before opening another) and (b) in
// wait(), which the gradient consumers (clipping norm, optimiser, accumulation) reach through
// GpuModel::Impl::wait_grad_work.
// Every rank of the DP group reduces the same buckets in the same order (a bucket with no gradient written, e.g.
// every tensor frozen, is reduced as zeros), so the collectives match.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "model/cuda/gpu_model.h"

namespace trex::dsv4gpu {

// Layer-bucket buffers alive at once (opened and not yet landed in the shard): the one being written and the one
// being reduced. The embedding's and the head's (and the MTP module's) buckets come on top: the head's gradient is
// written from the training forward to the head's backward, the embedding's (with MTP) from the MTP input's
// backward to the very end.
constexpr int kGradBucketsInFlight = 2;

class GradBuckets {
 public:
  // m: the model whose buckets these are (dp_size > 1); it outlives this.
  explicit GradBuckets(GpuModel::Impl& m);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // ZeRO-2: bucket b's open buffer (null when closed) and opening it (no-op when open).
  float* buffer(int b) const { return open_[size_t(b)]; }
  bool open(int b);  // true when it was closed (the caller rebinds the pointers of the bucket's tensors)
  bool any_open() const;
  // Bucket b complete: its reduction (fp32 or bf16) started. ZeRO-1: in place in the gradient arena; ZeRO-2: from
  // its buffer (opened, zero, if nothing wrote it), into the shard.
  void reduce(int b);
  // The compute stream waits for every reduction started so far to have landed.
  void wait_all();
  // The most transient bytes a model's bucket reductions hold at once (fp32 buffers under ZeRO-2, bf16 copies
  // for the bf16 reduction): kGradBucketsInFlight of the largest layer bucket plus the root buckets (embedding,
  // head, MTP module). 0 when neither is on.
  static int64_t transient_bytes(const GpuModel::Impl& m);

 private:
  // Frees the landed buffers' events beyond the bound: the compute stream waits for the oldest.
  void bound_in_flight(size_t keep);
  bool is_layer(int b) const;  // not the embedding's, the head's or the MTP module's

  GpuModel::Impl& m_;
  cudaStream_t stream_ = nullptr;  // private, non-blocking
  std::vector<float*> open_;
  std::deque<cudaEvent_t> inflight_;  // per reduced layer bucket: its landing (recorded on the private stream)
  bool pending_ = false;              // work queued on the private stream since the last wait_all
};

}  // namespace trex::dsv4gpu
