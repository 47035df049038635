// Internals of the GPU model shared by its translation units (params, attention, MoE, blocks/head). Not a public
// header: the GPU model's own files, its optimiser (src/train/cuda) and the inference engine's cached step
// (src/infer/cuda_engine_cuda.cpp) include it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mhc.h"
#include "model/cuda/arena_region.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/compressor.h"
#include "model/dsv4/config.h"
#include "model/dsv4/recompute.h"
#include "model/dsv4/rope.h"
#include "model/cuda/gpu_model.h"

namespace trex::dsv4gpu {

// Communicators whose operations take device pointers of this rank's GPU: NCCL, and the thread group
// (comm/thread_group.h: several ranks as threads sharing one GPU, as the multi-rank tests run).
// "emulated": one rank of a larger group emulated by local copies (comm/emulated_group.h, `trex bench train --emulate-rank`).
inline bool device_memory_comm(const comm::Communicator& c) {
  return c.backend() == "nccl" || c.backend() == "threads" || c.backend() == "emulated";
}


using bf16 = __nv_bfloat16;

// Device memory of the GPU model: the one device-buffer type (stream-ordered, kernels/cuda/device_buffer.h).
using DevMem = cuda::DeviceBuffer;

// A list of allocations with one lifetime (a block's saved activations, a backward's temporaries). bytes(): what
// it holds as requested (the activation plan, activation_plan.h, counts the same requests). Bound to a region of
// the model's activation arena (activation_arena.h) it places its requests there; a request the region cannot hold
// (the first step's, before the arena is planned, or a larger layout's) is a device buffer of its own, as an
// unbound pool's always are. Either way the memory is stream-ordered on the default stream: a cleared request's
// bytes go to the next request in stream order, as the device pool would hand them on.
class Pool {
 public:
  Pool() = default;
  explicit Pool(std::shared_ptr<ArenaRegion> region) : src_(std::move(region)) {}
  ~Pool() { clear(); }
  Pool(Pool&& o) noexcept
      : src_(std::move(o.src_)), entries_(std::move(o.entries_)), bytes_(std::exchange(o.bytes_, 0)) {
    o.entries_.clear();
  }
  Pool& operator=(Pool&& o) noexcept {
    if (this != &o) {
      clear();
      src_ = std::move(o.src_), entries_ = std::move(o.entries_), bytes_ = std::exchange(o.bytes_, 0);
      o.entries_.clear();
    }
    return *this;
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  template <typename T>
  T* take(int64_t n) {
    const size_t bytes = size_t(std::max<int64_t>(n, 1)) * sizeof(T);
    bytes_ += int64_t(bytes);
    Entry e;
    if (src_) {
      const ArenaRegion::Placed p = src_->push(int64_t(bytes));
      e.region = src_, e.id = p.id, e.ptr = p.ptr;
    }
    if (!e.ptr) e.own = DevMem(bytes), e.ptr = e.own.as<void>();
    entries_.push_back(std::move(e));
    return static_cast<T*>(entries_.back().ptr);
  }
  template <typename T>
  T* zeros(int64_t n) {
    T* p = take<T>(n);
    TREX_CUDA(cudaMemsetAsync(p, 0, size_t(std::max<int64_t>(n, 1)) * sizeof(T), nullptr));
    return p;
  }
  void clear() {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
      if (it->region) it->region->release(it->id);
    entries_.clear(), bytes_ = 0;
  }
  int64_t bytes() const { return bytes_; }
  // The region later requests go to (null: unbound). Requests already placed keep theirs (and its memory alive).
  const std::shared_ptr<ArenaRegion>& region() const { return src_; }
  void bind(std::shared_ptr<ArenaRegion> region) { src_ = std::move(region); }

 private:
  struct Entry {
    std::shared_ptr<ArenaRegion> region;  // null: not placed in a region
    int64_t id = -1;
    void* ptr = nullptr;
    DevMem own;  // the request's own buffer when the region could not hold it
  };
  std::shared_ptr<ArenaRegion> src_;
  std::vector<Entry> entries_;
  int64_t bytes_ = 0;
};

// Row-major linear layers on bf16 operands (cuBLASLt): y[M, out] = x[M, in] W[out, in]^T and its two backward
// products; fp32 outputs accumulate with beta = 1.
struct Linear {
  cuda::Gemm* gemm;
  void fwd(void* y, const bf16* x, const bf16* W, int64_t M, int64_t in, int64_t out, bool f32_out = false,
           float beta = 0.f) const {
    if (M == 0) return;
    cuda::GemmShape s{M, out, in, false, true, cuda::GemmType::BF16,
                      f32_out ? cuda::GemmType::F32 : cuda::GemmType::BF16, 1};
    gemm->run(s, x, W, y, 1.f, beta);
  }
  // dx[M, in] = dy[M, out] W[out, in]
  void dx(void* dx, const bf16* dy, const bf16* W, int64_t M, int64_t in, int64_t out, bool f32_out = false,
          float beta = 0.f) const {
    if (M == 0) return;
    cuda::GemmShape s{M, in, out, false, false, cuda::GemmType::BF16,
                      f32_out ? cuda::GemmType::F32 : cuda::GemmType::BF16, 1};
    gemm->run(s, dy, W, dx, 1.f, beta);
  }
  // dW[out, in] += dy[M, out]^T x[M, in]  (fp32)
  void dw(float* dW, const bf16* dy, const bf16* x, int64_t M, int64_t in, int64_t out) const {
    if (M == 0) return;
    cuda::GemmShape s{out, in, M, true, false, cuda::GemmType::BF16, cuda::GemmType::F32, 1};
    gemm->run(s, dy, x, dW, 1.f, 1.f);
  }
};

struct GpuParam {
  std::string name;
  Shape shape;
  int64_t offset = 0, numel = 0;
  int64_t ordinal = 0;  // position in the full model's declaration order (the random init stream; stages skip some)
  // Tensor parallelism (GpuModelOptions::tp): the axis the TP ranks split (dsv4::tp_split_axis; -1 = held whole)
  // and the official shape; `shape` is then this TP rank's slice.
  int tp_axis = -1;
  Shape full;
};

// Device view of one batch layout (positions, windows, compress plans per ratio).
struct DevPlan {
  dsv4::CompressPlan host;
  DevMem entry_first, entry_doc, entry_pos, vis_begin, vis_end;  // int32, int32, int32, int64, int64
  int64_t max_visible = 0;
};
struct DevLayout {
  int64_t B = 0, S = 0, N = 0;
  DevMem pos, win_begin, ids, token_iota;  // int32, int64, int32, int32
  DevMem embed_order, embed_seg;           // int32: the embedding backward's tokens grouped by id (embed_bwd_plan)
  int64_t embed_groups = 0;
  std::map<int64_t, DevPlan> plans;  // by compress ratio
};

struct RopeDev {
  int64_t n_pairs = 0, n_pos = 0;
  DevMem cos, sin;
};

// Attention parameters of one layer: bf16 compute copies and the fp32 master / gradient pointers.
struct AttnW {
  const bf16 *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *wo_a, *wo_b;
  const bf16 *cmp_wkv = nullptr, *cmp_wgate = nullptr, *cmp_norm = nullptr;
  const float *sink, *cmp_ape = nullptr;
  const bf16 *idx_wq_b = nullptr, *idx_wp = nullptr, *idx_wkv = nullptr, *idx_wgate = nullptr, *idx_norm = nullptr;
  const float* idx_ape = nullptr;
  float *g_wq_a, *g_q_norm, *g_wq_b, *g_wkv, *g_kv_norm, *g_wo_a, *g_wo_b, *g_sink;
  float *g_cmp_wkv = nullptr, *g_cmp_wgate = nullptr, *g_cmp_norm = nullptr, *g_cmp_ape = nullptr;
};

struct AttnActs {
  bf16 *qa, *cq, *q_pre, *q, *kvp, *kv, *o, *r;
  float *qa_rstd, *q_rstd, *kv_rstd, *lse;
  bf16 *ckv = nullptr, *cgate = nullptr, *pooled = nullptr, *cmp = nullptr;
  float* c_rstd = nullptr;
  int64_t* sel = nullptr;  // CSA [N, k_sel]
  bf16* og = nullptr;       // [G, N, H/G*c] the wo_a input (inverse-RoPE'd o, group-major); the backward reuses it
};

struct MoeW {
  const bf16 *gate, *w13, *w2, *sw13 = nullptr, *sw2 = nullptr;
  float *g_gate, *g_w13, *g_w2, *g_sw13 = nullptr, *g_sw2 = nullptr;
  const float* bias = nullptr;      // device [E]
  const int32_t* tid2eid = nullptr;  // device [V, K]
};

struct MoeEpState;  // the expert-parallel exchange of one forward (gpu_moe_cuda.cpp)
struct EpStaging;   // a block's pinned host staging and copy stream of that exchange (gpu_moe_cuda.cpp)

struct MoeActs {
  float *logits, *scores, *weight;
  float* dscores = nullptr;  // [N, E] d(balance loss)/d(scores) of the last forward (null: balance loss off)
  int32_t *sel, *order, *slot_pos, *offsets;
  std::vector<int32_t> h_offsets;
  bf16 *gu, *ye, *sgu = nullptr, *sy = nullptr;
  std::shared_ptr<int32_t> status_host;      // pinned: the router's range status of the last forward
  std::shared_ptr<CUevent_st> status_ready;  // recorded after the asynchronous copy into status_host
  std::shared_ptr<MoeEpState> ep;            // set when the last forward ran expert-parallel
  std::shared_ptr<EpStaging> ep_staging;     // allocated by the first expert-parallel forward, then kept
};

struct GpuBlock {
  int64_t layer = 0;
  std::string prefix;
  // This block's recomputation (dsv4::recompute_of_layer of GpuModelOptions::recompute / recompute_full_layers).
  dsv4::Recompute recompute = dsv4::Recompute::None;
  dsv4::AttentionDims dims;
  bool hash = false;
  AttnW aw;
  MoeW mw;
  const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale, *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
  float *g_hc_attn_fn, *g_hc_attn_base, *g_hc_attn_scale, *g_hc_ffn_fn, *g_hc_ffn_base, *g_hc_ffn_scale;
  const bf16 *attn_norm, *ffn_norm;
  float *g_attn_norm, *g_ffn_norm;
  // Saved activations of the last forward (pipeline stages park other micro-batches' in BlockSaved below): keep
  // until the block's backward (full recomputation: released after the forward, rebuilt by the replay); redo the
  // ones selective recomputation drops after the forward and rebuilds before the backward (in keep otherwise);
  // picks the router / indexer selections (kept until the block's next forward, replays re-use them).
  Pool keep, redo, picks;
  cuda::MhcActs sa{}, sf{};
  bf16 *col_a, *a, *y_a, *X_mid, *col_f, *u, *y_f;
  float *a_rstd, *u_rstd;
  AttnActs at{};
  MoeActs mo{};
};

// One micro-batch's saved activations of a block, parked while other micro-batches run through the block
// (pipeline stages keep several in flight). Mirrors GpuBlock's saved fields; swap_saved exchanges them, so the
// block functions keep reading GpuBlock as they do on one GPU. A field added to GpuBlock's saved state must be
// added here and to swap_saved too.
struct BlockSaved {
  Pool keep, redo, picks;
  cuda::MhcActs sa{}, sf{};
  bf16 *col_a = nullptr, *a = nullptr, *y_a = nullptr, *X_mid = nullptr, *col_f = nullptr, *u = nullptr,
       *y_f = nullptr;
  float *a_rstd = nullptr, *u_rstd = nullptr;
  AttnActs at{};
  MoeActs mo{};
};

inline void swap_saved(GpuBlock& b, BlockSaved& s) {
  std::swap(b.keep, s.keep), std::swap(b.redo, s.redo), std::swap(b.picks, s.picks);
  std::swap(b.sa, s.sa), std::swap(b.sf, s.sf);
  std::swap(b.col_a, s.col_a), std::swap(b.a, s.a), std::swap(b.y_a, s.y_a), std::swap(b.X_mid, s.X_mid);
  std::swap(b.col_f, s.col_f), std::swap(b.u, s.u), std::swap(b.y_f, s.y_f);
  std::swap(b.a_rstd, s.a_rstd), std::swap(b.u_rstd, s.u_rstd);
  std::swap(b.at, s.at), std::swap(b.mo, s.mo);
}

// Shared context the block functions need.
struct Ctx {
  const dsv4::ModelConfig* cfg;
  cuda::Gemm* gemm;
  Linear lin;
  const DevLayout* lay;
  const RopeDev* rope_main;
  const RopeDev* rope_compress;
  std::function<void(const char*, bool)> section;  // (name, begin) CUDA-event sections; may be empty
  comm::Communicator* ep = nullptr;  // expert-parallel group (GpuModelOptions::ep); null: all experts local
  // Tensor-parallel group (GpuModelOptions::tp) and its size; null / 1: no TP. The blocks' dims (AttentionDims
  // n_heads, o_groups) are already this rank's share; tp_size divides the shared expert's width here.
  comm::Communicator* tp = nullptr;
  int64_t tp_size = 1;
  // GpuModelOptions::expert_tp: tp_size divides the routed experts' width too (their outputs and input gradients
  // are partial per TP rank until the MoE's one all-reduce); expert_width is the width this rank computes.
  bool expert_tp = false;
  int64_t expert_width = 0;
  bool grouped_experts = false;      // GpuModelOptions::moe_grouped_gemm
  bool deterministic = false;        // GpuModelOptions::deterministic
  // GpuModelOptions::balanced_routing: the device table [N * topk] of forced expert ids (null: the router's own).
  const int32_t* balanced_sel = nullptr;
  // The activation arena's temporaries stack (activation_arena.h): an op's scratch, `Pool tmp(c.scratch)` (null:
  // the op's temporaries are device buffers of their own).
  std::shared_ptr<ArenaRegion> scratch;
};

// Timing sub-sections of one sub-layer: "<prefix><part>" nested inside the caller's section (e.g. "fwd.moe/" +
// "experts"), summed by name over the layers. next() closes the open part and opens the next; done() closes it.
// No-ops when the model times nothing.
class SectionParts {
 public:
  SectionParts(const Ctx& c, std::string prefix) : c_(c), prefix_(std::move(prefix)) {}
  ~SectionParts() { done(); }
  SectionParts(const SectionParts&) = delete;
  SectionParts& operator=(const SectionParts&) = delete;
  void next(const char* part) {
    if (!c_.section) return;
    done();
    open_ = prefix_ + part;
    c_.section(open_.c_str(), true);
  }
  void done() {
    if (open_.empty()) return;
    c_.section(open_.c_str(), false);
    open_.clear();
  }

