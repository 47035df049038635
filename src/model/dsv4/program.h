// The DeepSeek-V4 block program, written once (design §2.1-§2.10, §5): the forward and backward sequence over the
// embedding and streams, every block's two mHC sites (attention, MoE), the head, the MTP module and the losses,
// calling only the backend interface (backend.h). Training (one stage of a pipeline, or the whole model) and cached
// decoding (prompt chunks and single tokens of many sequences in one step) run the same blocks: a decode step is
// the block sequence with the attention reading and extending per-sequence caches.
//
// Block b (main layer or the MTP block), stream in -> out:
//   site_norm(attn, in) -> attention -> expand(attn, in -> Mid(b)) -> site_norm(ffn, Mid(b)) -> MoE
//   [-> balance loss] -> expand(ffn, Mid(b) -> out)
// With full recomputation (ProgramShape::replay) the backward of block b is: replay of its forward up to the MoE
// (the last expand's output is not read by the backward) -> block backward -> release.
// Stage: [embed -> X(0) | X(0) from the previous stage] -> blocks 0..L-1 -> [head + CE on X(L); MTP input from
// X(L) and Embed[token t+1] -> MTP block -> MTP head + CE | X(L) to the next stage].
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/dsv4/backend.h"

namespace trex::dsv4 {

// What one stage of the model holds, as the program sees it.
struct ProgramShape {
  int64_t n_layers = 0;        // main layers of this stage: blocks [0, n_layers)
  bool embed = true;           // the stage starts with the embedding (else X(0) comes from the previous stage)
  bool head = true;            // the stage ends with the head and the losses (else X(L) goes to the next stage)
  bool mtp = false;            // block n_layers is the MTP block (head stage only)
  std::vector<char> balance;   // per block: the balance loss applies to its router
  int64_t vocab = 0;
  // Full activation recomputation, per block (main layers, then the MTP block; empty: none): a block marked here has
  // its activations released after its forward (Backend::release_block) and its forward re-run (Pass::replay) right
  // before its backward, then released again (recompute_full_layers: the unmarked ones recompute selectively).
  std::vector<char> replay;
  bool replays(int64_t blk) const { return !replay.empty() && replay[size_t(blk)] != 0; }
};

struct MicroBatch {
  int64_t slot = 0;                   // activation slot (micro-batch in flight)
  const int32_t* ids = nullptr;       // [B*S]
  const int32_t* labels = nullptr;    // [B*S], < 0 = no loss; head stage only
  const SeqLayout* layout = nullptr;
  const void* x_in = nullptr;         // the incoming stream (not on the embed stage)
  void* x_out = nullptr;              // the outgoing stream (not on the head stage)
  double loss_scale = 1.0;            // the backward produces the gradients of loss_scale * total
  double mtp_weight = 0.0;
  double balance_alpha = 0.0;
};

// Called in the backward when block b's parameter gradients are complete (b = -1: everything else of the stage,
// last). On the head stage kHeadReady comes first, once the main head's backward is done: the head's own
// parameters (hc_head, norm, LM head) are then complete (a caller that reduces them with the rest at -1 ignores it).
using BlocksReady = std::function<void(int64_t block)>;
constexpr int64_t kHeadReady = -2;

class BlockProgram {
 public:
  BlockProgram(Backend& backend, ProgramShape shape);
  ~BlockProgram();
  BlockProgram(const BlockProgram&) = delete;
  BlockProgram& operator=(const BlockProgram&) = delete;

  const ProgramShape& shape() const { return shape_; }
  void set_slots(int64_t n);

  // Forward of one micro-batch; returns this stage's loss terms (total unscaled).
  const LossParts& forward(const MicroBatch& mb);
  // Backward of the micro-batch last run forward on `slot`: dx_out the gradient of the outgoing stream (not on the
  // head stage), dx_in receives the incoming stream's gradient (not on the embed stage).
  void backward(int64_t slot, const void* dx_out, void* dx_in, const BlocksReady& ready = {});
  const LossParts& losses(int64_t slot) const;

  // One decode step (whole model, main head; the MTP module does not run): the step's tokens through every block
  // with the caches, then the logits of the token rows asked for.
  void decode(const int32_t* ids, const CachedTokens& tokens, int64_t n_tok, const int64_t* rows, int64_t n_rows,
              float* logits);
  // The same step on a program without the embedding: x_in is the step's incoming stream X(0) (backend memory;
  // the MTP module's input streams in speculative decoding, whose next tokens the host does not hold).
  void decode_from(const void* x_in, const CachedTokens& tokens, int64_t n_tok, const int64_t* rows, int64_t n_rows,
                   float* logits);

 private:
  struct SlotState;
  SlotState& slot(int64_t i);
  const SlotState& slot(int64_t i) const;
  // alpha: the balance loss weight (0 = off), grad_scale: the scale of its gradient.
  void block_fwd(const Pass& p, int64_t blk, Stream in, Stream out, double alpha, double grad_scale);
  // alpha / grad_scale: the forward's, for a replay (full recomputation).
  void block_bwd(const Pass& p, int64_t blk, Stream in, Stream d_out, Stream d_in, double alpha, double grad_scale);
  void decode_pass(const int32_t* ids, const void* x_in, const CachedTokens& tokens, int64_t n_tok,
                   const int64_t* rows, int64_t n_rows, float* logits);

  Backend& be_;
  ProgramShape shape_;
  std::vector<std::unique_ptr<SlotState>> slots_;
};

}  // namespace trex::dsv4
