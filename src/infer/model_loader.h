// Loads a DeepSeek-V4 checkpoint directory (config.json + safetensors, official or transformers naming)
// into an fp32 CPU model for inference. The MTP module is loaded only when asked (with_mtp, and the config has
// one): the GPU engine's speculative decoding drafts with it; plain decoding uses the main head only.
#pragma once
#include <filesystem>
#include <memory>

#include "model/dsv4/model.h"

namespace trex::infer {

std::unique_ptr<dsv4::Model<float>> load_inference_model(const std::filesystem::path& model_dir,
                                                         bool with_mtp = false);

}  // namespace trex::infer