 private:
  const Ctx& c_;
  std::string prefix_, open_;
};

// replay: a full recomputation's re-run: the CSA selection saved by the forward (b.at.sel) is used as it is.
void attention_fwd(const Ctx& c, GpuBlock& b, const int64_t* injected_sel, bool replay = false);
// Selective recomputation: rebuilds (in b.redo) the attention activations the forward put there (the normed
// compressed query, the normed + rotated queries and key, the rotated output) from the kept projections.
void attention_redo(const Ctx& c, GpuBlock& b);
// dout [N, d] bf16 -> da [N, d] fp32 (accumulated).
void attention_bwd(const Ctx& c, GpuBlock& b, const bf16* dout, float* da);
// replay: a full recomputation's re-run: the experts the forward chose (b.mo.sel) are used again.
void moe_fwd(const Ctx& c, GpuBlock& b, const int32_t* injected_sel, bool replay = false);
// dout [N, d] bf16 -> du [N, d] fp32 (accumulated).
void moe_bwd(const Ctx& c, GpuBlock& b, const bf16* dout, float* du);

// rmsnorm backward with the weight gradient reduced into dw (fp32 accumulate; dw nullable).
void rmsnorm_bwd_full(const Ctx& c, bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                      const float* rstd, int64_t n, int64_t d);

}  // namespace trex::dsv4gpu
