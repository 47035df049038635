// GpuModel::Impl: the parameter arenas, the blocks and the head state (shared by gpu_params_cuda.cpp and
// gpu_model_cuda.cpp).
#pragma once
#include <memory>

#include "train/cuda/gpu_internal.h"

namespace trex::dsv4gpu {

struct GpuModel::Impl {
  dsv4::ModelConfig cfg;
  GpuModelOptions opts;
  cuda::Gemm gemm;
  // Parameters: one fp32 master arena, its bf16 copy, fp32 gradients and AdamW moments, same offsets.
  std::vector<GpuParam> params;
  std::map<std::string, size_t> index;
  int64_t total = 0;
  DevMem master, compute, grads, adam_m, adam_v;
  std::map<std::string, DevMem> bias;     // fp32 [E]
  std::map<std::string, DevMem> tid2eid;  // int32 [V, K]
  std::vector<std::unique_ptr<GpuBlock>> blocks;
  // Batch state.
  DevLayout lay;
  RopeDev rope_main, rope_compress;
  int64_t rope_pos = 0;
  Pool acts;  // streams X_0..X_L and head activations
  std::vector<bf16*> X;
  bf16 *head_col = nullptr, *head_normed = nullptr;
  float *head_mix = nullptr, *head_rstd = nullptr, *head_w = nullptr, *norm_rstd = nullptr, *lse = nullptr;
  bool forward_done = false;
  // Timing.
  struct Section {
    std::string name;
    cudaEvent_t start, stop;
  };
  std::vector<Section> open_sections, done_sections;
  std::map<std::string, double> section_totals;

  explicit Impl(const dsv4::ModelConfig& c, const GpuModelOptions& o) : cfg(c), opts(o) {}
  ~Impl();

  void declare(const std::string& name, const Shape& shape);
  void declare_all();
  void bind_all();
  const GpuParam& info(const std::string& name) const;
  float* f32(const std::string& n) const { return master.as<float>() + info(n).offset; }
  bf16* b16(const std::string& n) const { return compute.as<bf16>() + info(n).offset; }
  float* g32(const std::string& n) const { return grads.as<float>() + info(n).offset; }
  void refresh_compute();  // bf16 copy of the master weights
  Ctx ctx();
  void section(const char* name, bool begin);
};

}  // namespace trex::dsv4gpu
