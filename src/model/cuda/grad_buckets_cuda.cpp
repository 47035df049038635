// GradBuckets (grad_buckets.h): ZeRO-2's transient bucket buffers and the bf16 bucket reduction.
#include "model/cuda/grad_buckets.h"

#include <algorithm>

#include "comm/nccl_communicator.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

GradBuckets::GradBuckets(GpuModel::Impl& m) : m_(m) {
  TREX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  open_.assign(m_.buckets.size(), nullptr);
}

GradBuckets::~GradBuckets() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : inflight_) cudaEventDestroy(e);
  for (float* p : open_)
    if (p) cudaFreeAsync(p, nullptr);
  cudaStreamDestroy(stream_);
}

bool GradBuckets::any_open() const {
  for (float* p : open_)
    if (p) return true;
  return false;
}

void GradBuckets::bound_in_flight(size_t keep) {
  while (inflight_.size() > keep) {
    TREX_CUDA(cudaStreamWaitEvent(nullptr, inflight_.front(), 0));
    TREX_CUDA(cudaEventDestroy(inflight_.front()));
    inflight_.pop_front();
  }
}

bool GradBuckets::is_layer(int bi) const {
  return bi != m_.embed_bucket && bi != m_.head_bucket && !(m_.mtp() && bi == m_.mtp_bucket);
}

int64_t GradBuckets::transient_bytes(const GpuModel::Impl& m) {
  if (m.dp_size == 1 || !(m.zero2() || m.reduce_bf16)) return 0;
  const GpuModel::Impl::BucketExtents e = m.bucket_extents();
  const int64_t elems = kGradBucketsInFlight * e.largest_layer + e.roots;
  return (m.zero2() ? 4 * elems : 0) + (m.reduce_bf16 ? 2 * elems : 0);
}

bool GradBuckets::open(int bi) {
  if (open_[size_t(bi)]) return false;
  const GpuModel::Impl::Bucket& b = m_.buckets[size_t(bi)];
  const int64_t n = b.end - b.begin;
  if (n == 0) return false;  // another pipeline stage's bucket
  const bool layer = is_layer(bi);
  // One layer buffer being written beside the ones still being reduced: the oldest must have landed (and its
  // buffer been freed) before this one is allocated.
  if (layer) bound_in_flight(size_t(kGradBucketsInFlight - 1));
  float* p = nullptr;
  // Stream-ordered (the device pool): the freed buffers of landed buckets are reused.
  p = static_cast<float*>(cuda::device_malloc_async(size_t(n) * sizeof(float), nullptr, "a ZeRO-2 gradient bucket buffer"));
  TREX_CUDA(cudaMemsetAsync(p, 0, size_t(n) * sizeof(float), nullptr));
  open_[size_t(bi)] = p;
  return true;
}

void GradBuckets::reduce(int bi) {
  GpuModel::Impl& m = m_;
  const GpuModel::Impl::Bucket& b = m.buckets[size_t(bi)];
  const int64_t n = b.slice(m.dp_size), own = int64_t(m.dp_rank) * n, full = b.end - b.begin;
  if (n == 0) return;  // another pipeline stage's bucket
  float* g = m.grads.as<float>();
  float* src = nullptr;  // the bucket's whole fp32 gradient
  if (m.zero2()) {
    open(bi);  // nothing wrote it (all frozen): reduced as zeros, so every rank's collectives match
    src = open_[size_t(bi)];
  } else {
    src = g + b.begin;
  }
  float* dst = g + m.grad_index(b.begin + own);  // this rank's slice of the reduced gradient
  bf16* half = nullptr;
  comm::WorkPtr work;
  if (m.reduce_bf16) {
    if (!m.zero2() && is_layer(bi)) bound_in_flight(size_t(kGradBucketsInFlight - 1));  // the bf16 copies too
    half = static_cast<bf16*>(cuda::device_malloc_async(size_t(full) * sizeof(bf16), nullptr,
                                                         "a bf16 gradient bucket copy"));
    cuda::cast_f32_to_bf16(half, src, full, nullptr);
    work = m.dp->reduce_scatter(half, half + own, size_t(n), comm::ElemType::BF16, comm::ReduceOp::Sum);
  } else {
    // In place: this rank's slice of the sum lands where its own slice is (ZeRO-1: where it is read).
    work = m.dp->reduce_scatter(src, src + own, size_t(n), comm::ElemType::F32, comm::ReduceOp::Sum);
  }
  comm::stream_wait(*work, stream_);
  // And after the compute stream as of now: a communicator whose operations are copies on that stream (the
  // emulated group of `--emulate-rank`) completes its Work at once on the host, which orders nothing here.
  cudaEvent_t queued;
  TREX_CUDA(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
  TREX_CUDA(cudaEventRecord(queued, nullptr));
  TREX_CUDA(cudaStreamWaitEvent(stream_, queued, 0));
  TREX_CUDA(cudaEventDestroy(queued));
  if (m.reduce_bf16) {
    if (m.zero2())
      cuda::add_bf16_to_f32(dst, half + own, n, stream_);
    else
      cuda::cast_bf16_to_f32(dst, half + own, n, stream_);
    TREX_CUDA(cudaFreeAsync(half, stream_));
  } else if (m.zero2()) {
    cuda::add_f32(dst, src + own, n, stream_);  // 0 + x on the first micro-batch: exactly ZeRO-1's value
  }
  if (m.zero2()) {
    TREX_CUDA(cudaFreeAsync(src, stream_));
    open_[size_t(bi)] = nullptr;
  }
  cudaEvent_t e;
  TREX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  TREX_CUDA(cudaEventRecord(e, stream_));
  inflight_.push_back(e);
  pending_ = true;
}

void GradBuckets::wait_all() {
  if (!pending_) return;
  cudaEvent_t e;
  TREX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  TREX_CUDA(cudaEventRecord(e, stream_));
  TREX_CUDA(cudaStreamWaitEvent(nullptr, e, 0));
  TREX_CUDA(cudaEventDestroy(e));
  for (cudaEvent_t x : inflight_) TREX_CUDA(cudaEventDestroy(x));
  inflight_.clear();
  pending_ = false;
}

}  // namespace trex::dsv4gpu
