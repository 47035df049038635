// The CUDA backend of the block program (model/dsv4/backend.h): today's kernels on the default stream, bf16 values
// and fp32 gradients in device memory. Internal to model/cuda: GpuModel (gpu_model_cuda.cpp) runs BlockProgram on
// it for forward / backward and the pipeline stage steps.
//
// State. The backend works on GpuModel::Impl's live batch state (the device layout, the streams X, the head's
// activations) and on each GpuBlock's saved activations; GpuModel swaps a pipeline micro-batch's parked state in
// around the program call (Impl::swap_slot), so Pass::slot is not read here. What lives only in the backend is
// per call: the balance rows and the head's loss sums of the forward in progress (read by losses()), and the
// backward's gradient streams and per-block gradients.
//
// Pools, as the hand-written step had them: a block's saved activations in its keep pool (cleared by the block's
// first forward op), the streams and head activations in Impl::acts, every temporary in a pool of the op (or of
// one block's backward) that frees it stream-ordered when done. Recomputation (GpuModelOptions::recompute): the
// selections live in the block's picks pool (re-used by a replay); selective puts what redo_block rebuilds in
// the block's redo pool, dropped after the block's forward and after its backward; full releases keep and redo
// after the block's forward (release_block) and again after its replayed backward.
//
// Per op (docs/architecture.md, "How the CUDA backend plugs in"): site_norm = the mHC site + RMSNorm (n_hc 4: the
// tensor-core mixing projection + mhc_site_norm_fwd_proj; else mhc_site_norm_fwd_any), backward
// mhc_collapse_norm_bwd + the site backward; expand = mhc_expand_*_any; attention = attention_fwd / attention_bwd
// (gpu_attention_cuda.cpp); moe = moe_fwd / moe_bwd (gpu_moe_cuda.cpp, with its expert exchange); balance =
// cuda::balance_loss into device rows; head_loss = hc_head_fwd_any + mhc_collapse_norm_fwd + lm_head_ce_fwd_grad
// (HeadMode::LossAndGrad: the CE gradient formed in the forward) or lm_head_ce_fwd; embed = embed_streams_fwd /
// bwd; stream_in / stream_out = the stage boundary copies (none where the caller placed the buffer: place_*).
//
// Decoding (cuda_backend_decode_cuda.cpp): a pass with Pass::cached runs the same ops on one reused set of step
// activations (DecodePass) and the slots' caches (DecodeCaches, set_decode): the serving engine's kernels, batched
// over every new token of every sequence of the step (prompt chunks and decoded tokens alike). attention_cached =
// the query / K=V projections, the streaming compressors and the indexer (decode_compress_entries, indexer_topk)
// and the core attention on the tensor-core kernel over the cached keys (decode_key_sets + sparse_attention_fwd;
// DecodeOptions::reference_attention: the per-warp decode_attention kernel); head_logits = hc_head + norm + fp32
// logits of the asked rows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/cuda/decode_cache.h"
#include "model/cuda/gpu_impl.h"
#include "model/dsv4/backend.h"

namespace trex::dsv4gpu {

// The phases of a decode pass the backend reports to DecodeOptions::mark (the serving engine's step profile).
enum DecodePhase : int {
  kPhaseEmbed = 0, kPhaseMhc, kPhaseAttnProj, kPhaseAttnCore, kPhaseAttnOut, kPhaseMoe, kPhaseHead
};

struct DecodeOptions {
  int64_t slots = 1, max_context = 0;  // the caches hold max_context tokens for each of `slots` sequences
  bool reference_attention = false;    // the per-warp decode kernel (head dims 256 / 512) instead of the tensor cores
  bool grouped_experts = true;         // the routed experts as one grouped GEMM; false: one GEMM per expert
  // The LM head [lm_vocab, d] the logits use when it is not this model's head.weight (the MTP module shares the
  // main model's); null: head.weight.
  const bf16* lm_head = nullptr;
  int64_t lm_vocab = 0;
  std::function<void(int)> mark;  // called as each DecodePhase of a pass ends; may be empty
};

class CudaBackend final : public dsv4::Backend {
 public:
  explicit CudaBackend(GpuModel::Impl& m);
  ~CudaBackend() override;

