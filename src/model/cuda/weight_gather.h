// ZeRO-3 (GpuModelOptions::zero 3): the GPU model's dense bf16 weights fully sharded over the data-parallel group.
// Each rank keeps only its slice of every bucket (region A's buckets, gpu_impl.h: the embedding, the head, one
// per layer, the MTP module) in its persistent compute copy; before a bucket's weights are read (a block's
// forward, its backward, a recompute replay, the embedding, the heads, the MTP input) the slices are all-gathered
// over the DP group into a transient buffer of the whole bucket, from the device pool.
//
// Layer buckets: at most kWeightBuffersInFlight (2) live: the block computing and the next one in the walk's
// direction (forward: the layer above, backward: the layer below), whose gather is issued before the current
// block's kernels are queued, so it runs under them. Issuing the next gather drops the oldest buffer other than
// the current one (freed stream-ordered after the kernels that read it). The root buckets (embedding, head, MTP
// module) are units of their own, gathered when first needed: the embedding's dropped once the forward has used
// it (its backward reads no weight), the head's and the MTP module's kept from their forward to the end of the
// backward (their backward reads them again).
//
// Ordering: a gather is queued after the compute stream's work at the call (the communicators' rule) into a
// buffer allocated on the compute stream, and the compute stream waits for it before the first read; a buffer is
// freed on the compute stream. The gathered values are the bf16 of the ranks' fp32 master slices (what ZeRO-1's
// post-step all-gather leaves in every rank's full copy), so the forward and backward compute on the same bits as
// under ZeRO-1/2. Any change of the persistent slices (optimiser step, checkpoint load, init) drops every buffer
// (GpuModel::Impl::weights_changed). Every rank of the DP group runs the same program walk, so the gathers match.
//
// Timing (times()): every gather is bracketed by CUDA events on the stream it runs on (the NCCL communicator's
// own stream, made to wait first for the compute stream's work at the call, which the gather waits for anyway, so
// the span is the gather's own time; the emulated group's copies run on the compute stream, exposed whole; another
// backend's, e.g. the thread group of the tests, are bracketed on the compute stream, which times only what it
// queues there), and every compute-stream wait on a gather by events on the compute stream (the time the compute
// stream stood still for it).
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "comm/communicator.h"
#include "model/cuda/gpu_internal.h"
#include "model/cuda/gpu_model.h"

namespace trex::dsv4gpu {

constexpr int kWeightBuffersInFlight = 2;

class WeightGather {
 public:
  // m: the model whose buckets these are (ZeRO-3, dp_size > 1); it outlives this.
  explicit WeightGather(GpuModel::Impl& m);
  ~WeightGather();
  WeightGather(const WeightGather&) = delete;
  WeightGather& operator=(const WeightGather&) = delete;

  // Bucket b's gathered bf16 weights (null when not live).
  bf16* buffer(int b) const { return units_[size_t(b)].buf; }
  // Bucket b about to be read: live (gathered now unless prefetched) and its gather waited for by the compute
  // stream. A layer bucket becomes the current one.
  void need(int b);
  // Bucket b's gather started without waiting (no-op when live or empty here).
  void prefetch(int b);
  void release(int b);
  void release_all();
  // Buckets gathered since construction (tests: the prefetch and the reuse are visible).
  int64_t gathers() const { return gathers_; }
  // Milliseconds since construction (synchronises the device to read the events): the gathers' own time and the
  // part of it the compute stream waited for (exposed; the rest ran under compute), and the gathers counted.
  struct Times {
    double total_ms = 0, exposed_ms = 0;
    int64_t gathers = 0;
  };
  Times times();
  // The most transient bytes the gathered buffers hold at once: kWeightBuffersInFlight of the largest layer
  // bucket plus the root buckets (embedding, head, MTP module).
  static int64_t transient_bytes(const GpuModel::Impl& m);

 private:
  struct Unit {
    bf16* buf = nullptr;
    comm::WorkPtr work;  // the gather, until the compute stream waited for it
  };
  void issue(int b);
  bool is_layer(int b) const;
  void wait(Unit& u);  // the compute stream waits for u's gather (timed)

  GpuModel::Impl& m_;
  std::vector<Unit> units_;
  std::deque<int> layers_;  // live layer buckets, oldest first
  int current_ = -1;        // the layer bucket being read
  int64_t gathers_ = 0;
  bool emulated_ = false;  // the DP group is comm::EmulatedGroup (rank emulation)
  cudaStream_t stream_ = nullptr;  // the NCCL communicator's stream, else the compute stream
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> spans_, waits_;  // not yet read by times()
  Times times_;
};

}  // namespace trex::dsv4gpu
