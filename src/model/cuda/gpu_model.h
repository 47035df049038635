// The DeepSeek-V4 model on one GPU: bf16 weights and activations with fp32 accumulation, fp32 master weights and
// gradients, everything resident on the device (the optimiser and its state live in the training layer,
// train/cuda/gpu_optimizer.h; an inference-only model, GpuModelOptions::gradients false, has no gradient arena). The same blocks as the CPU model
// (src/model/dsv4/model.h): embedding into n_hc streams; per layer mHC site -> attn_norm -> attention (sliding,
// CSA with the lightning indexer, HCA) -> expand, mHC site -> ffn_norm -> MoE (score or hash routing, shared
// expert) -> expand; hc_head -> norm -> LM head fused with the masked next-token CE (logits never materialised).
// Parameters carry the CPU model's official names, so they load from its ParamTable and gradients compare by name.
//
// The MTP module (num_nextn_predict_layers 1, design §2.10) trains with the model (weight mtp_weight), on the last
// pipeline stage (with a tied copy of embed.weight there) and with its experts placed over ep like the main
// layers'. The sequence-wise balance loss runs in every layout (each stage its own layers' terms). Not covered
// (yet): the indexer KL training signal (the indexer's weights get no gradient, as on the CPU by default).
// Clipping: grad_norm() / scale_grads().
// The data-parallel gradient reduce-scatter (ZeRO-1 buckets) and the expert exchange run over comm::Communicator.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/cuda/activation_plan.h"
#include "model/dsv4/config.h"
#include "model/dsv4/recompute.h"
#include "model/dsv4/seq_layout.h"
#include "model/dsv4/weights.h"

namespace trex::dsv4 {
class CheckpointReader;
}

