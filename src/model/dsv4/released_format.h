// DeepSeek-V4 tensors stored as the released checkpoints store them (design §1.4, §3.5): FP8 E4M3 2-D projection
// weights with UE8M0 block scales (`<name>.scale`, [ceil(out/B), ceil(in/B)]), MXFP4 routed experts packed two per
// int8 with UE8M0 1x32 scales, F32 for the tensors kept in fp32, BF16 for the rest (embedding, head, norms,
// router), I32 hash tables. Used to write synthetic checkpoints of the released format (random codes, any config)
// for the GPU loader's tests and `trex bench load`, and to count a rank's stored bytes for the load projection.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "model/dsv4/config.h"

namespace trex::dsv4 {

enum class ReleasedStorage { Fp8Block, Fp4Packed, Bf16, F32, I32 };
// How the released format stores official tensor `name` of logical shape `shape` (dtype I64: a hash table).
// The FP8 set: every 2-D ".weight" but the embedding, the head, norms and the router's gate.
ReleasedStorage released_storage(const std::string& name, const Shape& shape, DType dtype);
// Its stored bytes, scale included (block: the FP8 block size).
int64_t released_bytes(const std::string& name, const Shape& shape, DType dtype, int64_t block = 128);

// Writes config.json (official dialect, quantization_config with weight_block_size [block, block]) and every
// tensor of expected_tensors(cfg) in the released format, random codes (FP8 without NaN codes, UE8M0 scales
// 2^-9 .. 2^6, FP4 any nibble, BF16 / F32 normal, valid expert ids) drawn from `seed`, into sharded safetensors of
// at most max_shard_bytes plus model.safetensors.index.json. Tensor by tensor: host memory one stored tensor.
void write_random_released(const std::filesystem::path& dir, const ModelConfig& cfg, int64_t block, uint64_t seed,
                           size_t max_shard_bytes);

}  // namespace trex::dsv4
