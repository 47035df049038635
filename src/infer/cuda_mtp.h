// The checkpoint's MTP module on the GPU (design §2.10), for speculative decoding in the CUDA engine: the MTP block
// (sliding attention, score-routed MoE, its own mHC sites, hc_head and norm) as a one-layer GPU model whose
// parameters are the CPU table's `mtp.0.*` under the one-layer model's names, plus the input projections
// (enorm / e_proj for the next token's embedding, hnorm / h_proj for the main model's final streams). The
// embedding and the LM head are the main model's (shared): the one-layer model's own are a single row, unused.
// Decoding runs the block through its own block program (no embedding: the input streams come from
// mtp_input_streams) over the one-layer model's CUDA backend, whose head is the MTP's hc_head and norm with the
// main model's LM head (DecodeOptions::lm_head). Only the CUDA engine includes this (CUDA headers).
#pragma once
#include <cstdint>
#include <memory>

#include "model/cuda/gpu_impl.h"
#include "model/dsv4/config.h"
#include "model/dsv4/program.h"
#include "model/dsv4/weights.h"

namespace trex::infer {

struct GpuMtp {
  std::unique_ptr<dsv4gpu::GpuModel> block;  // one layer: layers.0.* = mtp.0.*, hc_head_* / norm = mtp.0.*
  dsv4gpu::DevMem enorm, hnorm, e_proj, h_proj;  // bf16 [d], [d], [d, d], [d, d]
  std::unique_ptr<dsv4::BlockProgram> program;   // the block without the embedding, with the head (decode_from)
  const dsv4gpu::GpuBlock& layer() const { return *block->impl().blocks[0]; }
  dsv4gpu::GpuBlock& layer() { return *block->impl().blocks[0]; }
};

// True when the table holds the MTP module's tensors (a checkpoint loaded with them, config n_mtp = 1).
bool table_has_mtp(const dsv4::ParamTable<float>& weights);

// The MTP module of `cfg` (n_mtp must be 1) from `weights` (null: random by `seed`, as GpuModel::init_random draws
// the main model). Throws trex::Error naming a missing or mis-shaped `mtp.0.*` tensor.
std::unique_ptr<GpuMtp> make_gpu_mtp(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                     uint64_t seed, bool moe_grouped_gemm);

// The MTP block's input streams of a speculative step, per row q (design §2.10): h_proj(hnorm(the main model's
// final streams at the row's position)) + e_proj(enorm(Embed[the token after it])), into x [n, hc, d]. Device
// arrays: src[q] >= 0 is row src[q] of this step's main streams X, < 0 row -src[q]-1 of the kept streams xprev;
// next[q] >= 0 is the token id, < 0 the main step's pick -next[q]-1 of picks. Temporaries in `pool`.
void mtp_input_streams(const GpuMtp& mtp, dsv4gpu::GpuModel::Impl& main, const dsv4gpu::bf16* X,
                       const dsv4gpu::bf16* xprev, const int32_t* src, const int32_t* next, const int32_t* picks,
                       int64_t n, dsv4gpu::Pool& pool, dsv4gpu::bf16* x);

}  // namespace trex::infer