namespace trex::dsv4gpu {

struct GpuModelOptions {
  int64_t lm_chunk = 8192;  // vocabulary columns per LM-head GEMM of the fused CE (loss-only forward, recompute)
  // A training forward's LM-head pass (HeadMode::LossAndGrad) in row blocks: lm_rows rows' full-vocabulary fp32
  // logits at once, and the bf16 dlogits of lm_grad_rows rows kept for one head.weight gradient GEMM (K =
  // lm_grad_rows: its fp32 [vocab, d] output is re-read and re-written N / lm_grad_rows times). Scratch about
  // (4 lm_rows + 2 lm_grad_rows) * vocab bytes: 1.6 GB at vocabulary 129280.
  int64_t lm_rows = 1024, lm_grad_rows = 4096;
  bool timing = false;      // CUDA-event sections (forward/backward per sub-layer kind, head, optimizer)
  // Data-parallel group (a device-memory communicator: NCCL on this rank's device, e.g. the mesh's dp_group, or
  // the thread group of comm/thread_group.h): gradients reduce-scattered over it, the optimiser sharded (ZeRO-1).
  // Null or size 1: one GPU. Not owned.
  comm::Communicator* dp = nullptr;
  // Expert-parallel group (the mesh's ep_group; a device-memory communicator) for the MoE's token dispatch /
  // combine. With P > 1 ranks this rank allocates only its own E / P routed experts (rank r: [r E/P, (r+1) E/P))
  // with their gradients and optimiser state; by-name access to another rank's expert is an error naming its
  // owner. EP folds into DP: with a dp group too, P divides its size. Null: all experts local.
  comm::Communicator* ep = nullptr;
  // Tensor-parallel group (the mesh's tp_group; a device-memory communicator), Megatron-style inside the stage: the
  // attention's query heads and output groups (wq_b / wo_a / attn_sink by head group, wo_b by its input columns)
  // and the shared expert's hidden width (w1 | w3 rows, w2 columns) are split over its T ranks
  // (dsv4::tp_split_axis); the forward all-reduces the attention's and the shared expert's partial outputs, the
  // backward the partial input gradients of what is replicated (the attention's compressed query, its shared K=V
  // and compressed entries; the shared expert's input). Everything else (wq_a, q_norm, K=V, compressor, indexer,
  // router, routed experts unless expert_tp, mHC, norms, embedding, head) is replicated and computed redundantly on
  // identical inputs and gradients, so its gradients come out bit-identical on the TP ranks without any gradient
  // all-reduce. dp / ep are then the groups of this TP rank. Null or size 1: no TP. Not owned.
  comm::Communicator* tp = nullptr;
  // Expert tensor parallelism (parallel.etp = tp): the routed experts are split over the TP group like the shared
  // expert (each expert's w1 | w3 rows and w2 columns, dsv4::TpExperts::Split), so a TP rank holds and computes
  // 1 / T of each of its experts. Each TP rank still dispatches its copy of the tokens to the EP peers of its own
  // TP rank; the experts' partial outputs join the shared expert's in one fp32 all-reduce over TP after the
  // combine, their partial input gradients the shared expert's in the backward, and the gate weights' gradients
  // (dout . expert output, partial per rank) are summed over TP before the router's backward. Off: the routed
  // experts whole on every TP rank (expert TP 1). Needs tp.
  bool expert_tp = false;
  // Routed experts as one grouped GEMM over all (local) experts, sized from device memory (no host read of the
  // per-expert counts; on sm_90 wgmma + TMA at cuBLASLt's rate or better). Off: one cuBLASLt GEMM per expert after
  // one host read of the counts per layer (the comparison path: `trex bench train --moe-gemm per-expert`).
  bool moe_grouped_gemm = true;
  // Bitwise reproducible gradients: the sparse attention backward sums each key row's dK + dV contributions in a
  // fixed order (kernels/cuda/attention_sparse.h, SparseAttnBwdOrder::Deterministic) instead of with fp32 atomics.
  // Every other kernel of the step is deterministic already. Costs attention backward time (the partials' memory
  // traffic; docs/performance.md), so it is off unless a run asks for it (config `deterministic: true`).
  bool deterministic = false;
  // The sequence-wise balance loss (design §5, dsv4::ModelOptions::balance_alpha): added to forward()'s loss, its
  // gradient to the router scores in backward(). 0 = off. forward() on one DP rank, or stage steps whose
  // begin_step gives the step's micro-batch count (data parallel: each rank's sequences are its own). The term is
  // local to a rank: it reads the router's scores over all E experts, which every rank computes for its own tokens
  // before the expert exchange (so expert parallelism changes nothing), and a pipeline stage computes its own
  // layers' terms (forward_stage returns them on every stage).
  double balance_alpha = 0.0;
  bool balance_hash_layers = false;  // also on hash-routed layers (as dsv4::ModelOptions)
  // The MTP loss's weight (design §2.10, dsv4::ModelOptions::mtp_weight) when the config has the MTP module
  // (GpuModel::set_mtp_weight changes it between steps: the schedule's weight).
  double mtp_weight = 0.3;
  // Pipeline stage: this model holds layers [layer_begin, layer_end) (layer_end -1: up to n_layers), the
  // embedding when layer_begin == 0 and hc_head + final norm + LM head when layer_end == n_layers; only those
  // parameters are allocated (same names and init values as the full model). Combines with dp and ep (the stage's
  // DP / EP groups: its dense buckets ZeRO-1 sharded over dp, its layers' experts over ep). With the MTP module the
  // last stage runs it, holding its own copy of embed.weight (the MTP input embeds token t+1).
  int64_t layer_begin = 0, layer_end = -1;
  // Pipeline stages with the MTP module: the group of the first and the last stage's ranks with the same DP / EP /
  // TP coordinates (a device-memory communicator of 2 ranks, rank 0 the first stage; as Megatron's embedding
  // group), over which sum_tied_embedding_grads adds the two copies' embed.weight gradients. Null elsewhere. Not
  // owned.
  comm::Communicator* embed_group = nullptr;
  // Micro-batches whose saved activations can be held at once (forward_stage done, backward_stage pending);
  // micro-batch m uses slot m % stage_slots. 1F1B on pipeline rank r of P needs P - r.
  int stage_slots = 1;
  // Routing forced to a perfectly balanced assignment (rank emulation, `trex bench train --emulate-rank`): token
  // i's k-th expert is (i K + k) mod E, so every expert gets N K / E rows and every expert-parallel peer the
  // balanced share; the weights still come from the router's scores. Off: the router's own top-k.
  bool balanced_routing = false;
  // Activation recomputation (model/dsv4/recompute.h), whole model and stage steps alike. none: every block's
  // activations stay until its backward. selective: the cheap, large ones (normed sub-layer inputs, the mid
  // stream, the attention's normed / rotated queries, key and output) are rebuilt before the block's backward.
  // full: a block keeps its input stream and its router / indexer selections, and its forward re-runs right
  // before its backward (one block's activations live at a time). The gradients are none's: the same kernels on
  // the same inputs and selections.
  dsv4::Recompute recompute = dsv4::Recompute::None;
  // Under full: only main layers [0, recompute_full_layers) replay in full, the rest recompute selectively
  // (dsv4::recompute_of_layer); -1: every layer.
  int64_t recompute_full_layers = -1;
  // Dense gradient partitioning under data parallelism (a dp group of size > 1; ignored on one GPU).
  // 1 (ZeRO-1): every rank keeps the fp32 gradients of the whole arena; each bucket is reduce-scattered in place
  // as backward completes it, and the rank reads its own slice. 2 (ZeRO-2): a rank keeps persistent fp32
  // gradients only of its own bucket slices (plus region X, its experts, and region R, the replicated fp32-read
  // tensors); backward writes each bucket into a transient buffer (at most kGradBucketsInFlight layer buffers
  // beside the embedding's and head's, model/cuda/grad_buckets.h), reduce-scattered when the bucket completes
  // and added into the slice (so micro-batches accumulate in the slice). 3 (ZeRO-3 / FSDP): ZeRO-2's gradients,
  // and the dense bf16 weights persist only as this rank's bucket slices: each bucket is all-gathered into a
  // transient buffer ahead of use, the next layer's under the current one's compute (model/cuda/weight_gather.h;
  // at most two layer buffers live beside the embedding's, head's and MTP module's). Under tp each TP rank's DP
  // group gathers that rank's own arena (its slices of the split tensors).
  int zero = 1;
  // The buckets' reduce-scatter in bf16 (the fp32 gradients rounded once, summed by the communicator, added
  // back into fp32): half the bytes on the wire. Region R's all-reduce and the experts' stay fp32.
  bool grad_reduce_bf16 = false;
  // False: inference only (the serving engine): no gradient arena is allocated, and anything that would write or
  // read gradients (backward, a HeadMode::LossAndGrad forward, stage steps, zero_grads, grad) is an error.
  bool gradients = true;
  // A training model's activations in one planned arena (model/cuda/activation_arena.h): laid out at the start of
  // the second step from the first step's requests, so later steps allocate nothing. Off: every activation is a
  // stream-ordered device buffer of its own (the first step's behaviour, every step); the outputs are the same.
  bool activation_arena = true;
};

// Selections to use instead of the GPU's own (parity runs: bf16 rounding can flip near-ties of the indexer and
// the router). Indexed by main layer; an empty vector = let the GPU choose.
struct Injection {
  std::vector<std::vector<int64_t>> csa_sel;    // [N * index_topk] global entry indices (CPU AttentionSaved::sel)
  std::vector<std::vector<int32_t>> router_sel;  // [N * topk] expert ids
  std::vector<int32_t> mtp_router_sel;            // the MTP block's router, [N * topk] (empty: the GPU's own)
};

// What forward() computes at the LM head. Loss: the loss only (evaluation, inference, parity forward checks);
// a backward() after it recomputes the logits. LossAndGrad: the forward of a training step: the CE gradient is
// formed while the logits are at hand (3 vocabulary-sized GEMMs instead of 4): head.weight's gradient is
// accumulated by the forward itself, so zero_grads() must come BEFORE it (zero_grads() between it and its
// backward() is an error). Stage steps (begin_step / forward_stage) always run LossAndGrad.
enum class HeadMode { Loss, LossAndGrad };

class GpuModel {
 public:
  explicit GpuModel(const dsv4::ModelConfig& cfg, const GpuModelOptions& opts = {});

