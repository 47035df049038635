// DeepSeek-V4 checkpoints <-> fp32 host tensors keyed by OFFICIAL names (design §3).
//
// Loading accepts official or transformers naming (detected from the keys), one file or a sharded
// directory, and de-quantises as design §3.5 specifies:
//  - FP8 E4M3 weight W[out, in] + scale S[ceil(out/B), ceil(in/B)] (E8M0, or F32/BF16 in -Base
//    checkpoints): W_real[i, j] = fp8(W[i, j]) * S[i/B, j/B], B = quantization_config.weight_block_size
//    (128 by default);
//  - MXFP4 experts stored as int8 P[out, in/2] + E8M0 scale S[out, in/32]: the low nibble of P[i, k] is
//    W[i, 2k], the high nibble W[i, 2k+1]; W_real[i, j] = e2m1(nibble) * S[i, j/32];
//  - BF16 / F16 / F64 are converted to F32.
// `ffn.gate.tid2eid` stays integer: it is returned as DType::I64 (I32 files are widened), values checked
// to lie in [0, n_routed_experts).
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/tensor.h"
#include "model/dsv4/config.h"
#include "model/dsv4/naming.h"
#include "model/dsv4/param_table.h"

namespace trex::dsv4 {

namespace fs = std::filesystem;

using StateDict = std::map<std::string, HostTensor>;

// Every tensor the config implies (param_table, model/dsv4/param_table.h): official names, logical shapes (FP4
// experts unpacked), dtype F32 except tid2eid (I64). Order: globals, then layers 0..L-1, then mtp.0.
struct ExpectedTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
};
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

// One logical tensor of a checkpoint and where its bytes come from.
struct TensorSource {
  enum class Kind { Plain, Fp8Block, Fp4Packed, StackedSlice };
  Kind kind = Kind::Plain;
  std::string stored;         // stored key holding the data
  std::string scale;          // stored key of the scale (quantised kinds)
  Shape shape;                // logical shape
  size_t element_offset = 0;  // StackedSlice: first element within `stored`
};

// Opens a checkpoint and serves de-quantised tensors one at a time by official name, so callers that
// need only some layers/experts (pipeline/expert parallelism) never touch the rest.
class CheckpointReader {
 public:
  // `block_size` 0: read quantization_config.weight_block_size from config.json beside the weights (else
  // 128).
  explicit CheckpointReader(const fs::path& model_dir_or_file, int64_t block_size = 0);
  Naming naming() const { return naming_; }
  const ckpt::SafetensorsReader& files() const { return *st_; }
  bool has(const std::string& official) const { return sources_.count(official) > 0; }
  std::vector<std::string> official_names() const;                // sorted
  const TensorSource& source(const std::string& official) const;  // throws naming the tensor
  const Shape& shape(const std::string& official) const { return source(official).shape; }
  // F32 for float tensors (de-quantised), I64 for integer tensors.
  HostTensor load(const std::string& official) const;
  // Stored keys the reader could not place (not DeepSeek-V4 keys, or scales without a weight).
  const std::vector<std::string>& unrecognised() const { return unrecognised_; }
  int64_t block_size() const { return block_; }

 private:
  std::unique_ptr<ckpt::SafetensorsReader> st_;
  Naming naming_ = Naming::Official;
  int64_t block_ = 128;
  std::map<std::string, TensorSource> sources_;
  std::vector<std::string> unrecognised_;
};

struct LoadOptions {
  bool allow_unexpected = false;  // false: a tensor the config does not imply is an error; true: warn, skip
  // Load only the official names for which this returns true (missing/unexpected checks are limited to them).
  std::function<bool(const std::string&)> filter;
  int64_t block_size = 0;  // FP8 block; 0 = from config.json or 128
};

// Loads and checks every tensor the config implies: a missing tensor, an unexpected one, or a shape that
// differs from the config is an error naming the tensor, the expected and the actual shape.
StateDict load_state_dict(const fs::path& model_dir, const ModelConfig& cfg, const LoadOptions& opts = {});

// Writes config.json (in `dialect`) + safetensors (one file, or shards of at most max_shard_bytes plus
// model.safetensors.index.json), names in the dialect's naming (transformers: experts stacked, MTP kept
// official). `dtype` F32 or BF16 (F16 allowed); the tensors the official checkpoints keep in FP32 (mHC
// fn/base/scale, compressor ape, attn_sink, gate bias) stay F32, tid2eid stays I64. `state` must hold
// exactly expected_tensors(cfg).
void save_state_dict(const fs::path& dir, const StateDict& state, const ModelConfig& cfg, Dialect dialect,
                     DType dtype = DType::BF16, size_t max_shard_bytes = size_t(5) << 30);
// The same export with every tensor pulled from `feed` (official name, shape, F32 or I64, destination) while it is
// written, one at a time: the caller never holds the model (host memory: the writer's buffer of one output tensor,
// a transformers expert stack [E, 2f, d] being the largest, plus one fp32 expert tensor). The tensors are exactly
// expected_tensors(cfg).
using TensorFeed = std::function<void(const std::string& official, const Shape& shape, DType dtype, void* dst)>;
struct ExportStats {
  int64_t tensors = 0;        // tensors written
  int64_t bytes = 0;          // tensor bytes written
  int64_t host_peak_bytes = 0;  // the writer's output buffer plus the largest fp32 feed buffer (measured)
  double seconds = 0;
};
ExportStats save_model_streaming(const fs::path& dir, const ModelConfig& cfg, const TensorFeed& feed, Dialect dialect,
                          DType dtype = DType::BF16, size_t max_shard_bytes = size_t(5) << 30);

// De-quantisation kernels (exposed for tests and for callers with their own buffers).
// FP8 block: w [rows, cols] E4M3 bytes; scale [ceil(rows/block), ceil(cols/block)] of `scale_dtype`.
void dequant_fp8_block(const uint8_t* w, int64_t rows, int64_t cols, const void* scale, DType scale_dtype,
                       int64_t block, float* out);
// MXFP4: packed [rows, cols/2] bytes (low nibble = even column); scale [rows, ceil(cols/32)].
void dequant_fp4_packed(const uint8_t* packed, int64_t rows, int64_t cols, const void* scale,
                        DType scale_dtype, float* out);

}  // namespace trex::dsv4
