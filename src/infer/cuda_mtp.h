// The checkpoint's MTP module on the GPU (design §2.10), for speculative decoding in the CUDA engine: the MTP block
// (sliding attention, score-routed MoE, its own mHC sites, hc_head and norm) as a one-layer GPU model whose
// parameters are the CPU table's `mtp.0.*` under the one-layer model's names, plus the input projections
// (enorm / e_proj for the next token's embedding, hnorm / h_proj for the main model's final streams). The
// embedding and the LM head are the main model's (shared): the one-layer model's own are a single row, unused.
// Only the CUDA engine includes this (CUDA headers).
#pragma once
#include <cstdint>
#include <memory>

#include "model/cuda/gpu_impl.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace trex::infer {

struct GpuMtp {
  std::unique_ptr<dsv4gpu::GpuModel> block;  // one layer: layers.0.* = mtp.0.*, hc_head_* / norm = mtp.0.*
  dsv4gpu::DevMem enorm, hnorm, e_proj, h_proj;  // bf16 [d], [d], [d, d], [d, d]
  const dsv4gpu::GpuBlock& layer() const { return *block->impl().blocks[0]; }
  dsv4gpu::GpuBlock& layer() { return *block->impl().blocks[0]; }
};

// True when the table holds the MTP module's tensors (a checkpoint loaded with them, config n_mtp = 1).
bool table_has_mtp(const dsv4::ParamTable<float>& weights);

// The MTP module of `cfg` (n_mtp must be 1) from `weights` (null: random by `seed`, as GpuModel::init_random draws
// the main model). Throws trex::Error naming a missing or mis-shaped `mtp.0.*` tensor.
std::unique_ptr<GpuMtp> make_gpu_mtp(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                     uint64_t seed, bool moe_grouped_gemm);

}  // namespace trex::infer