  // What a GpuModel of (cfg, opts) would allocate for its parameters, before allocating anything (the same checks
  // and arena declaration as the constructor; no sub-communicator is split off): the bf16 compute copy and the
  // fp32 gradients span the arena, the fp32 master (and each AdamW moment of train/cuda/gpu_optimizer.h) the shard.
  struct Footprint {
    int64_t arena_elems = 0, shard_elems = 0, region_x_elems = 0, n_params = 0;
    // The persistent bf16 compute copy: the arena, or under ZeRO-3 this rank's slices (region X and R whole).
    int64_t weight_elems = 0;
    // ZeRO-3: the most the gathered bucket buffers hold at once (model/cuda/weight_gather.h), from the device pool.
    int64_t weight_buffer_bytes = 0;
    int64_t grad_elems = 0;  // the persistent fp32 gradients: the arena, or under ZeRO-2 its shard (Impl::grad_elems)
    // The most the bucket reductions hold at once beside them (ZeRO-2's bucket buffers, the bf16 reduction's
    // copies; model/cuda/grad_buckets.h), from the device pool during backward.
    int64_t grad_buffer_bytes = 0;
    bool gradients = true;
    int64_t compute_bytes() const { return 2 * weight_elems; }  // the persistent bf16 weights
    int64_t grad_bytes() const { return gradients ? 4 * grad_elems : 0; }
    int64_t master_bytes() const { return 4 * shard_elems; }   // the fp32 master (ZeRO-1 shard)
    int64_t adamw_bytes() const { return 8 * shard_elems; }    // GpuOptimizer's two fp32 moments
  };
  static Footprint footprint(const dsv4::ModelConfig& cfg, const GpuModelOptions& opts = {});
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  // Parameters: deterministic by seed (weights uniform with std 1/sqrt(fan_in) style scales, norms 1), or copied
  // from the CPU model's table (same names and shapes; router biases and tid2eid too).
  void init_random(uint64_t seed);
  void load_from(const dsv4::ParamTable<float>& cpu);
  // Streams this model's own parameters (its stage's layers, its experts, its TP rows / columns; each tensor placed
  // into its data-parallel master shard and the bf16 compute copy) from a checkpoint (sharded, memory-mapped
  // safetensors), one tensor at a time: the stored bytes (FP8 blocks, FP4 experts, BF16, F32) of the rank's part go
  // through a pinned staging buffer of `staging_bytes` to the device and are de-quantised there, bit-identical to
  // dsv4::CheckpointReader::load (model/cuda/checkpoint_stager.h). Host memory: the staging buffer (or the largest
  // router bias / hash table, decoded on the host, when larger); the device holds one fp32 tensor slice besides
  // the model. Tensors of other ranks' partitions are never read. A tensor that is missing or has another shape
  // is an error naming it, before anything is read.
  struct LoadStats {
    int64_t tensors = 0;
    int64_t bytes = 0;                  // fp32 bytes placed on this device (this rank's tensors)
    int64_t stored_bytes = 0;           // bytes read from the checkpoint files (weights and scales)
    int64_t largest_tensor_bytes = 0;   // the largest fp32 tensor slice of this rank (the device scratch)
    int64_t host_peak_bytes = 0;        // the loader's host high-water mark (the pinned staging buffer)
    double seconds = 0;
  };
  static constexpr size_t kDefaultStagingBytes = size_t(256) << 20;
  LoadStats load_checkpoint(const dsv4::CheckpointReader& ckpt, size_t staging_bytes = kDefaultStagingBytes);

