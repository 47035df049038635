// The one run configuration of `trex train` (YAML subset or JSON): model, data, optimiser, schedule,
// checkpointing, spike handling, logging. Unknown keys are errors naming the file and key.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shards.h"
#include "model/dsv4/recompute.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"

namespace trex::train {

struct SpikeConfig {
  std::string action = "skip";  // skip (drop the batch's update) | rollback (reload the last checkpoint) | none
  double z_threshold = 6.0;     // spike: loss > mean + z * std of the recent accepted losses (or non-finite)
  double min_ratio = 1.2;       // ... and loss > min_ratio * mean (ignores tiny-variance noise)
  int64_t window = 50, min_history = 20;
  int64_t max_rollbacks = 3;    // then the run stops with an error
};

// The device mesh of a distributed run (`parallel:` section). The step's global batch is the same as in one
// process (grad_accum micro-batches of batch_size rows): its micro-batches are dealt to the DP ranks, each
// DP rank runs grad_accum / dp of them through the pipeline. micro_batches (optional) is that per-DP-rank
// count; when given, grad_accum = micro_batches x dp (a data.grad_accum that disagrees is an error).
struct ParallelConfig {
  bool present = false;  // the config has a parallel section
  parallel::MeshSpec mesh;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  int64_t micro_batches = 0;  // per DP rank per step; 0 = grad_accum / dp
  // No-op padding layers (dsv4::ModelPartition::identity_layers) appended to the model's layers before they are
  // split into the pp x vpp (virtual) stages: the layer slots (layers + pad_layers) must then divide evenly into
  // the stages, and the padding fills the last stages' final slots (they also run the head and the loss). 0: the
  // layers split as evenly as they go (the larger stages first). The report pads 43 layers to 44 for PP 4.
  int64_t pad_layers = 0;
  std::string comm = "auto";  // communicator backend: auto | mpi | local
  double timeout_s = 600;     // a peer that does not answer within this stops the job (naming rank and op)
  // Dense-parameter partitioning over the DP ranks (device cuda; dsv4gpu::GpuModelOptions::zero). 1: the
  // optimiser state sharded (ZeRO-1), every rank keeps full-size fp32 gradients (the default: no transient
  // buffers, the fastest while it fits). 2: the gradients sharded too (ZeRO-2: each bucket reduce-scattered as
  // backward completes it, a rank keeps only its slice). 3: fully sharded dense weights (refused on the GPU: not
  // implemented yet).
  int zero = 1;
  // The dense buckets' gradient reduction: fp32 (default) or bf16 (half the bytes; one rounding of each
  // rank's gradient before the sum).
  std::string grad_reduce_dtype = "fp32";
};

struct TrainConfig {
  std::string where;            // the config file, for error messages
  uint64_t seed = 1234;
  std::string device = "cpu";  // cpu, or cuda (train/cuda/gpu_mesh_engine.h); `trex train --device` overrides
  // Activation recomputation (`recompute: none | selective | full`, model/dsv4/recompute.h): the GPU model's
  // (dsv4gpu::GpuModelOptions::recompute); the CPU model runs none only.
  dsv4::Recompute recompute = dsv4::Recompute::None;
  // `recompute_full_layers: K` with recompute full: only main layers [0, K) replay in full, the later ones recompute
  // selectively (GpuModelOptions::recompute_full_layers); -1 (absent): every layer.
  int64_t recompute_full_layers = -1;
  // model
  std::string model_type = "dsv4";  // dsv4 | toy
  nlohmann::json model;             // the model section as written
  // data: prepared shards, or JSONL + tokenizer (prepared into OUT/data on first run)
  std::filesystem::path shards, tokenizer;
  std::vector<std::filesystem::path> jsonl;
  std::string data_format = "auto";
  bool skip_bad_lines = false;
  data::LongChats long_chats = data::LongChats::Truncate;  // data.long_chats: truncate | drop (data/shards.h)
  int64_t seq_len = 256, batch_size = 4, grad_accum = 1;
  optim::OptimizerConfig optimizer;
  optim::ScheduleConfig schedule;
  std::vector<std::string> freeze;
  int64_t max_steps = 100;
  // train.deterministic: bitwise reproducible gradients on the GPU (the sparse attention backward sums in a fixed
  // order instead of with fp32 atomics; slower, docs/performance.md). The CPU is always deterministic.
  bool deterministic = false;
  // train.device_memory_gib: the most device memory one rank may count on (device cuda; 0: what its device has free
  // when the run starts). Every rank's count (train/cuda/rank_memory.h) is checked against it and against its
  // device's free memory before anything is allocated; a layout that does not fit is refused with the numbers.
  double device_memory_gib = 0;
  int64_t ckpt_every = 50, keep_last = 3;
  SpikeConfig spike;
  double peak_flops = 989.4e12;  // MFU denominator (H200 dense bf16, ../shared/bench convention)
  bool plot = true;
  ParallelConfig parallel;
  nlohmann::json raw;
};

TrainConfig parse_train_config(const nlohmann::json& j, const std::string& where);
TrainConfig load_train_config(const std::filesystem::path& path);

// Empty when the parallel section fits `world_size` processes and the model (check_mesh's reason, or
// the batch / micro-batch arithmetic that does not divide), else why.
std::string check_parallel_config(const TrainConfig& c, int world_size, const parallel::ModelShape& model);
// Empty when parallel.pad_layers no-op layers pad n_layers into layer slots that divide evenly into the pp x vpp
// stages with a real layer left on the last one (or pad_layers is 0), else why, with the numbers.
std::string check_pad_layers(const parallel::MeshSpec& mesh, int64_t n_layers, int64_t pad_layers);

}  // namespace trex::train
