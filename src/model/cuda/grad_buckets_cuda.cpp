// GradBuckets (grad_buckets.h): the bucket protocol's device memory: in-place fp32 reductions, ZeRO-2's
// transient bucket buffers, the bf16 bucket reduction and the gathers of the updated bf16 slices.
#include <algorithm>

#include "comm/nccl_communicator.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/grad_buckets.h"

namespace trex::dsv4gpu {

GradBuckets::GradBuckets(GpuModel::Impl& m) : m_(m) {
  TREX_CHECK(m.dp_size > 1 && m.dp, "GPU model: gradient buckets need a data-parallel group (size {})",
             m.dp_size);
  TREX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  open_.assign(m_.buckets.size(), nullptr);
  half_.assign(m_.buckets.size(), nullptr);
  // One mark per bucket; a bucket empty here (another pipeline stage's) is skipped on every rank of the
  // group, which all hold the same stage.
  std::vector<comm::SyncBucket> plan;
  for (const GpuModel::Impl::Bucket& b : m.buckets)
    plan.push_back({b.slice(m.dp_size), b.slice(m.dp_size) > 0 ? 1 : 0});
  std::vector<int> order;  // the backward's: the MTP module, the head, the layers from the top, the embedding
  if (m.cfg.n_mtp > 0) order.push_back(m.mtp_bucket);
  order.push_back(m.head_bucket);
  for (int64_t l = m.cfg.n_layers - 1; l >= 0; --l) order.push_back(m.layer_bucket[size_t(l)]);
  order.push_back(m.embed_bucket);
  sync_ = std::make_unique<comm::BucketSync>(*m.dp, static_cast<comm::BucketMemory&>(*this), std::move(plan),
                                             std::move(order));
}

GradBuckets::~GradBuckets() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : inflight_) cudaEventDestroy(e);
  for (float* p : open_)
    if (p) cudaFreeAsync(p, nullptr);
  for (void* p : half_)
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
  p = static_cast<float*>(
      cuda::device_malloc_async(size_t(n) * sizeof(float), nullptr, "a ZeRO-2 gradient bucket buffer"));
  TREX_CUDA(cudaMemsetAsync(p, 0, size_t(n) * sizeof(float), nullptr));
  open_[size_t(bi)] = p;
  return true;
}

bool GradBuckets::transient() const {
  return m_.zero2() || m_.reduce_bf16;
}

void GradBuckets::begin() {
  sync_
      ->wait_gathers();  // the forward waited for each; one it did not read is complete before gradients land
  sync_->begin();
}

comm::BucketTransfer GradBuckets::reduce_args(int bi, float) {
  GpuModel::Impl& m = m_;
  const GpuModel::Impl::Bucket& b = m.buckets[size_t(bi)];
  const int64_t n = b.slice(m.dp_size), own = int64_t(m.dp_rank) * n, full = b.end - b.begin;
  float* src = nullptr;  // the bucket's whole fp32 gradient
  if (m.zero2()) {
    open(bi);  // nothing wrote it (all frozen): reduced as zeros, so every rank's collectives match
    src = open_[size_t(bi)];
  } else {
    src = m.grads.as<float>() + b.begin;
  }
  if (!m.reduce_bf16)  // in place: this rank's slice of the sum lands where its own slice is
    return {src, src + own, size_t(n), comm::ElemType::F32};
  if (!m.zero2() && is_layer(bi)) bound_in_flight(size_t(kGradBucketsInFlight - 1));  // the bf16 copies too
  bf16* half = static_cast<bf16*>(
      cuda::device_malloc_async(size_t(full) * sizeof(bf16), nullptr, "a bf16 gradient bucket copy"));
  cuda::cast_f32_to_bf16(half, src, full, nullptr);
  half_[size_t(bi)] = half;
  return {half, half + own, size_t(n), comm::ElemType::BF16};
}

void GradBuckets::reduce_posted(int bi, comm::Work& work) {
  if (!transient()) return;  // in place: the gradient consumers wait (reduce_done)
  GpuModel::Impl& m = m_;
  const GpuModel::Impl::Bucket& b = m.buckets[size_t(bi)];
  const int64_t n = b.slice(m.dp_size), own = int64_t(m.dp_rank) * n;
  float* dst =
      m.grads.as<float>() + m.grad_index(b.begin + own);  // this rank's slice of the reduced gradient
  comm::stream_wait(work, stream_);
  // And after the compute stream as of now: a communicator whose operations are copies on that stream (the
  // emulated group of `--emulate-rank`) completes its Work at once on the host, which orders nothing here.
  cudaEvent_t queued;
  TREX_CUDA(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
  TREX_CUDA(cudaEventRecord(queued, nullptr));
  TREX_CUDA(cudaStreamWaitEvent(stream_, queued, 0));
  TREX_CUDA(cudaEventDestroy(queued));
  if (m.reduce_bf16) {
    bf16* half = static_cast<bf16*>(half_[size_t(bi)]);
    if (m.zero2())
      cuda::add_bf16_to_f32(dst, half + own, n, stream_);
    else
      cuda::cast_bf16_to_f32(dst, half + own, n, stream_);
    TREX_CUDA(cudaFreeAsync(half, stream_));
    half_[size_t(bi)] = nullptr;
  } else {
    float* src = open_[size_t(bi)];
    cuda::add_f32(dst, src + own, n, stream_);  // 0 + x on the first micro-batch: exactly ZeRO-1's value
  }
  if (m.zero2()) {
    TREX_CUDA(cudaFreeAsync(open_[size_t(bi)], stream_));
    open_[size_t(bi)] = nullptr;
  }
  cudaEvent_t e;
  TREX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  TREX_CUDA(cudaEventRecord(e, stream_));
  inflight_.push_back(e);
  pending_ = true;
}

void GradBuckets::reduce_done(int, comm::WorkPtr w) {
  // In place: the gradient consumers' stream waits for it (wait_grad_work); through the private stream, that
  // stream already waits (reduce_posted) and wait_all orders the consumers after it.
  if (!transient()) m_.grad_work.push_back(std::move(w));
}

comm::BucketTransfer GradBuckets::gather_args(int bi) {
  const GpuModel::Impl::Bucket& b = m_.buckets[size_t(bi)];
  const int64_t n = b.slice(m_.dp_size), own = b.begin + m_.dp_rank * n;
  bf16* c = m_.compute.as<bf16>();  // in place: the owner's slice is where the optimiser wrote it
  return {c + own, c + b.begin, size_t(n), comm::ElemType::BF16};
}

void GradBuckets::gather_done(int, comm::WorkPtr w) {
  m_.stream_wait(*w);
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