  // ids, labels [B, S] on the host. Returns the loss (mean CE over labelled targets; with a DP group, over the
  // targets of every rank's batch: the same number a single GPU gives on the concatenated batch).
  double forward(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                 const Injection* inject = nullptr, HeadMode head = HeadMode::Loss);
  void zero_grads();  // free when nothing wrote the gradients since the last zero_grads()
  void backward();  // accumulates fp32 gradients of the last forward
  // Overwrites this rank's gradient of one parameter (tests: an optimiser step from known gradients).
  void set_grad(const std::string& name, const std::vector<float>& g);

  // What a training run needs besides the step (`trex train` with device cuda, train/cuda/gpu_mesh_engine.h); one GPU.
  // The global L2 norm of the gradients (fp64 on the device, deterministic); scale_grads multiplies them (clipping).
  double grad_norm();
  void scale_grads(float s);
  // Overwrites one parameter's fp32 master value and its bf16 compute copy (checkpoint resume).
  void set_value(const std::string& name, const std::vector<float>& v);
  // Router biases (buffers the auxiliary-loss-free update writes, not the optimiser), by official name.
  std::vector<std::string> router_bias_names() const;
  std::vector<float> router_bias(const std::string& name) const;
  void set_router_bias(const std::string& name, const std::vector<float>& v);

