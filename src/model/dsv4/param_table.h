// The DeepSeek-V4 parameter table: every tensor a config implies, with its official name, logical shape, the
// dtype the model computes with, what part of the model owns it and how training initialises it. One function of
// the config (param_table); the CPU model's declarations, checkpoint import / export (expected_tensors), the GPU
// arena (fused w1|w3 and data-parallel buckets) and the planner's memory accounting all read it, so a new tensor
// is added here once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/dsv4/config.h"
#include "model/dsv4/partition.h"

namespace trex::dsv4 {

// Which part of the model holds a tensor: the embedding (first pipeline stage), the head (final norm, hc_head and
// LM head: last stage), one main layer, or the MTP module (held with the head).
enum class ParamPart { Embed, Head, Layer, Mtp };

// Weight: trained by the optimiser. RouterBias: a buffer the auxiliary-loss-free balance rule updates (no
// gradient). HashTable: tid2eid, the integer routing table of hash-routed layers.
enum class ParamKind { Weight, RouterBias, HashTable };

// How training initialises the tensor (design §5): Normal = N(0, init_std) (matrices, mHC fn included), One (norms,
// mHC scale), Zero (mHC base, attention sinks, compressor ape, router bias), HashTable (K distinct experts per
// token).
enum class ParamInit { Normal, One, Zero, HashTable };

struct ParamSpec {
  std::string name;  // official name
  Shape shape;       // logical shape (FP4 experts unpacked)
  // What the model computes with: BF16 for the tensors the GPU reads in bf16 (projections, norms, experts,
  // embedding and head), F32 for those kept in fp32 (keeps_fp32: mHC, sinks, ape, router bias), I64 for tid2eid.
  DType dtype = DType::F32;
  ParamKind kind = ParamKind::Weight;
  ParamPart part = ParamPart::Layer;
  int64_t layer = -1;   // Layer: the main layer; Mtp: the MTP module's index; else -1
  int64_t expert = -1;  // routed expert id (expert parallelism splits these), -1 for dense tensors
  ParamInit init = ParamInit::Normal;
  bool lm_grad = true;  // false: the LM loss gives it no gradient (the lightning indexer's tensors)

  bool trained() const { return kind == ParamKind::Weight; }
  bool in_block() const { return part == ParamPart::Layer || part == ParamPart::Mtp; }
};

// Every tensor of `cfg` in declaration order: embed.weight; head.weight, norm.weight, hc_head_{fn,base,scale};
// layers 0..L-1 (each: attn_norm, ffn_norm, the mHC sites, attention_param_specs, ffn.gate.weight and its bias or
// tid2eid, the shared expert's w1, w3, w2, then every routed expert's w1, then w3, then w2); the MTP module last
// (its block, then e_proj, h_proj, enorm, hnorm, norm, hc_head). The order is the training init's random stream.
std::vector<ParamSpec> param_table(const ModelConfig& cfg);

// The config the blocks are built from: the MTP module appended as one more block (sliding attention, score
// routing) when cfg.n_mtp > 0, so block cfg.n_layers is the MTP block.
ModelConfig with_mtp_block(const ModelConfig& cfg);

// Whether a pipeline stage / expert-parallel rank with partition `p` (resolved) holds `s`. with_mtp: the head
// stage holds the MTP module (and, when it does not embed, its own copy of embed.weight for the MTP input).
bool partition_holds(const ModelPartition& p, const ParamSpec& s, bool with_mtp);

// Tensor parallelism (Megatron-style, the GPU model's GpuModelOptions::tp): the axis along which tp ranks split a
// tensor, or -1 for one every TP rank holds whole (replicated). Query heads and the grouped output projection's
// groups are split: attn.wq_b (rows: head h's c rows), attn.wo_a (rows: group g's o_rank rows), attn.attn_sink
// (per head) along 0, attn.wo_b along 1 (its input columns are the groups' outputs); the shared expert's w1 / w3
// along 0 (hidden rows) and w2 along 1 (its input columns). The single shared K=V head, the compressor, the
// indexer, q_norm / wq_a, the router, mHC, norms, embedding and head are replicated. The routed experts are
// replicated too (expert TP 1, TpExperts::Whole) unless expert tensor parallelism splits them like the shared
// expert (TpExperts::Split, parallel.etp = tp: each expert's w1 / w3 along 0, w2 along 1). Main layers and the
// MTP block alike.
enum class TpExperts { Whole, Split };
inline TpExperts tp_experts_of(int64_t etp) { return etp > 1 ? TpExperts::Split : TpExperts::Whole; }
int tp_split_axis(const std::string& official, TpExperts experts);
// The TP rank's slice of a tensor of shape `full` split along `axis` over tp ranks (axis -1 or tp 1: full).
Shape tp_local_shape(const Shape& full, int axis, int tp);

// True for the official names kept in FP32 in released checkpoints (design §1.4): mHC fn / base / scale,
// compressor ape, attention sinks, router bias.
bool keeps_fp32(const std::string& official);

}  // namespace trex::dsv4
