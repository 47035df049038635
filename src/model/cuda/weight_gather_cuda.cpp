// WeightGather (weight_gather.h): ZeRO-3's per-bucket all-gathers of the dense bf16 weights.
#include "model/cuda/weight_gather.h"

#include <algorithm>

#include "comm/nccl_communicator.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

namespace {

std::pair<cudaEvent_t, cudaEvent_t> event_pair() {
  cudaEvent_t a, b;
  TREX_CUDA(cudaEventCreate(&a));
  TREX_CUDA(cudaEventCreate(&b));
  return {a, b};
}

// Sums and destroys the pairs' elapsed times (their events must be complete).
double elapsed_ms(std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& pairs) {
  double ms = 0;
  for (auto& [a, b] : pairs) {
    float t = 0.f;
    TREX_CUDA(cudaEventElapsedTime(&t, a, b));
    ms += t;
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  pairs.clear();
  return ms;
}

// Folds the leading pairs whose end has completed into ms (no wait): a run that never reads the times keeps a
// bounded number of events.
void fold_completed(std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& pairs, double& ms) {
  size_t n = 0;
  while (n < pairs.size() && cudaEventQuery(pairs[n].second) == cudaSuccess) ++n;
  if (n < pairs.size()) (void)cudaGetLastError();  // cudaErrorNotReady: not an error, cleared for later checks
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> done(pairs.begin(), pairs.begin() + std::ptrdiff_t(n));
  pairs.erase(pairs.begin(), pairs.begin() + std::ptrdiff_t(n));
  ms += elapsed_ms(done);
}

constexpr size_t kEventsBeforeFold = 1024;

}  // namespace

WeightGather::WeightGather(GpuModel::Impl& m) : m_(m), emulated_(m.dp->backend() == "emulated") {
  units_.resize(m_.buckets.size());
  if (auto* nccl = dynamic_cast<comm::NcclCommunicatorApi*>(m_.dp)) stream_ = nccl->stream();
}

WeightGather::Times WeightGather::times() {
  TREX_CUDA(cudaDeviceSynchronize());
  const double total = elapsed_ms(spans_);
  times_.total_ms += total;
  // The emulated group's copies hold the compute stream for all their time.
  times_.exposed_ms += elapsed_ms(waits_) + (emulated_ ? total : 0.0);
  times_.gathers = gathers_;
  return times_;
}

WeightGather::~WeightGather() {
  for (auto* v : {&spans_, &waits_})
    for (auto& [a, b] : *v) cudaEventDestroy(a), cudaEventDestroy(b);
  for (Unit& u : units_) {
    try {
      if (u.work) u.work->wait();
    } catch (...) {  // a failed collective is reported where it failed; the buffer is still freed
    }
    if (u.buf) cudaFreeAsync(u.buf, nullptr);
  }
}

bool WeightGather::is_layer(int bi) const {
  return bi != m_.embed_bucket && bi != m_.head_bucket && !(m_.mtp() && bi == m_.mtp_bucket);
}

int64_t WeightGather::transient_bytes(const GpuModel::Impl& m) {
  if (!m.zero3()) return 0;
  const GpuModel::Impl::BucketExtents e = m.bucket_extents();
  return 2 * (kWeightBuffersInFlight * e.largest_layer + e.roots);
}

void WeightGather::issue(int bi) {
  const GpuModel::Impl::Bucket& b = m_.buckets[size_t(bi)];
  const int64_t n = b.slice(m_.dp_size), full = b.end - b.begin;
  Unit& u = units_[size_t(bi)];
  // The buffer on the compute stream: a freed one (an older layer's) is reused only after the kernels that read it.
  u.buf = static_cast<bf16*>(cuda::device_malloc_async(size_t(full) * sizeof(bf16), nullptr,
                                                        "a ZeRO-3 gathered weight bucket"));
  const bf16* own = m_.weight_at(b.begin + int64_t(m_.dp_rank) * n);
  const auto span = event_pair();
  if (stream_) {  // the span starts once the compute stream's work at the call, which the gather follows, is done
    TREX_CUDA(cudaEventRecord(span.first, nullptr));
    TREX_CUDA(cudaStreamWaitEvent(stream_, span.first, 0));
  }
  TREX_CUDA(cudaEventRecord(span.first, stream_));
  if (emulated_)
    // The emulated group (`trex bench train --emulate-rank`) writes only this rank's block; the others would be
    // uninitialised pool memory (NaNs reach the attention's top-k). This rank's slice in every block instead: sane
    // weights, the same bytes counted on the wire.
    for (int r = 0; r < m_.dp_size; ++r)
      TREX_CUDA(cudaMemcpyAsync(u.buf + int64_t(r) * n, own, size_t(n) * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                nullptr));
  // Rank r's slice lands at r * n: the bucket as the arena lays it out (full == n * dp_size, the buckets' padding).
  u.work = m_.dp->all_gather(own, u.buf, size_t(n), comm::ElemType::BF16);
  TREX_CUDA(cudaEventRecord(span.second, stream_));
  spans_.push_back(span);
  if (spans_.size() > kEventsBeforeFold) {
    double ms = 0;
    fold_completed(spans_, ms);
    times_.total_ms += ms, times_.exposed_ms += emulated_ ? ms : 0.0;
  }
  if (is_layer(bi)) layers_.push_back(bi);
  ++gathers_;
  m_.bind_bucket_weights(bi);
}

void WeightGather::need(int bi) {
  const GpuModel::Impl::Bucket& b = m_.buckets[size_t(bi)];
  if (b.end == b.begin) return;  // another pipeline stage's bucket (empty here)
  Unit& u = units_[size_t(bi)];
  if (is_layer(bi)) {
    current_ = bi;
    if (u.buf) {  // most recently used: the eviction below takes the older one
      layers_.erase(std::find(layers_.begin(), layers_.end(), bi));
      layers_.push_back(bi);
    } else {
      while (int(layers_.size()) >= kWeightBuffersInFlight) release(layers_.front());
      issue(bi);
    }
  } else if (!u.buf) {
    issue(bi);
  }
  if (u.work) wait(u);
}

void WeightGather::wait(Unit& u) {
  const auto w = event_pair();
  TREX_CUDA(cudaEventRecord(w.first, nullptr));
  m_.stream_wait(*u.work);
  TREX_CUDA(cudaEventRecord(w.second, nullptr));
  waits_.push_back(w);
  u.work.reset();
  if (waits_.size() > kEventsBeforeFold) fold_completed(waits_, times_.exposed_ms);
}

void WeightGather::prefetch(int bi) {
  const GpuModel::Impl::Bucket& b = m_.buckets[size_t(bi)];
  if (b.end == b.begin || units_[size_t(bi)].buf) return;
  if (is_layer(bi)) {
    // Room for it: the oldest live layer other than the one computing is dropped (after its reads).
    while (int(layers_.size()) >= kWeightBuffersInFlight) {
      auto it = std::find_if(layers_.begin(), layers_.end(), [this](int x) { return x != current_; });
      if (it == layers_.end()) return;  // only the current one: nothing to drop (kWeightBuffersInFlight 1)
      release(*it);
    }
  }
  issue(bi);
}

void WeightGather::release(int bi) {
  Unit& u = units_[size_t(bi)];
  if (!u.buf) return;
  if (u.work) wait(u);  // the free must follow the gather's writes
  TREX_CUDA(cudaFreeAsync(u.buf, nullptr));  // after every kernel queued so far, which includes its readers
  u.buf = nullptr;
  auto it = std::find(layers_.begin(), layers_.end(), bi);
  if (it != layers_.end()) layers_.erase(it);
  if (current_ == bi) current_ = -1;
  m_.bind_bucket_weights(bi);  // the blocks' pointers null, not dangling
}

void WeightGather::release_all() {
  for (size_t bi = 0; bi < units_.size(); ++bi) release(int(bi));
}

}  // namespace trex::dsv4gpu