  // Pipeline stage step (any layer range, the full model too: one GPU accumulating micro-batches). begin_step
  // sets the loss normaliser: the labelled targets of the whole step (every micro-batch), so the accumulated
  // gradients are those of the mean loss over the step. forward_stage runs the stage's layers on micro-batch
  // `micro` (slot micro % stage_slots): ids / labels / layout of that micro-batch on the host; x_in the device
  // bf16 [N, hc, d] stream entering layer_begin (null on the first stage, which embeds ids). Returns this
  // micro-batch's share of the step loss: on the last stage its CE (sum / step targets, MTP's too) plus its
  // layers' balance terms, elsewhere the stage's layers' balance terms (0 without the balance loss). stage_output is
  // the bf16 [N, hc, d] stream leaving layer_end - 1 (valid until that slot's next forward). backward_stage
  // accumulates gradients; dx_out the device fp32 [N, hc, d] gradient of that stream (null on the last stage,
  // which starts from the loss); stage_input_grad then holds the fp32 gradient of x_in (not on the first stage;
  // valid until that slot's next backward).
  // step_mtp_targets: the MTP head's too, with MTP. With a DP group the targets are those of every DP rank's
  // micro-batches (the caller sums them). step_micro_batches: the micro-batches the step's loss is the mean of
  // (each micro-batch's balance loss weighs 1 / step_micro_batches, as its CE share does); 0 = not given, then the
  // balance loss is refused in stage steps. reduce_micro (DP only): -1 reduce-scatters the gradients in every
  // backward_stage (one micro-batch per step, or add_reduced_grads_to between them); m >= 0 only in micro-batch
  // m's backward, which must be the step's last (1F1B: M - 1): the earlier ones accumulate in the arena.
  void begin_step(int64_t step_targets, int64_t step_mtp_targets = -1, int64_t step_micro_batches = 0,
                  int64_t reduce_micro = -1);
  double forward_stage(int64_t micro, const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                       const void* x_in);
  const void* stage_output(int64_t micro) const;
  void backward_stage(int64_t micro, const float* dx_out);
  const float* stage_input_grad(int64_t micro) const;
  int64_t layer_begin() const;
  int64_t layer_end() const;
  int64_t stream_elems(const dsv4::SeqLayout& layout) const;  // B * S * hc * d: a boundary tensor's elements

