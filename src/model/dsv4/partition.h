// Which part of the DeepSeek-V4 model one pipeline stage (or one virtual stage of an interleaved schedule) holds.
// A Model built with a partition declares only that part's tensors, under the unchanged official names, so
// checkpoints and optimiser state stay keyed the same way on every stage.
//
//  - main layers [layer_begin, layer_end) (global indices; the stream enters before layer_begin);
//  - `embed`: this stage embeds the token ids (the first stage) and holds `embed.weight`;
//  - `head`: this stage holds hc_head + final norm + LM head + the loss, and the whole MTP module
//    (design §2.10: the MTP input needs the main model's final streams). The MTP input also embeds token t+1 with
//    the shared `embed`, so a head stage that is not the embed stage holds its own copy of `embed.weight` under the
//    same name; Model::stage_shared_params() lists such names, and the trainer sums their gradients over the
//    stages holding them before the optimiser step and keeps the copies identical (as Megatron does for tied
//    embeddings);
//  - routed experts [expert_begin, expert_end) of every MoE layer held here (-1 = all; expert parallelism);
//  - `identity_layers`: no-op padding layers that pass the stream through unchanged (the report pads 43 layers to
//    44 so that PP=4 gets 11 layer slots per stage). They hold no tensors and cost nothing; they exist so that a
//    schedule can be balanced by layer slots and the partition says so explicitly. split_layers() puts them at
//    the end of the last chunks, because the last stage also runs the head, the loss and the MTP block.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/dsv4/config.h"

namespace trex::dsv4 {

struct ModelPartition {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: cfg.n_layers
  bool embed = true;
  bool head = true;
  int64_t expert_begin = 0;
  int64_t expert_end = -1;  // -1: cfg.n_routed_experts
  int64_t identity_layers = 0;

  bool whole() const { return layer_begin == 0 && layer_end == -1 && embed && head; }
  // layer_end / expert_end with -1 resolved; throws trex::Error naming the bad field.
  ModelPartition resolved(const ModelConfig& cfg) const {
    ModelPartition p = *this;
    if (p.layer_end < 0) p.layer_end = cfg.n_layers;
    if (p.expert_end < 0) p.expert_end = cfg.n_routed_experts;
    TREX_CHECK(p.layer_begin >= 0 && p.layer_begin <= p.layer_end && p.layer_end <= cfg.n_layers,
               "model partition: layers [{}, {}) outside the config's {} layers", p.layer_begin, p.layer_end,
               cfg.n_layers);
    TREX_CHECK(p.expert_begin >= 0 && p.expert_begin < p.expert_end && p.expert_end <= cfg.n_routed_experts,
               "model partition: experts [{}, {}) outside the config's {} routed experts", p.expert_begin,
               p.expert_end, cfg.n_routed_experts);
    TREX_CHECK(p.identity_layers >= 0, "model partition: {} identity layers", p.identity_layers);
    TREX_CHECK(!p.embed || p.layer_begin == 0, "model partition: the embed stage must start at layer 0, not {}",
               p.layer_begin);
    TREX_CHECK(!p.head || p.layer_end == cfg.n_layers, "model partition: the head stage must end at layer {}, not {}",
               cfg.n_layers, p.layer_end);
    return p;
  }
};

// Splits the main layers, padded with `identity_layers` no-op layers, into n_chunks consecutive chunks of
// (nearly) equal layer slots: chunk c gets floor or ceil of (L + pad) / n_chunks slots, the larger ones first;
// padding fills the last chunks' final slots. Chunk 0 embeds, the last chunk holds the head (and MTP). For an
// interleaved schedule with P ranks and v virtual stages, n_chunks = P * v and rank r holds chunks r, r + P, ...
inline std::vector<ModelPartition> split_layers(const ModelConfig& cfg, int64_t n_chunks, int64_t identity_layers = 0) {
  const int64_t L = cfg.n_layers, slots = L + identity_layers;
  TREX_CHECK(n_chunks >= 1 && identity_layers >= 0, "split_layers: {} chunks, {} identity layers", n_chunks,
             identity_layers);
  std::vector<ModelPartition> out(static_cast<size_t>(n_chunks));
  int64_t slot = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t n = slots / n_chunks + (c < slots % n_chunks ? 1 : 0);
    ModelPartition& p = out[size_t(c)];
    p.layer_begin = std::min(slot, L);
    p.layer_end = std::min(slot + n, L);
    p.identity_layers = n - (p.layer_end - p.layer_begin);
    p.embed = c == 0;
    p.head = c == n_chunks - 1;
    slot += n;
  }
  return out;
}

}  // namespace trex::dsv4
