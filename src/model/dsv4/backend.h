// The backend interface of the DeepSeek-V4 block program (program.h): the ops the program sequences, at the
// granularity the GPU fuses them (docs/architecture.md maps each op to the kernels):
//   embedding -> streams | mHC site + RMSNorm | attention (whole batch, or against per-sequence caches) |
//   mHC expand | MoE (router, dispatch / combine through the expert exchange, experts, shared expert) |
//   balance loss | head (hc_head collapse + norm + LM head + CE) | MTP input | stage boundary copies.
// Each op has its forward and (where training needs it) its backward.
//
// The program names tensors, the backend stores them: a Stream says which [n_tok, n_hc, d] stream an op reads or
// writes, and everything else an op hands to the next (the site's mixing weights and normed sub-layer input, the
// sub-layer output, the router's choice, the head's softmax statistics, the gradients flowing between the ops of
// one block) lives in the backend under (pass slot, block, site). So the element type and memory (CPU fp32 / fp64
// host arrays; CUDA bf16 values and fp32 gradients on the device) are the backend's business, and a CUDA backend
// implements every op with a kernel launch on its stream: nothing here needs a value back on the host except
// losses(), read once at the end of a forward.
#pragma once
#include <cstdint>
#include <memory>

#include "model/dsv4/seq_layout.h"

namespace trex::dsv4 {

enum class Site : uint8_t { Attn = 0, Ffn = 1 };       // the two mHC sites of a block
enum class HeadKind : uint8_t { Main = 0, Mtp = 1 };   // main head, or the MTP module's (shared LM head)

// A stream [n_tok, n_hc, d] named by the program. Values: X(l) enters main layer l (X(L) leaves the last one),
// Mid(b) lies between block b's attention and its MoE, MtpIn / MtpOut surround the MTP block. Gradients: dA / dB
// alternate down the layers, dMid is inside a block, dMtpIn / dMtpOut surround the MTP block.
struct Stream {
  enum Kind : uint8_t { X, Mid, MtpIn, MtpOut, dA, dB, dMid, dMtpIn, dMtpOut };
  Kind kind = X;
  int64_t index = 0;  // X: the layer boundary; Mid: the block; unused otherwise
};

// Per-sequence decode caches (window ring, compressed entries, indexer keys of every layer); created by the
// backend, opaque to the program.
struct SequenceCaches {
  virtual ~SequenceCaches() = default;
};

// The new tokens of a decode step, grouped by sequence in order (a prompt chunk and a decoded token alike).
struct CachedTokens {
  const int64_t* pos = nullptr;         // [n_tok] position of each new token in its sequence
  const int64_t* seq = nullptr;         // [n_tok] which of the step's sequences it belongs to
  const int64_t* seq_begin = nullptr;   // [n_seqs + 1] first new token of each sequence
  int64_t n_seqs = 0;
  SequenceCaches* const* caches = nullptr;  // [n_seqs]
};

// One pass (a training micro-batch's forward or backward, or one decode step).
struct Pass {
  int64_t slot = 0;                      // activation slot: the micro-batch in flight (decode: unused)
  int64_t n_tok = 0;
  const int32_t* ids = nullptr;          // [n_tok] host token ids (embedding, hash routing)
  const SeqLayout* layout = nullptr;     // training: rows, positions, documents of the batch
  const CachedTokens* cached = nullptr;  // decode: the step's tokens and caches (then nothing is kept)
  // The weights the backward will give head_loss_bwd (main head: loss_scale, MTP head: mtp_weight * loss_scale),
  // known at the forward: a backend that forms the CE gradient while the logits are at hand (CUDA) scales it now.
  double loss_scale = 1.0, mtp_weight = 0.0;
  // A block's forward re-run in the backward (full recomputation, ProgramShape::replay): the backend reuses the
  // saved router / indexer selections instead of choosing again, and balance_fwd only recomputes its gradient.
  bool replay = false;
  bool keeps_activations() const { return cached == nullptr; }
};

struct LossParts {  // of one micro-batch and one stage; not multiplied by the loss scale
  double total = 0;    // lm + mtp_weight * mtp + balance
  double lm = 0;       // mean CE of the main head
  double mtp = 0;      // mean CE of the MTP head (unweighted)
  double balance = 0;  // already multiplied by alpha, summed over this stage's layers (MTP block included)
  int64_t lm_targets = 0, mtp_targets = 0;
};

// Conventions: a backward op that "writes" a gradient stream overwrites it, one that "adds" accumulates into it;
// parameter gradients always accumulate.
class Backend {
 public:
  virtual ~Backend() = default;

  // Prepares the activations of a pass of p.n_tok tokens: kept per block for the backward in training, one reused
  // set in decode.
  virtual void begin_pass(const Pass& p) = 0;