  // Host copies, by official name. With a DP group: value() of a bf16-read parameter is its bf16 compute copy
  // (the fp32 master is sharded; under ZeRO-3 no rank holds it whole: the bf16 of the master gathered over the DP
  // group, a collective every DP rank must enter); grad() is this rank's unreduced gradient except on this rank's own slices.
  std::vector<float> value(const std::string& name) const;
  std::vector<float> grad(const std::string& name) const;
  std::vector<std::string> param_names() const;
  int64_t n_params() const;
  std::vector<float> final_normed() const;              // [N, d] of the last forward
  std::vector<int64_t> csa_selection(int64_t l) const;  // [N * index_topk] global entries used by layer l
  std::vector<int32_t> router_selection(int64_t l) const;  // l == n_layers: the MTP block's
  // The MTP loss weight of the next forwards (the schedule's, StepControls::mtp_weight).
  void set_mtp_weight(double w);

  // Activation memory. activation_plan: what a training forward of this layout keeps (kept) and the largest one
  // block's activations recomputation rebuilds at a time (block_scratch), by the table of activation_plan.h (no
  // allocation). activation_bytes: the same as held now, read from the pools: kept after a forward (the streams,
  // head activations and every block's saved activations), block_peak the largest block's dropped activations
  // seen so far (0 with recompute none).
  struct ActivationBytes {
    int64_t kept = 0, block_peak = 0;
  };
  ActivationBytes activation_bytes() const;
  ActivationPlan activation_plan(const dsv4::SeqLayout& layout) const;
  // The activation arena (activation_arena.h, GpuModelOptions::activation_arena): its one allocation's bytes (0
  // before the plan, which the second step's start makes), how many times it has been laid out and whether the
  // layout is packed by lifetime; the sum of its regions' own peaks (what one region after another would take);
  // the most activation bytes live at once in the last complete step (measured: no layout holds that step in
  // less) and the same computed from the trace the layout was planned from.
  struct ArenaInfo {
    int64_t bytes = 0, plans = 0;
    bool packed = false;
    int64_t sum_of_peaks = 0, peak_live = 0, planned_peak_live = 0;
  };
  ArenaInfo activation_arena() const;

