// Loads a DeepSeek-V4 checkpoint directory (config.json + safetensors, official or transformers naming)
// into an fp32 CPU model for inference: the MTP module is not loaded (decoding uses the main head only).
#pragma once
#include <filesystem>
#include <memory>

#include "model/dsv4/model.h"

namespace trex::infer {

std::unique_ptr<dsv4::Model<float>> load_inference_model(const std::filesystem::path& model_dir);

}  // namespace trex::infer
