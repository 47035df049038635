// GpuModel::Impl: the parameter arenas, the blocks and the head state (shared by gpu_params_cuda.cpp and
// gpu_model_cuda.cpp).
#pragma once
#include <algorithm>
#include <memory>

#include "model/cuda/gpu_internal.h"
#include "model/dsv4/param_table.h"

namespace trex::dsv4 {
class BlockProgram;
}

namespace trex::dsv4gpu {

class CudaBackend;
class GradBuckets;
class WeightGather;
struct ActivationArena;

// One head's activations of a forward (hc_head collapse -> norm -> LM head + CE; the collapse stays fp32,
// mhc_norm.h).
struct HeadState {
  bf16* normed = nullptr;  // [N, d] the LM head's input
  float *mix = nullptr, *rstd = nullptr, *w = nullptr, *norm_rstd = nullptr, *lse = nullptr;
  // fp32 [N, d] d(loss)/d(normed) of a HeadMode::LossAndGrad forward (head.weight's gradient already accumulated);
  // null after a loss-only forward or once backward consumed it (backward then recomputes the logits).
  float* dnormed = nullptr;
  DevMem targets;  // int32 [N], -1 = none
  int64_t n_targets = 0;
};

// The MTP input's saved activations (design §2.10): Embed[token t+1] (0 where there is none), its enorm, the
// main streams' hnorm.
struct MtpInputSaved {
  DevMem next_ids;  // int32 [N], -1 = none
  bf16 *emb = nullptr, *e_norm = nullptr, *h_norm = nullptr;  // [N, d], [N, d], [N * n_hc, d]
  float *e_rstd = nullptr, *h_rstd = nullptr;                 // [N], [N * n_hc]
};

struct GpuModel::Impl {
  dsv4::ModelConfig cfg;
  GpuModelOptions opts;
  // Made by the GpuModel constructor (its cuBLASLt handle and workspace are device state); GpuModel::footprint
  // builds an Impl to count the arena and must not allocate, so it has none.
  std::unique_ptr<cuda::Gemm> gemm;
  // Parameters: one fp32 master arena, its bf16 copy and the fp32 gradients (none when opts.gradients is false),
  // same offsets. The optimiser (train/cuda/gpu_optimizer.h) keeps its moments in the master's (shard) layout.
  std::vector<GpuParam> params;
  std::map<std::string, size_t> index;
  int64_t total = 0;
  DevMem master, compute, grads;
  std::map<std::string, DevMem> bias;     // fp32 [E]
  std::map<std::string, DevMem> tid2eid;  // int32 [V, K]
  std::vector<std::unique_ptr<GpuBlock>> blocks;
  std::unique_ptr<GpuBlock> mtp_block;  // the MTP module's block ("mtp.0."; null without MTP or off the head stage)
  // Batch state.
  DevLayout lay;
  RopeDev rope_main, rope_compress;
  int64_t rope_pos = 0;
  Pool acts;  // streams X_0..X_L (and the MTP block's), head activations
  std::vector<bf16*> X;
  bf16 *mtp_in = nullptr, *mtp_out = nullptr;  // the MTP block's streams [N, hc, d]
  HeadState head, mtp_head;                    // the main head's, the MTP module's (shared LM head)
  MtpInputSaved mtp_input;                     // the MTP input's saved activations
  bool forward_done = false;
  // Pipeline stage (GpuModelOptions::layer_begin / layer_end): layers [l0, l1); the embedding on the first stage,
  // the head on the last. Declaration skips the other parameters (their ordinals stay reserved).
  int64_t l0 = 0, l1 = 0;
  bool first_stage() const { return l0 == 0; }
  bool last_stage() const { return l1 == cfg.n_layers; }
  // The last stage of a pipeline with the MTP module holds its own copy of embed.weight (the MTP input embeds
  // token t+1; design §2.10 ties it to the main embedding): declared in the embedding's bucket as on the first
  // stage, its gradient summed with the first stage's (GpuModel::sum_tied_embedding_grads), so both copies take
  // the same update. It is left out of this stage's gradient norm (the first stage counts it).
  bool embed_copy() const { return cfg.n_mtp > 0 && last_stage() && !first_stage(); }
  bool declaring = true;
  // Stage steps: the whole step's labelled targets come from begin_step, not from the micro-batch.
  bool step_mode = false;
  // Stage steps under data parallelism (begin_step's reduce_micro): -1 reduces the gradients in every backward;
  // m >= 0 only in micro-batch m's (the step's last), the earlier ones accumulating in the full arena.
  int64_t reduce_micro = -1;
  bool reduce_this_backward = true;  // of the backward in progress
  Pool grad_out;           // owns dx_in after a non-first stage's backward (kept for the boundary send)
  Pool out;                // owns X[l1] of a non-last stage's forward (read in place by the next stage)
  float* dx_in = nullptr;  // fp32 [N, hc, d]
  // Per-slot parked state of micro-batches in flight; swap_slot exchanges slot s with the live fields above.
  struct Slot {
    DevLayout lay;
    Pool acts, grad_out, out;
    std::vector<bf16*> X;
    bf16 *mtp_in = nullptr, *mtp_out = nullptr;
    HeadState head, mtp_head;
    MtpInputSaved mtp_input;
    float* dx_in = nullptr;
    bool forward_done = false;
    std::vector<BlockSaved> blocks;  // [n_layers], used for [l0, l1)
    BlockSaved mtp;                  // the MTP block's
  };
  std::vector<Slot> slots;
  void swap_slot(int s);
  // Timing.
  struct Section {
    std::string name;
    cudaEvent_t start, stop;
  };
  std::vector<Section> open_sections, done_sections;
  std::map<std::string, double> section_totals;

