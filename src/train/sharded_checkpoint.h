// Sharded training checkpoints of layouts of several processes (issue 10 part 6):
//   DIR/step_NNNNNNNN/rank-R.safetensors        the parameters rank R writes
//   DIR/step_NNNNNNNN/rank-R.optim.safetensors  the optimiser state rank R owns (ZeRO-1)
//   DIR/step_NNNNNNNN/rank-R.json               what R wrote, with sizes and checksums
//   DIR/step_NNNNNNNN/manifest.json             written last by rank 0: layout, step, training state,
//                                               optimiser steps, tensor -> file, shape, dtype, bytes, checksum
// Every tensor has its official name and is written once: a dense tensor by its ZeRO-1 owner in the DP
// group of its stage (or DP rank 0 when nothing optimises it), an expert tensor by its owner in the EDP
// group (or EDP rank 0); optimiser states by their owners. So any layout loads by name, from any file.
//
// Crash safety: the ranks write into DIR/.tmp-step_NNNNNNNN (each file itself through a temp name + rename),
// agree that all succeeded, then rank 0 writes the manifest and renames the directory into place. A crash at
// any point leaves the previous complete checkpoint the newest one (latest_checkpoint needs state.json or
// manifest.json in a step_ directory). Like the trainer's output directory, DIR must be one file system that
// every rank sees (rank 0 reads the other ranks' rank-R.json to build the manifest).
//
// Loading works from either format (the one-process state checkpoint of state_checkpoint.h or this one), into
// any layout: CheckpointReader finds each name in whichever file holds it and checks shape, dtype and checksum.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "optim/param.h"
#include "parallel/mesh.h"
#include "parallel/zero1_optimizer.h"
#include "train/state_checkpoint.h"

namespace trex::train {

// Either checkpoint format, by tensor name. Parameters and optimiser states are separate name spaces.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& dir);
  const std::filesystem::path& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  const TrainState& state() const { return state_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  const nlohmann::json& manifest() const { return manifest_; }  // empty for a one-process checkpoint

  std::vector<std::string> param_names() const;  // sorted
  std::vector<std::string> optim_names() const;
  bool has_param(const std::string& name) const { return params_.count(name) > 0; }
  bool has_optim(const std::string& name) const { return optim_.count(name) > 0; }
  Shape param_shape(const std::string& name) const;
  Shape optim_shape(const std::string& name) const;
  // Copies the F32 tensor into dst after checking shape and (sharded) bytes and checksum; a missing tensor
  // is an error naming it and the checkpoint (and, for a sharded one, the file the manifest names).
  void read_param(const std::string& name, const Shape& shape, float* dst) const;
  void read_optim(const std::string& name, const Shape& shape, float* dst) const;

 private:
  struct Loc {
    size_t file;
    std::string file_name;
    uint64_t checksum = 0;
    bool has_checksum = false;
  };
  void read(const std::map<std::string, Loc>& table, const char* kind, const std::string& name, const Shape& shape,
            float* dst) const;
  const ckpt::SafetensorsFile& file(const Loc& l) const;

  std::filesystem::path dir_;
  bool sharded_ = false;
  TrainState state_;
  int64_t optimizer_steps_ = 0;
  nlohmann::json manifest_;
  std::vector<std::filesystem::path> file_paths_;
  mutable std::vector<std::unique_ptr<ckpt::SafetensorsFile>> files_;  // opened on first use
  std::map<std::string, Loc> params_, optim_;
};

// 64-bit FNV-1a over the tensor's bytes (the manifest's checksum).
uint64_t tensor_checksum(const void* data, size_t bytes);

struct ShardedSaveArgs {
  int64_t keep_last = 3;
  // Tensors this rank holds but must not write (the upper pipeline stage's copy of a stage-shared tensor).
  std::vector<std::string> not_written;
  nlohmann::json config;  // recorded in the manifest (the run config)
  // Stages: "params", "optimizer", "rank_index", "manifest" (rank 0), "rename" (rank 0). May throw or exit.
  FaultHook fault;
};

// Collective over `world`: every rank calls it with its parameters (model order) and its ZeRO-1 optimiser.
// Returns the final step directory. A failure on any rank makes every rank throw, and nothing is renamed.
std::filesystem::path save_sharded_checkpoint(const std::filesystem::path& root, const TrainState& st,
                                              const std::vector<optim::ParamRef>& params,
                                              parallel::Zero1Optimizer& zero, const parallel::Mesh& mesh,
                                              comm::Communicator& world, const ShardedSaveArgs& args);

// One tensor a rank writes into a sharded checkpoint: fp32 host data (alive until the save returns); group: the
// optimiser group recorded for a parameter (empty for optimiser states).
struct ShardedTensor {
  std::string name;
  Shape shape;
  const float* data = nullptr;
  std::string group;
};

// The collective writer behind save_sharded_checkpoint, for a rank whose tensors are not optim::ParamRefs (the
// GPU mesh engine gathers its ZeRO-1 shards into whole tensors first): every rank passes the parameters and
// optimiser states it writes (each official name written by exactly one rank of the world, which the manifest
// checks), and the same optimizer_steps.
std::filesystem::path save_sharded_tensors(const std::filesystem::path& root, const TrainState& st,
                                           const std::vector<ShardedTensor>& params,
                                           const std::vector<ShardedTensor>& optim, int64_t optimizer_steps,
                                           const parallel::Mesh& mesh, comm::Communicator& world,
                                           const ShardedSaveArgs& args);

// Loads every parameter this rank holds and the optimiser state it owns from a checkpoint of either format
// (any layout); sets the optimiser's step count. Not collective.
TrainState load_into_zero1(const std::filesystem::path& dir, const std::vector<optim::ParamRef>& params,
                           parallel::Zero1Optimizer& zero);
// The same into one process's ordinary optimiser (load_checkpoint calls this for sharded checkpoints).
TrainState load_into_optimizer(const std::filesystem::path& dir, const std::vector<optim::ParamRef>& params,
                               optim::Optimizer& opt);

// Writes the checkpoint `dir` (either format) as a one-process state checkpoint ROOT/step_NNNNNNNN
// (model.safetensors, optimizer.safetensors, state.json), atomically; returns that directory.
std::filesystem::path consolidate_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& root);

}  // namespace trex::train
