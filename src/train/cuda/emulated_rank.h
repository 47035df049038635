// One rank of a large pp x dp x ep (x tp, x vpp) layout run alone on one GPU (`trex bench train --emulate-rank R
// --layout ...`): exactly rank R's partition (parallel/rank_partition.h: its stage's layers, or with vpp > 1 its
// interleaved chunks, one GpuModel each as the trainer builds them; its E / EP experts, its 1 / D ZeRO dense shard;
// the MTP module with its tied embedding copy on the rank holding the head when the config has it), its pipeline
// step (1F1B, or the interleaved schedule with its in-flight micro-batches per chunk) with every collective and
// boundary transfer replaced by local copies of the real sizes (comm/emulated_group.h; the wrap-around link of the
// interleaved schedule too), routing forced balanced (GpuModelOptions::balanced_routing) so the expert exchange
// carries the balanced share. What the rank computes is its real work; the boundary tensors it receives are fixed
// deterministic random ones at realistic scales (EmulatedGroup::set_recv_source), which the timing does not depend
// on and which keep the values finite.
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
  // The model options of chunk `chunk` of rank p (its layer range and slots, the emulated dp / ep / tp groups, the
  // tied-embedding group where it holds a copy of embed.weight, balanced routing) on top of `base` (timing, GEMM
  // choices, recomputation, ZeRO level).
  static dsv4gpu::GpuModelOptions model_options(const parallel::RankPartition& p, parallel::EmulatedMesh& mesh,
                                                dsv4gpu::GpuModelOptions base, int chunk = 0);

  // Allocates the rank's chunks (random weights from seed), their AdamW moments and, with pp > 1, the pipeline.
  // cfg as the rank runs it: with its MTP module when cfg.n_mtp > 0 (`--no-mtp` drops it before). Check the
  // memory first (GpuModel::footprint of every chunk): this allocates.
  EmulatedRank(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
               dsv4gpu::GpuModelOptions base, uint64_t seed,
               comm::EmulatedGroup::Payload payload = comm::EmulatedGroup::Payload::Copy);
  ~EmulatedRank();
  EmulatedRank(const EmulatedRank&) = delete;
  EmulatedRank& operator=(const EmulatedRank&) = delete;

  // One training step: zero_grads, the rank's M micro-batches (the pipeline schedule with pp > 1), the tied
  // embedding's gradient sum (MTP on a pipeline), the AdamW update of every chunk's shard. Returns this rank's
  // share of the step loss on the rank holding the head (its balance terms elsewhere: 0 without the balance loss).
  double step(const cuda::AdamWStep& a);

  int chunks() const { return int(models_.size()); }
  dsv4gpu::GpuModel& model(int chunk = 0) { return *models_.at(size_t(chunk)); }
  const dsv4gpu::GpuModel& model(int chunk = 0) const { return *models_.at(size_t(chunk)); }
  const parallel::RankPartition& partition() const { return p_; }
  int64_t tokens_per_step() const { return p_.micro_batches * p_.micro_batch_seqs * seq_; }
  int64_t n_params() const;  // over the chunks
  // Bytes the emulated collectives moved, by group and operation, since construction; their loop-back buffers.
  std::map<std::string, std::map<std::string, comm::EmulatedOpStats>> comm_stats() const;
  int64_t loopback_bytes() const;
  // The pipeline's receive buffers (two per direction, GpuPipeline), 0 without stages.
  int64_t pipeline_buffer_bytes() const;
  // The device pool's use now, by category (weights, gradients, optimizer state, activations by kind and whether
  // in the planned arena, ZeRO-2 bucket buffers, pipeline and loop-back buffers, the rest as workspace): one
  // paragraph, for the message of a failed allocation (emulated_rank_memory_cuda.cpp). Works on a partly built
  // rank (the constructor's own failure).
  std::string memory_report() const;

 private:
  double step_impl(const cuda::AdamWStep& a);
  dsv4::ModelConfig cfg_;
  parallel::RankPartition p_;
  int64_t seq_;
  parallel::EmulatedMesh mesh_;
  std::vector<std::unique_ptr<dsv4gpu::GpuModel>> models_;
  std::vector<std::unique_ptr<dsv4gpu::GpuOptimizer>> opts_;
  std::unique_ptr<dsv4gpu::GpuPipeline> pipe_;
  std::vector<int32_t> ids_, labels_;
};

}  // namespace trex::train
