#include "infer/cuda_mtp.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/speculative_rows.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/cuda_backend.h"

namespace trex::infer {

namespace {

using dsv4gpu::bf16;
using dsv4gpu::DevMem;

constexpr const char* kPrefix = "mtp.0.";

// The one-layer model of the MTP block: its config is the main one with one sliding, score-routed layer and a
// one-row vocabulary (the shared embedding and head are the main model's).
dsv4::ModelConfig block_config(const dsv4::ModelConfig& cfg) {
  dsv4::ModelConfig c = cfg;
  c.n_layers = 1, c.n_mtp = 0, c.vocab_size = 1;
  c.attn_types = {dsv4::AttnType::Sliding};
  c.compress_ratio = {0};
  c.mlp_types = {dsv4::MlpType::MoE};
  return c;
}

// The CPU table's name of a one-layer-model parameter.
std::string table_name(const std::string& gpu_name) {
  if (gpu_name.rfind("layers.0.", 0) == 0) return kPrefix + gpu_name.substr(9);
  return kPrefix + gpu_name;  // hc_head_fn / hc_head_base / hc_head_scale / norm.weight
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

DevMem upload_bf16(const float* src, int64_t n) {
  DevMem f(size_t(n) * sizeof(float)), b(size_t(n) * sizeof(bf16));
  TREX_CUDA(cudaMemcpy(f.as<float>(), src, size_t(n) * sizeof(float), cudaMemcpyHostToDevice));
  cuda::cast_f32_to_bf16(b.as<bf16>(), f.as<float>(), n);
  TREX_CUDA(cudaDeviceSynchronize());
  return b;
}

}  // namespace

bool table_has_mtp(const dsv4::ParamTable<float>& w) { return w.has("mtp.0.e_proj.weight"); }

std::unique_ptr<GpuMtp> make_gpu_mtp(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                     uint64_t seed, bool moe_grouped_gemm) {
  TREX_CHECK(cfg.n_mtp == 1, "MTP on the GPU: the config has {} MTP layers (need 1)", cfg.n_mtp);
  const int64_t d = cfg.hidden;
  dsv4gpu::GpuModelOptions mo;
  mo.moe_grouped_gemm = moe_grouped_gemm;
  mo.gradients = false;
  auto mtp = std::make_unique<GpuMtp>();
  mtp->block = std::make_unique<dsv4gpu::GpuModel>(block_config(cfg), mo);
  dsv4gpu::GpuModel::Impl& m = mtp->block->impl();
  auto tensor = [&](const std::string& name, const std::vector<int64_t>& shape) -> const float* {
    TREX_CHECK(weights->has(name), "MTP on the GPU: the checkpoint has no '{}' (config num_nextn_predict_layers 1)",
               name);
    const dsv4::ParamInfo& pi = weights->info(name);
    TREX_CHECK(pi.shape == shape, "MTP on the GPU: '{}' is {}, expected {}", name, shape_str(pi.shape),
               shape_str(shape));
    return weights->arena_value(pi);
  };
  if (weights) {
    std::vector<float> host(size_t(m.total), 0.f);
    for (const dsv4gpu::GpuParam& p : m.params) {
      if (p.name == "embed.weight" || p.name == "head.weight") continue;  // the main model's are used
      const float* src = tensor(table_name(p.name), p.shape);
      std::copy(src, src + p.numel, host.begin() + p.offset);
    }
    TREX_CUDA(cudaMemcpy(m.master.as<float>(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    m.refresh_compute();
    for (auto& [name, t] : m.bias) {  // layers.0.ffn.gate.bias
      const std::string src = table_name(name);
      auto it = weights->bias.find(src);
      TREX_CHECK(it != weights->bias.end() && int64_t(it->second.size()) == cfg.n_routed_experts,
                 "MTP on the GPU: the checkpoint has no router bias '{}' of {} experts", src, cfg.n_routed_experts);
      TREX_CUDA(cudaMemcpy(t.as<float>(), it->second.data(), it->second.size() * sizeof(float),
                           cudaMemcpyHostToDevice));
    }
    mtp->enorm = upload_bf16(tensor("mtp.0.enorm.weight", {d}), d);
    mtp->hnorm = upload_bf16(tensor("mtp.0.hnorm.weight", {d}), d);
    mtp->e_proj = upload_bf16(tensor("mtp.0.e_proj.weight", {d, d}), d * d);
    mtp->h_proj = upload_bf16(tensor("mtp.0.h_proj.weight", {d, d}), d * d);
  } else {
    mtp->block->init_random(seed * 7919ull + 17);
    const std::vector<float> ones(size_t(d), 1.f);
    mtp->enorm = upload_bf16(ones.data(), d);
    mtp->hnorm = upload_bf16(ones.data(), d);
    for (auto [w, k] : {std::pair{&mtp->e_proj, 1ull}, std::pair{&mtp->h_proj, 2ull}}) {
      DevMem f(size_t(d * d) * sizeof(float));
      cuda::fill_uniform_f32(f.as<float>(), d * d, seed * 7919ull + 100 + k, float(std::sqrt(3.0 / double(d))));
      *w = DevMem(size_t(d * d) * sizeof(bf16));
      cuda::cast_f32_to_bf16(w->as<bf16>(), f.as<float>(), d * d);
    }
  }
  dsv4::ProgramShape ps;
  ps.n_layers = 1, ps.embed = false, ps.head = true, ps.mtp = false, ps.vocab = cfg.vocab_size;
  ps.balance = {0};  // no losses in decoding
  mtp->program = std::make_unique<dsv4::BlockProgram>(*m.backend, std::move(ps));
  TREX_CUDA(cudaDeviceSynchronize());
  return mtp;
}

void mtp_input_streams(const GpuMtp& mtp, dsv4gpu::GpuModel::Impl& main, const bf16* X, const bf16* xprev,
                       const int32_t* src, const int32_t* next, const int32_t* picks, int64_t n, dsv4gpu::Pool& pool,
                       bf16* x) {
  const dsv4::ModelConfig& cfg = main.cfg;
  const int64_t d = cfg.hidden, hc = cfg.hc_mult;
  const dsv4gpu::Linear lin{main.gemm.get()};
  const float eps = float(cfg.rms_eps);
  int32_t* nid = pool.take<int32_t>(n);
  cuda::resolve_token_ids(nid, next, picks, n);
  bf16* emb = pool.take<bf16>(n * d);
  bf16* en = pool.take<bf16>(n * d);
  bf16* e = pool.take<bf16>(n * d);
  float* rs = pool.take<float>(n * hc);
  cuda::embed_streams_fwd(emb, nid, main.b16("embed.weight"), n, d, 1);
  cuda::rmsnorm_fwd(en, rs, emb, mtp.enorm.as<bf16>(), n, d, eps);
  lin.fwd(e, en, mtp.e_proj.as<bf16>(), n, d, d);
  bf16* xin = pool.take<bf16>(n * hc * d);
  bf16* hn = pool.take<bf16>(n * hc * d);
  cuda::copy_rows_bf16(xin, nullptr, X, xprev, src, n, hc * d);
  cuda::rmsnorm_fwd(hn, rs, xin, mtp.hnorm.as<bf16>(), n * hc, d, eps);
  lin.fwd(x, hn, mtp.h_proj.as<bf16>(), n * hc, d, d);
  cuda::add_to_streams_bf16(x, e, n, hc, d);
}

}  // namespace trex::infer
