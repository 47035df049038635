// What one rank of a GPU layout takes on its device, counted from the tables before anything is allocated, and the
// refusal of a layout whose ranks do not fit. Both `trex train --device cuda` (GpuMeshEngine, before its first
// model is built) and `trex bench train --emulate-rank` (before the emulated rank is built) count with it.
//
// The count: every chunk's parameter state (GpuModel::footprint: the bf16 compute copy, the fp32 gradients, the
// fp32 master shard and the two optimiser moments, from the parameter table and the arena the model would declare);
// the activations per chunk (model/cuda/activation_plan.h: the table the GPU model's pools take request by request,
// per micro-batch slot, times the micro-batches the schedule holds on that chunk at once, plus one block's
// recomputation scratch); the step's workspaces (dsv4gpu::plan_workspace: gradient streams, the pipeline
// boundary, the MoE backward; the LM head's row-block logits on the head's chunk); the bucket buffers ZeRO-2 and
// ZeRO-3 take from the pool; and what the caller holds beside the models (the trainer's accumulation shard).
// Not counted: per-op temporaries, the expert exchange's routing-dependent excess over the balanced share, the
// communicators' own buffers and the CUDA context (these are in use already when the free memory is read).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/cuda/activation_plan.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/config.h"
#include "parallel/rank_partition.h"

namespace trex::train {

struct RankMemory {
  dsv4gpu::GpuModel::Footprint params;        // summed over the rank's chunks
  std::vector<dsv4gpu::ActivationPlan> plans;  // per chunk, one micro-batch
  std::vector<int64_t> held;                   // per chunk: the micro-batches held at once
  int64_t activations = 0;                     // sum over chunks of held x kept + recomputation scratch
  dsv4gpu::Workspace workspace;
  int64_t lm_head = 0;       // the LM head's scratch on the head's chunk
  int64_t accumulation = 0;  // the caller's: GpuMeshEngine's reduced shard kept between backwards
  std::vector<int64_t> chunk_layer_begin, chunk_layer_end;

  int64_t parameter_state() const {
    return params.compute_bytes() + params.grad_bytes() + params.master_bytes() + params.adamw_bytes();
  }
  int64_t kept_per_micro_batch() const {  // every chunk's one micro-batch
    int64_t n = 0;
    for (const auto& pl : plans) n += pl.kept();
    return n;
  }
  int64_t workspaces() const { return workspace.total() + lm_head; }
  int64_t bucket_buffers() const { return params.grad_buffer_bytes + params.weight_buffer_bytes; }
  int64_t total() const { return parameter_state() + activations + workspaces() + bucket_buffers() + accumulation; }
  // Every term in GiB, the activations per chunk and layer: "42.10 GiB: bf16 weights 3.20, fp32 gradients ...".
  std::string describe() const;
};

// Rank p's count for micro-batches of p.micro_batch_seqs sequences of `seq` tokens (unpacked: packing documents
// into a row only shortens the compressed caches), with `base` the model options every chunk shares (recompute,
// ZeRO level, LM-head blocks, balance loss); the chunk's layers, slots and group sizes come from p.
RankMemory count_rank_memory(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
                             const dsv4gpu::GpuModelOptions& base);

// One rank's claim on its device and its host, as every rank reports it to the others.
struct DeviceClaim {
  std::array<uint8_t, 16> device{};  // the GPU's UUID: ranks on one device (thread ranks share one GPU) add up
  int ordinal = 0;                   // its CUDA device number on the rank's host
  int64_t need = 0;                  // the rank's count (RankMemory::total)
  int64_t free = 0, total = 0;       // the device's memory when the rank read it, before any rank allocated
  int64_t limit = 0;                 // train.device_memory_gib in bytes (0: none)
  // The host: ranks on one host (one process's thread ranks, a node's launched ranks) share its memory. host_need:
  // what the rank builds on the host before it can copy to the device (the seeded init's fp32 model without
  // model.init_from; 0 otherwise); host_free: MemAvailable when it read it (-1: unknown, not checked).
  uint64_t host = 0;
  int64_t host_need = 0, host_free = -1;
};

// Empty when every rank fits, else the refusal for rank `rank` of `claims` (one per world rank): the first rank
// whose count exceeds its limit, the first device whose ranks' counts together exceed its free memory, or the first
// host whose ranks' host needs together exceed its available memory, named with the numbers; `mine` (this rank's
// RankMemory::describe) is appended when this rank is among the device's.
std::string device_memory_refusal(const std::vector<DeviceClaim>& claims, int rank, const std::string& mine);

// This rank's claim: its count, its device and what the device has free now (cudaMemGetInfo), its host's name
// and available memory with what the rank will build there.
DeviceClaim claim_device_memory(int64_t need, double limit_gib, int64_t host_need = 0);

// Collective over `host` (host-buffer collectives: every rank of the world calls it alike): gathers every rank's
// claim and throws trex::Error prefixed with `who` (file, rank, layout) when device_memory_refusal refuses. All
// ranks read their free memory before any of them returns, so none has allocated for the run yet.
void check_device_memory(comm::Communicator& host, const DeviceClaim& mine, const std::string& who,
                         const std::string& my_count);

}  // namespace trex::train