  // out = n_hc copies of Embed[ids]; the backward adds d_out summed over the streams into embed.weight's gradient.
  virtual void embed_fwd(const Pass& p, Stream out) = 0;
  virtual void embed_bwd(const Pass& p, Stream d_out) = 0;
  // Pipeline stage boundaries: a stream from / to the neighbour stage's buffer (the backend's element type and
  // memory; values for X, gradients for dA / dB).
  virtual void stream_in(const Pass& p, Stream s, const void* src) = 0;
  virtual void stream_out(const Pass& p, Stream s, void* dst) = 0;

  // mHC site + RMSNorm: the site's mixing (pre / post / comb) from `in`, the collapse sum_i pre_i in[i] and its
  // attn_norm / ffn_norm: the site's sub-layer input.
  virtual void site_norm_fwd(const Pass& p, int64_t blk, Site s, Stream in) = 0;
  // From d(sub-layer input) (left by the sub-layer's backward) and the expand's d(post) / d(comb): ADDS into d_in.
  virtual void site_norm_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_in) = 0;
  // out[j] = post_j y + sum_i comb[i][j] in[i], y = the site's sub-layer output.
  virtual void expand_fwd(const Pass& p, int64_t blk, Site s, Stream in, Stream out) = 0;
  // WRITES d_in (the comb mix of d_out) and the site's d(y), d(post), d(comb).
  virtual void expand_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_out, Stream d_in) = 0;

  // Attention sub-layer on the attn site's input -> its output, over the whole batch (p.layout).
  virtual void attention_fwd(const Pass& p, int64_t blk) = 0;
  virtual void attention_bwd(const Pass& p, int64_t blk) = 0;  // d(output) -> d(input), parameter gradients
  // The same sub-layer for a decode step: each new token attends to its sequence's cache and the step's earlier
  // tokens of that sequence; the caches then hold the new tokens.
  virtual void attention_cached(const Pass& p, int64_t blk) = 0;

  // MoE sub-layer on the ffn site's input -> its output: router, dispatch through the expert exchange, the
  // experts, combine, shared expert; the expert load statistics of the pass.
  virtual void moe_fwd(const Pass& p, int64_t blk) = 0;
  virtual void moe_bwd(const Pass& p, int64_t blk) = 0;  // includes the balance loss's gradient when it ran
  // Sequence-wise balance loss of the block's router (design §5), weight alpha, added to the pass's losses; its
  // gradient, times grad_scale, is kept for moe_bwd.
  virtual void balance_fwd(const Pass& p, int64_t blk, double alpha, double grad_scale) = 0;

  // hc_head collapse -> norm -> LM head -> masked CE over targets[n_tok] (-1 = none): the mean is added to the
  // pass's losses (lm or mtp by `h`). The mean's divisor is the pass's labelled targets, unless the backend was
  // told a larger normaliser (CUDA: the targets of the whole data-parallel batch or of the step's micro-batches),
  // so that the micro-batches' and ranks' terms sum to the step's mean.
  virtual void head_loss_fwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets) = 0;
  // weight x d(mean CE): WRITES (accumulate false) or ADDS into d_in. weight is the one Pass announced.
  virtual void head_loss_bwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets, double weight,
                             Stream d_in, bool accumulate) = 0;
  // Decode: fp32 logits [n_rows, V] of the main head for the given token rows (backend memory: host for the CPU).
  virtual void head_logits(const Pass& p, Stream in, const int64_t* rows, int64_t n_rows, float* logits) = 0;

  // MTP input: out = h_proj(hnorm(main[j])) + e_proj(enorm(Embed[next_ids])) per stream j (next_ids -1: none).
  virtual void mtp_input_fwd(const Pass& p, const int32_t* next_ids, Stream main, Stream out) = 0;
  // WRITES (accumulate false) or ADDS into d_main; adds into embed.weight's gradient.
  virtual void mtp_input_bwd(const Pass& p, const int32_t* next_ids, Stream main, Stream d_out, Stream d_main,
                             bool accumulate) = 0;

  // Full recomputation (ProgramShape::replay): called after block blk's forward and again after its backward.
  // Drops the block's saved activations except its router / indexer selections (a replay re-uses them, so bf16
  // near-ties cannot choose differently); the block's input stream stays (it is the previous block's output).
  virtual void release_block(const Pass& p, int64_t blk) = 0;

  // The loss terms the forward on p.slot added (lm, mtp, balance and the target counts; total left to the program).
  virtual LossParts losses(const Pass& p) = 0;

  // Empty caches for one sequence (decode).
  virtual std::unique_ptr<SequenceCaches> new_caches() const = 0;
};

}  // namespace trex::dsv4