  // Before a forward: the selections to inject (parity runs; null: the GPU's own) and what the head computes.
  void set_forward(const Injection* inject, HeadMode head);
  // Before a forward of a stage without the head: the device bf16 [N, hc, d] buffer that holds the outgoing
  // stream X(L) itself (the last block writes it there; stream_out then copies nothing). Null: the backend's own.
  void place_output(bf16* x_out) { placed_out_ = x_out; }
  // Before a backward: allocates the gradient streams; dx_in (nullable) the fp32 [N, hc, d] buffer that receives
  // the incoming stream's gradient in place (a stage without the embedding). end_backward frees them.
  void begin_backward(float* dx_in);
  void end_backward();
  // The forward's raw CE sum of a head (the loss before the normaliser; data parallel: all-reduced by the model).
  double ce_sum(dsv4::HeadKind h) const;

  void begin_pass(const dsv4::Pass& p) override;
  void embed_fwd(const dsv4::Pass& p, dsv4::Stream out) override;
  void embed_bwd(const dsv4::Pass& p, dsv4::Stream d_out) override;
  void stream_in(const dsv4::Pass& p, dsv4::Stream s, const void* src) override;
  void stream_out(const dsv4::Pass& p, dsv4::Stream s, void* dst) override;
  void site_norm_fwd(const dsv4::Pass& p, int64_t blk, dsv4::Site s, dsv4::Stream in) override;
  void site_norm_bwd(const dsv4::Pass& p, int64_t blk, dsv4::Site s, dsv4::Stream in, dsv4::Stream d_in) override;
  void expand_fwd(const dsv4::Pass& p, int64_t blk, dsv4::Site s, dsv4::Stream in, dsv4::Stream out) override;
  void expand_bwd(const dsv4::Pass& p, int64_t blk, dsv4::Site s, dsv4::Stream in, dsv4::Stream d_out,
                  dsv4::Stream d_in) override;
  void attention_fwd(const dsv4::Pass& p, int64_t blk) override;
  void attention_bwd(const dsv4::Pass& p, int64_t blk) override;
  void attention_cached(const dsv4::Pass& p, int64_t blk) override;
  void moe_fwd(const dsv4::Pass& p, int64_t blk) override;
  void moe_bwd(const dsv4::Pass& p, int64_t blk) override;
  void balance_fwd(const dsv4::Pass& p, int64_t blk, double alpha, double grad_scale) override;
  void head_loss_fwd(const dsv4::Pass& p, dsv4::HeadKind h, dsv4::Stream in, const int32_t* targets) override;
  void head_loss_bwd(const dsv4::Pass& p, dsv4::HeadKind h, dsv4::Stream in, const int32_t* targets, double weight,
                     dsv4::Stream d_in, bool accumulate) override;
  void head_logits(const dsv4::Pass& p, dsv4::Stream in, const int64_t* rows, int64_t n_rows,
                   float* logits) override;
  void mtp_input_fwd(const dsv4::Pass& p, const int32_t* next_ids, dsv4::Stream main, dsv4::Stream out) override;
  void mtp_input_bwd(const dsv4::Pass& p, const int32_t* next_ids, dsv4::Stream main, dsv4::Stream d_out,
                     dsv4::Stream d_main, bool accumulate) override;
  void release_block(const dsv4::Pass& p, int64_t blk) override;
  dsv4::LossParts losses(const dsv4::Pass& p) override;
  std::unique_ptr<dsv4::SequenceCaches> new_caches() const override;

  // A host array uploaded mid-forward through pinned staging (a pageable copy could wait for the queued layers):
  // part 0 the main head's targets, 1 the MTP head's, 2 the MTP input's next ids. Reused once losses() has
  // synchronised the forward.
  // Into dst, grown when too small (a step after the first allocates nothing here).
  void upload_staged(DevMem& dst, int part, const int32_t* src, int64_t n);
  // The forward's and backward's own pools (balance rows, CE sums, gradient streams): the activation arena binds
  // them (activation_arena.h); one block's backward temporaries take the context's scratch region.
  std::vector<Pool*> step_pools() { return {&bal_, &loss_, &gbufs_}; }

