// `trex export-hf RUN --out DIR`: the newest native checkpoint of a DeepSeek-V4 training run as a Hugging
// Face model directory (config.json + safetensors, through src/model/dsv4/checkpoint.h save_state_dict).
#pragma once
#include <filesystem>

#include "core/dtype.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/config.h"

namespace trex::train {

// The checkpoint directory that was exported and what writing it took (host memory: one output tensor's buffer and
// one fp32 tensor; the checkpoint's tensors are read from its memory-mapped shard files, never gathered).
struct ExportResult {
  std::filesystem::path checkpoint;
  dsv4::ExportStats stats;
};
ExportResult export_hf(const std::filesystem::path& run_dir, const std::filesystem::path& out_dir, DType dtype,
                       dsv4::Dialect dialect);

}  // namespace trex::train
