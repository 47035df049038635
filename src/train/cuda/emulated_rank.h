// One rank of a large pp x dp x ep layout run alone on one GPU (`trex bench train --emulate-rank R --layout ...`):
// exactly rank R's partition (parallel/rank_partition.h: its stage's layers, its E / EP experts, its 1 / D ZeRO-1
// dense shard), its 1F1B pipeline step with the stage's in-flight micro-batches, every collective and boundary
// transfer replaced by local copies of the real sizes (comm/emulated_group.h), routing forced balanced
// (GpuModelOptions::balanced_routing) so the expert exchange carries the balanced share. What the rank computes is
// its real work; the boundary tensors it receives are fixed deterministic random ones at realistic scales
// (EmulatedGroup::set_recv_source), which the timing does not depend on and which keep the values finite.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/emulated_group.h"
#include "kernels/cuda/adamw.h"
#include "model/cuda/gpu_model.h"
#include "parallel/rank_partition.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_pipeline.h"

namespace trex::train {

class EmulatedRank {
 public:
  // The model options of rank p (layer range, stage slots, the emulated dp / ep groups, balanced routing) on top
  // of `base` (timing, GEMM choices). cfg must have no MTP module (the emulation leaves it out).
  static dsv4gpu::GpuModelOptions model_options(const parallel::RankPartition& p, parallel::EmulatedMesh& mesh,
                                                dsv4gpu::GpuModelOptions base);

  // Allocates the rank's model (random weights from seed), its AdamW moments and, with pp > 1, its pipeline.
  // Check GpuModel::footprint first: this allocates.
  EmulatedRank(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
               dsv4gpu::GpuModelOptions base, uint64_t seed,
               comm::EmulatedGroup::Payload payload = comm::EmulatedGroup::Payload::Copy);
  ~EmulatedRank();
  EmulatedRank(const EmulatedRank&) = delete;
  EmulatedRank& operator=(const EmulatedRank&) = delete;

  // One training step: zero_grads, the rank's M micro-batches (1F1B with pp > 1), the AdamW update of its shard.
  // Returns this rank's share of the step loss on the last stage (0 elsewhere).
  double step(const cuda::AdamWStep& a);

  dsv4gpu::GpuModel& model() { return *model_; }
  const parallel::RankPartition& partition() const { return p_; }
  int64_t tokens_per_step() const { return p_.micro_batches * p_.micro_batch_seqs * seq_; }
  // Bytes the emulated collectives moved, by group and operation, since construction; their loop-back buffers.
  std::map<std::string, std::map<std::string, comm::EmulatedOpStats>> comm_stats() const;
  int64_t loopback_bytes() const;

 private:
  dsv4::ModelConfig cfg_;
  parallel::RankPartition p_;
  int64_t seq_;
  parallel::EmulatedMesh mesh_;
  std::unique_ptr<dsv4gpu::GpuModel> model_;
  std::unique_ptr<dsv4gpu::GpuOptimizer> opt_;
  std::unique_ptr<dsv4gpu::GpuPipeline> pipe_;
  std::vector<int32_t> ids_, labels_;
};

}  // namespace trex::train