  // Decoding: allocates the caches of o.slots sequences (new_caches hands them out in order) and the rotary tables
  // for o.max_context positions. After a decode pass, decode_streams() is its final stream X(L) [n_tok, hc, d]
  // (valid until the next pass).
  void set_decode(const DecodeOptions& o);
  DecodeCaches& decode_caches();
  const bf16* decode_streams() const;
  // The choices the last decode pass made, per token of the pass (valid until the next pass; synchronises): block
  // blk's routed experts [n_tok * topk], and on a CSA block the indexer's entries [n_tok * index_topk] as global
  // indices of the slots' entry arrays (slot * cap + entry; -1 empty). Tests give them to the uncached model
  // (Injection), so that a bf16 near-tie the two resolve differently is told apart from a wrong cache.
  std::vector<int32_t> decode_router_selection(int64_t blk) const;
  std::vector<int64_t> decode_csa_selection(int64_t blk) const;

 private:
  struct BlockGrads;  // one block's backward temporaries
  GpuBlock& block(int64_t blk) const;
  dsv4::Stream block_input(int64_t blk) const;      // the stream entering block blk (X(blk), or MtpIn)
  void redo_block(const dsv4::Pass& p, int64_t blk);  // selective recomputation before the block's backward
  bf16* value(dsv4::Stream s) const;
  float* grad(dsv4::Stream s) const;
  const char* attn_section(const GpuBlock& b, bool fwd) const;
  // A decode pass (cuda_backend_decode_cuda.cpp): its plan and step activations, and its ops where they differ.
  void begin_decode(const dsv4::Pass& p);
  void decode_site_norm(int64_t blk, dsv4::Site s, dsv4::Stream in);
  void mark(DecodePhase ph) const {
    if (dec_opts_.mark) dec_opts_.mark(ph);
  }

  GpuModel::Impl& m_;
  Ctx c_;
  const Injection* inject_ = nullptr;
  HeadMode head_ = HeadMode::Loss;
  bf16* placed_out_ = nullptr;
  // The forward in progress: balance rows [n_layers, B] (fp64) and their scratch, the head's CE sum.
  Pool bal_, loss_;
  double* bal_rows_ = nullptr;  // [n_layers + 1, B]: by the block's layer in the extended config (MTP last)
  float *lm_sum_ = nullptr, *mtp_sum_ = nullptr;  // device CE sums of the two heads
  float lm_sum_host_ = 0.f, mtp_sum_host_ = 0.f;
  // The backward in progress: the gradient streams dA / dB (dMtpIn, dMtpOut) and one block's temporaries.
  Pool gbufs_;
  float *dA_ = nullptr, *dB_ = nullptr;
  float* dMtp_[2] = {nullptr, nullptr};
  std::shared_ptr<int32_t> pinned_;  // [3 * pinned_n_]
  int64_t pinned_n_ = 0;
  std::unique_ptr<BlockGrads> bg_;
  DevMem balanced_sel_;  // GpuModelOptions::balanced_routing: [balanced_n_ * topk] forced expert ids
  int64_t balanced_n_ = 0;
  // Decoding (set_decode): the options, the slots' caches (new_caches hands out slot next_slot_), the rotary
  // tables of max_context positions, and the pass in progress (decoding_ while a cached pass runs).
  DecodeOptions dec_opts_;
  std::unique_ptr<DecodeCaches> caches_;
  mutable int64_t next_slot_ = 0;
  RopeDev dec_rope_main_, dec_rope_compress_;
  std::unique_ptr<DecodePass> dec_;
  DevMem dec_rows_;  // head_logits' rows on the device
  bool decoding_ = false;
};

// Rotary cos / sin tables of n_pos positions on the device, as the CPU model forms them.
void upload_rope(RopeDev& r, const std::vector<double>& inv_freq, int64_t n_pos);

}  // namespace trex::dsv4gpu
