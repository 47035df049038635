// Native training checkpoints: DIR/step_NNNNNNNN/{model.safetensors, optimizer.safetensors, state.json}.
// Written into a temporary directory, fsynced, then renamed into place, so an interrupted write leaves
// the previous checkpoints untouched; only the newest keep_last are kept. Resume restores weights,
// buffers, optimiser moments and step, sampler position, RNG state and the spike detector's history,
// which makes a resumed run bit-identical to an uninterrupted one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "data/sampler.h"
#include "optim/optimizer.h"
#include "optim/param.h"

namespace trex::train {

struct TrainState {
  int64_t step = 0;  // optimiser steps completed
  data::SamplerState sampler;
  uint64_t rng = 0;
  int64_t tokens_seen = 0;
  int64_t rollbacks = 0;
  std::vector<double> recent_losses;  // spike detector history
  nlohmann::json to_json() const;
  static TrainState from_json(const nlohmann::json& j, const std::string& where);
};

// Test hook: called at each stage ("model", "optimizer", "state", "rename") of a save; may throw or exit.
using FaultHook = std::function<void(std::string_view stage)>;

std::filesystem::path save_checkpoint(const std::filesystem::path& root, const TrainState& st,
                                      const std::vector<optim::ParamRef>& params, optim::Optimizer& opt,
                                      int64_t keep_last, const FaultHook& fault = nullptr);
// The same from tensor lists (a TensorToWrite may produce its bytes on demand, e.g. copied from a GPU):
// model.safetensors, optimizer.safetensors and state.json with optimizer_steps and the parameters' groups.
std::filesystem::path save_checkpoint_tensors(const std::filesystem::path& root, const TrainState& st,
                                              const std::vector<ckpt::TensorToWrite>& model,
                                              const std::vector<ckpt::TensorToWrite>& optimizer,
                                              int64_t optimizer_steps, const nlohmann::json& param_groups,
                                              int64_t keep_last, const FaultHook& fault = nullptr);
// Complete checkpoints under root, oldest first: step_NNNNNNNN directories with state.json (this format) or
// manifest.json (a sharded checkpoint, sharded_checkpoint.h).
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& root);
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);
// Loads into the given params and optimiser; every tensor must be present with its shape. A sharded
// checkpoint (manifest.json) of any layout is read by name (sharded_checkpoint.h load_into_optimizer).
TrainState load_checkpoint(const std::filesystem::path& dir, const std::vector<optim::ParamRef>& params,
                           optim::Optimizer& opt);

}  // namespace trex::train
