// `trex export-hf RUN --out DIR`: the newest native checkpoint of a DeepSeek-V4 training run as a Hugging
// Face model directory (config.json + safetensors, through src/model/dsv4/checkpoint.h save_state_dict).
#pragma once
#include <filesystem>

#include "core/dtype.h"
#include "model/dsv4/config.h"

namespace trex::train {

// Returns the checkpoint directory that was exported.
std::filesystem::path export_hf(const std::filesystem::path& run_dir, const std::filesystem::path& out_dir,
                                DType dtype, dsv4::Dialect dialect);

}  // namespace trex::train