  // Out of line (gpu_model_cuda.cpp), where CudaBackend and BlockProgram are complete.
  explicit Impl(const dsv4::ModelConfig& c, const GpuModelOptions& o);
  ~Impl();

  // ordinal: the tensor's place in the full model's declaration order (its random init stream).
  void declare(const std::string& name, const Shape& shape, int64_t ordinal);       // bf16-read, unpadded
  void declare_fp32(const std::string& name, const Shape& shape, int64_t ordinal);  // region R (fp32-read), padded to 8
  void declare_all();
  void bind_all();
  std::unique_ptr<GpuBlock> bind_block(int64_t l);  // main layer l, or the MTP block (l == cfg.n_layers)
  const GpuParam& info(const std::string& name) const;
  float* f32(const std::string& n) const { return master_at(info(n)); }
  // The bf16 weights the kernels read. Under ZeRO-3 a bucket tensor's lie in its bucket's gathered buffer while
  // that is live (weight_gather.h), else null; region X (the local experts) is held whole.
  bf16* b16(const std::string& n) const;
  // This rank's persistent bf16 copy at an arena offset: the arena itself, or under ZeRO-3 (where `compute` holds
  // region X whole, this rank's bucket slices and region R, in grad_index's layout) inside a piece it holds.
  bf16* weight_at(int64_t arena_offset) const;
  // Null without a gradient arena (an inference-only model binds no gradient pointers). Under ZeRO-2 a bucket
  // tensor's gradient lives in its bucket's transient buffer while that is open (grad_buckets.h), else null.
  float* g32(const std::string& n) const;
  float* grad_at(int64_t arena_offset) const;
  void refresh_compute();  // bf16 copy of the master weights