  // Data-parallel shard state by tensor (gpu_shard_state_cuda.cpp): what a ZeRO-1 run's trainer needs for clipping,
  // gradient accumulation and checkpoints of the official names. A `shard` is an fp32 device array in the master's
  // shard layout (this rank's bucket slices, then the replicated region R: shard_elems() floats), e.g. an
  // optimiser moment (GpuOptimizer::moment); null means the fp32 master itself. On one GPU the shard layout is the
  // arena's and nothing is collective.
  int64_t shard_elems() const;
  int dp_size() const;
  int tp_size() const;
  // A parameter's TP split (dsv4::tp_split_axis; -1: replicated, or no TP) and its official, unsplit shape
  // (value() / grad() / set_grad() / set_value() work on this rank's slice).
  int tp_axis(const std::string& name) const;
  Shape full_shape(const std::string& name) const;
  // The whole fp32 tensor on every rank (collective over the DP group: every rank calls it for the same names in
  // the same order). Region R tensors and the local experts (held whole by their owner) are read locally. Under
  // tensor parallelism a TP-split tensor is gathered over the TP group too (collective over it): the full tensor
  // of the official shape; a replicated one is this rank's copy.
  std::vector<float> gather_shard(const std::string& name, const float* shard = nullptr) const;
  // Writes this rank's part of the whole tensor `full` into `shard` (not collective); for the master (shard null)
  // also the bf16 compute copy of the whole tensor, which every rank holds. Under tensor parallelism `full` is the
  // official (unsplit) tensor and this TP rank keeps its slice.
  void set_shard(const std::string& name, const std::vector<float>& full, float* shard = nullptr);
  void set_shard(const std::string& name, const float* full, int64_t n, float* shard = nullptr);
  // The global L2 norm of the reduced gradients, collective over the DP group: each rank's own bucket slices'
  // squared norm summed over the ranks, region R (all-reduced, the same on every rank) counted once. One GPU:
  // grad_norm(). Waits for the pending gradient reductions.
  double dp_grad_norm();
  // Gradient accumulation under data parallelism: backward reduce-scatters every bucket in place, so the next
  // micro-batch cannot add into the arena. add_reduced_grads_to(acc) adds this rank's reduced gradients (own
  // slices, region R) into acc (shard_elems() fp32 on the device) after a backward; the caller then zeroes the
  // gradients before the next forward; add_held_grads(acc) adds acc back after the step's last backward.
  void add_reduced_grads_to(float* acc);
  void add_held_grads(const float* acc);
  // What this rank allocated for its parameters, and the tensor elements behind it: the planner's per-rank
  // accounting (plan/rank_memory.h) predicts the element counts from the parameter table. Bytes include the
  // arena's alignment padding; elements do not.
  struct ParamMemory {
    int64_t held_elems = 0;    // parameter elements held: the bf16 compute copy and the fp32 gradients hold these
    int64_t master_elems = 0;  // parameter elements of the fp32 master this rank owns (ZeRO-1); each moment alike
    int64_t grad_elems = 0;    // parameter elements with persistent fp32 gradients (held_elems; ZeRO-2: the shard)
    int64_t weight_elems = 0;  // parameter elements of the persistent bf16 copy (held_elems; ZeRO-3: the shard)
    int64_t weight_bytes = 0;  // the bf16 compute copy (ZeRO-3: this rank's slices; the gathered buffers are transient)
    int64_t grad_bytes = 0;    // the fp32 gradients (0 for an inference-only model)
    int64_t master_bytes = 0;  // the fp32 master (each optimiser moment is as large: GpuOptimizer::state_bytes)
  };
  ParamMemory param_memory() const;
  // The compute stream waits for the pending gradient reductions (a step whose gradients are dropped, e.g. a
  // skipped loss spike, must not zero them while a reduce-scatter still writes them). No-op on one GPU.
  void wait_grad_reductions();
  // Pipeline stages with the MTP module (GpuModelOptions::embed_group): the first stage's embed.weight gradient
  // and the last stage's (its copy, from the MTP input) summed over the group, on this rank's reduced slice (its
  // ZeRO slice under DP: the two stages' ranks of one DP index own the same slice), so both copies take the same
  // optimiser update and stay identical. Call it on both stages after the step's last backward, before the norm
  // and the optimiser step (collective over the group). No-op without the group.
  void sum_tied_embedding_grads();
  // The expert ids chosen by layer l for micro-batch `micro` of a stage step (begin_step / forward_stage), read
  // from that micro-batch's slot; valid until the slot's next forward.
  std::vector<int32_t> stage_router_selection(int64_t micro, int64_t l);

  // Data parallel: milliseconds the compute stream stalled on gradient / parameter communication since the last
  // reset_sections (synchronises). 0 on one GPU.
  double exposed_comm_ms();
  // ZeRO-3 (weight_gather.h): since construction, the weight all-gathers' own milliseconds, the part of them the
  // compute stream waited for (exposed: the rest ran under compute; the compute stream's waits are also in
  // exposed_comm_ms), and how many buckets were gathered. Zeros without ZeRO-3. Synchronises.
  struct GatherTimes {
    double total_ms = 0, exposed_ms = 0;
    int64_t gathers = 0;
  };
  GatherTimes weight_gather_times();

  // Milliseconds per section since the last reset (timing on only; synchronises).
  std::map<std::string, double> section_ms();
  void reset_sections();

  struct Impl;
  // The parameter arenas and blocks (gpu_impl.h): the optimiser (train/cuda) updates them, the inference engine
  // (src/infer) runs its cached step on them.
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
  double forward_impl(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                      const Injection* inject, const void* x_in, HeadMode head);
  void backward_impl(const float* dx_out);
};

}  // namespace trex::dsv4gpu
