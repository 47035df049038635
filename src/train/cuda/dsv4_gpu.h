// The DeepSeek-V4 training step on one GPU: bf16 weights and activations with fp32 accumulation, fp32 master
// weights, gradients and AdamW state, everything resident on the device. The same blocks as the CPU model
// (src/model/dsv4/model.h): embedding into n_hc streams; per layer mHC site -> attn_norm -> attention (sliding,
// CSA with the lightning indexer, HCA) -> expand, mHC site -> ffn_norm -> MoE (score or hash routing, shared
// expert) -> expand; hc_head -> norm -> LM head fused with the masked next-token CE (logits never materialised).
// Parameters carry the CPU model's official names, so they load from its ParamTable and gradients compare by name.
//
// Not covered (yet): the MTP module (configs with num_nextn_predict_layers > 0 are rejected), the sequence-wise
// balance loss (alpha = 0), the indexer KL training signal (the indexer's weights get no gradient, as on the CPU
// by default), gradient clipping.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "model/dsv4/config.h"
#include "model/dsv4/seq_layout.h"
#include "model/dsv4/weights.h"

namespace trex::dsv4gpu {

struct GpuModelOptions {
  int64_t lm_chunk = 8192;  // vocabulary columns per LM-head GEMM of the fused CE
  bool timing = false;      // CUDA-event sections (forward/backward per sub-layer kind, head, optimizer)
};

// Selections to use instead of the GPU's own (parity runs: bf16 rounding can flip near-ties of the indexer and
// the router). Indexed by main layer; an empty vector = let the GPU choose.
struct Injection {
  std::vector<std::vector<int64_t>> csa_sel;    // [N * index_topk] global entry indices (CPU AttentionSaved::sel)
  std::vector<std::vector<int32_t>> router_sel;  // [N * topk] expert ids
};

class GpuModel {
 public:
  explicit GpuModel(const dsv4::ModelConfig& cfg, const GpuModelOptions& opts = {});
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  // Parameters: deterministic by seed (weights uniform with std 1/sqrt(fan_in) style scales, norms 1), or copied
  // from the CPU model's table (same names and shapes; router biases and tid2eid too).
  void init_random(uint64_t seed);
  void load_from(const dsv4::ParamTable<float>& cpu);

  // ids, labels [B, S] on the host. Returns the loss (mean CE over labelled targets).
  double forward(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                 const Injection* inject = nullptr);
  void zero_grads();
  void backward();  // accumulates fp32 gradients of the last forward
  void adamw_step(const cuda::AdamWStep& a);

  // Host copies, by official name.
  std::vector<float> value(const std::string& name) const;
  std::vector<float> grad(const std::string& name) const;
  std::vector<std::string> param_names() const;
  int64_t n_params() const;
  std::vector<float> final_normed() const;              // [N, d] of the last forward
  std::vector<int64_t> csa_selection(int64_t l) const;  // [N * index_topk] global entries used by layer l
  std::vector<int32_t> router_selection(int64_t l) const;

  // Milliseconds per section since the last reset (timing on only; synchronises).
  std::map<std::string, double> section_ms();
  void reset_sections();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trex::dsv4gpu