  // Data parallel with a sharded optimiser (ZeRO-1), gpu_params_cuda.cpp. The arena has two regions:
  // [0, region_a) the parameters the kernels read in bf16, cut into buckets (embed, head + norm, one per layer)
  // whose gradients are reduce-scattered as backward finishes them; bucket b's slice dp_rank of length
  // (end - begin) / dp_size is this rank's: its fp32 master and AdamW moments live here (at shard_off), the
  // updated bf16 slice is all-gathered back before the next forward uses it. [region_a, total) the parameters
  // read in fp32 (mHC mixing weights, attention sinks, compressor ape): small, all-reduced and updated on
  // every rank. Under expert parallelism region X (the local experts, above) comes first, before the buckets.
  // master (and the optimiser's moments) hold the shard layout (region X's own slice, own bucket slices, then
  // region R); with one rank it is the arena layout itself. The optimiser step itself lives in
  // train/cuda/gpu_optimizer_cuda.cpp.
  struct Bucket {
    int64_t begin = 0, end = 0, shard_off = 0;
    int64_t slice(int n) const { return (end - begin) / n; }
  };
  // Expert parallel (GpuModelOptions::ep with P > 1 ranks): this rank holds the routed experts [e_begin, e_end)
  // of every MoE layer, E / P of them, by the CPU model's rule (parallel/ep_exchange.h: rank r holds
  // [r E/P, (r+1) E/P)); the other experts' weights, gradients and optimiser moments exist on their owners only.
  // The local experts form region X at the arena's start, [0, region_x) (0 without EP): outside the data-parallel
  // buckets, since each EP rank's experts differ; their bf16 weights and gradients held whole by the rank. Their
  // gradients are complete on the owner after the MoE's exchange (every rank's tokens), and are summed over the
  // expert-data-parallel replicas (edp: the DP ranks with the same EP rank, when DP is larger than EP) before the
  // optimiser step (reduce_expert_grads). With replicas the experts' optimiser state is sharded over them as the
  // dense buckets' is over DP (ZeRO-1): region X's gradients are reduce-scattered over edp, replica i owns the
  // fp32 master and moments of region X's slice [x_own, x_own + x_shard) (x_own = i * x_shard, x_shard =
  // region_x / edp size), updates it, and all-gathers the bf16 slice back; without replicas x_shard = region_x.
  int ep_size = 1, ep_rank = 0;
  int64_t e_begin = 0, e_end = 0;
  int64_t region_x = 0;
  int64_t x_shard = 0, x_own = 0;
  bool experts_sharded() const { return x_shard < region_x; }
  std::unique_ptr<comm::Communicator> edp;
  bool local_expert(int64_t e) const { return e >= e_begin && e < e_end; }
  // Queues region X's edp reduce-scatter on grad_work (nothing without replicas), once per backward's gradients:
  // data-parallel accumulation (add_reduced_grads_to / add_held_grads), the clipping norm (dp_grad_norm) and the
  // optimiser step call it; a backward, set_grad or zero_grads re-arms it.
  void reduce_expert_grads();
  bool experts_reduced = false;

