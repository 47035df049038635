// WeightGather (weight_gather.h): ZeRO-3's per-bucket all-gathers of the dense bf16 weights.
#include "model/cuda/weight_gather.h"

#include <algorithm>

#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

WeightGather::WeightGather(GpuModel::Impl& m) : m_(m), emulated_(m.dp->backend() == "emulated") {
  units_.resize(m_.buckets.size());
}

WeightGather::~WeightGather() {
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
  int64_t layer = 0, root = 0;
  for (size_t bi = 0; bi < m.buckets.size(); ++bi) {
    const int64_t n = m.buckets[bi].end - m.buckets[bi].begin;
    const bool is_root = int(bi) == m.embed_bucket || int(bi) == m.head_bucket || (m.cfg.n_mtp > 0 && int(bi) == m.mtp_bucket);
    if (is_root)
      root += n;
    else
      layer = std::max(layer, n);
  }
  return 2 * (kWeightBuffersInFlight * layer + root);
}

void WeightGather::issue(int bi) {
  const GpuModel::Impl::Bucket& b = m_.buckets[size_t(bi)];
  const int64_t n = b.slice(m_.dp_size), full = b.end - b.begin;
  Unit& u = units_[size_t(bi)];
  // The buffer on the compute stream: a freed one (an older layer's) is reused only after the kernels that read it.
  u.buf = static_cast<bf16*>(cuda::device_malloc_async(size_t(full) * sizeof(bf16), nullptr,
                                                        "a ZeRO-3 gathered weight bucket"));
  const bf16* own = m_.weight_at(b.begin + int64_t(m_.dp_rank) * n);
  if (emulated_)
    // The emulated group (`trex bench train --emulate-rank`) writes only this rank's block; the others would be
    // uninitialised pool memory (NaNs reach the attention's top-k). This rank's slice in every block instead: sane
    // weights, the same bytes counted on the wire.
    for (int r = 0; r < m_.dp_size; ++r)
      TREX_CUDA(cudaMemcpyAsync(u.buf + int64_t(r) * n, own, size_t(n) * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                nullptr));
  // Rank r's slice lands at r * n: the bucket as the arena lays it out (full == n * dp_size, the buckets' padding).
  u.work = m_.dp->all_gather(own, u.buf, size_t(n), comm::ElemType::BF16);
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
  if (u.work) {
    m_.stream_wait(*u.work);
    u.work.reset();
  }
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
  if (u.work) {  // the free must follow the gather's writes
    m_.stream_wait(*u.work);
    u.work.reset();
  }
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