  // Gradient partitioning (GpuModelOptions::zero; 1 on one GPU). The persistent gradient array `grads` is the
  // arena under ZeRO-1. Under ZeRO-2 it is [region X whole | every bucket's own slice, in bucket order | region
  // R]: grad_index maps an arena offset held there (region X, region R, or inside this rank's slice of a bucket)
  // to its index; under ZeRO-1 it is the identity. grad_elems: the array's length.
  int zero = 1;
  bool reduce_bf16 = false;
  bool zero2() const { return zero >= 2 && dp_size > 1; }  // ZeRO-3's gradients are ZeRO-2's
  // ZeRO-3 (fully sharded dense weights): `compute` holds only this rank's bucket slices (and region X and R whole,
  // in grad_index's layout); a bucket's whole bf16 weights are all-gathered into a transient buffer ahead of use
  // (weight_gather.h: at most two layer buffers live, the next one prefetched while the current one computes).
  bool zero3() const { return zero >= 3 && dp_size > 1; }
  std::unique_ptr<WeightGather> wgather;
  // The weights of block blk (stage-local; the MTP block is l1 - l0) ready for its forward (backward false) or its
  // backward / replay (true): waited for, and under ZeRO-3 the neighbour in that direction prefetched.
  void block_weights(int64_t blk, bool backward);
  // Under ZeRO-3: every gathered buffer dropped (the persistent slices changed: optimiser step, checkpoint load,
  // init), so the next use gathers the new values; a no-op otherwise.
  void weights_changed();
  // A bucket's gathered buffer (re)placed or dropped: the blocks' bound weight pointers into it rebound.
  void bind_bucket_weights(int b);
  void bind_block_weights(GpuBlock& b);
  int64_t grad_index(int64_t arena_offset) const;
  int64_t grad_elems() const {
    return zero2() ? region_x + (region_a - region_x) / dp_size + (total - region_a) : total;
  }
  // The buckets' reductions and gathers (grad_buckets.h: the bucket protocol over the arena, ZeRO-2's transient
  // buffers, the bf16 reduction): data parallel with gradients only.
  std::unique_ptr<GradBuckets> gbuckets;
  int bucket_of(int64_t arena_offset) const;  // -1 outside region A
  void open_bucket(int b);                     // ZeRO-2: b's buffer ready (zeroed) and its blocks rebound to it
  void bind_block_grads(GpuBlock& b);          // a block's gradient pointers from g32 (bind_block, open_bucket)
  // Tensor parallel (GpuModelOptions::tp): this rank's slice of the TP-split tensors (GpuParam::tp_axis) is
  // declared in place of the whole tensor, under the official name; tp_rank picks the slice.
  comm::Communicator* tp = nullptr;
  int tp_size = 1, tp_rank = 0;
  // GpuModelOptions::expert_tp: the routed experts split over TP too; expert_width the width a rank holds of each.
  dsv4::TpExperts tp_experts = dsv4::TpExperts::Whole;
  int64_t expert_width() const { return tp_experts == dsv4::TpExperts::Split ? cfg.moe_inter / tp_size : cfg.moe_inter; }
  // The TP-split parameters' squared gradient norm (this rank's own pieces) apart from the rest, so the norm sums
  // the split ones over the TP group and counts the replicated ones once (gpu_shard_state_cuda.cpp).
  // Over the arena ranges [a, e) (each inside one piece this rank holds: region X, a bucket's own slice, region R),
  // read at grad_index's place: the squared gradient elements of TP-split tensors into *split, the others into
  // *rest (both added to).
  void tp_sum_squares(const std::vector<std::pair<int64_t, int64_t>>& ranges, double* split, double* rest) const;
  // The global gradient norm under tensor parallelism (grad_norm / dp_grad_norm with tp_size > 1): this rank's own
  // reduced gradients (its DP slices, or all of them on one DP rank), the TP-split tensors' squares summed over
  // the TP group, the replicated ones (identical on the TP ranks) counted once. The same bits on every TP rank.
  double tp_grad_norm();
  // This TP rank's slice of p's official tensor `full` (p.full elements) into `local` (p.numel elements), and
  // back (`full` must be zeroed elsewhere: the TP ranks' slices sum to the tensor). `kind` as cudaMemcpy2D's.
  void tp_slice(const GpuParam& p, const float* full, float* local, cudaMemcpyKind kind) const;
  void tp_place(const GpuParam& p, const float* local, float* full, cudaMemcpyKind kind) const;
  comm::Communicator* dp = nullptr;  // null or size 1: one GPU
  int dp_size = 1, dp_rank = 0;
  int64_t region_a = 0, shard_a = 0;  // shard_a = x_shard + (region_a - region_x) / dp_size
  std::vector<Bucket> buckets;
  int embed_bucket = 0, head_bucket = 0, mtp_bucket = 0;
  std::vector<int> layer_bucket;
  // What the transient bucket buffers (grad_buckets.h, weight_gather.h) are sized by, in elements: the largest
  // layer bucket (a few of those are in flight) and the root buckets together (embedding, head, MTP module: held
  // for the whole step). From the config's n_mtp, not mtp_block: the footprint asks before the blocks exist.
  struct BucketExtents {
    int64_t largest_layer = 0, roots = 0;
  };
  BucketExtents bucket_extents() const {
    BucketExtents e;
    for (size_t bi = 0; bi < buckets.size(); ++bi) {
      const int64_t n = buckets[bi].end - buckets[bi].begin;
      const int b = int(bi);
      if (b == embed_bucket || b == head_bucket || (cfg.n_mtp > 0 && b == mtp_bucket))
        e.roots += n;
      else
        e.largest_layer = std::max(e.largest_layer, n);
    }
    return e;
  }
  std::vector<comm::WorkPtr> grad_work;  // pending in-place reduce-scatters / the region-R and region-X reductions
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> stalls;  // compute-stream waits on communication
  double exposed_ms = 0;
  // The loss normalisers: labelled targets of the whole DP batch or step (main head; MTP head: its own targets).
  int64_t global_targets = 0, global_mtp_targets = -1;
  int64_t step_micro_batches = 0;  // begin_step's (0: not given): the balance loss's 1 / M in stage steps
  // The main or MTP head's normaliser of a forward with n_own labelled targets: the step's (begin_step), else the
  // DP batch's (all-reduced here: the head's forward calls it once the layers are queued).
  int64_t head_normaliser(bool mtp, int64_t n_own);
  float* master_at(const GpuParam& p) const;
  // grads_zero: the gradient arena is known to be all zero (allocation or a zero_grads() memset; a backward or
  // set_grad clears the flag), so zero_grads() can skip its memset.
  bool grads_zero = true;
  void require_gradients(const char* what) const;  // error unless the model was built with gradients
  int64_t shard_elems() const { return shard_a + (total - region_a); }  // master's length (== total on one GPU)
  // One piece of a tensor that this rank's shard holds: tensor elements [t, t + n) at shard offset s (arena offset
  // p.offset + t). One GPU, region R or a local expert without replicas: the whole tensor; a replicated expert:
  // its part of the replica's region-X slice; a bucket's tensor: its part of the
  // rank's slice (none, or one piece). gpu_shard_state_cuda.cpp.
  struct ShardPiece {
    int64_t t = 0, s = 0, n = 0;
  };
  std::vector<ShardPiece> own_pieces(const GpuParam& p) const;
  // p as this rank holds it (its TP slice), fp32 on the device: its own pieces into `base` (the master or a shard
  // of its layout), and with compute_copy the bf16 compute copy of the whole; queued on the default stream.
  void place_local(const GpuParam& p, const float* local, float* base, bool compute_copy);
  void pad_to(int64_t multiple);
  void scatter_master(const float* full);  // full fp32 arena -> master shard + bf16 compute copy
  void reduce_bucket(int b);               // bucket b's gradients complete in this backward (grad_buckets.h)
  void wait_gather(int b);                 // the compute stream waits for bucket b's all-gather
  void stream_wait(comm::Work& w);         // the compute stream waits for w, stall time recorded
  void wait_grad_work();                   // the compute stream waits for every pending gradient reduction
  Ctx ctx();
  void section(const char* name, bool begin);
  // The block program over the CUDA backend (cuda_backend.h), built once the parameters are bound. Program slot
  // k < stage_slots is pipeline slot k; slot stage_slots is the whole-model forward()/backward()'s.
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<dsv4::BlockProgram> program;
  int64_t program_slot = 0;  // of the call in progress (SlotScope sets a pipeline slot's)
  // The largest one block's dropped activations (keep + redo) seen when recomputation released them: the scratch
  // a full / selective recomputation needs on top of what stays (GpuModel::activation_bytes).
  int64_t act_block_peak = 0;
  // The activation arena (activation_arena.h): null for an inference-only model or with
  // GpuModelOptions::activation_arena off (every pool's requests are device buffers of their own).
  std::unique_ptr<ActivationArena> arena;
  bool mtp() const { return mtp_block != nullptr; }
};

}  // namespace trex::dsv4gpu
